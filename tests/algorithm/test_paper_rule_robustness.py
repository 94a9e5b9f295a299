"""Controller robustness (issue 11): centred reference clip,
warm-up faults, h_min on the grid, opt-ins.

Scripted streams as in ``test_paper_rule.py`` (``lr_mass = 1``, so a residual
``r`` against a flat history scores ``z = 10 r``).
"""

from __future__ import annotations

import json
import math

import pytest
from test_paper_rule import MODERATE_R, Driver, PaperConfig, flat

from autoloco_hf.algorithm.rules import PaperRule
from autoloco_hf.algorithm.rules.decisions import Assessment, Phase
from autoloco_hf.algorithm.stats import interval_statistics, log_normalized_drift
from autoloco_hf.config import AutoLoCoConfig, ConfigError, ReferenceClip


# ------------------------------------------------------------------ config
def test_h_min_must_lie_on_the_q_h_grid() -> None:
    """h_min=95 with q_h=10 used to make the fallback execute
    95, a horizon the grid does not contain."""
    with pytest.raises(ConfigError, match=r"h_min=95 .*multiple of q_h=10 .*h_min=90"):
        PaperConfig(h_base=100, q_h=10, h_min=95)
    assert PaperConfig(h_base=100, q_h=10, h_min=50).h_min == 50


@pytest.mark.parametrize(
    "field, value",
    [
        ("reference_clip", "median"),
        ("rejected_bound_min_age", -1),
        ("rejected_bound_min_age", 2.0),
        ("cumulative_check", "yes"),
        ("candidate_max_quanta", -1),
    ],
)
def test_robustness_fields_are_validated(field: str, value) -> None:
    with pytest.raises(
        ConfigError, match=rf"rule_options\['{field}'\]={value!r} of rule 'paper' is invalid"
    ):
        PaperConfig(rule_options={field: value})


def test_reference_clip_accepts_its_string_and_round_trips() -> None:
    cfg = PaperConfig(rule_options={"reference_clip": "zero"})
    assert cfg.rule_options.reference_clip is ReferenceClip.ZERO
    assert AutoLoCoConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert PaperConfig().rule_options.reference_clip is ReferenceClip.CENTRE


# --------------------------------------------------------------- log drift
def test_one_log_drift_function_for_statistics_and_controller() -> None:
    assert log_normalized_drift(math.e**3, math.e) == pytest.approx(1.0)
    for bad in [(0.0, 1.0), (1.0, 0.0), (math.nan, 1.0), (1.0, math.inf), (-1.0, 1.0)]:
        assert math.isnan(log_normalized_drift(*bad))
    stats = interval_statistics(8.0, 1.0, 2, lr_mass=0.5)
    assert stats.log_normalized_drift == log_normalized_drift(4.0, 0.5)


# ----------------------------------------------------------- reference 5.1
@pytest.mark.parametrize("clip, moved", [("centre", 0.2 * (0.5 + 0.2)), ("zero", 0.2 * 0.2)])
def test_reference_clip_centre_follows_the_lag_zero_caps_it(clip: str, moved: float) -> None:
    """A history centred on a steady lag of 0.5: the centred
    clip moves by alpha (c + clip(r - c))."""
    d = Driver(PaperConfig(h_base=500, q_h=50, h_max=750, rule_options={"reference_clip": clip}))
    d.to_monitoring()
    st = d.ctl.state
    st.history_drift = [0.5, 0.5, 0.5]
    out = d.feed(log_d=0.9)  # r = 0.9, c = 0.5, sigma = 0.1: z = 4, moderate
    assert out.assessment == Assessment.MODERATE
    assert st.ref_log_drift == pytest.approx(moved)


# ----------------------------------------------------------- warm-up 5.3.1
SFT_LIKE = PaperConfig(h_base=100, q_h=10, h_min=50, h_max=150)


@pytest.mark.parametrize("warmup", [0, 50])
def test_invalid_first_calibration_interval_reduces(warmup: int) -> None:
    """The interval completing warm-up (or interval 0 without
    one) is no warm-up interval: invalid acts."""
    d = Driver(SFT_LIKE, warmup_steps=warmup)
    out = d.feed(drift_energy=math.nan)
    assert (out.assessment, out.decision) == (Assessment.INVALID, "reduce")
    assert d.ctl.h_accepted == d.ctl.h_tok == 70
    assert d.feed(pseudo_grad_finite=False).decision == "fallback"
    assert d.ctl.h_tok == 50


