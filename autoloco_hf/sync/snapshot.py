"""Boundary snapshots: the shared outer state, persisted at every synchronization boundary
(docs/algorithm.md#boundary-snapshots).

Right after a boundary every worker holds the same ``theta_t``, outer momentum,
controller and token-mapper state and totals, so any number of workers can go
on from them. :class:`BoundarySnapshot` is a boundary listener that writes that
state once per writer (attach it on one process, or on two with ``copy=0`` and
``copy=1``: a node lost during one write leaves the other) as an AutoLoCo state file
(:mod:`autoloco_hf.state.checkpoint`: safetensors, SHA-256, temporary file, fsync,
rename): ``<directory>/boundary-<step>.safetensors``, the last ``keep`` of them.

The training thread only copies the tensors to host memory; serialization,
hashing, fsync and rename run on a background thread. The next boundary waits
for the previous write, and a failed write raises :class:`SnapshotWriteError`
at the next boundary or at :meth:`BoundarySnapshot.close`.

:func:`latest_snapshot` returns the newest snapshot that verifies; a truncated or
corrupted one is refused in one logged line and the one before it is used. A
snapshot written with other algorithm settings is refused
(:class:`~autoloco_hf.state.checkpoint.ConfigMismatchError`), whatever its age.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from autoloco_hf.config import AutoLoCoConfig, Overlap
from autoloco_hf.errors import AutoLoCoError
from autoloco_hf.state import checkpoint
from autoloco_hf.state.checkpoint import CheckpointError, ConfigMismatchError, read_shared_state
from autoloco_hf.sync.engine.engine import IntervalEngine

if TYPE_CHECKING:
    from autoloco_hf.state.records import IntervalRecord

__all__ = [
    "BoundarySnapshot",
    "Snapshot",
    "SnapshotWriteError",
    "latest_snapshot",
    "prune_snapshots",
    "read_snapshot",
    "snapshot_path",
    "snapshot_paths",
    "step_of",
]

logger = logging.getLogger("autoloco_hf")

PREFIX = "boundary-"
SUFFIX = ".safetensors"


class SnapshotWriteError(AutoLoCoError, RuntimeError):
    """A boundary snapshot could not be written (raised at the next boundary or at close)."""


@dataclass(frozen=True)
class Snapshot:
    """A verified boundary snapshot: where it is, its step, how many workers wrote it, its state."""

    path: str
    step: int
    workers: int
    state: dict[str, Any]

    @property
    def engine_state(self) -> dict[str, Any]:
        return self.state["engine"]


def snapshot_path(directory: str, step: int, copy: int = 0) -> str:
    """``boundary-<step>.safetensors``; a second writer's
    ``boundary-<step>.copy<k>.safetensors`` (read after it)."""
    return os.path.join(directory, f"{PREFIX}{step:09d}{f'.copy{copy}' if copy else ''}{SUFFIX}")


def snapshot_paths(directory: str) -> list[str]:
    """Every snapshot file in ``directory``, newest step
    first (at a step, the first writer's copy first)."""
    return sorted(
        glob.glob(os.path.join(glob.escape(directory), f"{PREFIX}*{SUFFIX}")), reverse=True
    )


def step_of(path: str) -> int:
    return int(os.path.basename(path)[len(PREFIX) : len(PREFIX) + 9])


def prune_snapshots(directory: str, keep: int) -> list[str]:
    """Keep the snapshots of the newest ``keep`` boundaries
    in ``directory``, whoever wrote them; return what went.

    Every launch writes into the same folder, so each writer prunes every file, not
    only its own: older boundaries' files (both copies), and the temporary files
    (``.tmp-<machine>-<pid>``) of writers that died during a write. A temporary
    file is removed when its writer is certainly gone (this machine, pid ended:
    :func:`~autoloco_hf.state.checkpoint.writer_is_gone`), or when its boundary is older than the
    kept ones: a live writer of this run never writes there (each writer finishes a write before its
    next boundary, and a boundary needs every worker), and a folder with another run's newer
    snapshots is refused at start.
    """
    paths = snapshot_paths(directory)
    steps = sorted({step_of(p) for p in paths}, reverse=True)
    oldest_kept = steps[keep - 1] if len(steps) >= keep else -1
    temporary = glob.glob(os.path.join(glob.escape(directory), f"{PREFIX}*{SUFFIX}.tmp-*"))
    stale = [p for p in paths if step_of(p) < oldest_kept]
    stale += [t for t in temporary if step_of(t) < oldest_kept or checkpoint.writer_is_gone(t)]
    removed = []
    for path in stale:
        try:
            os.remove(path)
            removed.append(path)
        except FileNotFoundError:  # the other copy's writer pruned it first
            pass
    return removed


def host_copy(value: Any) -> Any:
    """``value`` with every tensor copied to host memory (the
    training thread goes on changing the live ones)."""
    if torch.is_tensor(value):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: host_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host_copy(v) for v in value)
    return value


