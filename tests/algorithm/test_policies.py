"""Interval policies: DiLoCo, QSR, Linear Interval and AutoLoCo behind one interface
(docs/algorithm.md#token-mapper, 5, 6)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from autoloco_hf.algorithm.policies import (
    AutoLoCoPolicy,
    FixedPolicy,
    IntervalOutcome,
    IntervalPolicy,
    LinearIntervalPolicy,
    QSRPolicy,
    make_policy,
)
from autoloco_hf.algorithm.rules.decisions import Assessment
from autoloco_hf.algorithm.schedule import FunctionSchedule, lr_mass, warmup_cosine
from autoloco_hf.config import AutoLoCoConfig

C4 = warmup_cosine(3e-4, 1000, 50_000)


def outcome(interval, tokens_per_step: float = 1024.0, **kw) -> IntervalOutcome:
    values = dict(
        interval=interval,
        global_tokens=round(tokens_per_step * interval.h_step),
        drift_energy=1.0,
        coherence=1.0,
        lr_mass=1.0,
        mean_loss=1.0,
        pseudo_grad_finite=True,
    )
    values.update(kw)
    return IntervalOutcome(**values)


def execute(policy: IntervalPolicy, total: int, **kw) -> list:
    intervals, step = [], 0
    while step < total:
        interval = policy.next_interval(step)
        policy.complete(outcome(interval, **kw))
        intervals.append(interval)
        step += interval.h_step
    return intervals


# ------------------------------------------------------------------ DiLoCo
def test_fixed_policy_and_truncation() -> None:
    """docs/algorithm.md#baselines DiLoCo: fixed H_base; docs/algorithm.md#truncation: the last
    interval is cut to the remaining budget."""
    sched = warmup_cosine(1e-3, 100, 1050)
    p = FixedPolicy(sched, total_steps=1050, h_base=500)
    intervals = execute(p, 1050)
    assert [x.h_step for x in intervals] == [500, 500, 50]
    assert [x.truncated for x in intervals] == [False, False, True]
    assert [x.start_step for x in intervals] == [0, 500, 1000]
    for x in intervals:
        assert x.h_tok == 500 and x.h_ref == 500
        assert x.lr_mass == lr_mass(sched, x.start_step, x.h_step)
        assert x.lr_mass_base == lr_mass(sched, x.start_step, 500)


# ---------------------------------------------------------- Linear Interval
def test_linear_interval_c4() -> None:
    """docs/algorithm.md#baselines: 10, 20, ..., 990 then the
    500-step remainder: 100 syncs in 50,000 steps."""
    p = make_policy(AutoLoCoConfig(method="linear", h_base=500), C4, 50_000, 1000)
    assert isinstance(p, LinearIntervalPolicy)
    intervals = execute(p, 50_000)
    assert [x.h_step for x in intervals] == [10 * k for k in range(1, 100)] + [500]
    assert len(intervals) == 100 and intervals[-1].truncated and not intervals[-2].truncated


@pytest.mark.parametrize(
    "a, total, expected", [(25, 200, [25, 50, 75, 50]), (1, 10, [1, 2, 3, 4]), (5, 15, [5, 10])]
)
def test_linear_interval_general(a: int, total: int, expected: list) -> None:
    """docs/algorithm.md#baselines: H_k = a k, cut at the budget."""
    assert [x.h_step for x in execute(LinearIntervalPolicy(a, total), total)] == expected


def test_linear_next_interval_is_idempotent() -> None:
    p = LinearIntervalPolicy(increment=10, total_steps=1000)
    assert [p.next_interval(s).h_step for s in (0, 0, 10, 30, 30, 60, 100)] == [
        10,
        10,
        20,
        30,
        30,
        40,
        50,
    ]


# --------------------------------------------------------------------- QSR
def test_qsr_c4_paper_figures() -> None:
    """docs/algorithm.md#baselines: with the C4 schedule and
    the default alpha QSR executes 41 intervals, median 603."""
    p = make_policy(AutoLoCoConfig(method="qsr", h_base=500), C4, 50_000, 1000)
    assert isinstance(p, QSRPolicy)
    assert p.alpha == pytest.approx(math.sqrt(500) * 3e-4, rel=1e-12)  # alpha^2 = H_base eta_peak^2
    intervals = execute(p, 50_000)
    lengths = [x.h_step for x in intervals]
    assert len(lengths) == 41 and sum(lengths) == 50_000
    assert statistics.median(lengths) == 603
    assert intervals[-1].truncated


