"""Checkpoints: torch distributed checkpoints (DCP), committed atomically, with a `latest` pointer and fallback.

Layout of `<run>/checkpoints/`:

    step_0000100/            one committed checkpoint
      .metadata  __0_0.distcp ...   DCP: keys model.<ZebraForCausalLM state_dict name>, optimizer.*,
                                    scheduler.*, progress.* (step, consumed samples, ...)
      meta.json              step, consumed samples, world size, time (rank 0)
      rng/rank_00000.pt      each rank's torch / CUDA / numpy / python RNG states (tensors, lists, numbers)
    latest                   the name of the newest committed checkpoint

A save writes `step_XXXXXXX.partial/`, fsyncs every file, then renames it into place and rewrites `latest`
(temp file + rename), so a crash at any moment leaves the previous checkpoints and `latest` intact. A save of a
step already there waits for that folder's readers (`zebra.folders.checkpoint_dir.commit_step`).

A resume holds the checkpoints it may read (`zebra.folders.checkpoint_dir.held`), so that another run being resumed from
while it trains does not prune them midway; rank 0 lists them and every rank reads the same list.

A restore reads nothing that could run code (`zebra.core.safe_dcp`, `torch.load(weights_only=True)`) and falls back
to the previous checkpoint when a file of the newest is truncated or corrupt (a torn DCP folder, an empty
`meta.json`, an unreadable RNG file); any other error (out of memory, a failed collective) is raised.
"""

from __future__ import annotations

import contextlib
import errno
import json
import pickle
import random
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zebra.core.atomic import fsync_dir, fsync_tree, write_atomic
from zebra.core.errors import ZebraError, error_summary
from zebra.folders.checkpoint_dir import (
    commit_step,
    committed,
    find_checkpoints,
    held,
    read_meta,
    recover_interrupted_commit,
    remove_unless_held,
    step_name,
)
from zebra.train.dist import DistEnv, all_reduce_sum, barrier, broadcast_object


def _rng_states(device) -> dict[str, Any]:
    """This process's RNG states as tensors, lists and numbers (what `torch.load(weights_only=True)` reads)."""
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached_gaussian],
        "python": [version, list(internal), gauss_next],
    }
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def load_rng_states(path: Path) -> dict[str, Any]:
    """An RNG file, read with `weights_only=True`; files written before zebra stored plain lists hold numpy's
    state as an array, so numpy's array classes are allowed too (they build arrays, nothing else).

    Raises:
        ZebraError: the file names another class or function (it could run code).
        pickle.UnpicklingError, EOFError, RuntimeError: a truncated or corrupt file.
    """
    import numpy as np
    import torch

    from zebra.core.safe_dcp import REFUSAL_FIX, refused_global

    reconstruct = np.zeros(0).__reduce__()[0]  # numpy's array constructor, under both of its module names
    arrays = [
        (reconstruct, "numpy.core.multiarray._reconstruct"),
        (reconstruct, "numpy._core.multiarray._reconstruct"),
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),  # the key array's dtype class
    ]
    try:
        with torch.serialization.safe_globals(arrays):
            states = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if (blocked := refused_global(e)) is None:
            raise
        raise ZebraError(
            f"{path}: refusing to unpickle {blocked} (it could run code on this machine)", fix=REFUSAL_FIX
        ) from None
    if not isinstance(states, dict) or not {"torch", "numpy", "python"} <= states.keys():
        raise pickle.UnpicklingError(f"{path}: not an RNG state file")
    return states


def _set_rng_states(states: dict[str, Any], device) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)


def _rank_errors(error: BaseException) -> list[BaseException]:
    """The errors behind `error` (DCP wraps each rank's error in a CheckpointException: `failures`)."""
    failures = getattr(error, "failures", None)
    if not failures:
        return [error]
    return [f[0] if isinstance(f, tuple) else f for f in failures.values()]


def _reason(error: BaseException) -> str:
    """One line on why a checkpoint did not load."""
    return error_summary(_rank_errors(error)[0])


def is_corrupt(error: BaseException) -> bool:
    """Whether `error` says a checkpoint file is missing, truncated or corrupt (then an older one may load),
    rather than something about this machine (out of memory, a device or collective failure, a refusal)."""
    import torch
    import torch.distributed

    errors = _rank_errors(error)
    if len(errors) > 1 or errors[0] is not error:
        return all(is_corrupt(e) for e in errors)
    not_files = (torch.OutOfMemoryError, torch.distributed.DistError, getattr(torch, "AcceleratorError", ()))
    if isinstance(error, not_files) or "out of memory" in str(error).lower():
        return False
    if isinstance(error, OSError):  # missing files, and torch.load seeking past a truncated end (EINVAL)
        return error.errno not in (errno.EACCES, errno.EPERM, errno.ENOMEM, errno.EMFILE, errno.ENFILE)
    return isinstance(error, (EOFError, ValueError, pickle.UnpicklingError, RuntimeError))


def _not_corrupt(error: BaseException) -> BaseException:
    """The error to raise for a checkpoint that is not corrupt: a refusal (ZebraError) as itself, a file this
    process may not read as one line naming it, anything else (out of memory, a failed collective) as it is."""
    errors = [e for e in _rank_errors(error) if not is_corrupt(e)] or [error]
    if refusal := next((e for e in errors if isinstance(e, ZebraError)), None):
        return refusal
    if isinstance(errors[0], OSError) and errors[0].filename:
        return ZebraError(
            f"{errors[0].filename}: cannot read it ({errors[0].strerror})",
            fix="check the file's permissions and the file system, then resume again",
        )
    return error


