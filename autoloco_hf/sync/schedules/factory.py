"""``make_engine``: the one place that maps a config to its engine and sync schedule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from autoloco_hf.algorithm.policies import PolicyFactory, make_policy
from autoloco_hf.config import AutoLoCoConfig, Overlap
from autoloco_hf.sync.engine.contract import Engine
from autoloco_hf.sync.engine.engine import (
    BlockingSchedule,
    BoundaryListener,
    IntervalEngine,
    SyncSchedule,
)
from autoloco_hf.sync.schedules.gradient_averaging import GradientAveragingEngine
from autoloco_hf.sync.schedules.overlap import DelayedSchedule, EagerSchedule
from autoloco_hf.sync.schedules.streaming import FragmentSchedule

if TYPE_CHECKING:
    from autoloco_hf.algorithm.schedule import LRSchedule
    from autoloco_hf.sync.communicators.base import Communicator

__all__ = ["Engine", "make_engine", "make_sync_schedule"]


def make_sync_schedule(config: AutoLoCoConfig) -> SyncSchedule:
    """The schedule of ``config.overlap``; streaming fragments (``fragments > 1``) have their own.

    See docs/algorithm.md#overlap and #fragments.
    """
    if config.fragments > 1:
        return FragmentSchedule(config.overlap)
    schedules = {
        Overlap.NONE: BlockingSchedule,
        Overlap.DELAYED: DelayedSchedule,
        Overlap.EAGER: EagerSchedule,
    }
    return schedules[Overlap(config.overlap)]()


def make_engine(
    config: AutoLoCoConfig,
    models: Sequence[torch.nn.Module],
    schedule: LRSchedule,
    communicator: Communicator,
    total_steps: int,
    warmup_steps: int | None = None,
    optimizers: Sequence[torch.optim.Optimizer] = (),
    records_path: str | None = None,
    on_record: BoundaryListener | None = None,
    policy_factory: PolicyFactory = make_policy,
) -> Engine:
    """The engine of ``config.method``: gradient averaging for DDP, else intervals.

    An interval engine runs under ``config.overlap``'s schedule. Arguments as
    :class:`~autoloco_hf.sync.engine.engine.IntervalEngine` (the DDP engine ignores the
    interval ones). Either engine satisfies :class:`~autoloco_hf.sync.engine.contract.Engine`.
    """
    if not config.is_interval_method:
        return GradientAveragingEngine(config, models, communicator, total_steps)
    return IntervalEngine(
        config,
        models,
        schedule,
        communicator,
        total_steps,
        sync=make_sync_schedule(config),
        warmup_steps=warmup_steps,
        optimizers=optimizers,
        records_path=records_path,
        on_record=on_record,
        policy_factory=policy_factory,
    )
