"""Horizon controller driven by scripted statistic streams (docs/algorithm.md#horizon-rule).

Every stream is built by hand in log space: ``lr_mass = 1`` so that
``log d_t = log D_t`` and ``D_t = exp(log d)``, ``C_t = exp(log C)``. After
calibration the residual history of a flat stream is all zeros, so the robust
scale is ``sigma_floor = 0.10`` and the standardized score of a residual ``r``
is ``10 r``: ``r = 0.3`` is moderate (z = 3), ``r = 0.6`` is severe (z = 6),
``r = 0.1`` is reference-consistent but not supporting (z = 1).
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Callable

import pytest

from autoloco_hf.algorithm.rules import PaperRule
from autoloco_hf.algorithm.rules.decisions import (
    Assessment,
    IntervalObservation,
    Phase,
    RuleDecision,
)
from autoloco_hf.config import AutoLoCoConfig, Controller

# the paper's rule, which these tests are about (the default rule is descent: test_descent_rule.py)
PaperConfig = functools.partial(AutoLoCoConfig, controller=Controller.PAPER)

MODERATE_R, SEVERE_R, CONSISTENT_R = 0.3, 0.6, 0.1


def proportional(h_tok: int) -> float:
    """Constant inner LR: the LR mass of an interval is proportional to its length."""
    return float(h_tok)


def flat(h_tok: int) -> float:
    """Every horizon has the same LR-mass preview: the budget admits the largest one."""
    return 1.0


class Driver:
    """Feeds hand-made intervals to a controller; each
    interval runs at the controller's ``h_tok``."""

    def __init__(
        self,
        cfg: AutoLoCoConfig | None = None,
        warmup_steps: int = 0,
        preview: Callable[[int], float] = proportional,
    ) -> None:
        self.cfg = cfg or PaperConfig(h_base=500, q_h=50, h_max=750)
        self.ctl = PaperRule(self.cfg, warmup_steps=warmup_steps)
        self.preview = preview
        self.step = 0
        self.log: list[RuleDecision] = []

    def obs(self, log_d: float = 0.0, log_c: float = 0.0, **kw) -> IntervalObservation:
        h = self.ctl.h_tok
        values = dict(
            h_tok=h,
            start_step=self.step,
            end_step=self.step + h,
            drift_energy=math.exp(log_d),
            coherence=math.exp(log_c),
            lr_mass=1.0,
        )
        values.update(kw)
        return IntervalObservation(**values)

    def feed(self, log_d: float = 0.0, log_c: float = 0.0, **kw) -> RuleDecision:
        obs = self.obs(log_d, log_c, **kw)
        self.step = obs.end_step
        decision = self.ctl.observe(obs, self.preview)
        assert decision.next_h_tok == self.ctl.h_tok
        self.log.append(decision)
        return decision

    def feed_many(self, n: int, log_d: float = 0.0, log_c: float = 0.0) -> list[RuleDecision]:
        return [self.feed(log_d, log_c) for _ in range(n)]

    def to_monitoring(self) -> None:
        """2 calibration + 3 variability intervals of a flat stream (warm-up 0)."""
        decisions = self.feed_many(5)
        assert [d.phase for d in decisions] == [Phase.CALIBRATION] * 2 + [Phase.VARIABILITY] * 3
        assert self.ctl.phase == Phase.MONITORING
        assert self.ctl.state.history_drift == [0.0, 0.0, 0.0]

    def accept_at_max(self) -> None:
        """Reach an accepted horizon of ``h_max`` (flat
        previews propose it at once), then monitoring."""
        assert self.preview is flat
        self.to_monitoring()
        assert self.feed().decision == "propose"
        assert self.ctl.h_tok == self.cfg.h_max
        assert self.feed().decision == "adopt"
        self.feed_many(3)
        assert self.ctl.phase == Phase.MONITORING and self.ctl.h_accepted == self.cfg.h_max


def decisions(log: list[RuleDecision]) -> list[str]:
    return [d.decision for d in log]


# --------------------------------------------------------------------- 5.4
def test_always_supporting_stream_climbs_one_q_per_five_intervals() -> None:
    """docs/algorithm.md#phases/5.4: 2 calibration + 3 variability
    + 1 monitoring at H_base, then 5 per adopted horizon."""
    d = Driver()
    trace = []
    for _ in range(30):
        trace.append(d.ctl.h_tok)
        d.feed()
    assert trace == [500] * 6 + [550] * 5 + [600] * 5 + [650] * 5 + [700] * 5 + [750] * 4
    assert decisions(d.log[:6]) == ["keep"] * 5 + ["propose"]
    assert decisions(d.log[6:11]) == ["adopt", "keep", "keep", "keep", "propose"]
    assert decisions(d.log[26:]) == ["adopt", "keep", "keep", "keep"]


