"""The teacher-forced fit of every mixer layer at once: in this process, or spread over worker processes.

Each layer's fit reads only its own teacher records (`zebra.upcycle.fit`), so the layers are independent and can
be fitted side by side by `workers` spawned processes, each a share of the layers, each on a GPU of its own when
the device is `cuda` (all of the machine's GPUs) and the machine has several. The default is one process per such
GPU, and one process otherwise. Measured on one H100 (docs/benchmarks.md, "Calibration in worker processes"),
eight processes sharing the GPU were no faster than one: without MPS the processes' kernels take turns on it
rather than overlapping, and on a cold kernel cache each process compiles and autotunes its own kernels, so
eight were slower. On a CPU the fit is bound by the cores, which one process already uses.

A worker gets its layers' tensors and records through a file it memory-maps, and gives its fitted tensors back the
same way (not through shared memory: a container's /dev/shm is often 64 MB); its progress and errors come through a
queue. The result does not depend on the number of workers: each layer is fitted from the same start, on the same
records, with the same seed.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebra.core.errors import ZebraError
from zebra.core.noise import quiet_library_noise
from zebra.upcycle.fit import FitOptions, LayerFit, fit_layer

if TYPE_CHECKING:
    import torch

    from zebra.upcycle.attention_records import LayerRecord

DEAD_GRACE_S = 5.0  # a worker found stopped is an error once this long has passed without its "done"

# on_step(layer number in the list fitted, step, error)
StepCallback = Callable[[int, int, float], None]


def resolve_workers(workers: int, device: str, layers: int) -> int:
    """The processes to fit `layers` layers with: `workers`, or with 0 (auto) one per GPU when `device` means all
    of them (`cuda`, or `auto` on a GPU machine) and 1 otherwise; never more than the layers."""
    if workers == 0:
        workers = len(_gpus(device)) or 1
    return max(1, min(workers, layers))


def worker_device(device: str, k: int) -> str:
    """Worker `k`'s device: the machine's GPUs in turn when `device` means all of them, else `device` itself."""
    gpus = _gpus(device)
    return gpus[k % len(gpus)] if gpus else device


def _gpus(device: str) -> list[str]:
    """`cuda:0`, `cuda:1`, ... when `device` is the machine's GPUs as a whole (`cuda`, or `auto` on a GPU machine);
    [] for the CPU or one named GPU (`cuda:1`)."""
    from zebra.core.device import resolve_device

    if resolve_device(device) != "cuda":
        return []
    import torch

    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def fit_layers(
    config: Any,
    sublayers: list[int],
    states: dict[int, dict[str, torch.Tensor]],
    records: dict[int, LayerRecord],
    fit: FitOptions,
    device: str,
    workers: int,
    on_step: StepCallback,
) -> tuple[dict[str, torch.Tensor], list[LayerFit]]:
    """Fit mixer sublayers `sublayers` of the student (`config`), each from `states[i]` (its upcycled tensors,
    float32) to its teacher layer's `records[i // 2]`, in `workers` processes (1: here).

    Returns the fitted tensors (full names, float32, on the CPU) and each layer's LayerFit, in `sublayers` order.
    `records` is emptied as the layers are handed out.
    """
    numbered = list(enumerate(sublayers))
    if workers <= 1:
        return fit_here(config, numbered, states, records, fit, device, on_step)
    import queue as queues

    import torch
    import torch.multiprocessing as mp

    # round robin: shares within one layer of each other
    shares = [numbered[k::workers] for k in range(workers)]
    threads = max(1, torch.get_num_threads() // workers)
    context = mp.get_context("spawn")  # CUDA may be initialised here already: no fork
    messages = context.Queue()
    with tempfile.TemporaryDirectory(prefix="zebra-calibrate-") as folder:
        processes = []
        for k, share in enumerate(shares):
            job, result = Path(folder, f"job{k}.pt"), Path(folder, f"fitted{k}.pt")
            torch.save({"config": config, "numbered": share, "states": {i: states[i] for _, i in share},
                        "records": {i // 2: records.pop(i // 2) for _, i in share}, "fit": fit,
                        "device": worker_device(device, k), "threads": threads}, job)  # fmt: skip
            process = context.Process(target=_worker, args=(k, str(job), str(result), messages), daemon=True)
            process.start()
            processes.append(process)
        finished: set[int] = set()
        # a worker found stopped without its "done" may have left its last messages in the queue: wait a little
        dead_since: dict[int, float] = {}
        try:
            while len(finished) < workers:
                try:
                    kind, k, *rest = messages.get(timeout=1.0)
                    if kind == "step":
                        on_step(*rest)
                    elif kind == "done":
                        finished.add(k)
                    elif kind == "zebra":
                        raise ZebraError(rest[0], fix=rest[1])
                    else:
                        raise RuntimeError(f"calibration worker {k} failed:\n{rest[0]}")
                except queues.Empty:
                    pass
                for k in [k for k, p in enumerate(processes) if k not in finished and not p.is_alive()]:
                    if time.monotonic() - dead_since.setdefault(k, time.monotonic()) > DEAD_GRACE_S:
                        raise RuntimeError(f"calibration worker {k} stopped (exit code {processes[k].exitcode}) "
                                           "before its layers were fitted")  # fmt: skip
        finally:
            for process in processes:
                if process.is_alive():
                    process.terminate()
                process.join()
        fitted = [torch.load(Path(folder, f"fitted{k}.pt"), weights_only=False) for k in range(workers)]
    tensors = {name: t for part in fitted for name, t in part["tensors"].items()}
    by_number = {n: layer for share, part in zip(shares, fitted, strict=True)
                 for (n, _), layer in zip(share, part["layers"], strict=True)}  # fmt: skip
    return tensors, [by_number[n] for n in range(len(sublayers))]


def fit_here(
    config: Any,
    numbered: list[tuple[int, int]],
    states: dict[int, dict[str, torch.Tensor]],
    records: dict[int, LayerRecord],
    fit: FitOptions,
    device: str,
    on_step: StepCallback,
) -> tuple[dict[str, torch.Tensor], list[LayerFit]]:
    """Fit each (number, sublayer index) of `numbered` in turn, in this process (see `fit_layers`)."""
    import torch

    from zebra.core.device import resolve_device
    from zebra.models.modeling_zebra import ZebraSublayer

    dev = torch.device(resolve_device(device))
    tensors: dict[str, torch.Tensor] = {}
    layers: list[LayerFit] = []
    for n, index in numbered:
        record = records.pop(index // 2)  # freed once fitted
        mixer = ZebraSublayer(config, index).mixer.float()
        mixer.load_state_dict(states[index], strict=True)
        mixer = mixer.to(dev).eval()
        x, y = record.inputs.to(dev), record.outputs.to(dev)  # [S, T, D]
        layers.append(fit_layer(mixer, config, index, x, y, record, fit,
                                lambda step, error, n=n: on_step(n, step, error)))  # fmt: skip
        prefix = f"model.layers.{index}.mixer."
        tensors.update({prefix + k: v.detach().cpu() for k, v in mixer.state_dict().items()})
    return tensors, layers


def _worker(k: int, job: str, result: str, messages: Any) -> None:
    """A spawned process: fit the layers of `job` (a file from `fit_layers`), write them to `result`, and say
    so on `messages`; an error is sent, not raised."""
    try:
        quiet_library_noise()  # a spawned process starts with none of the command's log filters
        import torch

        work = torch.load(job, mmap=True, weights_only=False)
        torch.set_num_threads(work["threads"])
        tensors, layers = fit_here(work["config"], work["numbered"], work["states"], work["records"],
                                   work["fit"], work["device"],
                                   lambda n, step, error: messages.put(("step", k, n, step, error)))  # fmt: skip
        torch.save({"tensors": tensors, "layers": layers}, result + ".tmp")
        os.replace(result + ".tmp", result)
        messages.put(("done", k))
    except ZebraError as error:
        messages.put(("zebra", k, error.message, error.fix))
    except BaseException:
        messages.put(("error", k, traceback.format_exc()))
