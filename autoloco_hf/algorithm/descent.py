"""The descent rule: start at the long end of the horizon domain, shorten as the workers' agreement fades (docs/algorithm.md §5.6).

Measured on this repository's frontier (docs/controller.md, "Why the paper
rule loses"): raising the horizon during a run costs validation loss that a
fixed horizon does not pay, while lowering it does not cost, and a run that
starts long and then shortens ends below the fixed-horizon curve. So this rule
never raises the horizon on the coherence (only back to where a non-finite
interval interrupted it, once the faults stop). It starts at ``h_max`` and follows the coherence
``C_t``: once calibrated on the first intervals after warm-up, the next
horizon is

    H_next = min( H_t, floor_q( h_max * exp(k (s_t - r)) ) ),   clipped to [h_min, h_max]

with ``s_t`` an exponential moving average of ``log C_t``, ``r`` the mean
``log C`` of the calibration intervals and ``k`` = ``descent_gain`` (1). Workers whose pseudo-gradients agree
keep a long horizon; as they decorrelate (late training, heterogeneous data)
the rule synchronizes more often.

With ``descent_drift_guard`` the rule first measures the normalized drift
``log d`` at ``h_base`` (the anchor), then probes ``h_max``: a longer horizon
must show a smaller ``d`` than ``h_base`` did (on the frontier's runs it is
1.2-1.6 log-units smaller), else it is halved and probed again. Once monitored,
an interval whose ``log d`` rises more than ``descent_guard_margin`` above its
reference halves the horizon too. A horizon above which training blows up is
thus left within a few intervals, where the coherence alone would keep it.

Example (coherence halves: the horizon halves, and never comes back up)::

    >>> from autoloco_hf.config import AutoLoCoConfig, Controller
    >>> cfg = AutoLoCoConfig(h_base=10, q_h=1, controller=Controller.DESCENT, descent_smoothing=0.0)
    >>> ctl, step, trace = DescentController(cfg), 0, []
    >>> for coherence in (2.0, 2.0, 2.0, 1.5, 1.0, 2.0):
    ...     h = ctl.h_tok
    ...     obs = IntervalObservation(h_tok=h, start_step=step, end_step=step + h,
    ...                               drift_energy=1.0, coherence=coherence, lr_mass=1.0)
    ...     step += h
    ...     trace.append(h)
    ...     _ = ctl.observe(obs, preview=lambda h_tok: float(h_tok))
    >>> trace + [ctl.h_tok]
    [40, 40, 40, 40, 30, 20, 20]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from autoloco_hf.algorithm.controller import (
    Assessment,
    ControllerDecision,
    Decision,
    IntervalObservation,
    Phase,
)
from autoloco_hf.algorithm.stats import log_normalized_drift
from autoloco_hf.config import AutoLoCoConfig


@dataclass
class _DescentState:
    h_tok: int
    phase: Phase = Phase.WARMUP
    calibration_logs: list[float] = field(default_factory=list)  # log C_t of the calibration intervals
    drift_logs: list[float] = field(default_factory=list)  # log d_t of the anchor or calibration intervals
    anchor_log_drift: float | None = None  # drift guard: mean log d_t at h_base
    drift_slope: float = 0.0  # drift guard: d log d / d log H from the anchor to the first accepted horizon
    ref_log_drift: float | None = None  # drift guard: reference log d_t at the horizon in force
    ref_log_coherence: float | None = None  # r, re-based so that the horizon in force is the target
    smoothed_log_coherence: float | None = None  # s_t
    fallback_from: int | None = None  # the horizon a run of non-finite intervals interrupted (halved since)
    finite_since_fallback: int = 0
    restored: bool = False  # back at fallback_from, not yet recalibrated: a fault now halves what it restores to


class DescentController:
    """A horizon that starts at ``h_max`` and only shortens, following ``C_t`` (docs/algorithm.md §5.6).

    Same interface as :class:`~autoloco_hf.algorithm.controller.HorizonController`.
    """

    def __init__(self, config: AutoLoCoConfig, warmup_steps: int = 0) -> None:
        self.cfg = config
        self.warmup_steps = warmup_steps
        anchored = config.descent_drift_guard and config.h_max > config.h_base
        self.state = _DescentState(h_tok=config.h_base if anchored else config.h_max)

    @property
    def h_tok(self) -> int:
        return self.state.h_tok

    @property
    def h_accepted(self) -> int:
        return self.state.h_tok

    @property
    def phase(self) -> Phase:
        return self.state.phase

    def observe(self, obs: IntervalObservation, preview: Callable[[int], float]) -> ControllerDecision:
        """Assess a completed interval and choose the next horizon (``preview`` is unused: the rule does not look ahead)."""
        st, cfg = self.state, self.cfg
        in_warmup = st.phase == Phase.WARMUP and obs.end_step < self.warmup_steps + cfg.calibration_delay_steps
        if not obs.finite:
            return self._fall_back()
        if obs.truncated:
            return self._decision(Assessment.TRUNCATED, Decision.NONE)
        if st.fallback_from is not None:
            return self._hold_after_fallback()
        log_drift = log_normalized_drift(obs.drift_energy, obs.lr_mass)
        if obs.coherence <= 0 or (cfg.descent_drift_guard and math.isnan(log_drift)):
            return self._decision(Assessment.NO_DECISION, Decision.NONE)
        if in_warmup:
            return self._decision(Assessment.UNUSED, Decision.KEEP)
        log_coherence = math.log(obs.coherence)
        if st.phase in (Phase.WARMUP, Phase.ANCHOR) and self._anchoring:
            return self._anchor(log_drift)
        if st.phase == Phase.CANDIDATE:
            return self._probe(log_drift, log_coherence)
        if st.phase in (Phase.WARMUP, Phase.CALIBRATION):
            return self._calibrate(log_coherence, log_drift)
        smoothing = cfg.descent_smoothing
        if cfg.descent_drift_guard:
            assert st.ref_log_drift is not None
            residual_drift = log_drift - st.ref_log_drift
            if residual_drift > cfg.descent_guard_margin:  # a blow-up: this interval does not move the reference
                return self._halve(Assessment.SEVERE, residual_drift, floor=cfg.h_min)
            st.ref_log_drift += (1.0 - smoothing) * residual_drift
        st.smoothed_log_coherence = smoothing * st.smoothed_log_coherence + (1.0 - smoothing) * log_coherence
        assert st.ref_log_coherence is not None
        target = cfg.h_max * math.exp(cfg.descent_gain * (st.smoothed_log_coherence - st.ref_log_coherence))
        shorter = max(cfg.h_min, _floor_to(target, cfg.q_h))
        if shorter < st.h_tok:
            self._shorten_to(shorter)
            return self._decision(Assessment.MODERATE, Decision.REDUCE, residual=log_coherence - st.ref_log_coherence)
        return self._decision(Assessment.CONSISTENT, Decision.KEEP, residual=log_coherence - st.ref_log_coherence)

    @property
    def _anchoring(self) -> bool:
        return self.cfg.descent_drift_guard and self.state.anchor_log_drift is None and self.cfg.h_max > self.cfg.h_base

    def _anchor(self, log_drift: float) -> ControllerDecision:
        """Measure ``log d`` at ``h_base``, then probe ``h_max``."""
        st = self.state
        st.phase = Phase.ANCHOR
        st.drift_logs.append(log_drift)
        if len(st.drift_logs) < self.cfg.calibration_intervals:
            return self._decision(Assessment.CONSISTENT, Decision.KEEP)
        st.anchor_log_drift, st.drift_logs = math.fsum(st.drift_logs) / len(st.drift_logs), []
        st.h_tok, st.phase = self.cfg.h_max, Phase.CANDIDATE
        return self._decision(Assessment.CONSISTENT, Decision.PROPOSE)

    def _probe(self, log_drift: float, log_coherence: float) -> ControllerDecision:
        """A longer horizon must lower ``d`` below the anchor's; the first one that does is calibrated."""
        st, cfg = self.state, self.cfg
        assert st.anchor_log_drift is not None
        residual = log_drift - st.anchor_log_drift
        if residual >= 0:
            return self._halve(Assessment.SEVERE, residual, floor=cfg.h_base)
        st.drift_slope = max(residual / math.log(st.h_tok / cfg.h_base), -2.0)
        st.phase = Phase.CALIBRATION  # the accepted probe is the first calibration interval
        return self._calibrate(log_coherence, log_drift)

    def _halve(self, assessment: Assessment, residual_drift: float, floor: int) -> ControllerDecision:
        """The drift guard tripped: halve the horizon (a probe that reaches ``h_base`` calibrates there)."""
        st, cfg = self.state, self.cfg
        shorter = max(floor, _floor_to(st.h_tok / 2, cfg.q_h))
        decision = Decision.REDUCE if shorter < st.h_tok else Decision.KEEP
        self._shorten_to(shorter)
        if st.phase == Phase.CANDIDATE and shorter <= cfg.h_base:
            st.phase, st.drift_slope = Phase.CALIBRATION, 0.0
        return ControllerDecision(st.phase, assessment, decision, st.h_tok, residual_drift=residual_drift)

    def _shorten_to(self, h_tok: int) -> None:
        """A shorter horizon moves the drift reference by the measured slope (``d`` grows as ``H`` shrinks)."""
        st = self.state
        if st.ref_log_drift is not None:
            st.ref_log_drift += st.drift_slope * math.log(h_tok / st.h_tok)
        st.h_tok = h_tok

    def _fall_back(self) -> ControllerDecision:
        """A non-finite interval halves the horizon at once (its outer step was skipped, docs/algorithm.md §4).

        A probed horizon that fails is left like one that trips the drift guard.
        """
        st, cfg = self.state, self.cfg
        if st.phase == Phase.CANDIDATE:
            return self._halve(Assessment.INVALID, math.nan, floor=cfg.h_base)
        if st.restored:  # the restored horizon failed again: restore only half of it next time
            st.fallback_from, st.restored = max(cfg.h_min, _floor_to(st.h_tok / 2, cfg.q_h)), False
        elif st.fallback_from is None:
            st.fallback_from = st.h_tok
        st.finite_since_fallback = 0
        shorter = max(cfg.h_min, _floor_to(st.h_tok / 2, cfg.q_h))
        decision = Decision.FALLBACK if shorter < st.h_tok else Decision.KEEP
        st.h_tok = shorter
        return self._decision(Assessment.INVALID, decision)

    def _hold_after_fallback(self) -> ControllerDecision:
        """After ``calibration_intervals`` finite intervals, return to the interrupted horizon and calibrate there.

        A fault is not a coherence signal, so the shorter horizon it forced is not kept (the only lengthening the
        rule makes); the hold's intervals do not enter ``s_t``.
        """
        st, cfg = self.state, self.cfg
        st.finite_since_fallback += 1
        if st.finite_since_fallback < cfg.calibration_intervals:
            return self._decision(Assessment.UNUSED, Decision.KEEP)
        assert st.fallback_from is not None
        st.h_tok, st.fallback_from, st.finite_since_fallback, st.restored = st.fallback_from, None, 0, True
        if st.phase == Phase.ANCHOR:
            st.drift_logs = []
        elif st.phase != Phase.WARMUP:
            st.phase, st.calibration_logs, st.drift_logs = Phase.CALIBRATION, [], []
        return self._decision(Assessment.UNUSED, Decision.ADOPT)

    def _calibrate(self, log_coherence: float, log_drift: float) -> ControllerDecision:
        st = self.state
        st.phase = Phase.CALIBRATION
        st.calibration_logs.append(log_coherence)
        st.drift_logs.append(log_drift)
        if len(st.calibration_logs) >= self.cfg.calibration_intervals:
            mean = math.fsum(st.calibration_logs) / len(st.calibration_logs)
            if self.cfg.descent_drift_guard:
                st.ref_log_drift = math.fsum(st.drift_logs) / len(st.drift_logs)
            st.drift_logs = []
            # re-based so that the target equals the horizon in force (h_max at the start)
            st.ref_log_coherence = mean - math.log(st.h_tok / self.cfg.h_max) / self.cfg.descent_gain
            st.smoothed_log_coherence = mean
            st.calibration_logs = []
            st.phase = Phase.MONITORING
            st.restored = False
        return self._decision(Assessment.CONSISTENT, Decision.KEEP)

    def _decision(
        self, assessment: Assessment, decision: Decision, residual: float | None = None
    ) -> ControllerDecision:
        return ControllerDecision(self.state.phase, assessment, decision, self.state.h_tok, residual_coherence=residual)

    def recalibrate_for_new_workers(self) -> None:
        """``C_t``'s level depends on N: calibrate again at the horizon in force (docs/algorithm.md §8.5)."""
        st = self.state
        if st.phase in (Phase.CALIBRATION, Phase.MONITORING):  # the anchor and probes do not read C_t
            st.phase = Phase.CALIBRATION
            st.calibration_logs, st.drift_logs = [], []

    def state_dict(self) -> dict[str, Any]:
        return asdict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        values = dict(state)
        values["phase"] = Phase(values["phase"])
        self.state = _DescentState(**values)


def _floor_to(value: float, multiple: int) -> int:
    """Largest multiple of ``multiple`` not above ``value`` (a ratio that is exact on paper stays exact)."""
    return multiple * math.floor(value / multiple + 1e-9)
