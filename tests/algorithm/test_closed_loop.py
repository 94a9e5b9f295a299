"""Closed loop: ``AutoLoCoPolicy`` driven through synthetic
statistic streams as the engine drives it.

The streams and the loop live in ``benchmarks/campaigns/rule_streams.py`` (model in its
docstring); ``benchmarks/campaigns/controller_scenarios.py`` runs the same scenarios on
10 seeds for docs/controller.md. Here a few seeds per scenario assert bounds
that the pre-fix controller, or a regression, breaks.
"""

from __future__ import annotations

import pytest
from campaigns.rule_streams import (
    SCENARIOS,
    Kind,
    Noise,
    Stream,
    Trace,
    recipe_config,
    run_closed_loop,
)

from autoloco_hf.algorithm.preview import preview_run, run_length
from autoloco_hf.algorithm.rules.decisions import Assessment, Decision

SEEDS = range(10)
OPT_INS = [
    {},
    dict(rule_options={"reference_clip": "zero"}),
    dict(rule_options={"rejected_bound_min_age": 20}),
    dict(rule_options={"cumulative_check": True}),
    dict(rule_options={"candidate_max_quanta": 1}),
]


def runs(name: str, seeds=SEEDS, **overrides) -> list[Trace]:
    return [SCENARIOS[name].run(seed, **overrides) for seed in seeds]


def seeds_with_reductions(traces: list[Trace]) -> int:
    return sum(t.reductions() > 0 for t in traces)


# ------------------------------------------------------------------ benign
@pytest.mark.parametrize("overrides", OPT_INS, ids=lambda o: ",".join(o) or "default")
def test_benign_stream_executes_the_plan_trajectory(overrides: dict) -> None:
    """A noise-free, drift-free stream runs exactly what
    `autoloco plan` prints, with every option."""
    cfg, schedule, warmup = recipe_config("sft", **overrides)
    trace = run_closed_loop(Stream(noise=Noise.NONE), seed=0, **overrides)
    assert trace.h_step == preview_run(cfg, schedule, warmup).intervals
    assert trace.syncs == 49 and trace.reductions() == 0


def test_benign_c4_stream_executes_the_paper_trajectory() -> None:
    trace = run_closed_loop(Stream(noise=Noise.NONE), seed=0, recipe="c4")
    assert run_length(trace.h_step) == "500x7, 550x5, 600x5, 650x5, 700x5, 750x45, 250x1"


# ------------------------------------------------------------------- drift
@pytest.mark.parametrize("name", ["noise only", "drift 1x", "drift 3x", "drift 4x", "student-t(3)"])
def test_no_false_reduction_up_to_4x_drift_and_heavy_tails(name: str) -> None:
    """The centred reference clip follows drift at 4x the unit rate: no seed reduces."""
    traces = runs(name)
    assert seeds_with_reductions(traces) == 0
    assert all(t.h_tok[-2] == 150 for t in traces)  # and every seed still climbs to H_max


def test_literal_clip_falls_behind_4x_drift() -> None:
    """The spec's literal rule follows at most 0.04 log-units
    per interval: 4x drift reads as deviations."""
    assert seeds_with_reductions(runs("drift 4x", rule_options={"reference_clip": "zero"})) >= 2


def test_8x_drift_no_worse_than_literal_clip() -> None:
    default, literal = runs("drift 8x"), runs("drift 8x", rule_options={"reference_clip": "zero"})
    assert sum(t.reductions() for t in default) <= sum(t.reductions() for t in literal)


# ---------------------------------------------------------------- blow-ups
def test_sharp_blowup_costs_one_probe_per_bound_and_min_age_spaces_them() -> None:
    default = runs("sharp blow-up > 120", seeds=range(4))
    spaced = runs(
        "sharp blow-up > 120", seeds=range(4), rule_options={"rejected_bound_min_age": 20}
    )
    for trace in default:
        assert 3 <= trace.above(120) <= 10  # every probe above 120 is rejected at once
        assert Assessment.SEVERE in trace.assessments
    assert all(t.above(120) <= 3 for t in spaced)
    assert sum(t.above(120) for t in spaced) < sum(t.above(120) for t in default)


def test_soft_blowup_is_caught_only_by_the_cumulative_check() -> None:
    """Each one-quantum step reads consistent; summed since 110 they deviate."""
    seeds = range(5)
    default = sum(t.excess(110, 10) for t in runs("soft blow-up > 110", seeds))
    cumulative_traces = runs("soft blow-up > 110", seeds, rule_options={"cumulative_check": True})
    assert sum(t.excess(110, 10) for t in cumulative_traces) < 0.6 * default
    assert any(Assessment.CUMULATIVE in t.assessments for t in cumulative_traces)


def test_late_blowup_is_left_at_once() -> None:
    since = SCENARIOS["late blow-up > 120"].since_step()
    for trace in runs("late blow-up > 120", seeds=range(4)):
        first = next(i for i, s in enumerate(trace.start) if s >= since)
        assert trace.h_tok[first] == 150  # at H_max when the blow-up appears ...
        assert trace.decisions[first] == Decision.REDUCE  # ... severe: reduced by 1.5 at once
        assert trace.above(120, since) <= 3


# the descent rule as first measured: from 4 h_base, gain 1,
# unguarded (the SFT scenarios' h_base is 100)
FROM_FOUR = dict(controller="descent", h_max=400, rule_options={"gain": 1.0, "drift_guard": False})