def test_qsr_rule() -> None:
    """docs/algorithm.md#baselines: H = max(H_base, floor((alpha / eta(s_t))^2)); warm-up intervals
    H_base; capped at the budget."""
    sched = warmup_cosine(1.0, 100, 20_000)
    alpha = math.sqrt(50) * 1.0
    p = QSRPolicy(sched, 20_000, h_base=50, alpha=alpha, gamma=2.0, warmup_steps=100)
    # starts inside the warm-up
    assert p.next_interval(0).h_step == 50 and p.next_interval(99).h_step == 50
    for s in (100, 5000, 10_000, 15_000, 17_000):
        expected = max(50, math.floor((alpha / sched.lr_at(s)) ** 2))
        assert p.next_interval(s).h_step == min(expected, 20_000 - s)
    late = p.next_interval(19_990)
    assert late.h_step == 10 and late.truncated
    assert p.next_interval(1000).h_step == 50  # near peak LR the rule stays at H_base
    assert p.next_interval(19_000).h_step > 50


def test_qsr_alpha_override_and_gamma() -> None:
    sched = FunctionSchedule(lambda s: 0.5, 10_000)
    p = make_policy(
        AutoLoCoConfig(method="qsr", h_base=10, qsr_alpha=4.0, qsr_gamma=3.0), sched, 10_000, 0
    )
    assert p.next_interval(0).h_step == math.floor((4.0 / 0.5) ** 3) == 512


def test_make_policy_types() -> None:
    assert isinstance(make_policy(AutoLoCoConfig(method="diloco"), C4, 50_000, 1000), FixedPolicy)
    assert isinstance(make_policy(AutoLoCoConfig(), C4, 50_000, 1000), AutoLoCoPolicy)
    with pytest.raises(ValueError, match="DDP"):
        make_policy(AutoLoCoConfig(method="ddp"), C4, 50_000, 1000)


# ----------------------------------------------------------------- AutoLoCo
def small_autoloco(**overrides) -> tuple[AutoLoCoPolicy, FunctionSchedule]:
    sched = FunctionSchedule(lambda s: 1.0, 100_000)  # constant LR: only gamma_inc limits each step
    rule = {"controller": "paper", "h_max": 150} if overrides.get("adaptive_horizon", True) else {}
    cfg = AutoLoCoConfig(**rule, h_base=100, q_h=10, **overrides)
    return AutoLoCoPolicy(cfg, sched, 100_000, warmup_steps=0), sched


def test_autoloco_constant_density_trajectory() -> None:
    """docs/algorithm.md#paper-trajectory pattern at H_base =
    100: 6 intervals at 100, then 5 per adopted horizon."""
    p, _ = small_autoloco()
    intervals = execute(p, 4000)
    steps = [x.h_step for x in intervals]
    assert steps[:16] == [100] * 6 + [110] * 5 + [120] * 5
    # constant density: the mapper is the identity
    assert all(x.h_step == x.h_tok for x in intervals)
    assert max(steps) == 150


def test_autoloco_follows_token_density() -> None:
    """docs/algorithm.md#token-mapper: three recipe-horizon intervals
    give M_base; then fewer tokens per step -> more steps."""
    p, sched = small_autoloco(adaptive_horizon=False)
    step = 0
    intervals = []
    for density in [1000, 1000, 1000, 500, 500, 500]:
        interval = p.next_interval(step)
        intervals.append(interval)
        p.complete(outcome(interval, tokens_per_step=density))
        step += interval.h_step
    assert [x.h_tok for x in intervals] == [100] * 6
    assert [x.h_step for x in intervals[:4]] == [100, 100, 100, 100]
    # n_hat after the 4th interval: 0.9 * 1000 + 0.1 * 500 = 950 -> 100 * 1000 / 950 = 105.3 -> 110
    assert intervals[4].h_step == 110
    n_hat = 0.9 * (0.9 * 950 + 0.1 * 500) + 0.1 * 500
    assert p.mapper.tokens_per_step == pytest.approx(n_hat)
    nxt = p.next_interval(step)
    assert nxt.h_step == 10 * math.floor(100 * 1000 / n_hat / 10 + 0.5)
    assert nxt.h_ref == nxt.h_step  # H_ref = map(H_base)
    assert nxt.lr_mass_base == lr_mass(sched, step, nxt.h_ref)


