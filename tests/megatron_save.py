"""Save a megatron-core `torch_dist` checkpoint on a CPU-only machine: the one writer both Megatron test helpers
(tests/convert/megatron_writer.py, tests/upcycle/megatron_dense.py) build their sharded state for."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch


def save_torch_dist(root: Path, state: dict, iteration: int) -> Path:
    """`root/iter_XXXXXXX/` written by megatron-core's `dist_checkpointing.save` + the tracker file; returns root."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    directory = root / f"iter_{iteration:07d}"
    directory.mkdir(parents=True)
    sync, current = torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.synchronize = lambda *a, **k: None  # no GPU here: megatron syncs a stream before writing
    torch.cuda.current_device = lambda: "cpu"  # and puts a status flag on the current device
    owns_group = not dist.is_initialized()
    try:
        if owns_group:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ["MASTER_PORT"] = str(port)
            dist.init_process_group("gloo", rank=0, world_size=1)
        dist_checkpointing.save(state, str(directory))
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = sync, current
        if owns_group:
            dist.destroy_process_group()
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return root