def guard(settings: dict) -> dict:
    return {**settings, "rule_options": {**settings["rule_options"], "drift_guard": True}}


@pytest.mark.parametrize(
    "name", ["sharp blow-up > 120", "soft blow-up > 110", "late blow-up > 120"]
)
def test_the_descent_rules_drift_guard_leaves_a_blown_up_horizon_within_two_intervals(
    name: str,
) -> None:
    """Without the guard the descent rule keeps a blown-up
    h_max for most of the run; with it, two halvings."""
    scenario = SCENARIOS[name]
    critical, since = scenario.stream.critical, scenario.since_step()
    for seed in range(3):
        plain = scenario.run(seed, **FROM_FOUR)
        guarded = scenario.run(seed, **guard(FROM_FOUR))
        assert guarded.above(critical, since) <= 2 < plain.above(critical, since)
        assert Assessment.SEVERE in guarded.assessments


@pytest.mark.parametrize(
    ("name", "paper_spends_less"),
    [("sharp blow-up > 120", False), ("soft blow-up > 110", False), ("late blow-up > 120", True)],
)
def test_the_default_spends_fewer_quanta_above_a_blow_up_than_the_paper_rule_except_the_late_one(
    name: str, paper_spends_less: bool
) -> None:
    """From 4 h_base one healthy-looking interval is 28 quanta above a critical
    1.2 h_base; from 2 h_base (the default rule: guarded, gain 0.9), 8. The paper
    rule spends 10 and about 96 on the sharp and soft blow-ups, but only 5 on the
    late one, which starts after the default has descended: there the default
    spends 6-8, the miss docs/controller.md states (6.3 against 5 on 10 seeds)."""
    scenario, q_h = SCENARIOS[name], recipe_config("sft")[0].q_h
    critical, since = scenario.stream.critical, scenario.since_step()
    for seed in range(3):
        default = scenario.run(seed, controller="descent")
        paper = scenario.run(seed)
        from_four = scenario.run(seed, **guard(FROM_FOUR))
        spent = default.excess(critical, q_h, since)
        assert default.above(critical, since) == 1
        assert spent <= 10 < from_four.excess(critical, q_h, since)
        assert (paper.excess(critical, q_h, since) < spent) is paper_spends_less


@pytest.mark.parametrize("name", ["noise only", "drift 4x", "student-t(3)", "NaN pair at 0"])
def test_the_drift_guard_only_reads_where_nothing_blows_up(name: str) -> None:
    for seed in range(3):
        plain = SCENARIOS[name].run(seed, **FROM_FOUR)
        guarded = SCENARIOS[name].run(seed, **guard(FROM_FOUR))
        assert guarded.h_tok == plain.h_tok and guarded.decisions == plain.decisions


def test_candidate_cap_bounds_every_increase() -> None:
    """Late in training the budget admits two quanta at once; the cap keeps each proposal to one."""

    def largest_step(trace: Trace) -> int:
        return max(b - a for a, b in zip(trace.h_tok, trace.h_tok[1:]))

    seeds = range(3)
    assert max(largest_step(t) for t in runs("soft blow-up > 110", seeds)) > 10
    assert (
        max(
            largest_step(t)
            for t in runs("soft blow-up > 110", seeds, rule_options={"candidate_max_quanta": 1})
        )
        == 10
    )


# --------------------------------------------------------------------- NaN
@pytest.mark.parametrize("name", [n for n, s in SCENARIOS.items() if s.kind == Kind.NAN])
def test_nan_intervals_reduce_then_recover_without_deadlock(name: str) -> None:
    """Non-finite intervals act in every phase (interval 0 included); the controller proposes again
    after 1 calibration + 3 variability + 1 monitoring interval and climbs back (h_min 70 -> H_base
    100 takes 15 intervals, one q_H per 5)."""
    bad = sorted(SCENARIOS[name].stream.nan_intervals)
    for trace in runs(name, seeds=range(3)):
        assert trace.decisions[bad[0]] == Decision.REDUCE  # a first bad event reduces by 1.5 ...
        # ... a second in a row falls back to h_min (a
        # recalibration when already there: 100 / 1.5 -> 70)
        assert trace.decisions[bad[1]] in (Decision.FALLBACK, Decision.RECALIBRATE)
        assert trace.h_tok[bad[1] + 1] == 70
        assert all(trace.assessments[i] == Assessment.INVALID for i in bad)
        assert trace.recovery(bad[-1]) == 5
        assert max(trace.h_tok[bad[-1] + 1 :]) >= 110  # climbs back past H_base: no deadlock


def test_the_guarded_start_probe_leaves_a_sharp_blow_up_with_its_cut_interval() -> None:
    """The stream's d falls as h^-0.5 (p = 1.5), so the probe
    cuts the first 400-step interval at 200."""
    scenario, q_h = SCENARIOS["sharp blow-up > 120"], recipe_config("sft")[0].q_h
    probe = dict(FROM_FOUR, rule_options={"gain": 0.9, "start_probe": 1.85, "drift_guard": False})
    for seed in range(3):
        guarded = scenario.run(seed, **guard(probe))
        # the guard halves it too
        assert guarded.h_step[0] == 200 and guarded.assessments[0] == Assessment.SEVERE
        assert guarded.above(120) == 1 and guarded.excess(120, q_h) <= scenario.run(seed).excess(
            120, q_h
        )
        unguarded = scenario.run(seed, **probe)
        assert unguarded.assessments[0] == Assessment.BENT and unguarded.above(120) == len(
            unguarded.h_tok
        )