def test_autoloco_maps_next_horizon_after_updating_n_hat() -> None:
    """docs/algorithm.md#token-mapper: the horizon right after
    an interval is mapped with n_hat including that interval."""
    p, _ = small_autoloco(adaptive_horizon=False)
    step = 0
    for _ in range(3):
        interval = p.next_interval(step)
        p.complete(outcome(interval, tokens_per_step=1000))
        step += interval.h_step
    interval = p.next_interval(step)
    p.complete(outcome(interval, tokens_per_step=100))  # a drastic drop: n_hat = 910
    assert p.next_interval(step + interval.h_step).h_step == 110


def test_autoloco_without_token_mapping_is_identity() -> None:
    p, _ = small_autoloco(adaptive_horizon=False, map_tokens=False)
    intervals = execute(p, 1000, tokens_per_step=37.0)
    intervals += [p.next_interval(1000)]
    assert {x.h_step for x in intervals} == {100} and {x.h_ref for x in intervals} == {100}


def test_autoloco_fixed_horizon_ignores_statistics() -> None:
    """adaptive_horizon=False keeps H_base whatever the statistics say (DiLoCo special case,
    docs/algorithm.md#outer-correction)."""
    p, _ = small_autoloco(adaptive_horizon=False, map_tokens=False)
    assert all(x.h_step == 100 for x in execute(p, 3000))
    assert p.complete(outcome(p.next_interval(3000), drift_energy=math.nan)) is None


def test_autoloco_truncated_last_interval_takes_no_decision() -> None:
    sched = warmup_cosine(1e-3, 0, 1030)
    p = AutoLoCoPolicy(
        AutoLoCoConfig(controller="paper", h_base=100, q_h=10, h_max=150),
        sched,
        1030,
        warmup_steps=0,
    )
    step, decisions = 0, []
    while step < 1030:
        interval = p.next_interval(step)
        decisions.append(p.complete(outcome(interval)))
        step += interval.h_step
    assert decisions[-1].assessment == Assessment.TRUNCATED
    assert step == 1030


def test_autoloco_invalid_outcome() -> None:
    p, _ = small_autoloco()
    execute(p, 500)  # calibration + variability
    d = p.complete(outcome(p.next_interval(500), pseudo_grad_finite=False))
    assert d.assessment == Assessment.INVALID


def test_autoloco_state_dict_resumes_same_trajectory() -> None:
    """docs/algorithm.md#state: controller and token mapper state resume the same trajectory."""
    densities = [1000, 1000, 1000, 800, 700, 900, 600] * 6

    def run(policy, start_index=0, step=0, n=None):
        n = len(densities) if n is None else n
        out = []
        for density in densities[start_index:n]:
            interval = policy.next_interval(step)
            policy.complete(outcome(interval, tokens_per_step=density))
            out.append((interval.h_tok, interval.h_step, interval.h_ref))
            step += interval.h_step
        return out, step

    full, _ = run(small_autoloco()[0])
    first_policy = small_autoloco()[0]
    first, step = run(first_policy, n=17)
    resumed_policy = small_autoloco()[0]
    resumed_policy.load_state_dict(json.loads(json.dumps(first_policy.state_dict())))
    rest, _ = run(resumed_policy, start_index=17, step=step)
    assert first + rest == full
    assert len({h for _, h, _ in full}) > 3