def test_candidate_is_longest_horizon_within_lr_mass_budget() -> None:
    """docs/algorithm.md#candidate-selection: the longest admissible horizon whose preview is <=
    gamma_inc x the accepted one's."""
    masses = {500: 1.0, 550: 1.10, 600: 1.15, 650: 1.1500001, 700: 1.3, 750: 1.4}
    d = Driver(preview=lambda h: masses[h])
    d.to_monitoring()
    assert d.feed().decision == "propose"
    assert d.ctl.h_tok == 600 and d.ctl.h_accepted == 500


def test_no_candidate_within_budget_keeps() -> None:
    d = Driver(preview=lambda h: float(h) ** 3)
    d.to_monitoring()
    assert d.feed().decision == "keep"
    assert d.ctl.h_tok == 500 and d.ctl.phase == Phase.MONITORING


# ------------------------------------------------------------- warm-up 5.3.1
def test_warmup_intervals_are_unused_and_completing_interval_calibrates() -> None:
    """docs/algorithm.md#warm-up: intervals ending before warm-up ends are unused; the one
    completing it is calibration #1."""
    d = Driver(warmup_steps=1000)
    first = d.feed(log_d=5.0, log_c=-3.0)  # wild values: must not enter the reference
    assert (first.phase, first.assessment, first.decision) == (
        Phase.WARMUP,
        Assessment.UNUSED,
        "keep",
    )
    assert d.ctl.phase == Phase.WARMUP and d.ctl.state.ref_log_drift is None
    second = d.feed()  # [500, 1000): warm-up completes in it
    assert second.phase == Phase.CALIBRATION and d.ctl.phase == Phase.CALIBRATION
    d.feed()
    assert d.ctl.phase == Phase.VARIABILITY
    assert d.ctl.state.ref_log_drift == 0.0 and d.ctl.state.ref_log_coherence == pytest.approx(
        0.0, abs=1e-7
    )
    d.feed_many(3)
    assert d.feed().decision == "propose"
    assert len(d.log) == 7  # docs/algorithm.md#paper-trajectory: 500 x 7 with a 1,000-step warm-up


@pytest.mark.parametrize(
    "warmup, delay, unused",
    [
        (0, 0, 0),
        (1000, 0, 1),
        (999, 0, 1),
        (1001, 0, 2),
        (1200, 0, 2),
        (1000, 500, 2),
        (1000, 501, 3),
    ],
)
def test_warmup_and_calibration_delay(warmup: int, delay: int, unused: int) -> None:
    """docs/algorithm.md#warm-up: an interval ending before
    ``warmup + calibration_delay_steps`` is unused."""
    d = Driver(
        PaperConfig(h_base=500, q_h=50, h_max=750, rule_options={"calibration_delay_steps": delay}),
        warmup_steps=warmup,
    )
    phases = [d.feed().assessment for _ in range(unused + 1)]
    assert phases == [Assessment.UNUSED] * unused + [Assessment.CONSISTENT]
    assert d.ctl.phase == Phase.CALIBRATION


# ------------------------------------------------------------ reference 5.1
def test_reference_is_geometric_mean_of_calibration_then_clipped_ema() -> None:
    """docs/algorithm.md#references-and-residuals: reference = mean of calibration logs; then EMA
    alpha 0.2 with residual clipped to +-2 sigma."""
    d = Driver()
    d.feed(log_d=0.0, log_c=math.log(2.0))
    d.feed(log_d=0.1, log_c=math.log(8.0))
    st = d.ctl.state
    assert st.ref_log_drift == pytest.approx(0.05)
    assert st.ref_log_coherence == pytest.approx(math.log(4.0))
    d.feed(log_d=0.15, log_c=math.log(4.0))  # variability: residual 0.1 moves the reference by 0.02
    assert st.ref_log_drift == pytest.approx(0.07)
    assert st.history_drift == [pytest.approx(0.1)]
    d.feed(log_d=5.07, log_c=math.log(4.0))  # residual 5.0: clipped to 2 * 0.1 before the EMA
    assert st.ref_log_drift == pytest.approx(0.07 + 0.2 * 0.2)
    # ... and each variability residual enters the history clipped to +- k_moderate * sigma_floor
    assert st.history_drift[-1] == pytest.approx(0.2)


def test_variability_intervals_cannot_be_moderate_or_severe() -> None:
    """docs/algorithm.md#interval-assessment: with fewer than
    3 residuals only invalid is assessed."""
    d = Driver()
    d.feed_many(2)
    out = [d.feed(log_d=3.0, log_c=-3.0) for _ in range(3)]
    assert [x.assessment for x in out] == [Assessment.CONSISTENT] * 3
    assert decisions(out) == ["keep"] * 3
    assert d.ctl.phase == Phase.MONITORING and d.ctl.h_accepted == 500


def test_candidate_intervals_do_not_update_reference() -> None:
    """docs/algorithm.md#references-and-residuals: the EMA follows intervals at the accepted
    horizon, not candidate intervals."""
    d = Driver()
    d.to_monitoring()
    d.feed()  # propose 550
    ref = d.ctl.state.ref_log_drift
    assert d.feed(log_d=CONSISTENT_R).decision == "continue"
    assert d.ctl.state.ref_log_drift == ref