class Checkpointer:
    """Saves and restores one run's checkpoints; every rank calls `save` / `resume` / `restore` (they are
    collective). `warn` is told when a save waits for a reader of the step it replaces."""

    def __init__(
        self, run_dir: Path, *, keep_last: int, env: DistEnv, warn: Callable[[str], None] | None = None
    ):
        self.dir = run_dir / "checkpoints"
        self.keep_last = keep_last
        self.env = env
        self.warn = warn

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
            fsync_tree(partial)
            commit_step(partial, final, on_wait=self.warn)
            fsync_dir(self.dir)
            write_atomic(self.dir / "latest", final.name + "\n")
            self._prune()
        barrier(self.env)
        return final

    def _prune(self) -> None:
        self._recover()  # before the stale copies go: one may be the only copy of its step
        for old in committed(self.dir)[self.keep_last :]:  # rank 0 only; one being converted stays for now
            remove_unless_held(old)
        for stale in [*self.dir.glob("step_*.partial"), *self.dir.glob("step_*.replaced")]:
            shutil.rmtree(stale, ignore_errors=True)

    def _recover(self) -> None:
        """Rank 0: this run's checkpoints a save interrupted between its two renames, put back under their names
        (`recover_interrupted_commit`; this run's trainer is the only writer of its folder)."""
        for name in recover_interrupted_commit(self.dir):
            if self.warn is not None:
                self.warn(f"{self.dir / name}: put back under its name (a save of it was interrupted)")

    def resume(
        self, source: str, state: dict[str, Any], *, warn: Callable[[str], None]
    ) -> tuple[Path, dict[str, Any]] | None:
        """`restore` from the checkpoints `--resume SOURCE` names (`auto`: this run's; a run, its checkpoints/
        or a step folder), held against their run's pruning while they are read.

        Rank 0 lists and holds them, and every rank reads that list (a live run may save and prune between two
        listings); the other ranks hold them too, for as long as they read.
        """
        with contextlib.ExitStack() as holds:
            listed: list[str] | tuple[str, str | None] = []
            if self.env.is_main:
                self._recover()
                try:
                    found = holds.enter_context(held(lambda: find_checkpoints(source, self.dir.parent)))
                    listed = [str(p) for p in found]
                except ZebraError as e:  # every rank raises it, instead of waiting for rank 0
                    listed = (e.message, e.fix)
            listed = broadcast_object(listed, self.env)
            if isinstance(listed, tuple):
                raise ZebraError(listed[0], fix=listed[1])
            candidates = [Path(p) for p in listed]
            if not self.env.is_main:
                holds.enter_context(held(lambda: candidates))
            return self.restore(candidates, state, warn=warn)

    def restore(
        self, candidates: list[Path], state: dict[str, Any], *, warn: Callable[[str], None]
    ) -> tuple[Path, dict[str, Any]] | None:
        """Load the first readable checkpoint of `candidates` into `state`; warn about each one skipped.

        Returns (checkpoint, its meta.json) or None when `candidates` is empty. Raises ZebraError when none loads,
        or when a file holds objects that could run code; errors other than corrupt files are raised as they are.
        """
        failures = []
        for path in candidates:
            reason, meta = self._try_load(path, state)
            if reason is None:
                return path, meta
            failures.append(f"{path}: {reason}")
            nxt = candidates[len(failures)] if len(failures) < len(candidates) else None
            if nxt is not None:  # the last one is told by the error alone
                warn(f"checkpoint {path} could not be loaded ({reason}); falling back to {nxt.name}")
        if failures:
            raise ZebraError(
                "no checkpoint could be loaded: " + "; ".join(failures),
                fix="pass --resume never to start over, or --resume PATH to pick one",
            )
        return None

    def _try_load(self, path: Path, state: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """Load checkpoint `path` into `state` (collective); (None, meta.json) or (why it is corrupt, {}).

        The files each rank reads alone (meta.json, .metadata, its RNG file) are read first and the ranks agree
        on the outcome, so that they all load the same checkpoint or all skip it.
        """
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        from zebra.core.safe_dcp import SafeFileSystemReader, SafeLoadPlanner

        reason, fatal, meta, reader, rng = None, None, {}, None, None
        try:
            meta = read_meta(path)
            reader = SafeFileSystemReader(str(path))
            rng_file = path / "rng" / f"rank_{self.env.rank:05d}.pt"
            if meta.get("world_size") == self.env.world_size and rng_file.is_file():
                rng = load_rng_states(rng_file)
        except Exception as e:
            if is_corrupt(e):
                reason = _reason(e)
            else:
                fatal = e
        # [corrupt, fatal] ranks: every rank learns both, so that none waits in a collective for one that stopped
        counts = torch.tensor([float(reason is not None), float(fatal is not None)], device=self.env.device)
        corrupt_ranks, fatal_ranks = all_reduce_sum(counts, self.env).tolist()
        if fatal is not None:
            raise _not_corrupt(fatal) from None
        if fatal_ranks:
            raise ZebraError(
                f"{path}: another rank could not read its files (its error says why)",
                fix="fix what that rank reports, then resume again",
            )
        if corrupt_ranks:
            return reason or "another rank could not read its files", {}
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single.*")
                dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(path))
        except (Exception, CheckpointException) as e:  # CheckpointException derives from BaseException
            if not is_corrupt(e):
                raise _not_corrupt(e) from None
            return _reason(e), {}
        if rng is not None:
            _set_rng_states(rng, self.env.device)
        return None, meta