def check_snapshot_support(engine: Any) -> None:
    """Refuse the engines whose state at a boundary is not
    shared by every worker, naming the setting."""
    if not isinstance(engine, IntervalEngine):
        raise ValueError(
            "boundary snapshots need an interval method: method='ddp' averages gradients every "
            "step and has no boundary state; resume DDP runs from Trainer checkpoints"
        )
    config = engine.config
    if config.overlap != Overlap.NONE:
        raise ValueError(
            f"boundary snapshots need overlap='none' (got overlap={str(config.overlap)!r}): an "
            "overlapped schedule holds an average in flight at every boundary; resume it "
            "from Trainer checkpoints"
        )
    if engine.outer.shard is not None:
        raise ValueError(
            "boundary snapshots need the whole outer state on each rank "
            f"(ranks_per_worker={config.ranks_per_worker} with hierarchical_sync shards it): use "
            "hierarchical_sync=False or resume from Trainer checkpoints"
        )


class BoundarySnapshot:
    """Boundary listener writing the shared outer state at every boundary, off the training thread.

    Args:
        directory: where the snapshots go (storage that the restarted workers read).
        engine: the engine whose :meth:`~IntervalEngine.boundary_state` is written.
        extra_state: more shared state to store (e.g. the LR scheduler's), called at the boundary.
        keep: how many of the newest snapshots stay on disk (at least 2: the previous one
            is the fallback when the newest turns out corrupted).
        copy: 0 for the first writer; another process on another node writing the same state as
            copy 1 keeps the boundary when the first writer dies during its write.
    """

    def __init__(
        self,
        directory: str,
        engine: IntervalEngine,
        extra_state: Callable[[], dict[str, Any]] | None = None,
        keep: int = 2,
        copy: int = 0,
    ) -> None:
        check_snapshot_support(engine)
        if keep < 2:
            raise ValueError(
                f"keep={keep}: keep at least 2 boundary snapshots (the "
                "previous one is the fallback)"
            )
        self.directory = directory
        self.engine = engine
        self.extra_state = extra_state
        self.keep = keep
        self.copy = copy
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autoloco-snapshot")
        self._pending: tuple[int, Future] | None = None
        os.makedirs(directory, exist_ok=True)

    def __call__(self, record: IntervalRecord) -> None:
        self.wait()
        engine = self.engine
        state = {"engine": engine.boundary_state()}
        if self.extra_state is not None:
            state.update(self.extra_state())
        state = host_copy(state)
        self._pending = (
            engine.step,
            self._executor.submit(self._write, state, engine.step, engine.num_workers),
        )

    def _write(self, state: dict[str, Any], step: int, workers: int) -> None:
        path = snapshot_path(self.directory, step, self.copy)
        checkpoint.write_state(
            path,
            state,
            config=self.engine.config,
            world_size=workers,
            ranks_per_worker=1,
            rank=0,
            step=step,
        )
        prune_snapshots(self.directory, self.keep)

    def wait(self) -> None:
        """Wait for the write in progress; raise :class:`SnapshotWriteError` if it failed."""
        if self._pending is None:
            return
        (step, future), self._pending = self._pending, None
        try:
            future.result()
        except Exception as err:
            raise SnapshotWriteError(
                f"AutoLoCo: the boundary snapshot of step {step} could not be written to "
                f"{self.directory} ({type(err).__name__}: {err}): free space or fix the folder, "
                "then resume from the last snapshot there (docs/reliability.md)"
            ) from err

    def close(self) -> None:
        """Wait for the last write (raising its error) and stop the writer thread."""
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)


def read_snapshot(path: str, config: AutoLoCoConfig) -> Snapshot:
    """The boundary snapshot in ``path``, verified (checksum,
    format, every config field but the local ones)."""
    header, state = read_shared_state(path, config=config)
    return Snapshot(path, header.step, header.world_size, state)


def latest_snapshot(directory: str, config: AutoLoCoConfig) -> Snapshot | None:
    """The newest boundary snapshot in ``directory`` that verifies, or ``None`` when there is none.

    A truncated or corrupted file is refused in one logged line and the one
    before it is tried; when every one is refused, :class:`CheckpointError`
    (a run must not silently start afresh); a sound file written with other
    settings raises :class:`~autoloco_hf.state.checkpoint.ConfigMismatchError`.
    """
    paths = snapshot_paths(directory)
    for path in paths:
        try:
            return read_snapshot(path, config)
        except ConfigMismatchError:
            raise
        except (OSError, CheckpointError) as err:
            logger.warning("AutoLoCo: boundary snapshot refused: %s; trying the one before", err)
    if paths:
        raise CheckpointError(
            f"{directory}: none of its {len(paths)} boundary snapshots verifies (see the warnings "
            "above): resume from a Trainer checkpoint, or move the folder away to start afresh"
        )
    return None