# --------------------------------------------------------------- monitoring
def test_two_consecutive_moderates_reduce_by_1_2_with_tie_toward_larger() -> None:
    """docs/algorithm.md#monitoring/5.3.7: 750 / 1.2 = 625, equidistant from 600 and 650 -> 650."""
    d = Driver(preview=flat)
    d.accept_at_max()
    first = d.feed(log_d=MODERATE_R)
    assert (first.assessment, first.decision) == (Assessment.MODERATE, "keep")
    assert d.ctl.h_tok == 750
    second = d.feed(log_d=MODERATE_R)
    assert (second.assessment, second.decision) == (Assessment.MODERATE, "reduce")
    assert d.ctl.h_accepted == d.ctl.h_tok == 650
    assert d.ctl.phase == Phase.CALIBRATION


@pytest.mark.parametrize(
    "h_acc, expected", [(750, 650), (700, 600), (650, 550), (600, 500), (550, 500)]
)
def test_moderate_reduction_targets(h_acc: int, expected: int) -> None:
    """docs/algorithm.md#reduction: nearest admissible multiple
    of q_H to H_acc / 1.2, strictly smaller, >= H_min."""
    d = Driver(PaperConfig(h_base=500, q_h=50, h_max=h_acc), preview=flat)
    d.accept_at_max()
    d.feed(log_c=-MODERATE_R)  # less coherence is adverse too
    assert d.feed(log_c=-MODERATE_R).decision == "reduce"
    assert d.ctl.h_accepted == expected


def test_moderate_then_consistent_does_not_reduce() -> None:
    """docs/algorithm.md#monitoring: only *consecutive* moderates
    reduce; a consistent interval resets the streak."""
    d = Driver(preview=flat)
    d.accept_at_max()
    out = [d.feed(log_d=r) for r in (MODERATE_R, CONSISTENT_R, MODERATE_R, 0.0, MODERATE_R)]
    assert [x.assessment for x in out] == [
        Assessment.MODERATE,
        Assessment.CONSISTENT,
        Assessment.MODERATE,
        Assessment.SUPPORTING,
        Assessment.MODERATE,
    ]
    assert decisions(out) == ["keep"] * 5
    assert d.ctl.h_accepted == 750 and d.ctl.phase == Phase.MONITORING


@pytest.mark.parametrize("log_d, log_c", [(SEVERE_R, 0.0), (0.0, -SEVERE_R), (SEVERE_R, -SEVERE_R)])
def test_severe_reduces_by_1_5_at_once(log_d: float, log_c: float) -> None:
    """docs/algorithm.md#monitoring: severe (a > 4) -> reduce
    by 1.5 immediately: 750 / 1.5 = 500."""
    d = Driver(preview=flat)
    d.accept_at_max()
    out = d.feed(log_d=log_d, log_c=log_c)
    assert (out.assessment, out.decision) == (Assessment.SEVERE, "reduce")
    assert d.ctl.h_accepted == d.ctl.h_tok == 500
    assert d.ctl.phase == Phase.CALIBRATION
    assert d.ctl.state.history_drift == [] and d.ctl.state.history_coherence == []


@pytest.mark.parametrize(
    "r, assessment",
    [
        (0.2, Assessment.CONSISTENT),
        (0.2001, Assessment.MODERATE),
        (0.4, Assessment.MODERATE),
        (0.4001, Assessment.SEVERE),
    ],
)
def test_thresholds_are_strict(r: float, assessment: str) -> None:
    """docs/algorithm.md#interval-assessment: moderate is
    ``k_moderate < a <= k_severe``, severe ``a > k_severe``."""
    d = Driver(preview=flat)
    d.accept_at_max()
    # the reference sits exactly at 0 and the history is [0, 0, 0]: z = r / 0.1
    assert d.feed(log_d=r).assessment == assessment


def test_below_h_base_reductions() -> None:
    """docs/algorithm.md#reduction with H_min < H_base:
    500/1.5 = 333 -> 350; 500/1.2 = 417 -> 400."""
    cfg = PaperConfig(h_base=500, q_h=50, h_min=250, h_max=500)
    d = Driver(cfg)
    d.to_monitoring()
    assert d.feed(log_d=SEVERE_R).decision == "reduce"
    assert d.ctl.h_accepted == 350
    d = Driver(cfg)
    d.to_monitoring()
    d.feed(log_d=MODERATE_R)
    assert d.feed(log_d=MODERATE_R).decision == "reduce"
    assert d.ctl.h_accepted == 400


def test_holdoff_after_reduction() -> None:
    """docs/algorithm.md#reduction: after a reduction 1 calibration + 3 variability + 1 monitoring
    interval before an increase."""
    d = Driver(PaperConfig(h_base=500, q_h=50, h_min=250, h_max=750))
    d.to_monitoring()
    d.feed(log_d=MODERATE_R)
    assert d.feed(log_d=MODERATE_R).decision == "reduce"
    assert d.ctl.h_accepted == 400
    after = d.feed_many(5)
    assert [x.phase for x in after] == [Phase.CALIBRATION] + [Phase.VARIABILITY] * 3 + [
        Phase.MONITORING
    ]
    assert decisions(after) == ["keep"] * 4 + ["propose"]
    assert d.ctl.h_tok == 450  # 460 budget at proportional previews


