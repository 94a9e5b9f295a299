"""The paper's horizon rule, ``controller="paper"``: a
serializable state machine (docs/algorithm.md#phases).

Plain numbers in, a decision out. After every interval the rule sees the
interval's statistics (``D_t``, ``C_t``, ``Lambda_t``, loss, finiteness) and
chooses the next token-equivalent horizon. Phases (docs/algorithm.md#phases): warm-up ->
calibration -> variability -> monitoring <-> candidate, with reductions and
recalibrations on deviations. Its options are :class:`PaperOptions`.

Example (an always-supporting stream climbs one ``q_H`` at a time)::

    >>> from autoloco_hf.config import AutoLoCoConfig
    >>> ctl = PaperRule(AutoLoCoConfig(h_base=20, q_h=2, h_max=24, controller="paper"),
    ...                         warmup_steps=0)
    >>> step, trace = 0, []
    >>> for _ in range(12):
    ...     h = ctl.h_tok
    ...     obs = IntervalObservation(h_tok=h, start_step=step, end_step=step + h,
    ...                               drift_energy=1.0, coherence=2.0, lr_mass=1.0)
    ...     step += h
    ...     trace.append(h)
    ...     _ = ctl.observe(obs, preview=lambda h_tok: float(h_tok))
    >>> trace
    [20, 20, 20, 20, 20, 20, 22, 22, 22, 22, 22, 24]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from autoloco_hf.algorithm.rules.base import HorizonRule
from autoloco_hf.algorithm.rules.decisions import (
    Assessment,
    Decision,
    IntervalObservation,
    Phase,
    RuleDecision,
)
from autoloco_hf.algorithm.rules.paper_options import PaperOptions
from autoloco_hf.algorithm.stats import log_normalized_drift, robust_centre_scale
from autoloco_hf.config import (
    AutoLoCoConfig,
    ReferenceClip,
)
from autoloco_hf.rule_registry import register_rule


@dataclass
class RejectedBound:
    """A rejected candidate horizon: increases stay below it until it retires
    (docs/algorithm.md#candidate-selection)."""

    h_tok: int
    lr_mass: float | None  # Lambda observed when the bound was created (None if non-finite)
    age: int = 0


@dataclass
class _State:
    h_accepted: int
    h_tok: int
    phase: Phase = Phase.WARMUP
    calibration_needed: int = 2
    calibration_logs: list = field(default_factory=list)  # [(log d, log C)]
    variability_left: int = 3
    ref_log_drift: float | None = None
    ref_log_coherence: float | None = None
    history_drift: list = field(default_factory=list)
    history_coherence: list = field(default_factory=list)
    monitored_ok: int = 0
    moderate_streak: int = 0
    bad_event_pending: bool = False
    candidate_intervals: int = 0
    rejected: RejectedBound | None = None
    # opt-in cumulative check: [h_tok, sum z_D, sum -z_C] per
    # adopted horizon since the last reduction
    ladder: list = field(default_factory=list)


@register_rule
class PaperRule(HorizonRule):
    """docs/algorithm.md#horizon-rule state machine over
    token-equivalent horizons: the rule ``controller="paper"``.

    Args:
        config: the run's :class:`AutoLoCoConfig` (domain;
            its ``rule_options`` are :class:`PaperOptions`).
        warmup_steps: inner-LR warm-up length; intervals ending before
            ``warmup_steps + calibration_delay_steps`` are not used (docs/algorithm.md#warm-up).
    """

    name = "paper"
    Options = PaperOptions

    def __init__(self, config: AutoLoCoConfig, warmup_steps: int = 0) -> None:
        super().__init__(config, warmup_steps)
        options = self.options
        self.state = _State(
            h_accepted=config.h_base,
            h_tok=config.h_base,
            calibration_needed=options.calibration_intervals,
            variability_left=options.variability_intervals,
        )

    # ------------------------------------------------------------------ API
    @property
    def h_tok(self) -> int:
        """Token-equivalent horizon of the next interval."""
        return self.state.h_tok

    @property
    def h_accepted(self) -> int:
        return self.state.h_accepted

    @property
    def phase(self) -> str:
        return self.state.phase

    def observe(self, obs: IntervalObservation, preview: Callable[[int], float]) -> RuleDecision:
        """Assess a completed interval and choose the next horizon.

        ``preview(h_tok)`` must return ``Lambda(s_next, map(h_tok))``, the LR
        mass the interval starting right after this one would carry at horizon
        ``h_tok`` (used by candidate selection and bound retirement).
        """
        st = self.state
        phase = st.phase
        if st.rejected is not None:
            st.rejected.age += 1
        log_drift, log_coherence = self._logs(obs)
        finite = obs.finite

        # intervals ending before warm-up (+ delay) ends; the one
        # completing it already calibrates (docs/algorithm.md#warm-up)
        in_warmup = (
            phase == Phase.WARMUP
            and obs.end_step < self.warmup_steps + self.options.calibration_delay_steps
        )
        if not finite and in_warmup:
            # the recipe horizon is kept through warm-up, but the event arms the fallback
            # (docs/algorithm.md#interval-assessment)
            st.bad_event_pending = True
            decision = self._decision(phase, Assessment.INVALID, Decision.KEEP)
        elif not finite and phase == Phase.CANDIDATE:
            decision = self._reject(
                self._decision(phase, Assessment.INVALID, Decision.REJECT), obs.lr_mass
            )
        elif not finite:
            decision = self._on_invalid_or_severe(phase, Assessment.INVALID, None)
        elif obs.truncated:
            decision = self._decision(phase, Assessment.TRUNCATED, Decision.NONE)
        # Lambda_t = 0 or D_t = 0: treated like truncation
        # (docs/algorithm.md#references-and-residuals)
        elif log_drift is None:
            decision = self._decision(phase, Assessment.NO_DECISION, Decision.NONE)
        elif in_warmup:
            st.bad_event_pending = False  # a finite warm-up interval separates two bad events
            decision = self._decision(phase, Assessment.UNUSED, Decision.KEEP)
        elif phase in (Phase.WARMUP, Phase.CALIBRATION):
            decision = self._calibrate(log_drift, log_coherence)
        elif phase == Phase.VARIABILITY:
            decision = self._variability(log_drift, log_coherence)
        elif phase == Phase.MONITORING:
            decision = self._monitor(log_drift, log_coherence, preview)
        else:
            decision = self._candidate(log_drift, log_coherence, obs.lr_mass)
        self._maybe_retire_bound(preview)
        decision.next_h_tok = st.h_tok
        return decision

    # --------------------------------------------------------------- phases
    def _calibrate(self, log_drift: float, log_coherence: float) -> RuleDecision:
        st = self.state
        st.calibration_logs.append((log_drift, log_coherence))
        st.bad_event_pending = False  # a finite calibration interval counts as consistent
        self._finish_calibration_if_complete()
        return self._decision(Phase.CALIBRATION, Assessment.CONSISTENT, Decision.KEEP)

    def _finish_calibration_if_complete(self) -> None:
        st = self.state
        st.phase = Phase.CALIBRATION
        if len(st.calibration_logs) < st.calibration_needed:
            return
        st.ref_log_drift = math.fsum(d for d, _ in st.calibration_logs) / len(st.calibration_logs)
        st.ref_log_coherence = math.fsum(c for _, c in st.calibration_logs) / len(
            st.calibration_logs
        )
        st.calibration_logs = []
        st.variability_left = self.options.variability_intervals
        st.phase = Phase.VARIABILITY if st.variability_left > 0 else Phase.MONITORING
        st.monitored_ok = 0

    def _variability(self, log_drift: float, log_coherence: float) -> RuleDecision:
        st, _cfg = self.state, self.cfg
        decision = self._assess(Phase.VARIABILITY, log_drift, log_coherence)
        self._update_reference(decision)
        bound = self.options.k_moderate * self.options.sigma_floor
        st.history_drift.append(_clip(decision.residual_drift, bound))
        st.history_coherence.append(_clip(decision.residual_coherence, bound))
        self._trim_history()
        st.bad_event_pending = False
        st.variability_left -= 1
        if st.variability_left <= 0:
            st.phase = Phase.MONITORING
            st.monitored_ok = 0
        decision.decision = Decision.KEEP
        return decision

    def _monitor(
        self, log_drift: float, log_coherence: float, preview: Callable[[int], float]
    ) -> RuleDecision:
        st, _cfg = self.state, self.cfg
        decision = self._assess(Phase.MONITORING, log_drift, log_coherence)
        if decision.assessment == Assessment.SEVERE:
            return self._on_invalid_or_severe(Phase.MONITORING, Assessment.SEVERE, decision)
        self._update_reference(decision)
        if decision.assessment == Assessment.MODERATE:
            st.moderate_streak += 1
            if st.moderate_streak >= self.options.moderate_confirmations:
                return self._reduce(decision, self.options.reduce_moderate)
            decision.decision = Decision.KEEP
            return decision
        # supporting or consistent
        st.moderate_streak = 0
        st.bad_event_pending = False
        st.history_drift.append(decision.residual_drift)
        st.history_coherence.append(decision.residual_coherence)
        self._trim_history()
        st.monitored_ok += 1
        may_increase = st.monitored_ok >= self.options.monitoring_holdoff and (
            decision.assessment == Assessment.SUPPORTING
            or not self.options.increase_requires_support
        )
        candidate = self._select_candidate(preview) if may_increase else None
        if candidate is None:
            decision.decision = Decision.KEEP
        else:
            st.phase, st.h_tok, st.candidate_intervals = Phase.CANDIDATE, candidate, 0
            decision.decision = Decision.PROPOSE
        return decision

    def _candidate(self, log_drift: float, log_coherence: float, lr_mass: float) -> RuleDecision:
        st = self.state
        decision = self._assess(Phase.CANDIDATE, log_drift, log_coherence)
        st.candidate_intervals += 1
        if decision.assessment in (Assessment.MODERATE, Assessment.SEVERE):
            return self._reject(decision, lr_mass)
        if (
            decision.assessment == Assessment.SUPPORTING
            or st.candidate_intervals >= self.options.candidate_max_intervals
        ):
            if self.options.cumulative_check and self._climb_ladder(decision):
                return self._reject(decision, lr_mass)
            # adopt: this interval doubles as the new reference's calibration interval
            st.h_accepted = st.h_tok
            st.moderate_streak = 0
            st.bad_event_pending = False
            self._start_recalibration()
            st.calibration_logs.append((log_drift, log_coherence))
            self._finish_calibration_if_complete()
            decision.decision = Decision.ADOPT
        else:
            decision.decision = Decision.CONTINUE
        return decision

    def _climb_ladder(self, decision: RuleDecision) -> bool:
        """Opt-in cumulative check at an adoption; True when the candidate must be rejected.

        Each adoption adds the candidate's standardized scores to a ladder of
        adopted horizons. Every score is measured against the reference of the
        horizon just below, at nearly the same time, so the sums carry the
        effect of the horizon and not the drift of training. A healthy longer
        horizon scores ``z_D <= 0``, ``z_C >= 0``, so the sums fall as the
        ladder climbs; if they rise since some lower rung to
        ``max(sum z_D, -sum z_C) > k_moderate``, the accepted horizon returns
        to that rung (the one scoring worst) and the candidate becomes the
        rejected bound.
        """
        st, _cfg = self.state, self.cfg
        ladder = st.ladder or [[st.h_accepted, 0.0, 0.0]]
        _, sum_drift, sum_incoherence = ladder[-1]
        top = [st.h_tok, sum_drift + decision.z_drift, sum_incoherence - decision.z_coherence]
        worst, worst_index = self.options.k_moderate, None
        for index, (_, rung_drift, rung_incoherence) in enumerate(ladder):
            score = max(top[1] - rung_drift, top[2] - rung_incoherence)
            if score > worst:
                worst, worst_index = score, index
        if worst_index is None:
            st.ladder = ladder + [top]
            return False
        st.ladder = ladder[: worst_index + 1]
        st.h_accepted = ladder[worst_index][0]
        decision.assessment = Assessment.CUMULATIVE
        return True

    # ------------------------------------------------------------ transitions
    def _reject(self, decision: RuleDecision, lr_mass: float) -> RuleDecision:
        st = self.state
        st.rejected = RejectedBound(
            h_tok=st.h_tok, lr_mass=lr_mass if math.isfinite(lr_mass) else None
        )
        if decision.assessment in (Assessment.SEVERE, Assessment.INVALID):
            st.bad_event_pending = True
        st.h_tok = st.h_accepted
        self._start_recalibration()
        decision.decision = Decision.REJECT
        return decision

    def _on_invalid_or_severe(
        self, phase: str, assessment: str, decision: RuleDecision | None
    ) -> RuleDecision:
        """Severe or invalid: reduce by ``reduce_severe``; the
        second such event in a row falls back to ``h_min``."""
        st, cfg = self.state, self.cfg
        decision = decision or self._decision(phase, assessment, Decision.NONE)
        if st.bad_event_pending:
            st.bad_event_pending = False
            fallback = st.h_accepted != cfg.h_min
            st.h_accepted = st.h_tok = cfg.h_min
            st.ladder = []
            self._start_recalibration()
            decision.decision = Decision.FALLBACK if fallback else Decision.RECALIBRATE
            return decision
        st.bad_event_pending = True
        return self._reduce(decision, self.options.reduce_severe)

    def _reduce(self, decision: RuleDecision, factor: float) -> RuleDecision:
        """docs/algorithm.md#reduction: nearest admissible horizon to ``H_acc / factor`` below
        ``H_acc``; else recalibrate."""
        st = self.state
        target = st.h_accepted / factor
        smaller = [h for h in self._admissible() if h < st.h_accepted]
        if smaller:
            st.h_accepted = st.h_tok = _nearest(smaller, target)
            decision.decision = Decision.REDUCE
        else:
            st.h_tok = st.h_accepted
            decision.decision = Decision.RECALIBRATE
        st.moderate_streak = 0
        st.ladder = []
        self._start_recalibration()
        return decision

    def _start_recalibration(self) -> None:
        st = self.state
        st.phase = Phase.CALIBRATION
        st.calibration_needed = self.options.recalibration_intervals
        st.calibration_logs = []
        st.history_drift, st.history_coherence = [], []
        st.monitored_ok = 0

    def _select_candidate(self, preview: Callable[[int], float]) -> int | None:
        """docs/algorithm.md#candidate-selection: the longest horizon within the LR-mass budget, or
        the geometric midpoint below a bound."""
        st, cfg = self.state, self.cfg
        self._maybe_retire_bound(preview)
        above = [h for h in self._admissible() if h > st.h_accepted]
        if self.options.candidate_max_quanta:  # opt-in: climb at most this many q_H per proposal
            above = [
                h for h in above if h <= st.h_accepted + self.options.candidate_max_quanta * cfg.q_h
            ]
        if st.rejected is not None:
            inside = [h for h in above if h < st.rejected.h_tok]
            if not inside:
                return None
            return _nearest(inside, math.sqrt(st.h_accepted * st.rejected.h_tok))
        # previews grow with the horizon (LR >= 0): bisect for the longest one within budget
        budget = self.options.gamma_inc * preview(st.h_accepted)
        low, high = 0, len(above)  # invariant: above[:low] within budget, above[high:] over it
        while low < high:
            middle = (low + high) // 2
            if preview(above[middle]) <= budget:
                low = middle + 1
            else:
                high = middle
        return above[low - 1] if low else None

    def _maybe_retire_bound(self, preview: Callable[[int], float]) -> None:
        bound = self.state.rejected
        if bound is None:
            return
        too_old = bound.age >= self.options.rejected_bound_max_age
        decayed = (
            bound.age >= self.options.rejected_bound_min_age
            and bound.lr_mass is not None
            and preview(bound.h_tok) <= self.options.rejected_bound_release * bound.lr_mass
        )
        if too_old or decayed:
            self.state.rejected = None

    # ------------------------------------------------------------- helpers
    def _admissible(self) -> list[int]:
        cfg = self.cfg  # h_min is a multiple of q_h (validated by the config)
        return list(range(cfg.h_min, cfg.h_max + 1, cfg.q_h))

    def _logs(self, obs: IntervalObservation) -> tuple[float | None, float | None]:
        """``(log d_t, log(C_t + eps))`` in float64, or ``(None, None)`` when undefined
        (docs/algorithm.md#references-and-residuals)."""
        log_drift = log_normalized_drift(obs.drift_energy, obs.lr_mass)
        if (
            math.isnan(log_drift)
            or not math.isfinite(obs.coherence)
            or obs.coherence + self.cfg.eps <= 0
        ):
            return None, None
        return log_drift, math.log(obs.coherence + self.cfg.eps)

    def _assess(self, phase: str, log_drift: float, log_coherence: float) -> RuleDecision:
        """Residuals, standardized scores and the
        docs/algorithm.md#interval-assessment assessment of a finite interval."""
        st, _cfg = self.state, self.cfg
        r_drift = log_drift - st.ref_log_drift
        r_coherence = log_coherence - st.ref_log_coherence
        c_d, s_d = robust_centre_scale(st.history_drift, self.options.sigma_floor)
        c_c, s_c = robust_centre_scale(st.history_coherence, self.options.sigma_floor)
        z_d, z_c = (r_drift - c_d) / s_d, (r_coherence - c_c) / s_c
        adverse = max(z_d, -z_c)
        if len(st.history_drift) < self.options.min_history:
            assessment = Assessment.CONSISTENT
        elif adverse > self.options.k_severe:
            assessment = Assessment.SEVERE
        elif adverse > self.options.k_moderate:
            assessment = Assessment.MODERATE
        elif z_d <= 0 and z_c >= 0:
            assessment = Assessment.SUPPORTING
        else:
            assessment = Assessment.CONSISTENT
        return RuleDecision(
            phase, assessment, Decision.NONE, st.h_tok, r_drift, r_coherence, z_d, z_c, adverse
        )

    def _update_reference(self, decision: RuleDecision) -> None:
        """Log-space EMA of the reference with a clipped residual
        (docs/algorithm.md#references-and-residuals)."""
        st, _cfg = self.state, self.cfg
        st.ref_log_drift += self.options.ref_ema_alpha * self._clipped_residual(
            decision.residual_drift, st.history_drift
        )
        st.ref_log_coherence += self.options.ref_ema_alpha * self._clipped_residual(
            decision.residual_coherence, st.history_coherence
        )

    def _clipped_residual(self, residual: float, history: list[float]) -> float:
        """``c + clip(r - c, +-k_moderate * sigma)`` (``reference_clip="centre"``) or
        ``clip(r, ...)`` (``"zero"``).

        Around 0 the reference follows at most ``alpha * k_moderate * sigma``
        log-units per interval, so faster drift piles up in the residuals and
        reads as a deviation. Around the robust centre ``c`` (the lag a steady
        drift leaves in the history) it follows drift of any speed while an
        outlier still moves it by at most ``alpha * k_moderate * sigma`` more
        than the lag. ``c`` is taken as 0 while the history is shorter than
        ``min_history`` (a median of one or two residuals is no robust centre).
        """
        centre, scale = robust_centre_scale(history, self.options.sigma_floor)
        if (
            self.options.reference_clip == ReferenceClip.ZERO
            or len(history) < self.options.min_history
        ):
            centre = 0.0
        return centre + _clip(residual - centre, self.options.k_moderate * scale)

    def _trim_history(self) -> None:
        st, size = self.state, self.options.history_size
        st.history_drift = st.history_drift[-size:]
        st.history_coherence = st.history_coherence[-size:]

    def _decision(self, phase: Phase, assessment: Assessment, decision: Decision) -> RuleDecision:
        return RuleDecision(phase, assessment, decision, self.state.h_tok)

    def recalibrate_for_new_workers(self) -> None:
        """Another number of workers from here on:
        re-estimate the reference at the accepted horizon.

        ``C_t`` lies in ``[0, N]`` and its level depends on ``N`` (and ``D_t`` on the
        inner state, which restarts), so the reference and the residual history of
        the old ``N`` say nothing about the new one. A candidate in progress is
        abandoned; warm-up stays warm-up (docs/algorithm.md#boundary-snapshots).
        """
        st = self.state
        st.h_tok = st.h_accepted
        st.moderate_streak = 0
        st.ladder = []
        if st.phase != Phase.WARMUP:
            self._start_recalibration()

    # ------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        state = asdict(self.state)
        state["calibration_logs"] = [list(x) for x in self.state.calibration_logs]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        values = dict(state)
        bound = values.pop("rejected")
        values["calibration_logs"] = [tuple(x) for x in values["calibration_logs"]]
        values["phase"] = Phase(values["phase"])
        self.state = _State(**values, rejected=RejectedBound(**bound) if bound else None)


def _clip(value: float, bound: float) -> float:
    return min(max(value, -bound), bound)


def _nearest(options: list[int], target: float) -> int:
    """The option nearest to ``target``; ties break toward the larger horizon
    (docs/algorithm.md#phases)."""
    return min(options, key=lambda h: (abs(h - target), -h))
