"""Synthetic statistic streams and a closed loop that drives ``AutoLoCoPolicy`` as the engine does.

The stream model (docs/algorithm.md#references-and-residuals, #implementation-readings), in log
space per interval of ``h`` steps starting at step ``s``:

    log d = -A log(h / H_base) + drift * V * s / H_base + blow-up(h, s) + noise
    log C = log C0 + B log(h / H_base) - drift * V/2 * s / H_base - blow-up(h, s) / 2 + noise

* horizon effect: ``log d`` falls and ``log C`` rises with longer horizons
  (``A = 0.5``, ``B = 0.3``: 100 -> 110 moves ``log d`` by -0.048), so a
  healthy candidate reads as increase-supporting;
* drift: ``drift`` times a unit rate ``V = 0.01`` log-units per ``H_base``
  steps, in the adverse direction for both statistics (``log d`` up, ``log C``
  down). The literal reference rule follows at most
  ``alpha * k_moderate * sigma_floor = 0.04`` per interval, i.e. 4x;
* noise: AR(1) (``phi = 0.5``) with marginal standard deviation 0.04 (the
  prototype's interval-to-interval noise), Gaussian or Student-t(3) rescaled to
  the same variance;
* blow-ups above a critical horizon: ``sharp`` adds 1.0 to ``log d`` (severe);
  ``soft`` adds 0.15 per ``q_H`` above it (net of the horizon effect a
  one-quantum step reads z ~ 1: consistent); ``late`` is the sharp one from 60% of the run on;
* NaN intervals: every statistic non-finite, as the engine reports them.

``run_closed_loop`` calls ``policy.next_interval(step)`` at each interval start, runs
``h_step`` steps whose measured LR mass is the schedule's sum over them, and
hands ``policy.complete`` the all-reduced outcome; then advances by ``h_step``.
Pure Python, seeded, milliseconds per run (the benchmark and the tests share it).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from autoloco_hf.algorithm.policies import (
    IntervalOutcome,
    IntervalPolicy,
    NextInterval,
    make_policy,
)
from autoloco_hf.algorithm.rules import Delivery, Measured
from autoloco_hf.algorithm.rules.decisions import Decision
from autoloco_hf.algorithm.schedule import LRSchedule, lr_mass, warmup_cosine
from autoloco_hf.config import RECIPE_SCHEDULES, AutoLoCoConfig, ValueEnum

DRIFT_UNIT = 0.01  # log-units per H_base steps at drift 1x
NOISE_SD = 0.04
AR_PHI = 0.5
HORIZON_D, HORIZON_C = 0.5, 0.3
LOG_C0 = math.log(2.0)
WORKERS = 8
SHARP_JUMP = 1.0
SOFT_PER_QUANTUM = 0.15
LATE_FROM = 0.6
TOKENS_PER_STEP = 1024
PEAK_LR = {"c4": 3e-4, "sft": 2e-5}

# decisions that lower the horizon or restart the reference without a proposal
REDUCTIONS = frozenset({Decision.REDUCE, Decision.FALLBACK, Decision.RECALIBRATE})


class Noise(ValueEnum):
    NONE = "none"
    GAUSSIAN = "gaussian"
    STUDENT_T3 = "student_t3"


class Blowup(ValueEnum):
    NONE = "none"
    SHARP = "sharp"
    SOFT = "soft"
    LATE = "late"


@dataclass(frozen=True)
class Stream:
    """One scenario's statistics as a function of horizon, step and seed."""

    drift: float = 0.0
    noise: Noise = Noise.GAUSSIAN
    blowup: Blowup = Blowup.NONE
    critical: int = 0  # token horizon above which the blow-up acts
    nan_intervals: frozenset = frozenset()  # interval indices whose statistics are non-finite


@dataclass
class Trace:
    """What a closed-loop run executed and decided, interval by interval."""

    h_tok: list[int] = field(default_factory=list)
    h_step: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    assessments: list[str] = field(default_factory=list)

    @property
    def syncs(self) -> int:
        return len(self.h_step)

    def reductions(self, since: int = 0) -> int:
        """Reductions, fallbacks and recalibrations-in-place from interval ``since`` on."""
        return sum(d in REDUCTIONS for d in self.decisions[since:])

    def above(self, critical: int, since_step: int = 0) -> int:
        """Intervals executed above ``critical`` among those starting at ``since_step`` or later."""
        return sum(h > critical and s >= since_step for h, s in zip(self.h_tok, self.start))

    def excess(self, critical: int, q_h: int, since_step: int = 0) -> int:
        """Quanta above ``critical`` summed over those intervals: how far, not only how often."""
        return sum(
            max(h - critical, 0) // q_h for h, s in zip(self.h_tok, self.start) if s >= since_step
        )

    def recovery(self, last_bad: int) -> int:
        """Intervals after interval ``last_bad`` until the controller
        proposes an increase again (the paper rule) or takes a longer horizon
        (the descent rule's return to the horizon the faults interrupted)."""
        for index in range(last_bad + 1, self.syncs):
            if self.decisions[index] in (Decision.PROPOSE, Decision.ADOPT):
                return index - last_bad
        return self.syncs  # never: a deadlock, or the run ended first


