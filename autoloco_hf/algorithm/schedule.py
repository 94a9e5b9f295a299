"""Exact learning-rate-mass previews (docs/algorithm.md#interval-statistics).

AutoLoCo compares intervals by their accumulated inner learning rate
``Lambda(s, h) = sum_{k<h} eta_in(s + k)``. The preview must be exact and must
not touch the live scheduler: stepping it would shift the training schedule.
Steps at or past the training budget contribute 0, because HF's cosine schedule
rises again after its end.

Example::

    >>> sched = FunctionSchedule(lambda s: 1e-3, total_steps=10)
    >>> round(sched.lr_mass(8, 5), 6)       # only steps 8 and 9 count
    0.002
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from typing import Any, Protocol


class LRSchedule(Protocol):
    """Anything that knows the inner learning rate of optimizer step ``s``."""

    total_steps: int

    def lr_at(self, step: int) -> float: ...


def lr_mass(schedule: LRSchedule, start: int, num_steps: int) -> float:
    """``Lambda(start, num_steps)`` in float64, clamped to the budget
    (docs/algorithm.md#interval-statistics)."""
    end = min(start + max(num_steps, 0), schedule.total_steps)
    return math.fsum(schedule.lr_at(step) for step in range(max(start, 0), end))


class LRMassMixin:
    """Adds ``lr_mass`` to a class that defines ``lr_at`` and ``total_steps``."""

    def lr_mass(self, start: int, num_steps: int) -> float:
        return lr_mass(self, start, num_steps)


class FunctionSchedule(LRMassMixin):
    """A schedule given as a plain function ``step -> lr`` (pure; used by `plan` and tests)."""

    def __init__(self, fn: Callable[[int], float], total_steps: int) -> None:
        self.fn = fn
        self.total_steps = int(total_steps)

    def lr_at(self, step: int) -> float:
        return 0.0 if step >= self.total_steps or step < 0 else float(self.fn(step))


def warmup_cosine(
    peak_lr: float, warmup_steps: int, total_steps: int, min_ratio: float = 0.0
) -> FunctionSchedule:
    """Linear warm-up then cosine decay, identical to
    ``transformers.get_cosine_schedule_with_warmup``.

    ``min_ratio`` > 0 gives ``get_cosine_with_min_lr_schedule_with_warmup``'s floor.
    """

    def fn(step: int) -> float:
        if step < warmup_steps:
            return peak_lr * (float(step) / float(max(1, warmup_steps)))
        progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
        factor = max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * 0.5 * progress)))
        return peak_lr * (factor * (1 - min_ratio) + min_ratio)

    return FunctionSchedule(fn, total_steps)


def warmup_linear(peak_lr: float, warmup_steps: int, total_steps: int) -> FunctionSchedule:
    """Linear warm-up then linear decay, identical to
    ``transformers.get_linear_schedule_with_warmup``."""

    def fn(step: int) -> float:
        if step < warmup_steps:
            return peak_lr * (float(step) / float(max(1, warmup_steps)))
        return peak_lr * max(
            0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps))
        )

    return FunctionSchedule(fn, total_steps)


class _ShadowOptimizer:
    """Stands in for the real optimizer inside a copied scheduler: holds only hyper-parameters."""

    def __init__(self, param_groups: list[dict[str, Any]]) -> None:
        self.param_groups = [
            {k: v for k, v in group.items() if k != "params"} for group in param_groups
        ]
        for group in self.param_groups:
            group["params"] = []
        self.defaults: dict[str, Any] = {}

    def step(self) -> None:  # lets the scheduler's "step order" check pass
        pass


class SchedulerPreview(LRMassMixin):
    """Exact, non-mutating preview of a ``torch.optim.lr_scheduler``
    (docs/algorithm.md#interval-statistics).

    ``LambdaLR`` (all of transformers' ``get_*_schedule_with_warmup``) is
    evaluated in closed form, ``base_lr * lr_lambda(step)``. Any other
    deterministic scheduler is deep-copied around a shadow optimizer (so no
    parameter or state is copied) and the copy is stepped forward; the live
    scheduler is never stepped. ``ReduceLROnPlateau`` depends on metrics and
    cannot be previewed.

    Args:
        scheduler: the live scheduler; step ``s`` is the optimizer step that
            runs after ``s`` scheduler steps.
        total_steps: the training budget; later steps contribute 0.
        param_group: which parameter group's learning rate defines ``eta_in``.
    """

    def __init__(self, scheduler: Any, total_steps: int, param_group: int = 0) -> None:
        from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

        if isinstance(scheduler, ReduceLROnPlateau):
            raise TypeError(
                "ReduceLROnPlateau depends on future metrics, so its learning-rate mass cannot be "
                "previewed (docs/algorithm.md#interval-statistics): use a deterministic schedule "
                "(e.g. cosine with warm-up)"
            )
        self.total_steps = int(total_steps)
        self.param_group = param_group
        self._closed_form = None
        if type(scheduler) is LambdaLR:
            self._closed_form = (
                float(scheduler.base_lrs[param_group]),
                scheduler.lr_lambdas[param_group],
            )
        else:
            self._table: list[float] = []
            epoch = getattr(scheduler, "last_epoch", None)
            if epoch is None:  # ChainedScheduler keeps its position only in its children
                epoch = scheduler._schedulers[0].last_epoch
            self._table_start = int(epoch)
            self._shadow = copy.deepcopy(
                scheduler,
                memo={id(scheduler.optimizer): _ShadowOptimizer(scheduler.optimizer.param_groups)},
            )

    def lr_at(self, step: int) -> float:
        if step >= self.total_steps or step < 0:
            return 0.0
        if self._closed_form is not None:
            base_lr, fn = self._closed_form
            return base_lr * float(fn(step))
        if step < self._table_start:
            raise ValueError(
                f"cannot preview step {step}: this scheduler was captured at step "
                f"{self._table_start}; create the SchedulerPreview before training starts"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            while self._table_start + len(self._table) <= step:
                self._table.append(float(self._shadow.get_last_lr()[self.param_group]))
                self._shadow.step()
        return self._table[step - self._table_start]
