"""Preview the horizons a run would execute, before renting machines (`autoloco plan`).

Runs the real interval policy against the recipe's LR schedule with an
always-increase-supporting statistic stream (``d_t`` and ``C_t`` constant,
so every residual is 0; the schedule still drives candidate previews) and constant token density:
the upper bound of what AutoLoCo can save, and exactly the trajectory of
docs/algorithm.md#paper-trajectory.

Example::

    >>> from autoloco_hf import AutoLoCoConfig
    >>> from autoloco_hf.algorithm.schedule import warmup_cosine
    >>> p = preview_run(
    ...     AutoLoCoConfig.for_recipe("c4"), warmup_cosine(3e-4, 1000, 50_000), warmup_steps=1000
    ... )
    >>> run_length(p.intervals), p.syncs
    ('500x7, 550x5, 600x5, 650x5, 700x5, 750x45, 250x1', 73)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from autoloco_hf.algorithm.policies import IntervalOutcome, make_policy
from autoloco_hf.algorithm.schedule import LRSchedule
from autoloco_hf.config import AutoLoCoConfig


@dataclass
class RunPreview:
    """Horizon sequence and sync count of a previewed run."""

    method: str
    intervals: list[int] = field(default_factory=list)

    @property
    def syncs(self) -> int:
        return len(self.intervals)

    @property
    def steps(self) -> int:
        return sum(self.intervals)


def preview_run(
    config: AutoLoCoConfig, schedule: LRSchedule, warmup_steps: int, tokens_per_step: float = 1024.0
) -> RunPreview:
    """Execute ``config``'s policy over ``schedule.total_steps``
    with an always-supporting stream."""
    total = schedule.total_steps
    if not config.is_interval_method:  # DDP: one gradient all-reduce per step
        return RunPreview(config.method, [1] * total)
    policy = make_policy(config, schedule, total, warmup_steps)
    result = RunPreview(config.method)
    step = 0
    while step < total:
        interval = policy.next_interval(step)
        policy.complete(
            IntervalOutcome(
                interval=interval,
                global_tokens=round(tokens_per_step * interval.h_step),
                # D_t = Lambda_t = 1 keeps log d_t and log C_t exactly constant: every
                # residual is exactly 0, so every interval reads as increase-supporting
                drift_energy=1.0,
                coherence=1.0,
                lr_mass=1.0,
                mean_loss=1.0,
                pseudo_grad_finite=True,
            )
        )
        result.intervals.append(interval.h_step)
        step += interval.h_step
    return result


def run_length(intervals: list[int]) -> str:
    """``[500, 500, 550]`` -> ``'500x2, 550x1'``."""
    return ", ".join(f"{h}x{len(list(group))}" for h, group in itertools.groupby(intervals))
