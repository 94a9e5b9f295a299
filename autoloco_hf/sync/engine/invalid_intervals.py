"""What happens after an interval with non-finite values: a warning, or a stop (docs/algorithm.md
docs/algorithm.md#interval-assessment).

Apart from the engine because it reads only the records and the labels, and
its messages are what an operator acts on: they name the culprits and the
steps to check.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from autoloco_hf.errors import AutoLoCoError

if TYPE_CHECKING:
    from autoloco_hf.algorithm.policies import NextInterval
    from autoloco_hf.state.records import IntervalRecord
    from autoloco_hf.sync.control import ControlRound

__all__ = ["TooManyInvalidIntervals", "report_invalid", "reset_nonfinite_state"]

logger = logging.getLogger("autoloco_hf")


class TooManyInvalidIntervals(AutoLoCoError, RuntimeError):
    """``config.max_consecutive_invalid`` intervals in a row had a non-finite loss or
    pseudo-gradient.

    See docs/algorithm.md#interval-assessment.
    """


def report_invalid(
    records: Sequence[IntervalRecord],
    interval: NextInterval,
    control: ControlRound,
    labels: Sequence[str],
    step: int,
    limit: int,
) -> None:
    """Log who produced the non-finite values; stop after ``limit`` such intervals in a row.

    ``records`` ends with this interval's record; ``step`` is the run's step now.
    """
    culprits = [label for label, w in zip(labels, control.workers) if w.nonfinite]
    culprits = culprits or ["the mean (every worker)"]
    streak = 0
    for record in reversed(records):  # this interval's record is the last one
        if record.outer_step_applied:
            break
        streak += 1
    good_step = records[-streak].start_step  # theta is still the one synchronized there
    where = (
        f"interval {len(records) - 1} (steps {interval.start_step + 1}-"
        f"{interval.start_step + interval.h_step}): non-finite loss or pseudo-gradient on "
        f"{', '.join(culprits)}"
    )
    if streak >= limit:
        raise TooManyInvalidIntervals(
            f"AutoLoCo stopped at step {step}: {where}, {streak} such intervals in a row "
            f"(max_consecutive_invalid={limit}); the outer parameters are still those "
            f"synchronized at step {good_step}: lower the learning rate or check the data of "
            f"steps {good_step + 1}-{step}, then resume from the last checkpoint "
            "(docs/reliability.md)"
        )
    logger.warning(
        "AutoLoCo: %s; outer step skipped, every worker restarts from the parameters synchronized "
        "at step %d (%d of max_consecutive_invalid=%d in a row)",
        where,
        good_step,
        streak,
        limit,
    )


def reset_nonfinite_state(optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """Zero non-finite inner-optimizer state, so a worker that produced NaN can go on."""
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for value in state.values():
                if not (torch.is_tensor(value) and value.is_floating_point()):
                    continue
                if not torch.isfinite(value).all():
                    torch.nan_to_num_(value, nan=0.0, posinf=0.0, neginf=0.0)