# ---------------------------------------------------------------- fallback
FALLBACK_CFG = PaperConfig(h_base=500, q_h=50, h_min=100, h_max=750)


def test_severe_then_invalid_falls_back_to_h_min() -> None:
    """docs/algorithm.md#monitoring: two severe-or-invalid events
    with nothing supporting/consistent between -> H_min."""
    d = Driver(FALLBACK_CFG)
    d.to_monitoring()
    assert d.feed(log_d=SEVERE_R).decision == "reduce"
    assert d.ctl.h_accepted == 350
    out = d.feed(drift_energy=math.nan)
    assert (out.assessment, out.decision) == (Assessment.INVALID, "fallback")
    assert d.ctl.h_accepted == d.ctl.h_tok == 100
    assert d.ctl.phase == Phase.CALIBRATION


def test_invalid_invalid_falls_back_and_no_decision_intervals_do_not_separate() -> None:
    d = Driver(FALLBACK_CFG)
    d.to_monitoring()
    assert d.feed(pseudo_grad_finite=False).decision == "reduce"
    d.feed(lr_mass=0.0)  # Lambda = 0: no decision, neither supporting nor consistent
    assert d.feed(mean_loss=math.inf).decision == "fallback"
    assert d.ctl.h_accepted == 100


def test_consistent_interval_between_bad_events_prevents_fallback() -> None:
    """A finite calibration interval counts as consistent (docs/algorithm.md#interval-assessment),
    so the second event only reduces."""
    d = Driver(FALLBACK_CFG)
    d.to_monitoring()
    d.feed(log_d=SEVERE_R)  # 500 -> 350
    assert d.feed().phase == Phase.CALIBRATION
    out = d.feed(coherence=math.nan)  # variability, invalid
    assert out.decision == "reduce"
    assert d.ctl.h_accepted == 250  # 350 / 1.5 = 233 -> 250 (nearer than 200)


def test_rejected_severe_candidate_then_invalid_falls_back() -> None:
    d = Driver(FALLBACK_CFG)
    d.to_monitoring()
    d.feed()  # propose 550
    assert d.feed(log_d=SEVERE_R).decision == "reject"
    # no extra reduction on rejection (docs/algorithm.md#reduction)
    assert d.ctl.h_accepted == d.ctl.h_tok == 500
    assert d.feed(drift_energy=math.inf).decision == "fallback"
    assert d.ctl.h_accepted == 100


# ---------------------------------------------------- recalibration at H_min
@pytest.mark.parametrize("trigger", ["severe", "moderate", "fallback"])
def test_reduction_impossible_at_h_min_recalibrates_without_deadlock(trigger: str) -> None:
    """docs/algorithm.md#reduction: no smaller admissible horizon
    -> keep it but recalibrate; later increases resume."""
    d = Driver()  # H_min = H_base = 500
    d.to_monitoring()
    if trigger == "severe":
        out = d.feed(log_d=SEVERE_R)
    elif trigger == "moderate":
        d.feed(log_d=MODERATE_R)
        out = d.feed(log_d=MODERATE_R)
    else:
        d.feed(log_d=SEVERE_R)
        out = d.feed(pseudo_grad_finite=False)
    assert out.decision == "recalibrate"
    st = d.ctl.state
    assert d.ctl.h_tok == d.ctl.h_accepted == 500
    assert d.ctl.phase == Phase.CALIBRATION
    assert st.history_drift == [] and st.history_coherence == []
    # the stream settles at a new level (the literal reading deadlocked here in "severe")
    level = SEVERE_R + 0.5
    after = [d.feed(log_d=level) for _ in range(5)]
    assert [x.phase for x in after] == [Phase.CALIBRATION] + [Phase.VARIABILITY] * 3 + [
        Phase.MONITORING
    ]
    assert decisions(after)[-1] == "propose"
    assert d.feed(log_d=level).decision == "adopt"
    assert d.ctl.h_accepted == 550


# --------------------------------------------------------------- candidates
def test_candidate_supporting_is_adopted_at_once() -> None:
    d = Driver()
    d.to_monitoring()
    d.feed()
    assert d.ctl.phase == Phase.CANDIDATE and d.ctl.h_tok == 550 and d.ctl.h_accepted == 500
    out = d.feed(log_d=-0.05)
    assert (out.assessment, out.decision) == (Assessment.SUPPORTING, "adopt")
    assert d.ctl.h_accepted == 550
    # the candidate interval doubled as the new reference's only calibration interval
    assert d.ctl.phase == Phase.VARIABILITY
    assert d.ctl.state.ref_log_drift == pytest.approx(-0.05)


