"""Device values read on the host without stalling the GPU: copied into pinned memory behind the work queued so
far, then read once that copy has landed, waiting for it alone and not for the work queued after it (the decode
loop's chosen tokens, a training step's loss and gradient norm)."""

from __future__ import annotations

import torch


class HostCopy:
    """A pinned host buffer for a tensor of `shape` and `dtype` on `device`, filled asynchronously by `start` (again
    and again: one buffer and one event); on a CPU the tensor itself is kept, to be read before it is overwritten."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.buffer = torch.empty(shape, dtype=dtype, pin_memory=True)
            self.event = torch.cuda.Event()

    def start(self, tensor: torch.Tensor) -> HostCopy:
        """Queue the copy of `tensor` (its values as they are once the work queued so far has run); returns self."""
        if self.cuda:
            self.buffer.copy_(tensor, non_blocking=True)
            self.event.record()
        else:
            self.buffer = tensor
        return self

    def read(self) -> list:
        """The values, as a (nested) list; waits for this copy only."""
        if self.cuda:
            self.event.synchronize()
        return self.buffer.tolist()
