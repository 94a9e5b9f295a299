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

With ``descent_drift_guard`` each interval also carries its anchor: the
normalized drift ``d`` after its first ``h_ref`` steps, measured locally by
every worker on the way. A healthy longer horizon lowers ``d`` (the
displacement grows more slowly than the LR mass), so an interval of at least
``1.5 h_base`` whose ``d`` is not below its anchor's is blown up: the horizon
is halved. The guard only reads, so a run it never trips is the unguarded run.

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
from autoloco_hf.algorithm.stats import drift_growth
from autoloco_hf.config import AutoLoCoConfig


@dataclass
class _DescentState:
    h_tok: int
    phase: Phase = Phase.WARMUP
    calibration_logs: list[float] = field(default_factory=list)  # log C_t of the calibration intervals
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
        self.state = _DescentState(h_tok=config.h_max)

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
        if obs.cut_short:
            return self._shorten_start(obs)
        if obs.truncated:
            return self._decision(Assessment.TRUNCATED, Decision.NONE)
        if st.fallback_from is not None:
            return self._hold_after_fallback()
        if obs.coherence <= 0:
            return self._decision(Assessment.NO_DECISION, Decision.NONE)
        if in_warmup:
            return self._decision(Assessment.UNUSED, Decision.KEEP)
        blown_up = self._drift_rise(obs)
        if blown_up is not None:
            return self._halve(blown_up)
        log_coherence = math.log(obs.coherence)
        if st.phase in (Phase.WARMUP, Phase.CALIBRATION):
            return self._calibrate(log_coherence)
        smoothing = cfg.descent_smoothing
        st.smoothed_log_coherence = smoothing * st.smoothed_log_coherence + (1.0 - smoothing) * log_coherence
        assert st.ref_log_coherence is not None
        target = cfg.h_max * math.exp(cfg.descent_gain * (st.smoothed_log_coherence - st.ref_log_coherence))
        shorter = max(cfg.h_min, _floor_to(target, cfg.q_h))
        if shorter < st.h_tok:
            st.h_tok = shorter
            return self._decision(Assessment.MODERATE, Decision.REDUCE, residual=log_coherence - st.ref_log_coherence)
        return self._decision(Assessment.CONSISTENT, Decision.KEEP, residual=log_coherence - st.ref_log_coherence)

    def _drift_rise(self, obs: IntervalObservation) -> float | None:
        """``log d - log d_anchor`` of an interval the drift guard judges blown up, else ``None``.

        Judged only on horizons of at least ``1.5 h_base``: closer to ``h_base`` the expected fall of ``log d``
        is within the noise.
        """
        if not self.cfg.descent_drift_guard or not obs.anchor_lr_mass > 0 or 2 * obs.h_tok < 3 * self.cfg.h_base:
            return None
        fall, _ = drift_growth(obs.drift_energy, obs.lr_mass, obs.anchor_drift_energy, obs.anchor_lr_mass)
        return None if math.isnan(fall) or fall < 0 else fall

    def _halve(self, rise: float) -> ControllerDecision:
        """A blown-up interval halves the horizon and tells nothing about the coherence: calibrate afresh if calibrating."""
        st, cfg = self.state, self.cfg
        shorter = max(cfg.h_min, _floor_to(st.h_tok / 2, cfg.q_h))
        decision = Decision.REDUCE if shorter < st.h_tok else Decision.KEEP
        st.h_tok = shorter
        if st.phase in (Phase.WARMUP, Phase.CALIBRATION):
            st.calibration_logs = []
        return ControllerDecision(st.phase, Assessment.SEVERE, decision, st.h_tok, residual_drift=rise)

    def _shorten_start(self, obs: IntervalObservation) -> ControllerDecision:
        """The start probe cut the run's first interval at ``2 h_ref``: that is the horizon now, unless the guard halves it.

        The cut interval's coherence does not calibrate: it was measured over a shorter interval than the one planned.
        """
        st, cfg = self.state, self.cfg
        st.h_tok = max(cfg.h_min, min(st.h_tok, _floor_to(obs.h_tok, cfg.q_h)))
        blown_up = self._drift_rise(obs)  # 2 h_base may be blown up too
        return self._halve(blown_up) if blown_up is not None else self._decision(Assessment.BENT, Decision.REDUCE)

    def _fall_back(self) -> ControllerDecision:
        """A non-finite interval halves the horizon at once (its outer step was skipped, docs/algorithm.md §4)."""
        st, cfg = self.state, self.cfg
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
        if st.phase != Phase.WARMUP:
            st.phase, st.calibration_logs = Phase.CALIBRATION, []
        return self._decision(Assessment.UNUSED, Decision.ADOPT)

    def _calibrate(self, log_coherence: float) -> ControllerDecision:
        st = self.state
        st.phase = Phase.CALIBRATION
        st.calibration_logs.append(log_coherence)
        if len(st.calibration_logs) >= self.cfg.calibration_intervals:
            mean = math.fsum(st.calibration_logs) / len(st.calibration_logs)
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
        if st.phase != Phase.WARMUP:
            st.phase = Phase.CALIBRATION
            st.calibration_logs = []

    def state_dict(self) -> dict[str, Any]:
        return asdict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        values = dict(state)
        values["phase"] = Phase(values["phase"])
        self.state = _DescentState(**values)


def _floor_to(value: float, multiple: int) -> int:
    """Largest multiple of ``multiple`` not above ``value`` (a ratio that is exact on paper stays exact)."""
    return multiple * math.floor(value / multiple + 1e-9)