def test_candidate_consistent_then_adopted_on_second_interval() -> None:
    d = Driver()
    d.to_monitoring()
    d.feed()
    first = d.feed(log_d=CONSISTENT_R)
    assert (first.assessment, first.decision) == (Assessment.CONSISTENT, "continue")
    assert d.ctl.phase == Phase.CANDIDATE and d.ctl.h_tok == 550 and d.ctl.h_accepted == 500
    second = d.feed(log_d=1.5 * CONSISTENT_R)
    assert (second.assessment, second.decision) == (Assessment.CONSISTENT, "adopt")
    assert d.ctl.h_accepted == d.ctl.h_tok == 550
    assert d.ctl.phase == Phase.VARIABILITY
    # the last candidate interval
    assert d.ctl.state.ref_log_drift == pytest.approx(1.5 * CONSISTENT_R)


@pytest.mark.parametrize(
    "first, second",
    [
        (dict(log_d=MODERATE_R), None),
        (dict(log_d=SEVERE_R), None),
        (dict(drift_energy=math.nan), None),
        (dict(pseudo_grad_finite=False), None),
        (dict(log_d=CONSISTENT_R), dict(log_d=MODERATE_R)),
        (dict(log_d=CONSISTENT_R), dict(log_c=-SEVERE_R)),
        (dict(log_d=CONSISTENT_R), dict(mean_loss=math.nan)),
    ],
)
def test_candidate_rejected_creates_bound_and_returns(first: dict, second: dict | None) -> None:
    """docs/algorithm.md#candidate-evaluation: moderate, severe or invalid in either candidate
    interval -> reject, bound, return."""
    d = Driver()
    d.to_monitoring()
    d.feed()
    out = d.feed(**first)
    if second is not None:
        assert out.decision == "continue"
        out = d.feed(**second)
    assert out.decision == "reject"
    st = d.ctl.state
    assert st.rejected is not None and st.rejected.h_tok == 550
    assert d.ctl.h_tok == d.ctl.h_accepted == 500
    assert d.ctl.phase == Phase.CALIBRATION


def test_rejected_bound_uses_geometric_midpoint() -> None:
    """docs/algorithm.md#candidate-selection: below an active bound the next proposal is nearest
    sqrt(H_acc * H_rej), strictly between."""
    d = Driver(preview=flat)
    d.to_monitoring()
    d.feed()
    assert d.ctl.h_tok == 750
    assert d.feed(log_d=MODERATE_R).decision == "reject"
    assert d.ctl.state.rejected.h_tok == 750 and d.ctl.state.rejected.lr_mass == 1.0
    trace = []
    for _ in range(17):
        d.feed()
        trace.append((d.log[-1].decision, d.ctl.h_tok))
    # 1 calibration + 3 variability + 1 monitoring, then sqrt(500*750) = 612 -> 600
    assert trace[:5] == [("keep", 500)] * 4 + [("propose", 600)]
    assert trace[5] == ("adopt", 600)
    # sqrt(600*750) = 670.8 -> 650; sqrt(650*750) = 698.2 ->
    # 700; nothing strictly between 700 and 750
    assert trace[9] == ("propose", 650)
    assert trace[14] == ("propose", 700)
    assert trace[15] == ("adopt", 700)
    assert d.ctl.state.rejected is not None  # flat previews: the bound only retires by age


def test_rejected_bound_one_q_above_blocks_until_max_age() -> None:
    """docs/algorithm.md#candidate-selection: a bound retires
    after ``rejected_bound_max_age = 20`` intervals."""
    d = Driver()
    d.to_monitoring()
    d.feed()
    assert d.feed(log_d=MODERATE_R).decision == "reject"  # bound at 550, created on this interval
    rest = d.feed_many(20)
    assert decisions(rest[:-1]) == ["keep"] * 19
    assert d.ctl.state.rejected is None
    assert rest[-1].decision == "propose" and d.ctl.h_tok == 550


def test_rejected_bound_max_age_is_configurable() -> None:
    d = Driver(
        PaperConfig(h_base=500, q_h=50, h_max=750, rule_options={"rejected_bound_max_age": 7})
    )
    d.to_monitoring()
    d.feed()
    d.feed(log_d=MODERATE_R)
    rest = d.feed_many(7)
    assert decisions(rest) == ["keep"] * 6 + ["propose"]


@pytest.mark.parametrize(
    "level, retired", [(0.95, False), (0.9001, False), (0.90, True), (0.5, True)]
)
def test_rejected_bound_retires_when_preview_falls_to_release_fraction(
    level: float, retired: bool
) -> None:
    """docs/algorithm.md#candidate-selection: retire when
    preview(bound) <= 0.90 x the LR mass observed at its creation."""
    scale = {"v": 1.0}

    # preview(550) == scale; the rejected interval measured Lambda = 1
    def preview(h: int) -> float:
        return scale["v"] * h / 550

    d = Driver(preview=preview)
    d.to_monitoring()
    d.feed()
    d.feed(log_d=MODERATE_R, lr_mass=1.0)
    assert d.ctl.state.rejected.lr_mass == 1.0
    d.feed_many(4)  # calibration + variability under the original schedule
    assert d.ctl.state.rejected is not None
    scale["v"] = level
    out = d.feed()  # first monitoring interval
    if retired:
        assert d.ctl.state.rejected is None
        assert out.decision == "propose" and d.ctl.h_tok == 550
    else:
        assert d.ctl.state.rejected is not None
        assert out.decision == "keep" and d.ctl.h_tok == 500


