"""The descent rule (docs/algorithm.md#descent-rule): starts
at h_max, follows the coherence down, never lengthens."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import pytest
from test_policies import outcome

from autoloco_hf.algorithm.policies import AutoLoCoPolicy, NextInterval, make_rule
from autoloco_hf.algorithm.rules import Delivery, DescentRule, DisplacementAt
from autoloco_hf.algorithm.rules.decisions import Assessment, Decision, IntervalObservation, Phase
from autoloco_hf.algorithm.schedule import FunctionSchedule
from autoloco_hf.algorithm.stats import drift_growth
from autoloco_hf.config import AutoLoCoConfig, ConfigError, Controller


def descent_config(**kw) -> AutoLoCoConfig:
    """The rule's mechanics at round numbers: gain 1, no
    smoothing, no guard, from 4 h_base (h_max 40)."""
    options = {"smoothing": 0.0, "gain": 1.0, "drift_guard": False, **kw.pop("rule_options", {})}
    return AutoLoCoConfig(
        **{
            "h_base": 10,
            "q_h": 1,
            "h_max": 40,
            "controller": Controller.DESCENT,
            "rule_options": options,
            **kw,
        }
    )


def feed(ctl: DescentRule, coherences, step: int = 0, **kw) -> tuple[list[int], int]:
    """Run ``ctl`` over a coherence stream; the horizons it executed and the next start."""
    executed = []
    for c in coherences:
        h = ctl.h_tok
        obs = IntervalObservation(
            h_tok=h,
            start_step=step,
            end_step=step + h,
            drift_energy=1.0,
            coherence=c,
            lr_mass=1.0,
            **kw,
        )
        ctl.observe(obs, preview=lambda h_tok: float(h_tok))
        executed.append(h)
        step += h
    return executed, step


def test_the_default_rule_is_descent_from_two_h_base_at_momentum_half_with_the_guard() -> None:
    """The no-knob default (docs/results.md, "Choosing the default rule"): only h_base to set."""
    default = AutoLoCoConfig(h_base=10)
    assert default.controller is Controller.DESCENT
    assert (default.q_h, default.h_min, default.h_max, default.outer_momentum) == (1, 10, 20, 0.5)
    assert (default.rule_options.gain, default.rule_options.drift_guard) == (0.9, None)
    assert DescentRule(default).guarded and DescentRule(default).h_tok == 20
    assert AutoLoCoConfig(h_base=500).h_max == 1000
    # the paper rule keeps 1.5 h_base and momentum 0.7
    paper = AutoLoCoConfig(h_base=10, controller="paper")
    assert (paper.h_max, paper.outer_momentum) == (15, 0.7)
    assert AutoLoCoConfig(method="diloco").outer_momentum == 0.9


def test_the_guard_is_on_unless_set_off_or_the_overlap_is_eager() -> None:
    assert DescentRule(AutoLoCoConfig(h_base=10, overlap="delayed")).guarded
    # no anchor there, not refused
    assert not DescentRule(AutoLoCoConfig(h_base=10, overlap="eager")).guarded
    assert not DescentRule(AutoLoCoConfig(h_base=10, rule_options={"drift_guard": False})).guarded


def test_an_unknown_controller_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="controller"):
        AutoLoCoConfig(h_base=10, controller="greedy")


def test_the_horizon_follows_the_coherence_ratio_to_the_calibration() -> None:
    ctl = DescentRule(descent_config())
    executed, _ = feed(ctl, [3.0, 3.0, 3.0, 2.25, 1.5, 0.75])
    # calibrated at log 3; then h_max * C / 3, floored to q_h
    assert executed == [40, 40, 40, 40, 30, 20]
    assert ctl.h_tok == 10  # 40 * 0.75 / 3 = 10 = h_min


def test_the_gain_is_the_exponent_of_the_coherence_ratio() -> None:
    ctl = DescentRule(descent_config(rule_options={"gain": 0.5}))
    executed, _ = feed(ctl, [3.0, 3.0, 3.0, 0.75])
    # calibrated at log 3, re-based so that h_max stays the target; then 40 * (0.75 / 3) ** 0.5 = 20
    assert executed == [40, 40, 40, 40]
    assert ctl.h_tok == 20
    # a recalibration at 20 keeps 20 as the target; a halving
    # then shortens by 2 ** -0.5, not by half
    ctl.recalibrate_for_new_workers()
    executed, _ = feed(ctl, [1.0, 1.0, 0.5])
    assert executed == [20, 20, 20]
    assert ctl.h_tok == 14  # 20 * 0.5 ** 0.5 = 14.1
    with pytest.raises(ConfigError, match=r"rule_options\['gain'\]=0.0 of rule 'descent'"):
        descent_config(rule_options={"gain": 0.0})


def test_the_horizon_never_lengthens_and_stays_in_the_domain() -> None:
    rng = random.Random(0)
    cfg = descent_config(rule_options={"smoothing": 0.5}, h_min=5)
    ctl = DescentRule(cfg)
    executed, _ = feed(ctl, [math.exp(rng.gauss(0.0, 0.7)) for _ in range(200)])
    assert all(later <= earlier for earlier, later in zip(executed, executed[1:]))
    assert all(cfg.h_min <= h <= cfg.h_max for h in executed)
    assert executed[-1] < cfg.h_max  # the noise did take it down


def test_smoothing_is_an_ema_of_log_coherence() -> None:
    ctl = DescentRule(descent_config(rule_options={"smoothing": 0.5}))
    feed(ctl, [4.0, 4.0, 1.0])
    # s = 0.5 log 4 + 0.5 log 1 = log 2: target 40 * 2 / 4 = 20
    assert ctl.h_tok == 20


def test_warmup_intervals_are_unused_and_truncated_ones_take_no_decision() -> None:
    ctl = DescentRule(descent_config(), warmup_steps=50)
    executed, step = feed(ctl, [9.0])  # ends at 40 < 50: warm-up
    assert ctl.phase == Phase.WARMUP and executed == [40]
    obs = IntervalObservation(
        h_tok=40,
        start_step=step,
        end_step=step + 5,
        drift_energy=1.0,
        coherence=0.1,
        lr_mass=1.0,
        truncated=True,
    )
    decision = ctl.observe(obs, preview=float)
    assert decision.assessment == Assessment.TRUNCATED and ctl.h_tok == 40


def test_a_non_finite_interval_halves_the_horizon() -> None:
    ctl = DescentRule(descent_config())
    feed(ctl, [2.0, 2.0])
    obs = IntervalObservation(
        h_tok=40, start_step=80, end_step=120, drift_energy=math.nan, coherence=2.0, lr_mass=1.0
    )
    decision = ctl.observe(obs, preview=float)
    assert (decision.assessment, decision.decision, ctl.h_tok) == (
        Assessment.INVALID,
        Decision.FALLBACK,
        20,
    )
    for _ in range(5):
        ctl.observe(obs, preview=float)
    assert ctl.h_tok == 10  # never below h_min


def observe_nan(ctl: DescentRule, h: int, step: int) -> None:
    ctl.observe(
        IntervalObservation(
            h_tok=h,
            start_step=step,
            end_step=step + h,
            drift_energy=math.nan,
            coherence=2.0,
            lr_mass=1.0,
        ),
        preview=float,
    )


def test_after_a_fault_the_rule_returns_to_the_interrupted_horizon_and_calibrates_there() -> None:
    ctl = DescentRule(descent_config())
    _, step = feed(ctl, [2.0, 2.0, 1.5])  # calibrated at log 2, then 40 * 0.75 = 30
    assert ctl.h_tok == 30
    observe_nan(ctl, 30, step)
    observe_nan(ctl, 15, step + 30)
    assert ctl.h_tok == 10  # halved twice (7.5), not below h_min
    executed, _ = feed(ctl, [0.5, 0.5, 1.0, 1.0, 1.0], step=step + 45)
    # two finite intervals at the fallback horizon (their coherence is
    # not used), then back to 30, where the next two intervals calibrate:
    # the restored horizon is the new target, and a steady C_t keeps it
    assert executed == [10, 10, 30, 30, 30] and ctl.h_tok == 30 and ctl.phase == Phase.MONITORING


def test_a_fault_right_after_a_restore_halves_what_the_rule_restores_to() -> None:
    ctl = DescentRule(descent_config())
    _, step = feed(ctl, [2.0, 2.0])
    observe_nan(ctl, 40, step)  # 40 -> 20
    _, step = feed(ctl, [2.0, 2.0], step=step + 40)  # back at 40
    assert ctl.h_tok == 40
    observe_nan(ctl, 40, step)  # the restored 40 failed: 20, and 20 is what it returns to
    executed, _ = feed(ctl, [2.0, 2.0, 2.0], step=step + 40)
    assert executed == [20, 20, 20] and ctl.h_tok == 20


def test_resume_equals_uninterrupted() -> None:
    rng = random.Random(1)
    stream = [math.exp(rng.gauss(0.0, 0.5)) for _ in range(30)]
    whole = DescentRule(descent_config(rule_options={"smoothing": 0.3}))
    full, _ = feed(whole, stream)
    first = DescentRule(descent_config(rule_options={"smoothing": 0.3}))
    head, step = feed(first, stream[:11])
    resumed = DescentRule(descent_config(rule_options={"smoothing": 0.3}))
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    tail, _ = feed(resumed, stream[11:], step=step)
    assert head + tail == full
    assert resumed.state == whole.state


def test_new_workers_recalibrate_at_the_horizon_in_force() -> None:
    ctl = DescentRule(descent_config())
    feed(ctl, [4.0, 4.0, 2.0])
    assert ctl.h_tok == 20
    ctl.recalibrate_for_new_workers()
    assert ctl.phase == Phase.CALIBRATION
    feed(ctl, [1.0, 1.0, 1.0, 0.5])  # a new level, half of it: 20 -> 10
    assert ctl.h_tok == 10


def test_the_policy_builds_the_configured_rule_and_calibrates_the_mapper_at_h_max() -> None:
    assert isinstance(make_rule(descent_config(), 0), DescentRule)
    sched = FunctionSchedule(lambda s: 1.0, 10_000)
    policy = AutoLoCoPolicy(
        descent_config(token_calibration_intervals=2), sched, 10_000, warmup_steps=0
    )
    first = policy.next_interval(0)
    assert (first.h_tok, first.h_step) == (40, 40)
    policy.complete(outcome(first, tokens_per_step=100))
    policy.complete(outcome(policy.next_interval(40), tokens_per_step=100))
    assert policy.mapper.base_counts == [1000, 1000]  # tokens of one h_base interval
    policy.complete(outcome(policy.next_interval(80), tokens_per_step=50))  # half the density
    assert policy.next_interval(120).h_step > 40  # the mapper stretches the same token budget


# ------------------------------------------------------------------ the drift guard
def feed_stats(ctl: DescentRule, stats, step: int = 0) -> tuple[list[int], int]:
    """Like ``feed`` over ``(C_t, d_t, anchor d)`` triples
    (``lr_mass`` 1, the anchor's 0.25: ``d = D / mass^2``)."""
    executed = []
    for coherence, drift, anchor in stats:
        h = ctl.h_tok
        obs = IntervalObservation(
            h_tok=h,
            start_step=step,
            end_step=step + h,
            drift_energy=drift,
            coherence=coherence,
            lr_mass=1.0,
            anchor_drift_energy=anchor * 0.25**2,
            anchor_lr_mass=0.25,
        )
        ctl.observe(obs, preview=float)
        executed.append(h)
        step += h
    return executed, step


def guarded(**kw) -> DescentRule:
    options = {"drift_guard": True, **kw.pop("rule_options", {})}
    return DescentRule(descent_config(rule_options=options, **kw))


HEALTHY = (2.0, math.e, math.e**2)  # d falls from its anchor's over the interval
BLOWN = (2.0, math.e**3, math.e**2)  # d rises over the interval


def test_the_guard_leaves_a_run_whose_drift_falls_as_it_was() -> None:
    plain, guard = DescentRule(descent_config()), guarded()
    stream = [HEALTHY] * 3 + [(1.5, math.e, math.e**2), (1.0, math.e, math.e**2)]
    assert feed_stats(guard, stream)[0] == feed_stats(plain, stream)[0] == [40, 40, 40, 40, 30]
    assert guard.state == plain.state


def test_an_interval_whose_drift_does_not_fall_below_its_anchor_halves_the_horizon() -> None:
    ctl = guarded()
    _, step = feed_stats(ctl, [HEALTHY] * 3)
    obs = IntervalObservation(
        h_tok=40,
        start_step=step,
        end_step=step + 40,
        drift_energy=math.e**2,
        coherence=2.0,
        lr_mass=1.0,
        anchor_drift_energy=math.e**2 * 0.25**2,
        anchor_lr_mass=0.25,
    )
    decision = ctl.observe(obs, preview=float)  # d equal to the anchor's: not falling is enough
    assert (decision.assessment, decision.decision, ctl.h_tok) == (
        Assessment.SEVERE,
        Decision.REDUCE,
        20,
    )
    assert decision.residual_drift == pytest.approx(0.0)
    executed, _ = feed_stats(ctl, [BLOWN, HEALTHY, HEALTHY])
    # halved again, then h_min (10 is below 1.5 h_base: not judged)
    assert executed == [20, 10, 10] and ctl.h_tok == 10


def test_a_blow_up_during_calibration_restarts_it_at_the_halved_horizon() -> None:
    ctl = guarded()
    executed, _ = feed_stats(
        ctl, [HEALTHY, BLOWN, (3.0, math.e, math.e**2), (3.0, math.e, math.e**2), (1.5, 1, 9)]
    )
    # calibrated at 20 on the two intervals after the blow-up
    # (log 3): the halved horizon is the target there
    assert executed == [40, 40, 20, 20, 20] and ctl.h_tok == 10 and ctl.phase == Phase.MONITORING


def test_a_drift_exactly_equal_to_its_anchors_is_blown_up() -> None:
    """The boundary of "does not fall below the anchor's": a
    fall of exactly 0 halves the horizon."""
    ctl = guarded()
    _, step = feed_stats(ctl, [HEALTHY] * 3)
    obs = IntervalObservation(
        h_tok=40, start_step=step, end_step=step + 40, drift_energy=1.0, coherence=2.0, lr_mass=1.0,
        anchor_drift_energy=0.0625, anchor_lr_mass=0.25,
    )  # fmt: skip
    # d = 1 / 1**2 = 0.0625 / 0.25**2, in floats too
    assert drift_growth(1.0, 1.0, 0.0625, 0.25)[0] == 0.0
    decision = ctl.observe(obs, preview=float)
    assert (decision.assessment, decision.decision, ctl.h_tok) == (
        Assessment.SEVERE,
        Decision.REDUCE,
        20,
    )


def test_the_guard_does_not_judge_warm_up_or_the_hold_after_a_fault() -> None:
    """Documented in docs/algorithm.md#descent-rule: a blown-up interval there keeps the horizon;
    the same interval later halves it."""
    ctl = DescentRule(descent_config(rule_options={"drift_guard": True}), warmup_steps=100)
    executed, step = feed_stats(ctl, [BLOWN, BLOWN])  # both end by step 80, inside the warm-up
    assert executed == [40, 40] and ctl.h_tok == 40 and ctl.phase == Phase.WARMUP
    ctl = guarded()
    _, step = feed_stats(ctl, [HEALTHY] * 3)
    observe_nan(ctl, 40, step)  # 40 -> 20, then a hold of calibration_intervals (2) intervals at 20
    executed, step = feed_stats(ctl, [BLOWN, BLOWN], step=step + 40)
    assert executed == [20, 20] and ctl.h_tok == 40  # not judged: back at the interrupted horizon
    feed_stats(ctl, [BLOWN], step=step)
    assert ctl.h_tok == 20  # judged again


def test_the_anchor_is_measured_only_inside_the_interval() -> None:
    """An anchor at the interval's last step would equal its end: no measurement is asked for."""
    ctl = guarded()
    assert ctl.measurements(NextInterval(0, 40, 11, 10, False, 1.0, 1.0)) == (DisplacementAt(10),)
    assert ctl.measurements(NextInterval(0, 40, 10, 10, False, 1.0, 1.0)) == ()


def test_the_guard_judges_horizons_of_at_least_one_and_a_half_h_base_only() -> None:
    ctl = guarded(h_max=14)
    executed, _ = feed_stats(ctl, [BLOWN] * 4)
    assert executed == [14] * 4  # 14 < 15: the expected fall of d is within the noise there
    ctl = guarded(h_max=15)
    assert feed_stats(ctl, [BLOWN])[0] == [15] and ctl.h_tok == 10
    ctl = guarded()
    obs = IntervalObservation(
        h_tok=40, start_step=0, end_step=40, drift_energy=9.0, coherence=2.0, lr_mass=1.0
    )
    ctl.observe(obs, preview=float)  # no anchor measured (NaN): nothing to judge
    assert ctl.h_tok == 40


def test_without_the_guard_the_anchor_is_not_read() -> None:
    plain = DescentRule(descent_config())
    assert feed_stats(plain, [BLOWN] * 5)[0] == [40] * 5


def test_resume_equals_uninterrupted_with_the_guard() -> None:
    rng = random.Random(2)
    stream = [
        (math.exp(rng.gauss(0.0, 0.3)), math.exp(rng.gauss(0.0, 0.5)), 1.0) for i in range(30)
    ]
    whole = guarded(rule_options={"smoothing": 0.3})
    full, _ = feed_stats(whole, stream)
    for cut in (1, 3, 12):
        first = guarded(rule_options={"smoothing": 0.3})
        head, step = feed_stats(first, stream[:cut])
        resumed = guarded(rule_options={"smoothing": 0.3})
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        tail, _ = feed_stats(resumed, stream[cut:], step=step)
        assert head + tail == full
        assert resumed.state == whole.state


def test_the_guard_is_refused_with_the_eager_overlap_naming_the_field() -> None:
    with pytest.raises(
        ConfigError,
        match=r"rule_options\['drift_guard'\]=True of rule 'descent'.*overlap='delayed'",
    ):
        descent_config(rule_options={"drift_guard": True}, overlap="eager")
    delayed = DescentRule(descent_config(rule_options={"drift_guard": True}, overlap="delayed"))
    assert delayed.measurements(NextInterval(0, 40, 40, 10, False, 1.0, 1.0)) == (
        DisplacementAt(10),
    )
    with pytest.raises(
        ConfigError, match="not an option of rule 'paper'.*option of rule 'descent'"
    ):
        AutoLoCoConfig(h_base=10, controller="paper", rule_options={"drift_guard": True})


# ------------------------------------------------------------------ the start probe
# (docs/algorithm.md#descent-rule)
def test_an_interval_the_start_probe_cut_sets_the_horizon_and_restarts_the_calibration() -> None:
    ctl = DescentRule(
        descent_config(rule_options={"start_probe": 1.85, "calibration_intervals": 1})
    )
    cut = IntervalObservation(
        h_tok=20,
        start_step=0,
        end_step=20,
        drift_energy=1.0,
        coherence=2.0,
        lr_mass=1.0,
        cut_short=True,
    )
    # the first interval, planned at h_max = 40, cut at 20
    decision = ctl.observe(cut, preview=float)
    assert (decision.assessment, decision.decision, ctl.h_tok) == (
        Assessment.BENT,
        Decision.REDUCE,
        20,
    )
    # its coherence is not a calibration
    assert ctl.state.calibration_logs == [] and ctl.phase == Phase.WARMUP
    executed, _ = feed(ctl, [3.0, 1.5], step=20)
    assert executed == [20, 20] and ctl.h_tok == 10  # calibrated at 20 on log 3: 1.5 halves it


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (
            dict(overlap="delayed"),
            "start_probe.*1.85 of rule 'descent'.*overlap=delayed cannot follow",
        ),
        (dict(fragments=2), "start_probe.*1.85 of rule 'descent'.*fragments=2 cannot follow"),
        (
            dict(rule_options={"start_probe": 2.5}),
            r"\['start_probe'\]=2.5 of rule 'descent'.*\(0.0, 2.0\]",
        ),
        (dict(rule_options={"start_probe": 0.0}), r"\['start_probe'\]=0.0 of rule 'descent'"),
    ],
)
def test_the_start_probe_is_refused_where_an_interval_cannot_end_early_naming_the_field(
    overrides, named
) -> None:
    options = {"start_probe": 1.85, **overrides.pop("rule_options", {})}
    with pytest.raises(ConfigError, match=named):
        descent_config(rule_options=options, **overrides)