def test_autoloco_counts_base_tokens_only_at_recipe_horizon() -> None:
    """docs/algorithm.md#token-mapper: M_1..M_3 come from
    full intervals executed at the recipe horizon."""
    sched = FunctionSchedule(lambda s: 1.0, 100_000)
    cfg = AutoLoCoConfig(controller="paper", h_base=100, q_h=10, h_min=50, h_max=150)
    p = AutoLoCoPolicy(cfg, sched, 100_000, warmup_steps=0)
    p.complete(outcome(p.next_interval(0), tokens_per_step=1000))
    d = p.complete(outcome(p.next_interval(100), tokens_per_step=1000, pseudo_grad_finite=False))
    assert d.decision == "reduce" and p.rule.h_tok == 70  # 100 / 1.5 -> 70
    step = 200
    for _ in range(4):
        interval = p.next_interval(step)
        assert interval.h_tok == 70 and interval.h_step == 70
        p.complete(outcome(interval, tokens_per_step=500))
        step += interval.h_step
    assert p.mapper.base_counts == [100_000, 100_000]
    assert p.mapper.base_tokens is None


def test_autoloco_truncated_interval_is_not_a_base_count() -> None:
    sched = FunctionSchedule(lambda s: 1.0, 250)
    p = AutoLoCoPolicy(
        AutoLoCoConfig(controller="paper", h_base=100, q_h=10, h_max=150),
        sched,
        250,
        warmup_steps=0,
    )
    intervals = execute(p, 250)
    assert [x.h_step for x in intervals] == [100, 100, 50] and intervals[-1].truncated
    assert len(p.mapper.base_counts) == 2


def test_autoloco_candidate_previews_use_mapped_steps() -> None:
    """docs/algorithm.md#candidate-selection: candidates are
    previewed as Lambda(s_next, map(H)), i.e. in executable steps."""
    sched = FunctionSchedule(lambda s: 1.0, 100_000)  # constant LR: the preview counts steps
    p = AutoLoCoPolicy(
        AutoLoCoConfig(controller="paper", h_base=100, q_h=10, h_max=150),
        sched,
        100_000,
        warmup_steps=0,
    )
    density = 1000 / 0.45  # 2.2x the base density: map(H) = round10(0.45 H)
    p.mapper.load_state_dict({"base_counts": [100_000] * 3, "tokens_per_step": density})
    assert [p.mapper.map(h) for h in (100, 110, 120, 130)] == [50, 50, 50, 60]
    intervals = execute(p, 6 * 50, tokens_per_step=density)
    assert [x.h_step for x in intervals] == [50] * 6
    assert p.rule.h_tok == 120  # previews 50, 50, 50 <= 1.15 x 50; 130 -> 60 is over budget
    assert p.next_interval(300).h_step == 50


@pytest.mark.parametrize("h_base", [25, 45, 100, 500])
def test_autoloco_recipe_horizon_survives_token_mapping(h_base: int) -> None:
    """docs/algorithm.md#token-mapper: at constant density the
    mapper is the identity, also once M_base and n_hat exist."""
    cfg = AutoLoCoConfig(h_base=h_base, adaptive_horizon=False)
    p = AutoLoCoPolicy(
        cfg, FunctionSchedule(lambda s: 1.0, 100 * h_base), 100 * h_base, warmup_steps=0
    )
    assert {x.h_step for x in execute(p, 10 * h_base)} == {h_base}


def test_an_interval_shorter_than_min_steps_is_stretched_to_whole_quanta_and_takes_no_decision():
    cfg = AutoLoCoConfig(method="autoloco", h_base=500, q_h=50)
    policy = AutoLoCoPolicy(cfg, C4, 50_000, 1000)
    plain = policy.next_interval(10_000)
    assert not plain.stretched and policy.next_interval(10_000, min_steps=plain.h_step) == plain
    stretched = policy.next_interval(10_000, min_steps=plain.h_step + 1)
    assert (
        stretched.stretched
        and stretched.h_step == plain.h_step + 50
        and stretched.h_tok == plain.h_tok
    )
    assert stretched.lr_mass == pytest.approx(lr_mass(C4, 10_000, stretched.h_step))
    assert outcome(stretched).observation(10_550).truncated  # ran another length than H_tok maps to
    end = policy.next_interval(49_980, min_steps=plain.h_step + 1)  # the budget still ends the run
    assert end.h_step == 20 and end.truncated
    fixed = FixedPolicy(C4, 50_000, 10).next_interval(0, min_steps=13)
    # DiLoCo executes any length: a quantum of 1
    assert (fixed.h_step, fixed.stretched) == (13, True)