def recipe_config(recipe: str, **overrides: Any) -> tuple[AutoLoCoConfig, LRSchedule, int]:
    """The recipe's config, its LR schedule (warm-up then cosine) and warm-up length."""
    plan = RECIPE_SCHEDULES[recipe]
    schedule = warmup_cosine(PEAK_LR[recipe], plan["warmup_steps"], plan["total_steps"])
    return AutoLoCoConfig.for_recipe(recipe, **overrides), schedule, plan["warmup_steps"]


class _Noise:
    def __init__(self, kind: Noise, rng: random.Random) -> None:
        self.kind, self.rng, self.state = kind, rng, 0.0

    def draw(self) -> float:
        if self.kind == Noise.NONE:
            return 0.0
        if self.kind == Noise.GAUSSIAN:
            w = self.rng.gauss(0.0, 1.0)
        else:  # Student-t(3) = Z / sqrt(chi2_3 / 3), variance 3: rescaled to unit variance
            chi2 = sum(self.rng.gauss(0.0, 1.0) ** 2 for _ in range(3))
            w = self.rng.gauss(0.0, 1.0) / math.sqrt(chi2 / 3.0) / math.sqrt(3.0)
        self.state = AR_PHI * self.state + math.sqrt(1.0 - AR_PHI**2) * NOISE_SD * w
        return self.state


def _blowup(stream: Stream, cfg: AutoLoCoConfig, h: int, start: int, total: int) -> float:
    if stream.blowup == Blowup.SHARP or (
        stream.blowup == Blowup.LATE and start >= LATE_FROM * total
    ):
        return SHARP_JUMP if h > stream.critical else 0.0
    if stream.blowup == Blowup.SOFT:
        return SOFT_PER_QUANTUM * max(h - stream.critical, 0) / cfg.q_h
    return 0.0


def _logs(
    stream: Stream, cfg: AutoLoCoConfig, h: int, start: int, total: int, noise: tuple
) -> tuple[float, float]:
    ratio = math.log(h / cfg.h_base)
    drift = stream.drift * DRIFT_UNIT * start / cfg.h_base
    blow = _blowup(stream, cfg, h, start, total)
    log_d = -HORIZON_D * ratio + drift + blow + noise[0].draw()
    log_c = LOG_C0 + HORIZON_C * ratio - drift / 2 - blow / 2 + noise[1].draw()
    return log_d, log_c


def _probed(
    interval: NextInterval,
    policy: IntervalPolicy,
    stream: Stream,
    cfg: AutoLoCoConfig,
    step: int,
    total: int,
    noise: _Noise,
) -> NextInterval:
    """The descent rule's start probe (docs/algorithm.md#descent-rule) on the stream's ``d`` after
    ``1.5 h_ref`` and ``2 h_ref`` steps.

    The stream's ``d`` falls as ``h^-A`` (``p = 2 - A`` = 1.5 at a constant LR), so a probe at 1.85
    cuts every start here: the column then shows what the cut itself costs and saves.
    """
    window = [r.step for r in policy.measurements(interval) if r.delivery == Delivery.SHARED]
    if not window:
        return interval
    drift = stream.drift * DRIFT_UNIT * step / cfg.h_base
    log_d = [
        -HORIZON_D * math.log(k / cfg.h_base)
        + drift
        + _blowup(stream, cfg, k, step, total)
        + noise.draw()
        for k in window
    ]
    masses = [lr_mass(policy.schedule, step, k) for k in window]
    # what the engine's all-reduce would hand the rule: D = d Lambda^2 at each requested step
    measured = tuple(Measured(k, math.exp(d) * m * m, m) for k, d, m in zip(window, log_d, masses))
    return policy.on_measurement(interval, measured)