def test_rejected_bound_stores_measured_lr_mass() -> None:
    d = Driver()
    d.to_monitoring()
    d.feed()
    d.feed(log_d=MODERATE_R + 2 * math.log(1.25), lr_mass=1.25)  # same log d as MODERATE_R
    assert d.log[-1].decision == "reject"
    assert d.ctl.state.rejected.lr_mass == 1.25


# ------------------------------------------------------------------ invalid
INVALID_OBS = [
    dict(drift_energy=math.nan),
    dict(coherence=math.nan),
    dict(mean_loss=math.nan),
    dict(lr_mass=math.inf),
    dict(pseudo_grad_finite=False),
]


def _drive_to(phase: str) -> Driver:
    d = Driver(FALLBACK_CFG, warmup_steps=1000 if phase == Phase.WARMUP else 0)
    if phase == Phase.CALIBRATION:
        d.feed()
    elif phase == Phase.VARIABILITY:
        d.feed_many(3)
    elif phase == Phase.MONITORING:
        d.to_monitoring()
    elif phase == Phase.CANDIDATE:
        d.to_monitoring()
        d.feed()
    assert d.ctl.phase == phase
    return d


@pytest.mark.parametrize("bad", INVALID_OBS)
@pytest.mark.parametrize("phase", [Phase.CALIBRATION, Phase.VARIABILITY, Phase.MONITORING])
def test_invalid_takes_invalid_path_in_every_phase(phase: str, bad: dict) -> None:
    """docs/algorithm.md#interval-assessment/5.3: non-finite D, C, Lambda, loss or pseudo-gradient
    -> invalid, handled like severe."""
    d = _drive_to(phase)
    out = d.feed(**bad)
    assert (out.assessment, out.decision) == (Assessment.INVALID, "reduce")
    assert d.ctl.h_accepted == d.ctl.h_tok == 350  # 500 / 1.5 -> 350
    assert d.ctl.phase == Phase.CALIBRATION


@pytest.mark.parametrize("bad", INVALID_OBS)
def test_invalid_candidate_is_rejected(bad: dict) -> None:
    d = _drive_to(Phase.CANDIDATE)
    out = d.feed(**bad)
    assert (out.assessment, out.decision) == (Assessment.INVALID, "reject")
    assert d.ctl.h_accepted == d.ctl.h_tok == 500
    assert d.ctl.state.rejected.h_tok == 550


@pytest.mark.parametrize("bad", INVALID_OBS)
def test_invalid_during_warmup_is_assessed_but_recipe_horizon_kept(bad: dict) -> None:
    """docs/algorithm.md#warm-up: the recipe horizon is kept
    throughout warm-up; invalid is still detected."""
    d = _drive_to(Phase.WARMUP)
    out = d.feed(**bad)
    assert out.assessment == Assessment.INVALID
    assert d.ctl.h_tok == 500 and d.ctl.phase == Phase.WARMUP


@pytest.mark.parametrize(
    "kw, assessment",
    [
        (dict(truncated=True, log_d=SEVERE_R * 3), Assessment.TRUNCATED),
        (dict(lr_mass=0.0), Assessment.NO_DECISION),
        (dict(drift_energy=0.0), Assessment.NO_DECISION),
    ],
)
@pytest.mark.parametrize(
    "phase", [Phase.CALIBRATION, Phase.VARIABILITY, Phase.MONITORING, Phase.CANDIDATE]
)
def test_truncated_and_zero_mass_intervals_take_no_decision(
    phase: str, kw: dict, assessment: str
) -> None:
    """docs/algorithm.md#references-and-residuals, 5.3.8: truncated intervals and Lambda = 0 (or D =
    0) leave the state unchanged."""
    d = _drive_to(phase)
    before = json.dumps(d.ctl.state_dict())
    out = d.feed(**kw)
    assert out.assessment == assessment
    assert json.dumps(d.ctl.state_dict()) == before


# ----------------------------------------------------------- drift, no alarm
def _noisy_stream(
    seed: int, n: int = 200, drift_d: float = -0.002, drift_c: float = 0.001, noise: float = 0.04
):
    rng = random.Random(seed)
    return [
        (drift_d * i + rng.gauss(0.0, noise), drift_c * i + rng.gauss(0.0, noise)) for i in range(n)
    ]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("drift_d, drift_c", [(-0.002, 0.001), (0.002, -0.001)])
