"""benchmarks/campaigns/switch_cost.py: when a treatment fires (the first interval from the switch
step on, with or without a change of horizon)."""

from __future__ import annotations

import pytest
from test_frontier import ROOT, load

from autoloco_hf.algorithm.schedule import FunctionSchedule


def intervals_treated(before: int, after: int, switch: int, steps: int = 200) -> list[int]:
    switch_cost = load("switch_cost")
    plan = switch_cost.Schedule(before, after, switch)
    policy = switch_cost.ScheduledPolicy(
        FunctionSchedule(lambda s: 1e-3, steps), steps, before, plan
    )
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


def test_a_replay_executes_the_recorded_runs_horizons_interval_for_interval():
    switch_cost = load("switch_cost")
    recorded = switch_cost.Replay("autoloco").for_seed(0, str(ROOT / "results" / "frontier"))
    steps = recorded.horizons[-1][0] + recorded.horizons[-1][1]
    assert len(set(h for _, h in recorded.horizons)) > 3  # the paper rule's run climbed
    policy = switch_cost.ScheduledPolicy(
        FunctionSchedule(lambda s: 1e-3, steps), steps, 10, recorded
    )
    planned, start = [], 0
    while start < steps:
        planned.append((start, policy.next_interval(start).h_step))
        start = sum(planned[-1])
    assert tuple(planned) == recorded.horizons
