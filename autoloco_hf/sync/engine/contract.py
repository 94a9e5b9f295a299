"""The contracts of the sync layer, each written once: engines and sync schedules.

:class:`Engine` is what the integrations may call on any engine. Two implement
it: :class:`~autoloco_hf.sync.engine.engine.IntervalEngine` (DiLoCo-style intervals)
and :class:`~autoloco_hf.sync.schedules.gradient_averaging.GradientAveragingEngine` (the
DDP baseline); a caller typed against it needs no branch beyond
:attr:`Engine.averages_gradients`. :class:`SyncSchedule` is what the interval
engine asks of a schedule. :func:`check_workers` is the precondition both
engines check on their inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from autoloco_hf.algorithm.policies import NextInterval
    from autoloco_hf.config import AutoLoCoConfig, Overlap
    from autoloco_hf.state.records import IntervalRecord, RunTotals
    from autoloco_hf.sync.communicators.base import Communicator
    from autoloco_hf.sync.engine.engine import IntervalEngine
    from autoloco_hf.sync.engine.interval_state import InFlight
    from autoloco_hf.sync.outer import OuterOptimizer

__all__ = ["Engine", "SyncSchedule", "check_workers"]


@runtime_checkable
class Engine(Protocol):
    """A sync engine: it counts every step of the run and synchronizes the workers when due."""

    averages_gradients: bool  # DDP: every step's gradients are averaged, no interval runs
    config: AutoLoCoConfig
    comm: Communicator
    total_steps: int
    step: int  # steps of the run accounted so far
    totals: RunTotals
    records: list[IntervalRecord]

    @property
    def num_workers(self) -> int:
        """Workers across all processes."""
        ...

    @property
    def current_interval(self) -> NextInterval | None:
        """The interval being run; ``None`` when there is none (DDP, or the budget is spent)."""
        ...

    @property
    def in_flight(self) -> object | None:
        """An average started and not applied yet (overlapped schedules), else ``None``."""
        ...

    @property
    def outer(self) -> OuterOptimizer | None:
        """``theta_t`` and the outer momentum; ``None`` for DDP, which has no outer state."""
        ...

    def after_optimizer_step(
        self,
        tokens: Sequence[int],
        losses: Sequence[float],
        lr: float | None = None,
        steps: Sequence[int] | None = None,
        seconds: Sequence[float] | None = None,
    ) -> IntervalRecord | None:
        """Account one step of the run: every local worker's tokens, summed losses and inner LR.

        ``lr``: the inner learning rate of the step (default: the schedule's).
        ``steps``: each local worker's inner steps in it (default one each; budget pacing:
        ``IntervalEngine.steps_due``); ``seconds``: the time each spent on them (real or
        virtual), from which its speed is measured. Returns the record of an interval whose
        average was applied at this step, if any.
        """
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to resume the engine (docs/algorithm.md#state)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` of an engine with the same config."""
        ...


class SyncSchedule(Protocol):
    """When the stages of a boundary run, and what the workers train from until it is applied.

    A schedule calls the engine's public stages only, and keeps its own state
    (what is in flight, per-worker start points) in :meth:`state_dict`. A new
    schedule is one more class with these members and one more branch in
    ``make_engine``, as the streaming fragments' (:mod:`autoloco_hf.sync.schedules.streaming`).
    """

    mode: Overlap

    @property
    def in_flight(self) -> InFlight | None: ...

    def attach(self, engine: IntervalEngine) -> None:
        """Prepare per-worker buffers; called once, after ``theta_0`` is in every worker."""

    def after_step(self, engine: IntervalEngine) -> IntervalRecord | None:
        """Called after every counted step; the record of an interval applied at this step."""

    def state_dict(self) -> dict[str, Any] | None: ...

    def load_state_dict(self, state: dict[str, Any] | None, engine: IntervalEngine) -> None: ...


def check_workers(
    config: AutoLoCoConfig,
    models: Sequence[torch.nn.Module],
    communicator: Communicator,
    total_steps: int,
) -> None:
    """Refuse a communicator that does not match the models or the config, and an empty budget."""
    if len(models) != communicator.local_workers:
        raise ValueError(
            f"{len(models)} local models but the communicator expects "
            f"{communicator.local_workers}: pass one model per process, or N replicas to "
            "SimulatedCommunicator(N)"
        )
    sent = (communicator.wire_dtype, communicator.block_size, communicator.topk_fraction)
    if sent != (config.wire_dtype, config.int8_block_size, config.topk_fraction):
        raise ValueError(
            f"the communicator sends {communicator.wire_dtype} (block "
            f"{communicator.block_size}, top-k {communicator.topk_fraction}) but "
            f"config.wire_dtype={config.wire_dtype!r} (int8_block_size={config.int8_block_size}, "
            f"topk_fraction={config.topk_fraction}): build it with make_communicator(config, ...)"
        )
    if total_steps <= 0:
        raise ValueError(f"total_steps={total_steps}: the training budget must be positive")