def test_only_the_descent_rule_probes_its_start() -> None:
    first = NextInterval(0, 40, 40, 10, False, 1.0, 1.0)
    probing = DescentRule(descent_config(rule_options={"start_probe": 1.85}))
    assert probing.measurements(first) == (
        DisplacementAt(15, Delivery.SHARED),
        DisplacementAt(20, Delivery.SHARED),
    )
    # the run's first interval only
    assert probing.measurements(replace(first, start_step=40)) == ()
    assert DescentRule(descent_config()).measurements(first) == ()
    with pytest.raises(ConfigError, match="not an option of rule 'paper'"):
        AutoLoCoConfig(h_base=10, controller="paper", rule_options={"start_probe": 1.85})


def test_the_drift_guard_still_judges_an_interval_the_start_probe_cut() -> None:
    ctl = DescentRule(descent_config(rule_options={"start_probe": 1.85, "drift_guard": True}))
    cut = IntervalObservation(
        h_tok=20, start_step=0, end_step=20, drift_energy=math.e**2, coherence=2.0, lr_mass=1.0,
        anchor_drift_energy=math.e**2 * 0.25**2, anchor_lr_mass=0.5, cut_short=True,
    )  # fmt: skip
    # d rose from its anchor's over the cut interval: blown up too
    decision = ctl.observe(cut, preview=float)
    assert (decision.assessment, decision.decision, ctl.h_tok) == (
        Assessment.SEVERE,
        Decision.REDUCE,
        10,
    )