def run_closed_loop(stream: Stream, seed: int, recipe: str = "sft", **overrides: Any) -> Trace:
    """Drive the recipe's ``AutoLoCoPolicy`` through ``stream`` with the engine's call sequence."""
    cfg, schedule, warmup = recipe_config(recipe, **overrides)
    total = schedule.total_steps
    policy = make_policy(cfg, schedule, total, warmup)
    rng = random.Random(seed)
    noise = (_Noise(stream.noise, rng), _Noise(stream.noise, rng))
    # its own stream: the others' draws stay as they were
    anchor_noise = _Noise(stream.noise, random.Random(seed + 10_000))
    trace, step = Trace(), 0
    while step < total:
        interval = _probed(
            policy.next_interval(step), policy, stream, cfg, step, total, anchor_noise
        )
        mass = lr_mass(schedule, step, interval.h_step)  # what the engine accumulates step by step
        log_d, log_c = _logs(stream, cfg, interval.h_tok, step, total, noise)
        valid = trace.syncs not in stream.nan_intervals
        # the drift guard's anchor: the same model after the
        # interval's first h_ref steps (an H_base interval)
        anchor_mass = (
            lr_mass(schedule, step, interval.h_ref)
            if interval.h_ref < interval.h_step
            else math.nan
        )
        drift = stream.drift * DRIFT_UNIT * step / cfg.h_base
        log_anchor = drift + _blowup(stream, cfg, cfg.h_base, step, total) + anchor_noise.draw()
        decision = policy.complete(
            IntervalOutcome(
                interval=interval,
                global_tokens=TOKENS_PER_STEP * interval.h_step,
                drift_energy=math.exp(log_d) * mass * mass if valid else math.nan,
                coherence=min(math.exp(log_c), WORKERS) if valid else math.nan,
                lr_mass=mass,
                mean_loss=1.0 if valid else math.nan,
                pseudo_grad_finite=valid,
                anchor_drift_energy=math.exp(log_anchor) * anchor_mass * anchor_mass
                if valid
                else math.nan,
                anchor_lr_mass=anchor_mass,
            )
        )
        assert decision is not None
        trace.h_tok.append(interval.h_tok)
        trace.h_step.append(interval.h_step)
        trace.start.append(step)
        trace.decisions.append(decision.decision)
        trace.phases.append(decision.phase)
        trace.assessments.append(decision.assessment)
        step += interval.h_step
    return trace


class Kind(ValueEnum):
    """What a scenario measures."""

    FALSE_ALARM = "false_alarm"  # no blow-up: every reduction is a false one
    BLOWUP = "blowup"  # intervals (and quanta) spent above the critical horizon
    NAN = "nan"  # recovery after the last non-finite interval


@dataclass(frozen=True)
class Scenario:
    stream: Stream
    kind: Kind
    # count intervals above critical only from this fraction of the run on
    from_fraction: float = 0.0
    # NaN scenarios lower h_min so that reductions show (70 -> 80 fits gamma_inc)
    h_min: int | None = None

    def run(self, seed: int, recipe: str = "sft", **overrides: Any) -> Trace:
        if self.h_min is not None:
            overrides.setdefault("h_min", self.h_min)
        return run_closed_loop(self.stream, seed, recipe, **overrides)

    def since_step(self, recipe: str = "sft") -> int:
        """First step at which the blow-up counts (the late
        one appears at ``LATE_FROM`` of the run)."""
        return math.ceil(self.from_fraction * RECIPE_SCHEDULES[recipe]["total_steps"])


def _nan(*indices: int) -> Stream:
    return Stream(nan_intervals=frozenset(indices))


# The issue-11 scenarios on the SFT recipe (H_base 100, q_H 10, H_max 150, 6,490 steps)
SCENARIOS: dict[str, Scenario] = {
    "benign (no noise)": Scenario(Stream(noise=Noise.NONE), Kind.FALSE_ALARM),
    "noise only": Scenario(Stream(), Kind.FALSE_ALARM),
    "drift 1x": Scenario(Stream(drift=1.0), Kind.FALSE_ALARM),
    "drift 3x": Scenario(Stream(drift=3.0), Kind.FALSE_ALARM),
    "drift 4x": Scenario(Stream(drift=4.0), Kind.FALSE_ALARM),
    "drift 8x": Scenario(Stream(drift=8.0), Kind.FALSE_ALARM),
    "drift 12x": Scenario(Stream(drift=12.0), Kind.FALSE_ALARM),
    "student-t(3)": Scenario(Stream(noise=Noise.STUDENT_T3), Kind.FALSE_ALARM),
    "sharp blow-up > 120": Scenario(Stream(blowup=Blowup.SHARP, critical=120), Kind.BLOWUP),
    "soft blow-up > 110": Scenario(Stream(blowup=Blowup.SOFT, critical=110), Kind.BLOWUP),
    "late blow-up > 120": Scenario(
        Stream(blowup=Blowup.LATE, critical=120), Kind.BLOWUP, from_fraction=LATE_FROM
    ),
    "NaN pair at 0": Scenario(_nan(0, 1), Kind.NAN, h_min=70),
    "NaN pair at 20": Scenario(_nan(20, 21), Kind.NAN, h_min=70),
    "NaN x5 at 0": Scenario(_nan(*range(5)), Kind.NAN, h_min=70),
    "NaN x5 at 30": Scenario(_nan(*range(30, 35)), Kind.NAN, h_min=70),
}
