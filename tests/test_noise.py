"""The library log lines zebra drops (`zebra.core.noise`): only those, once, whatever else the loggers say."""

from __future__ import annotations

import logging

from zebra.core.noise import NOISE, quiet_library_noise


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_library_noise_is_dropped_and_the_rest_of_those_loggers_still_shows():
    """torchao's unloadable extensions and torch's Enum deprecation are dropped; another warning of the same loggers
    still shows; attaching twice (every command of one process calls it) leaves one filter per logger. (A handler
    on the loggers themselves: torch's loggers do not propagate to the root once torch has set up its logging.)"""
    quiet_library_noise()
    quiet_library_noise()
    torchao, pytree = logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")
    seen = Collect()
    for logger in (torchao, pytree):
        logger.addHandler(seen)
    try:
        torchao.warning("Failed to load /site-packages/torchao/_C_mxfp8.so: Could not load this library: ...")
        pytree.warning(
            "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile"
        )
        torchao.warning("Float8 training needs an sm89+ GPU")
        pytree.warning("something else")
    finally:
        for logger in (torchao, pytree):
            logger.removeHandler(seen)
    assert seen.messages == ["Float8 training needs an sm89+ GPU", "something else"]
    for name in NOISE:
        assert len(logging.getLogger(name).filters) == 1
