"""A training micro-batch's forward and backward replayed from one CUDA graph (`train.forward_backward_graph`).

Eager PyTorch launches every kernel of a step from Python: a 1B hybrid's forward and backward are thousands of
launches, and FLA's recurrent kernels spend more host time per call than GPU time (1.9 ms against 0.3 ms for the
GDN forward at 8 x 2048 on an H200), so parts of the step leave the GPU idle. Captured once, the whole forward,
loss and backward are one `graph.replay()`.

What a graph needs, and how the step provides it:
- fixed shapes and addresses: the micro-batch is copied into static input buffers; a micro-batch of another shape
  runs eagerly (same gradients, no replay);
- no host reads inside: zebra's forward, its chunked loss and FLA's kernels make none without `cu_seqlens`; the
  warm-up's last pass runs in torch's sync debug mode, so a loss or model that does is named with its line;
- kernels compiled and autotuned before capture: two eager warm-up passes on a side stream first;
- gradients at fixed addresses: the warm-up's backward creates them, the graph adds into them, and the step
  zeroes them in place (`zero_grad(set_to_none=False)`), so gradient accumulation works as in eager mode (and a
  parameter the loss does not reach keeps no gradient: AdamW leaves it alone, as in eager mode);
- autocast's weight-cast cache off (each cast is a kernel of the graph).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from zebra.errors import ZebraError, first_line

if TYPE_CHECKING:
    import torch

# (tokens, labels, loss_mask [m, T], scale []) -> (summed loss [], parts [k]); runs backward of loss * scale
ForwardBackward = Callable[..., tuple["torch.Tensor", "torch.Tensor"]]

WARMUP_PASSES = 2  # eager passes before capture: Triton compiles and autotunes, cuBLAS picks its kernels
FIX = "--set train.forward_backward_graph=false"


def check_graphable(device_type: str, distributed: bool) -> None:
    """A ZebraError unless the step runs on one CUDA (or ROCm) GPU: the graph has no data-parallel hooks."""
    if device_type != "cuda":
        raise ZebraError(
            f"train.forward_backward_graph needs a CUDA GPU (this run is on {device_type})", fix=FIX
        )
    if distributed:
        raise ZebraError(
            "train.forward_backward_graph runs on one GPU (DDP's and FSDP2's gradient hooks are not captured)",
            fix=FIX + ", or train on one GPU",
        )


class GraphedForwardBackward:
    """`forward_backward` captured in a CUDA graph on its first call, replayed on the next ones.

    Args:
        forward_backward: one micro-batch's eager forward + backward (`ForwardBackward`), adding into the
            parameters' gradients.
        params: the parameters that get gradients (their `.grad` must keep its storage between steps).
    """

    def __init__(self, forward_backward: ForwardBackward, params: list[torch.Tensor]):
        self.forward_backward = forward_backward
        self.params = params
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: tuple[torch.Tensor, ...] = ()  # static tokens, labels, loss_mask, scale
        self.outputs: tuple[torch.Tensor, torch.Tensor] | None = None  # static summed loss, parts

    def __call__(
        self, tokens: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch's (summed loss, parts); its gradients (times `scale`) are added to `.grad`. The
        returned tensors are the graph's: read them before the next call."""
        batch = (tokens, labels, loss_mask)
        if self.graph is None:
            self._capture(batch)
        elif any(
            a.shape != b.shape or a.dtype != b.dtype for a, b in zip(batch, self.inputs[:3], strict=True)
        ):
            return self.forward_backward(*batch, scale)
        for static, given in zip(self.inputs[:3], batch, strict=True):
            static.copy_(given, non_blocking=True)
        self.inputs[-1].fill_(scale)
        self.graph.replay()
        return self.outputs

    def _capture(self, batch: tuple[torch.Tensor, ...]) -> None:
        """Warm up, then record one forward + backward on static copies of `batch` (the first micro-batch of a
        step: no gradient is held before it)."""
        import torch

        self.inputs = (*(t.clone() for t in batch), torch.zeros((), device=batch[0].device))
        # the warm-up's backward creates the gradients the graph then adds into (a parameter the loss does not
        # reach keeps none, so AdamW skips it as in eager mode); it ran at scale 0, but 0 x inf is NaN: zero them
        warm_up(self.forward_backward, self.inputs)
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()
        try:
            self.graph, self.outputs = record(self.forward_backward, self.inputs)
        except RuntimeError as error:
            raise ZebraError(
                f"train.forward_backward_graph: the step could not be captured in a CUDA graph ({first_line(error)})",
                fix=FIX,
            ) from None


def warm_up(fn: ForwardBackward, inputs: tuple[torch.Tensor, ...]) -> None:
    """`WARMUP_PASSES` eager calls of `fn(*inputs)` on a side stream (as CUDA graph capture wants), then the
    warm-up's cached memory released: the graph gets its own pool. The last pass runs with torch's sync debug
    mode set to error: an operation that makes the host wait for the GPU (`.item()`, a boolean mask, a copy from
    pageable memory), which a graph cannot hold, is named with its line before capture fails on it."""
    import torch

    device = inputs[0].device
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_PASSES - 1):  # compiling and autotuning synchronize: not checked
            fn(*inputs)
        before = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn(*inputs)
        except RuntimeError as error:
            if "synchronizing" not in str(error):
                raise
            raise ZebraError(
                "train.forward_backward_graph: the step makes the host wait for the GPU at "
                f"{_caller(error)}, which a CUDA graph cannot hold",
                fix=FIX + ", or remove the host read (.item(), .tolist(), boolean indexing) from the forward",
            ) from None
        finally:
            torch.cuda.set_sync_debug_mode(before)
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


def _caller(error: BaseException) -> str:
    """`file:line (code)` of the innermost frame of `error`'s traceback outside torch: the line that asked."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if "/torch/" not in f.filename]
    if not frames:
        return "an unknown line"
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"


def record(fn: ForwardBackward, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.cuda.CUDAGraph, tuple]:
    """`fn(*inputs)` captured in a CUDA graph: (the graph, its static outputs). Other threads may call CUDA
    meanwhile (`thread_local`): the data loader's pin-memory thread allocates pinned buffers, which a `global`
    capture would forbid it."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outputs = fn(*inputs)
    return graph, outputs
