"""Checkpoints: torch distributed checkpoints (DCP), committed atomically, with a `latest` pointer and fallback.

Layout of `<run>/checkpoints/`:

    step_0000100/            one committed checkpoint
      .metadata  __0_0.distcp ...   DCP: keys model.<ZebraForCausalLM state_dict name>, optimizer.*,
                                    scheduler.*, progress.* (step, consumed samples, ...)
      meta.json              step, consumed samples, world size, time (rank 0)
      rng/rank_00000.pt      each rank's torch / CUDA / numpy / python RNG states
    latest                   the name of the newest committed checkpoint

A save writes `step_XXXXXXX.partial/`, fsyncs every file, then renames it into place and rewrites `latest`
(temp file + rename), so a crash at any moment leaves the previous checkpoints and `latest` intact.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zebra.errors import ZebraError
from zebra.train.dist import DistEnv, barrier

_STEP_DIR = re.compile(r"step_(\d+)")


def step_name(step: int) -> str:
    return f"step_{step:07d}"


def is_complete(path: Path) -> bool:
    """A committed checkpoint: DCP metadata and our meta.json are both present."""
    return (path / ".metadata").is_file() and (path / "meta.json").is_file()


def read_meta(path: Path) -> dict[str, Any]:
    return json.loads((path / "meta.json").read_text())


def committed(checkpoints: Path) -> list[Path]:
    """Complete checkpoints under `checkpoints/`, newest first, the one `latest` names leading."""
    if not checkpoints.is_dir():
        return []
    found = [p for p in checkpoints.iterdir() if _STEP_DIR.fullmatch(p.name) and is_complete(p)]
    found.sort(key=lambda p: int(_STEP_DIR.fullmatch(p.name).group(1)), reverse=True)
    pointer = checkpoints / "latest"
    if pointer.is_file():
        name = pointer.read_text().strip()
        found.sort(key=lambda p: p.name != name)  # stable: `latest` first, the rest stay newest-first
    return found


def find_checkpoints(source: str | Path, run_dir: Path) -> list[Path]:
    """Checkpoints to try, in order, for `--resume auto` (this run) or `--resume PATH`.

    PATH may be one checkpoint (`.../step_0000100`), a `checkpoints/` folder or a run directory.
    """
    if str(source) == "auto":
        return committed(run_dir / "checkpoints")
    path = Path(source)
    if (path / ".metadata").is_file():
        if not is_complete(path):
            raise ZebraError(
                f"--resume {path}: incomplete checkpoint (no meta.json)", fix="pick another step"
            )
        return [path]
    for folder in (path / "checkpoints", path):
        if folder.is_dir() and (found := committed(folder)):
            return found
    raise ZebraError(
        f"--resume {path}: no checkpoint there",
        fix="pass a run directory, its checkpoints/ or a step_XXXXXXX",
    )


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text` so that readers see the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    _fsync_dir(path.parent)


def _rng_states(device) -> dict[str, Any]:
    import numpy as np
    import torch

    states = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def _set_rng_states(states: dict[str, Any], device) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)


def _reason(error: BaseException) -> str:
    """One line on why a checkpoint did not load (DCP wraps each rank's error in a CheckpointException)."""
    failures = getattr(error, "failures", None)
    if failures:
        error = next(iter(failures.values()))[0]
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:160]}" if text else type(error).__name__


class Checkpointer:
    """Saves and restores one run's checkpoints; every rank calls `save` / `restore` (they are collective)."""

    def __init__(self, run_dir: Path, *, keep_last: int, env: DistEnv):
        self.dir = run_dir / "checkpoints"
        self.keep_last = keep_last
        self.env = env

    def save(self, step: int, state: dict[str, Any], meta: dict[str, Any]) -> Path:
        """Write checkpoint `step` of `state` (a dict of DCP Stateful objects) and commit it."""
        import torch
        import torch.distributed.checkpoint as dcp

        final = self.dir / step_name(step)
        partial = final.with_name(final.name + ".partial")
        if self.env.is_main:
            shutil.rmtree(partial, ignore_errors=True)
            (partial / "rng").mkdir(parents=True)
        barrier(self.env)
        torch.save(_rng_states(self.env.device), partial / "rng" / f"rank_{self.env.rank:05d}.pt")
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*assuming the intent is to save in a single process.*"
            )
            dcp.save(state, checkpoint_id=str(partial))
        barrier(self.env)
        if self.env.is_main:
            meta = {**meta, "step": step, "world_size": self.env.world_size, "time": time.time()}
            (partial / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            _fsync_tree(partial)
            if final.exists():
                shutil.rmtree(final)
            partial.replace(final)
            _fsync_dir(self.dir)
            write_atomic(self.dir / "latest", final.name + "\n")
            self._prune()
        barrier(self.env)
        return final

    def _prune(self) -> None:
        for old in committed(self.dir)[self.keep_last :]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.dir.glob("step_*.partial"):
            shutil.rmtree(stale, ignore_errors=True)

    def restore(
        self, candidates: list[Path], state: dict[str, Any], *, warn: Callable[[str], None]
    ) -> tuple[Path, dict[str, Any]] | None:
        """Load the first readable checkpoint of `candidates` into `state`; warn about each one skipped.

        Returns (checkpoint, its meta.json) or None when `candidates` is empty. Raises ZebraError when none loads.
        """
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        failures = []
        for path in candidates:
            try:
                meta = read_meta(path)
                with warnings.catch_warnings():
                    warnings.filterwarnings(
                        "ignore", message=".*assuming the intent is to load in a single.*"
                    )
                    dcp.load(state, checkpoint_id=str(path))
            except (Exception, CheckpointException) as e:  # torn or corrupted: try the previous one
                reason = _reason(e)
                failures.append(f"{path.name}: {reason}")
                nxt = candidates[len(failures)] if len(failures) < len(candidates) else None
                warn(
                    f"checkpoint {path} could not be loaded ({reason}); "
                    + (f"falling back to {nxt.name}" if nxt else "no older checkpoint left")
                )
                continue
            rng = path / "rng" / f"rank_{self.env.rank:05d}.pt"
            if meta.get("world_size") == self.env.world_size and rng.is_file():
                _set_rng_states(torch.load(rng, weights_only=False), self.env.device)
            return path, meta
        if failures:
            raise ZebraError(
                "no checkpoint could be loaded: " + "; ".join(failures),
                fix="pass --resume never to start over, or --resume PATH to pick one",
            )
        return None