def test_slow_drift_with_realistic_noise_raises_no_alarm(
    seed: int, drift_d: float, drift_c: float
) -> None:
    """docs/algorithm.md#references-and-residuals, 10: noise ~0.04 in log d and log C plus slow
    drift: no reduction, no severe, no fallback."""
    d = Driver(warmup_steps=0)
    for log_d, log_c in _noisy_stream(seed, drift_d=drift_d, drift_c=drift_c):
        d.feed(log_d, log_c)
    assessments = [x.assessment for x in d.log]
    assert Assessment.SEVERE not in assessments
    assert not {"reduce", "fallback", "recalibrate"} & set(decisions(d.log))
    assert d.ctl.h_accepted == 750  # the favourable or slow stream still climbs to H_max


# ------------------------------------------------------------------ state
def _eventful_stream() -> list[dict]:
    """Climb, a rejection with a bound, moderates, a severe reduction, invalid, truncated ..."""
    rng = random.Random(11)
    stream: list[dict] = []
    for i in range(120):
        kw: dict = dict(log_d=rng.gauss(0.0, 0.04), log_c=rng.gauss(0.0, 0.04))
        if i in (12, 19, 28, 40, 41):
            kw["log_d"] = MODERATE_R
        if i == 60:
            kw["log_d"] = SEVERE_R
        if i == 75:
            kw["drift_energy"] = math.nan
        if i == 90:
            kw["lr_mass"] = 0.0
        stream.append(kw)
    return stream


def test_state_dict_round_trip_reproduces_decisions_at_every_split() -> None:
    """docs/algorithm.md#state: the controller state is
    JSON-serializable and resuming continues the same trajectory."""
    cfg = PaperConfig(h_base=500, q_h=50, h_min=250, h_max=750)
    stream = _eventful_stream()
    full = Driver(cfg)
    for kw in stream:
        full.feed(**kw)
    assert {"reject", "reduce", "adopt", "propose", "continue"} <= set(decisions(full.log))
    assert Assessment.MODERATE in [x.assessment for x in full.log]
    expected = [vars(x) for x in full.log]

    for split in range(1, len(stream)):
        first = Driver(cfg)
        for kw in stream[:split]:
            first.feed(**kw)
        state = json.loads(json.dumps(first.ctl.state_dict(), allow_nan=False))
        resumed = Driver(cfg)
        resumed.ctl.load_state_dict(state)
        resumed.step = first.step
        for kw in stream[split:]:
            resumed.feed(**kw)
        assert [vars(x) for x in first.log + resumed.log] == expected, (
            f"diverged after a split at {split}"
        )
        assert resumed.ctl.state_dict() == full.ctl.state_dict()


def test_state_dict_with_rejected_bound_is_json_serializable() -> None:
    d = Driver()
    d.to_monitoring()
    d.feed()
    d.feed(log_d=MODERATE_R)
    state = d.ctl.state_dict()
    assert state["rejected"] == {"h_tok": 550, "lr_mass": 1.0, "age": 0}
    copy = PaperRule(d.cfg)
    copy.load_state_dict(json.loads(json.dumps(state)))
    assert copy.state == d.ctl.state


# ------------------------------------------------------- scores, 5.1 / 5.2
def test_scores_follow_robust_centre_and_scale() -> None:
    """docs/algorithm.md#references-and-residuals: z = (r - median(history)) / max(1.4826
    MAD(history), sigma_floor); a = max(z_D, -z_C)."""
    import statistics

    def centre_scale(hist: list[float]) -> tuple[float, float]:
        c = statistics.median(hist)
        return c, max(1.4826 * statistics.median([abs(x - c) for x in hist]), 0.10)

    rng = random.Random(5)
    d = Driver(preview=flat)
    d.accept_at_max()
    checked = mad_used = 0
    for _ in range(60):
        st = d.ctl.state
        hist_d, hist_c = list(st.history_drift), list(st.history_coherence)
        ref_d, ref_c = st.ref_log_drift, st.ref_log_coherence
        log_d, log_c = rng.gauss(0.0, 0.12), rng.gauss(0.0, 0.12)
        out = d.feed(log_d, log_c)
        if out.phase != Phase.MONITORING:
            continue
        c_d, s_d = centre_scale(hist_d)
        c_c, s_c = centre_scale(hist_c)
        assert out.residual_drift == pytest.approx(log_d - ref_d)
        assert out.residual_coherence == pytest.approx(log_c - ref_c, abs=1e-7)
        assert out.z_drift == pytest.approx((log_d - ref_d - c_d) / s_d)
        assert out.z_coherence == pytest.approx((log_c - ref_c - c_c) / s_c, abs=1e-6)
        assert out.adverse == pytest.approx(max(out.z_drift, -out.z_coherence))
        checked += 1
        mad_used += max(s_d, s_c) > 0.1
    assert checked > 20 and mad_used > 0  # some scores used the MAD rather than the floor


