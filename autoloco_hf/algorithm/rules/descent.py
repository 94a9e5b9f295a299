"""The descent rule: start at the long end of the horizon domain, shorten as the workers' agreement
fades (docs/algorithm.md#descent-rule).

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
``log C`` of the calibration intervals and ``k`` = ``gain`` (0.9). Workers
whose pseudo-gradients agree keep a long horizon; as they decorrelate
(late training, heterogeneous data) the rule synchronizes more often.

With ``drift_guard`` each interval also carries its anchor: the
normalized drift ``d`` after its first ``h_ref`` steps, measured locally by
every worker on the way. A healthy longer horizon lowers ``d`` (the
displacement grows more slowly than the LR mass), so an interval of at least
``1.5 h_base`` whose ``d`` is not below its anchor's is blown up: the horizon
is halved. The guard only reads, so a run it never trips is the unguarded run.
It does not judge an interval that ends in warm-up (+ ``calibration_delay_steps``),
the hold after a fault (until the rule is back at the interrupted horizon), a
truncated interval or one with ``C_t <= 0``: those keep the horizon, blown up or not.

Example (the coherence halves: the horizon about halves,
``20 * 0.5**0.9`` = 10.7 floored to 10, and never comes back up)::

    >>> from autoloco_hf.config import AutoLoCoConfig
    >>> cfg = AutoLoCoConfig(
    ...     h_base=10, q_h=1, controller="descent", rule_options={"smoothing": 0.0}
    ... )
    >>> ctl, step, trace = DescentRule(cfg), 0, []
    >>> for coherence in (2.0, 2.0, 2.0, 1.5, 1.0, 2.0):
    ...     h = ctl.h_tok
    ...     obs = IntervalObservation(h_tok=h, start_step=step, end_step=step + h,
    ...                               drift_energy=1.0, coherence=coherence, lr_mass=1.0)
    ...     step += h
    ...     trace.append(h)
    ...     _ = ctl.observe(obs, preview=lambda h_tok: float(h_tok))
    >>> trace + [ctl.h_tok]
    [20, 20, 20, 20, 15, 10, 10]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from autoloco_hf.algorithm.rules.base import (
    Delivery,
    DisplacementAt,
    HorizonRule,
    Measured,
)
from autoloco_hf.algorithm.rules.decisions import (
    Assessment,
    Decision,
    IntervalObservation,
    Phase,
    RuleDecision,
)
from autoloco_hf.algorithm.stats import drift_exponent, drift_growth
from autoloco_hf.config import (
    COUNT,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    AutoLoCoConfig,
    Overlap,
    Range,
    option,
)
from autoloco_hf.rule_registry import RuleError, register_rule

if TYPE_CHECKING:
    from autoloco_hf.algorithm.policies import NextInterval


@dataclass
class DescentOptions:
    """Options of the descent rule (``AutoLoCoConfig(controller="descent", rule_options=...)``)."""

    smoothing: float = option(
        0.5,
        "EMA factor of `log C_t`: 0 follows each interval (docs/algorithm.md#descent-rule).",
        FRACTION,
    )
    gain: float = option(
        0.9,
        """Exponent `k` of the coherence ratio, `H = h_max (C / C_ref)^k`: below 1 the
        horizon shortens more slowly than the coherence falls (docs/algorithm.md#descent-rule).""",
        POSITIVE,
    )
    drift_guard: bool | None = option(
        None,
        """Each worker also measures its displacement after the interval's first `h_ref` steps
        (local, no collective); an interval of at least `1.5 h_base` whose normalized
        drift `d_t` does not fall below the anchor's halves the horizon, the guard
        against a horizon that blows up (docs/algorithm.md#descent-rule). Intervals in
        warm-up and in the hold after a fault are not judged. Unset: on, except with
        the eager overlap, where the anchor is not the interval's displacement.""",
    )
    start_probe: float | None = option(
        None,
        """The run's first interval, if longer than `2 h_ref`, is probed on the way. Every
        worker measures its displacement at `1.5 h_ref` and `2 h_ref` steps; one small
        all-reduce of those squared norms gives the drift exponent `p` of `D ~ Lambda^p`.
        Below this value (1.85 measured: 1.94-2.02 where a long start is cheap, 1.66-1.73
        where it costs) the interval ends at `2 h_ref` and the horizon becomes `2 h_base`:
        a start too long for the run is caught before its first sync (docs/algorithm.md
        docs/algorithm.md#descent-rule). Unset: no probe, no extra collective.""",
        Range(0.0, 2.0, low_open=True),
    )
    calibration_delay_steps: int = option(
        0,
        "Extra steps after warm-up before the first calibration interval "
        "(docs/algorithm.md#warm-up).",
        NON_NEGATIVE,
    )
    calibration_intervals: int = option(
        2,
        "Intervals that set the reference levels at the start "
        "(docs/algorithm.md#reference-calibration).",
        COUNT,
    )


