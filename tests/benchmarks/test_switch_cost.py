"""benchmarks/switch_cost.py: when a treatment fires (the first interval from the switch step on, with or without a
change of horizon)."""

from __future__ import annotations

import pytest
from test_frontier import load

from autoloco_hf.algorithm.schedule import FunctionSchedule


def intervals_treated(before: int, after: int, switch: int, steps: int = 200) -> list[int]:
    switch_cost = load("switch_cost")
    plan = switch_cost.Schedule(before, after, switch)
    policy = switch_cost.ScheduledPolicy(FunctionSchedule(lambda s: 1e-3, steps), steps, before, plan)
    treated, start = [], 0
    while start < steps:
        interval = policy.next_interval(start)
        if policy.first_after_switch():  # asked when the interval closes, as the outer step does
            treated.append(start)
        start += interval.h_step
    return treated


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [(10, 15, [130]), (15, 10, [135]), (10, 10, [130]), (15, 15, [135]), (20, 10, [140])],
)
def test_a_treatment_fires_once_on_the_first_interval_from_the_switch_step(before, after, expected):
    assert intervals_treated(before, after, 130) == expected