def test_monitoring_intervals_move_reference_by_clipped_ema() -> None:
    """docs/algorithm.md#references-and-residuals: every finite accepted-horizon interval (moderate
    included) updates the reference."""
    d = Driver(preview=flat)
    d.accept_at_max()
    st = d.ctl.state
    assert st.ref_log_drift == 0.0
    assert d.feed(log_d=CONSISTENT_R).assessment == Assessment.CONSISTENT
    assert st.ref_log_drift == pytest.approx(0.2 * CONSISTENT_R)
    ref = st.ref_log_drift
    assert d.feed(log_d=MODERATE_R).assessment == Assessment.MODERATE
    # sigma is still the floor (the history holds 0, 0, 0, 0.1): residual clipped to 0.2
    assert st.ref_log_drift == pytest.approx(ref + 0.2 * 0.2)
    assert st.history_drift == pytest.approx([0.0, 0.0, 0.0, CONSISTENT_R])  # moderates stay out


def test_residual_history_keeps_last_16() -> None:
    """docs/algorithm.md#references-and-residuals: per family at most the last 16 residuals."""
    d = Driver(preview=flat)
    d.accept_at_max()
    values = [0.01 * (i % 7) - 0.03 for i in range(30)]
    residuals = [d.feed(log_d=v).residual_drift for v in values]
    assert len(d.ctl.state.history_drift) == 16
    assert d.ctl.state.history_drift == pytest.approx(residuals[-16:])


def test_second_rejection_replaces_bound() -> None:
    """docs/algorithm.md#candidate-evaluation: a rejection creates
    or *replaces* the rejected bound (with a fresh age)."""
    d = Driver(preview=flat)
    d.to_monitoring()
    d.feed()  # propose 750
    d.feed(log_d=MODERATE_R)  # bound 750
    d.feed_many(4)
    assert d.feed().decision == "propose" and d.ctl.h_tok == 600  # midpoint
    assert d.feed(log_d=MODERATE_R).decision == "reject"
    assert (d.ctl.state.rejected.h_tok, d.ctl.state.rejected.age) == (600, 0)
    d.feed_many(4)
    assert d.feed().decision == "propose" and d.ctl.h_tok == 550  # sqrt(500 * 600) = 548 -> 550


# ------------------------------------------------------- documented knobs
def test_increase_requires_support() -> None:
    """docs/algorithm.md#monitoring default proposes after a
    consistent interval; the switch requires a supporting one."""
    for requires, expected in ((False, "propose"), (True, "keep")):
        d = Driver(
            PaperConfig(
                h_base=500, q_h=50, h_max=750, rule_options={"increase_requires_support": requires}
            )
        )
        d.to_monitoring()
        assert d.feed(log_d=CONSISTENT_R).decision == expected
    assert d.feed(log_d=-0.01).decision == "propose"


def test_monitoring_holdoff() -> None:
    d = Driver(PaperConfig(h_base=500, q_h=50, h_max=750, rule_options={"monitoring_holdoff": 3}))
    d.to_monitoring()
    assert decisions(d.feed_many(3)) == ["keep", "keep", "propose"]


def test_candidate_max_intervals() -> None:
    d = Driver(
        PaperConfig(h_base=500, q_h=50, h_max=750, rule_options={"candidate_max_intervals": 3})
    )
    d.to_monitoring()
    d.feed()
    assert decisions([d.feed(log_d=CONSISTENT_R) for _ in range(3)]) == [
        "continue",
        "continue",
        "adopt",
    ]


def test_calibration_and_variability_counts() -> None:
    cfg = PaperConfig(
        h_base=500,
        q_h=50,
        h_max=750,
        rule_options={"calibration_intervals": 3, "variability_intervals": 1},
    )
    d = Driver(cfg)
    out = d.feed_many(5)
    assert [x.phase for x in out] == [Phase.CALIBRATION] * 3 + [Phase.VARIABILITY, Phase.MONITORING]
    assert out[-1].decision == "propose"


def test_another_number_of_workers_recalibrates_at_the_accepted_horizon() -> None:
    """docs/algorithm.md#boundary-snapshots: a candidate in progress is dropped; the reference is
    re-estimated, warm-up stays warm-up."""
    d = Driver(preview=flat)
    d.to_monitoring()
    assert d.feed().decision == "propose" and d.ctl.h_tok > d.ctl.h_accepted
    accepted = d.ctl.h_accepted
    d.ctl.recalibrate_for_new_workers()
    assert (d.ctl.phase, d.ctl.h_tok, d.ctl.h_accepted) == (Phase.CALIBRATION, accepted, accepted)
    assert d.ctl.state.calibration_needed == d.cfg.rule_options.recalibration_intervals
    assert d.ctl.state.history_drift == [] and d.ctl.state.calibration_logs == []
    new_level = [
        d.feed(log_d=1.0, log_c=-0.5) for _ in range(d.cfg.rule_options.recalibration_intervals)
    ]
    # the new level is the reference
    assert all(x.assessment == Assessment.CONSISTENT for x in new_level)
    assert d.ctl.state.ref_log_drift == pytest.approx(
        1.0
    ) and d.ctl.state.ref_log_coherence == pytest.approx(-0.5)

    warm = Driver(warmup_steps=10_000)
    warm.ctl.recalibrate_for_new_workers()
    assert warm.ctl.phase == Phase.WARMUP