@dataclass
class _DescentState:
    h_tok: int
    phase: Phase = Phase.WARMUP
    # log C_t of the calibration intervals
    calibration_logs: list[float] = field(default_factory=list)
    ref_log_coherence: float | None = None  # r, re-based so that the horizon in force is the target
    smoothed_log_coherence: float | None = None  # s_t
    # the horizon a run of non-finite intervals interrupted (halved since)
    fallback_from: int | None = None
    finite_since_fallback: int = 0
    # back at fallback_from, not yet recalibrated: a fault now halves what it restores to
    restored: bool = False


@register_rule
class DescentRule(HorizonRule):
    """A horizon that starts at ``h_max`` and only shortens, following ``C_t``
    (docs/algorithm.md#descent-rule)."""

    name = "descent"
    Options = DescentOptions
    # it starts there (4 saves more syncs in regimes A and B and costs in C: docs/changelog.md)
    h_max_factor = 2
    # the best fixed outer momentum of the tuned baseline (docs/results.md)
    base_outer_momentum = 0.5
    # its first full intervals, at h_max, calibrate the token mapper
    calibrates_tokens_at_any_horizon = True

    def __init__(self, config: AutoLoCoConfig, warmup_steps: int = 0) -> None:
        super().__init__(config, warmup_steps)
        self.state = _DescentState(h_tok=config.h_max)
        guard = self.options.drift_guard
        self.guarded = guard if guard is not None else config.overlap != Overlap.EAGER

    @classmethod
    def check_config(cls, config: AutoLoCoConfig) -> None:
        """The start probe ends an interval early and the anchor is a
        displacement from ``theta_t``: refuse what cannot follow."""
        options = config.rule_options
        if options.start_probe is not None and (
            config.overlap != Overlap.NONE or config.fragments > 1
        ):
            setting = (
                f"overlap={config.overlap}"
                if config.overlap != Overlap.NONE
                else f"fragments={config.fragments}"
            )
            raise RuleError(
                f"rule_options['start_probe']={options.start_probe!r} of rule 'descent' is "
                f"invalid: the probe ends an interval early, which {setting} cannot follow: use "
                "overlap='none' and fragments=1, or unset start_probe"
            )
        if options.drift_guard is True and config.overlap == Overlap.EAGER:
            raise RuleError(
                "rule_options['drift_guard']=True of rule 'descent' is invalid: the eager "
                "overlap's workers start from their own points, so the guard's anchor would not "
                "be the interval's displacement: use overlap='delayed' or drift_guard=False"
            )

    @property
    def h_tok(self) -> int:
        return self.state.h_tok

    def measurements(self, interval: NextInterval) -> tuple[DisplacementAt, ...]:
        """The drift guard's anchor after ``h_ref`` steps, and
        the start probe's window on the run's first interval."""
        requests = []
        if self.guarded and interval.h_ref < interval.h_step:
            requests.append(DisplacementAt(interval.h_ref))
        window = self._start_probe_window(interval)
        if window is not None:
            requests += [DisplacementAt(step, Delivery.SHARED) for step in window]
        return tuple(requests)

    def _start_probe_window(self, interval: NextInterval) -> tuple[int, int] | None:
        """``(1.5 h_ref, 2 h_ref)`` for the run's first
        interval, if it is full and longer than ``2 h_ref``.

        The first only: after the first sync the paths bend in every regime (the second interval at
        ``4 H_base`` measured 1.43 and 1.56 on seed 0 of regimes A and B, where a long start is
        cheap), so a later probe would cut the runs it should leave alone
        (docs/algorithm.md#descent-rule).
        """
        plain = not (interval.truncated or interval.stretched or interval.cut_short)
        first = interval.start_step == 0
        if not (
            self.options.start_probe is not None
            and plain
            and first
            and interval.h_step > 2 * interval.h_ref
        ):
            return None
        return 3 * interval.h_ref // 2, 2 * interval.h_ref

    def on_measurement(self, interval: NextInterval, results: tuple[Measured, ...]) -> NextInterval:
        """The start probe's exponent ``p`` of ``D ~ Lambda^p``;
        below ``start_probe`` the paths bent: end at ``2 h_ref``."""
        before, now = results
        exponent = drift_exponent(
            *drift_growth(now.sq_norm_sum, now.lr_mass, before.sq_norm_sum, before.lr_mass)
        )
        probed = replace(interval, probe_exponent=exponent)
        if not exponent < self.options.start_probe:
            return probed
        return replace(probed, h_tok=2 * self.cfg.h_base, h_step=2 * interval.h_ref, cut_short=True)

    @property
    def phase(self) -> Phase:
        return self.state.phase

    def observe(self, obs: IntervalObservation, preview: Callable[[int], float]) -> RuleDecision:
        """Assess a completed interval and choose the next horizon
        (``preview`` is unused: the rule does not look ahead)."""
        st, cfg, options = self.state, self.cfg, self.options
        in_warmup = (
            st.phase == Phase.WARMUP
            and obs.end_step < self.warmup_steps + options.calibration_delay_steps
        )
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
        smoothing = options.smoothing
        st.smoothed_log_coherence = (
            smoothing * st.smoothed_log_coherence + (1.0 - smoothing) * log_coherence
        )
        assert st.ref_log_coherence is not None
        target = cfg.h_max * math.exp(
            options.gain * (st.smoothed_log_coherence - st.ref_log_coherence)
        )
        shorter = max(cfg.h_min, _floor_to(target, cfg.q_h))
        if shorter < st.h_tok:
            st.h_tok = shorter
            return self._decision(
                Assessment.MODERATE, Decision.REDUCE, residual=log_coherence - st.ref_log_coherence
            )
        return self._decision(
            Assessment.CONSISTENT, Decision.KEEP, residual=log_coherence - st.ref_log_coherence
        )

    def _drift_rise(self, obs: IntervalObservation) -> float | None:
        """``log d - log d_anchor`` of an interval the drift guard judges blown up, else ``None``.

        Judged only on horizons of at least ``1.5 h_base``: closer to ``h_base`` the expected fall
        of ``log d`` is within the noise. :meth:`observe` does not ask at all in warm-up, in the
        hold after a fault, or for a truncated interval or one with ``C_t <= 0``.
        """
        if not self.guarded or not obs.anchor_lr_mass > 0 or 2 * obs.h_tok < 3 * self.cfg.h_base:
            return None
        fall, _ = drift_growth(
            obs.drift_energy, obs.lr_mass, obs.anchor_drift_energy, obs.anchor_lr_mass
        )
        return None if math.isnan(fall) or fall < 0 else fall

    def _halve(self, rise: float) -> RuleDecision:
        """A blown-up interval halves the horizon and tells nothing
        about the coherence: calibrate afresh if calibrating."""
        st, cfg = self.state, self.cfg
        shorter = max(cfg.h_min, _floor_to(st.h_tok / 2, cfg.q_h))
        decision = Decision.REDUCE if shorter < st.h_tok else Decision.KEEP
        st.h_tok = shorter
        if st.phase in (Phase.WARMUP, Phase.CALIBRATION):
            st.calibration_logs = []
        return RuleDecision(st.phase, Assessment.SEVERE, decision, st.h_tok, residual_drift=rise)

    def _shorten_start(self, obs: IntervalObservation) -> RuleDecision:
        """The start probe cut the run's first interval at ``2 h_ref``:
        that is the horizon now, unless the guard halves it.

        The cut interval's coherence does not calibrate: it was
        measured over a shorter interval than the one planned.
        """
        st, cfg = self.state, self.cfg
        st.h_tok = max(cfg.h_min, min(st.h_tok, _floor_to(obs.h_tok, cfg.q_h)))
        blown_up = self._drift_rise(obs)  # 2 h_base may be blown up too
        return (
            self._halve(blown_up)
            if blown_up is not None
            else self._decision(Assessment.BENT, Decision.REDUCE)
        )

    def _fall_back(self) -> RuleDecision:
        """A non-finite interval halves the horizon at once (its outer step was skipped,
        docs/algorithm.md#outer-correction)."""
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

    def _hold_after_fallback(self) -> RuleDecision:
        """After ``calibration_intervals`` finite intervals,
        return to the interrupted horizon and calibrate there.

        A fault is not a coherence signal, so the shorter horizon it forced is not kept (the only
        lengthening the rule makes); the hold's intervals do not enter ``s_t``.
        """
        st, _cfg = self.state, self.cfg
        st.finite_since_fallback += 1
        if st.finite_since_fallback < self.options.calibration_intervals:
            return self._decision(Assessment.UNUSED, Decision.KEEP)
        assert st.fallback_from is not None
        st.h_tok, st.fallback_from, st.finite_since_fallback, st.restored = (
            st.fallback_from,
            None,
            0,
            True,
        )
        if st.phase != Phase.WARMUP:
            st.phase, st.calibration_logs = Phase.CALIBRATION, []
        return self._decision(Assessment.UNUSED, Decision.ADOPT)

    def _calibrate(self, log_coherence: float) -> RuleDecision:
        st = self.state
        st.phase = Phase.CALIBRATION
        st.calibration_logs.append(log_coherence)
        if len(st.calibration_logs) >= self.options.calibration_intervals:
            mean = math.fsum(st.calibration_logs) / len(st.calibration_logs)
            # re-based so that the target equals the horizon in force (h_max at the start)
            st.ref_log_coherence = mean - math.log(st.h_tok / self.cfg.h_max) / self.options.gain
            st.smoothed_log_coherence = mean
            st.calibration_logs = []
            st.phase = Phase.MONITORING
            st.restored = False
        return self._decision(Assessment.CONSISTENT, Decision.KEEP)

    def _decision(
        self, assessment: Assessment, decision: Decision, residual: float | None = None
    ) -> RuleDecision:
        return RuleDecision(
            self.state.phase, assessment, decision, self.state.h_tok, residual_coherence=residual
        )

    def recalibrate_for_new_workers(self) -> None:
        """``C_t``'s level depends on N: calibrate again at the horizon in force
        (docs/algorithm.md#boundary-snapshots)."""
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
    """Largest multiple of ``multiple`` not above ``value``
    (a ratio that is exact on paper stays exact)."""
    return multiple * math.floor(value / multiple + 1e-9)
