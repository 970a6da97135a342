"""Library log lines that tell a zebra user nothing, dropped before they reach stderr (every command, every rank,
every spawned worker).

Each is named by its logger and a fragment of its text, so that anything else those libraries log still shows.
"""

from __future__ import annotations

import logging

NOISE = {
    # torchao (train.fp8's), which transformers imports wherever it is installed: its compiled extensions that do
    # not load on this machine (a CPU, another CUDA or torch build), two lines on every command that loads a model
    "torchao": ("Failed to load ",),
    # torch, as torchao registers its Enums: a deprecation for torchao's authors, not for zebra's users
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported",),
}


class _DropNoise(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


def quiet_library_noise() -> None:
    """Attach the NOISE filters to their loggers (once per process; cheap: no library is imported)."""
    for name, fragments in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise(fragments))
