"""Interval policies behind one interface: fixed (DiLoCo), QSR, Linear Interval, AutoLoCo
(docs/algorithm.md#baselines).

A policy answers two questions: how long is the interval that starts at step
``s`` (:meth:`IntervalPolicy.next_interval`), and what does a completed interval teach
it (:meth:`IntervalPolicy.complete`). All policies are pure and serializable.

Example::

    >>> p = LinearIntervalPolicy(increment=10, total_steps=100)
    >>> [p.next_interval(s).h_step for s in (0, 10, 30, 60)]
    [10, 20, 30, 40]
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from autoloco_hf.algorithm.rules import DisplacementAt, HorizonRule, Measured
from autoloco_hf.algorithm.rules.decisions import (
    Assessment,
    Decision,
    IntervalObservation,
    RuleDecision,
)
from autoloco_hf.algorithm.schedule import LRSchedule, lr_mass
from autoloco_hf.algorithm.token_mapper import TokenMapper
from autoloco_hf.config import AutoLoCoConfig, Method


@dataclass
class NextInterval:
    """The interval that starts at `start_step`: its length and LR-mass previews, identical on all
    workers (docs/algorithm.md#phases)."""

    start_step: int
    h_tok: int  # token-equivalent horizon
    h_step: int  # executable steps (after mapping and truncation)
    h_ref: int  # steps of one base token interval at the current density
    truncated: bool  # cut to the remaining budget: takes no decision
    lr_mass: float  # preview Lambda(s, h_step)
    lr_mass_base: float  # preview Lambda(s, h_ref)
    # lengthened so that a delayed merge lands inside it: takes no decision either
    stretched: bool = False
    # ended early by the rule's on_measurement (docs/algorithm.md#rule-plugins)
    cut_short: bool = False
    # what the rule's in-interval probe measured, for the
    # record (docs/algorithm.md#descent-rule, #rule-plugins)
    probe_exponent: float | None = None


@dataclass
class IntervalOutcome:
    """All-reduced facts about a completed interval."""

    interval: NextInterval
    global_tokens: int
    drift_energy: float
    coherence: float
    lr_mass: float  # measured Lambda_t
    mean_loss: float
    pseudo_grad_finite: bool
    # D at the rule's BOUNDARY displacement request (docs/algorithm.md#rule-plugins)
    anchor_drift_energy: float = math.nan
    anchor_lr_mass: float = math.nan

    def observation(self, end_step: int) -> IntervalObservation:
        """What the rule sees of it; ``end_step``: where the interval its decision sets starts."""
        interval = self.interval
        return IntervalObservation(
            h_tok=interval.h_tok,
            start_step=interval.start_step,
            end_step=end_step,
            drift_energy=self.drift_energy,
            coherence=self.coherence,
            lr_mass=self.lr_mass,
            mean_loss=self.mean_loss,
            pseudo_grad_finite=self.pseudo_grad_finite,
            # it did not run the length h_tok maps to
            truncated=interval.truncated or interval.stretched,
            anchor_drift_energy=self.anchor_drift_energy,
            anchor_lr_mass=self.anchor_lr_mass,
            cut_short=interval.cut_short,
        )


class IntervalPolicy(ABC):
    """Chooses interval lengths. Subclasses implement :meth:`_length`."""

    def __init__(self, schedule: LRSchedule, total_steps: int, h_base: int) -> None:
        self.schedule = schedule
        self.total_steps = total_steps
        self.h_base = h_base

    def next_interval(self, start_step: int, min_steps: int = 1) -> NextInterval:
        """The interval from ``start_step``; at least ``min_steps``
        long (in whole quanta) unless the budget ends first.

        ``min_steps`` > 1 comes from a delayed merge due ``min_steps - 1`` steps
        into this interval (docs/algorithm.md#delayed-merge).
        """
        h_tok, wanted = self._length(start_step)
        stretched = wanted < min_steps
        if stretched:
            wanted = -(-min_steps // self.quantum) * self.quantum
        h_ref = self._reference_steps()
        h_step = min(wanted, self.total_steps - start_step)
        return NextInterval(
            start_step=start_step,
            h_tok=h_tok,
            h_step=h_step,
            h_ref=h_ref,
            truncated=h_step < wanted,
            lr_mass=lr_mass(self.schedule, start_step, h_step),
            lr_mass_base=lr_mass(self.schedule, start_step, h_ref),
            stretched=stretched,
        )

    quantum = 1  # executable lengths are multiples of this (AutoLoCo: q_h)

    def measurements(self, interval: NextInterval) -> tuple[DisplacementAt, ...]:
        """What the engine measures inside ``interval`` for the horizon rule
        (docs/algorithm.md#rule-plugins); none by default."""
        return ()

    def on_measurement(self, interval: NextInterval, results: tuple[Measured, ...]) -> NextInterval:
        """The interval to run on once the shared measurements are in
        (docs/algorithm.md#rule-plugins); unchanged by default."""
        return interval

    def complete(
        self, outcome: IntervalOutcome, next_start: int | None = None
    ) -> RuleDecision | None:
        """Learn from a completed interval; adaptive policies return their decision.

        ``next_start``: the start of the interval the decision sets, when that is
        not the one right after ``outcome`` (eager overlap, docs/algorithm.md#overlap-checkpoints).
        """
        return None

    # B027: N-independent policies keep this no-op
    def rescale_workers(self, old_workers: int, new_workers: int) -> None:  # noqa: B027
        """Another number of workers continues the run (elastic resume,
        docs/algorithm.md#boundary-snapshots)."""

    @abstractmethod
    def _length(self, start_step: int) -> tuple[int, int]:
        """``(h_tok, wanted executable steps)`` of the interval starting at ``start_step``."""

    def _reference_steps(self) -> int:
        return self.h_base

    def state_dict(self) -> dict[str, Any]:
        return {}

    # B027: stateless policies keep this no-op
    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027
        pass


class FixedPolicy(IntervalPolicy):
    """DiLoCo: every interval has ``h_base`` steps."""

    def _length(self, start_step: int) -> tuple[int, int]:
        return self.h_base, self.h_base


class QSRPolicy(IntervalPolicy):
    """Quadratic Synchronization Rule (Gu et al., 2024; docs/algorithm.md#baselines).

    ``H = max(H_base, floor((alpha / eta_in(s))**gamma))`` at the interval
    start; intervals starting inside the warm-up keep ``H_base``.
    """

    def __init__(
        self,
        schedule: LRSchedule,
        total_steps: int,
        h_base: int,
        alpha: float,
        gamma: float,
        warmup_steps: int,
    ) -> None:
        super().__init__(schedule, total_steps, h_base)
        self.alpha, self.gamma, self.warmup_steps = alpha, gamma, warmup_steps

    def _length(self, start_step: int) -> tuple[int, int]:
        if start_step < self.warmup_steps:
            return self.h_base, self.h_base
        lr = self.schedule.lr_at(start_step)
        if lr <= 0:
            length = self.total_steps
        else:
            length = max(self.h_base, math.floor((self.alpha / lr) ** self.gamma))
        length = min(length, self.total_steps)
        return length, length


class LinearIntervalPolicy(IntervalPolicy):
    """Linear Interval: the k-th interval has ``increment * k`` steps
    (docs/algorithm.md#baselines)."""

    def __init__(
        self, increment: int, total_steps: int, schedule: LRSchedule | None = None
    ) -> None:
        from autoloco_hf.algorithm.schedule import FunctionSchedule

        super().__init__(
            schedule or FunctionSchedule(lambda s: 0.0, total_steps), total_steps, increment
        )
        self.increment = increment

    def _length(self, start_step: int) -> tuple[int, int]:
        # k is derived from the start step so that next_interval() is idempotent
        k, covered = 1, 0
        while covered + self.increment * k <= start_step:
            covered += self.increment * k
            k += 1
        length = self.increment * k
        return length, length

    def _reference_steps(self) -> int:
        return self.increment


class AutoLoCoPolicy(IntervalPolicy):
    """AutoLoCo: the horizon rule (docs/algorithm.md#horizon-rule) over token-equivalent horizons,
    token mapper (docs/algorithm.md#token-mapper)."""

    def __init__(
        self, config: AutoLoCoConfig, schedule: LRSchedule, total_steps: int, warmup_steps: int
    ) -> None:
        super().__init__(schedule, total_steps, config.h_base)
        self.config = config
        self.quantum = config.q_h
        self.rule = make_rule(config, warmup_steps)
        self.mapper = TokenMapper(
            config.h_base,
            config.q_h,
            calibration_intervals=config.token_calibration_intervals,
            beta=config.token_ema_beta,
            enabled=config.map_tokens,
        )

    def _length(self, start_step: int) -> tuple[int, int]:
        h_tok = self.rule.h_tok if self.config.adaptive_horizon else self.h_base
        return h_tok, self.mapper.map(h_tok)

    def _reference_steps(self) -> int:
        return self.mapper.map(self.h_base)

    def measurements(self, interval: NextInterval) -> tuple[DisplacementAt, ...]:
        return self.rule.measurements(interval) if self.config.adaptive_horizon else ()

    def on_measurement(self, interval: NextInterval, results: tuple[Measured, ...]) -> NextInterval:
        """The rule's answer; an interval it shortened gets the LR mass of its new length."""
        answer = self.rule.on_measurement(interval, results)
        if answer.h_step != interval.h_step:
            answer = replace(
                answer, lr_mass=lr_mass(self.schedule, interval.start_step, answer.h_step)
            )
        return answer

    def complete(
        self, outcome: IntervalOutcome, next_start: int | None = None
    ) -> RuleDecision | None:
        """Observe a completed interval; ``next_start`` (lagged
        decisions) is where the interval it decides starts.

        With the eager overlap the statistics of interval ``t`` arrive when
        interval ``t + 1`` has already run, and the decision sets interval
        ``t + 2`` (``next_start``). An interval that ran a horizon the
        controller has replaced since it was planned says nothing about the
        current horizon: if finite it is marked ``stale`` and not fed to the
        controller; a non-finite one still takes the invalid path
        (docs/algorithm.md#overlap-checkpoints).
        """
        interval = outcome.interval
        full = not interval.truncated
        # a rule that starts away from h_base calibrates the
        # base token count on its first full intervals
        calibrates = interval.h_tok == self.h_base or self.rule.calibrates_tokens_at_any_horizon
        self.mapper.observe(outcome.global_tokens, interval.h_step, calibrates=full and calibrates)
        if not self.config.adaptive_horizon:
            return None
        lagged = next_start is not None
        if next_start is None:
            next_start = interval.start_step + interval.h_step
        observation = outcome.observation(next_start)
        if lagged and observation.finite and interval.h_tok != self.rule.h_tok:
            return RuleDecision(self.rule.phase, Assessment.STALE, Decision.KEEP, self.rule.h_tok)
        # candidate previews use the mapper updated with this interval
        # (docs/algorithm.md#token-mapper, last bullets)
        return self.rule.observe(
            observation,
            preview=lambda h_tok: lr_mass(self.schedule, next_start, self.mapper.map(h_tok)),
        )

    def rescale_workers(self, old_workers: int, new_workers: int) -> None:
        self.mapper.rescale_workers(old_workers, new_workers)
        self.rule.recalibrate_for_new_workers()

    def state_dict(self) -> dict[str, Any]:
        # "controller": the key of checkpoints written before the horizon rule had its name
        return {"controller": self.rule.state_dict(), "mapper": self.mapper.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rule.load_state_dict(state["controller"])
        self.mapper.load_state_dict(state["mapper"])


PolicyFactory = Callable[[AutoLoCoConfig, LRSchedule, int, int], IntervalPolicy]
"""``(config, schedule, total_steps, warmup_steps) -> policy``: how an engine gets its interval
policy (:func:`make_policy`, or an experiment's own, e.g. the open-loop schedules of
``benchmarks/campaigns/switch_cost.py``)."""


def make_rule(config: AutoLoCoConfig, warmup_steps: int) -> HorizonRule:
    """The horizon rule registered as ``config.controller`` (docs/algorithm.md#rule-plugins)."""
    return config.rule_class(config, warmup_steps=warmup_steps)


def make_policy(
    config: AutoLoCoConfig, schedule: LRSchedule, total_steps: int, warmup_steps: int
) -> IntervalPolicy:
    """The interval policy of ``config.method`` (not defined for DDP, which has no intervals); the
    engine's default :data:`PolicyFactory`."""
    if config.method == Method.DILOCO:
        return FixedPolicy(schedule, total_steps, config.h_base)
    if config.method == Method.AUTOLOCO:
        return AutoLoCoPolicy(config, schedule, total_steps, warmup_steps)
    if config.method == Method.LINEAR:
        return LinearIntervalPolicy(config.linear_increment, total_steps, schedule)
    if config.method == Method.QSR:
        alpha = config.qsr_alpha
        if alpha is None:
            peak = max(
                schedule.lr_at(s) for s in range(0, min(total_steps, max(warmup_steps, 0) + 1))
            )
            alpha = math.sqrt(config.h_base) * peak
        return QSRPolicy(
            schedule, total_steps, config.h_base, alpha, config.qsr_gamma, warmup_steps
        )
    raise ValueError(
        f"method {config.method!r} has no interval policy (DDP synchronizes every step)"
    )