def test_invalid_during_warmup_keeps_the_horizon_but_arms_the_fallback() -> None:
    d = Driver(SFT_LIKE, warmup_steps=250)
    assert d.feed(mean_loss=math.nan).decision == "keep"  # [0, 100): warm-up
    assert d.ctl.h_tok == 100 and d.ctl.phase == Phase.WARMUP
    assert d.feed(coherence=math.nan).decision == "keep"  # [100, 200): still warm-up
    assert d.feed(drift_energy=math.nan).decision == "fallback"  # [200, 300) completes it
    assert d.ctl.h_tok == 50


def test_finite_warmup_interval_disarms_the_fallback() -> None:
    d = Driver(SFT_LIKE, warmup_steps=250)
    d.feed(mean_loss=math.nan)
    assert d.feed().assessment == Assessment.UNUSED
    assert d.feed(drift_energy=math.nan).decision == "reduce"
    assert d.ctl.h_tok == 70


# ------------------------------------------------------------------ opt-ins
def test_candidate_max_quanta_caps_the_jump() -> None:
    """Flat previews admit H_max at once; the cap admits that many q_H."""
    for cap, expected in [(0, 750), (1, 550), (2, 600)]:
        d = Driver(
            PaperConfig(h_base=500, q_h=50, h_max=750, rule_options={"candidate_max_quanta": cap}),
            preview=flat,
        )
        d.to_monitoring()
        assert d.feed().decision == "propose"
        assert d.ctl.h_tok == expected


def _bound_after_rejection(min_age: int) -> Driver:
    cfg = PaperConfig(
        h_base=500, q_h=50, h_max=750, rule_options={"rejected_bound_min_age": min_age}
    )
    d = Driver(cfg, preview=flat)
    d.to_monitoring()
    d.feed()  # propose 750
    assert d.feed(log_d=MODERATE_R).decision == "reject"
    return d


def test_rejected_bound_min_age_delays_the_lr_mass_release() -> None:
    """With previews already at the release fraction, the bound retires at once, or at min_age."""
    d = _bound_after_rejection(0)
    d.preview = lambda h: 0.5  # the LR mass at the bound has decayed
    d.feed()
    assert d.ctl.state.rejected is None
    d = _bound_after_rejection(4)
    d.preview = lambda h: 0.5
    ages = []
    while d.ctl.state.rejected is not None:
        ages.append(d.ctl.state.rejected.age)
        d.feed()
    assert ages == [0, 1, 2, 3]


def _climb(cfg: AutoLoCoConfig, step_r: float) -> Driver:
    """Every adoption adds ``step_r`` to log d: each candidate reads consistent (z ~ 10 step_r)."""
    d = Driver(cfg)
    d.to_monitoring()
    level = 0.0
    for _ in range(2):
        assert d.feed(log_d=level).decision == "propose"
        level += step_r
        assert d.feed(log_d=level).decision == "continue"
        out = d.feed(log_d=level)
        if out.decision != "adopt":
            return d
        d.feed_many(3, log_d=level)
    return d


def test_cumulative_check_returns_to_the_last_healthy_rung() -> None:
    cfg = PaperConfig(h_base=500, q_h=50, h_max=750, rule_options={"cumulative_check": True})
    d = _climb(cfg, 0.15)  # 500 -> 550 adopted (sum z 1.5), 550 -> 600 sums 3.0 > k_moderate
    last = d.log[-1]
    assert (last.assessment, last.decision) == (Assessment.CUMULATIVE, "reject")
    assert d.ctl.h_accepted == d.ctl.h_tok == 500
    assert d.ctl.state.rejected.h_tok == 600
    assert d.ctl.state.ladder == [[500, 0.0, 0.0]]
    assert d.ctl.phase == Phase.CALIBRATION
    plain = _climb(PaperConfig(h_base=500, q_h=50, h_max=750), 0.15)
    assert plain.ctl.h_accepted == 600  # the spec's one-step comparison adopts both


def test_cumulative_ladder_survives_a_checkpoint_and_resets_on_reduction() -> None:
    cfg = PaperConfig(h_base=500, q_h=50, h_max=750, rule_options={"cumulative_check": True})
    d = _climb(cfg, 0.05)
    assert [rung[0] for rung in d.ctl.state.ladder] == [500, 550, 600]
    copy = PaperRule(cfg)
    copy.load_state_dict(json.loads(json.dumps(d.ctl.state_dict())))
    assert copy.state == d.ctl.state
    d.feed(log_d=10.0)  # severe at the accepted horizon: reduce
    assert d.ctl.state.ladder == []
