"""Typed configuration of every AutoLoCo constant (spec sections 2-8).

One dataclass, :class:`AutoLoCoConfig`, holds the method, the horizon domain, the
outer optimizer, the controller thresholds and the communication settings. Every
field is validated when the object is built, so a typo fails before any machine
is rented. Defaults are the spec's; fields marked *[reconstruction]* are choices
the spec had to make where the paper lost its equations.

Example::

    >>> from autoloco_hf import AutoLoCoConfig
    >>> cfg = AutoLoCoConfig(method="autoloco", h_base=500)
    >>> cfg.q_h, cfg.h_min, cfg.h_max, cfg.outer_momentum
    (50, 500, 750, 0.7)
    >>> AutoLoCoConfig.for_recipe("sft").normalize_pseudo_grad
    True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import Enum
from typing import Any


class ValueEnum(str, Enum):
    """A ``str`` enum that prints as its value, so records, JSON and messages show ``"diloco"``."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)


class Method(ValueEnum):
    """How workers synchronize: every step (DDP) or at interval boundaries chosen by a policy."""

    DDP = "ddp"
    DILOCO = "diloco"
    AUTOLOCO = "autoloco"
    QSR = "qsr"
    LINEAR = "linear"


class WireDtype(ValueEnum):
    """Format of the pseudo-gradient on the wire."""

    FP32 = "fp32"
    BF16 = "bf16"
    INT8 = "int8"

    @property
    def bytes_per_element(self) -> int:
        return {"fp32": 4, "bf16": 2, "int8": 1}[self.value]


class ReferenceClip(ValueEnum):
    """How the reference EMA clips a residual before the update (docs/algorithm.md §5.1)."""

    CENTRE = "centre"  # clip r - c around the history's robust centre c: follows drift of any speed
    ZERO = "zero"  # clip r around 0 (the paper's literal rule): follows drift by <= alpha * k_moderate * sigma


class Overlap(ValueEnum):
    """Whether the outer collective blocks the workers or runs behind the next inner steps (docs/algorithm.md §11)."""

    NONE = "none"  # blocking: every worker waits for the average at each boundary
    DELAYED = "delayed"  # Streaming-DiLoCo merge of the outer result overlap_steps inner steps later
    EAGER = "eager"  # eager update from each worker's own fresh pseudo-gradient; the average lands one interval later


METHODS = tuple(m.value for m in Method)
WIRE_DTYPES = tuple(w.value for w in WireDtype)
OVERLAPS = tuple(o.value for o in Overlap)

# Recipe presets: the paper's two settings (docs/algorithm.md §1, 5.4). Budgets are what the
# `plan` command previews; training code reads the budget from the trainer.
RECIPES: dict[str, dict[str, Any]] = {
    "c4": dict(h_base=500, q_h=50, h_max=750, normalize_pseudo_grad=False),
    "sft": dict(h_base=100, q_h=10, h_max=150, normalize_pseudo_grad=True),
}
RECIPE_SCHEDULES: dict[str, dict[str, Any]] = {
    "c4": dict(total_steps=50_000, warmup_steps=1_000, schedule="cosine"),
    "sft": dict(total_steps=6_490, warmup_steps=65, schedule="cosine"),
}


_SWITCHES = (
    "adjust_momentum",
    "scale_outer_lr",
    "normalize_pseudo_grad",
    "adaptive_horizon",
    "map_tokens",
    "increase_requires_support",
    "error_feedback",
    "outer_on_cpu",
    "hierarchical_sync",
)


class ConfigError(ValueError):
    """A configuration field has an invalid value; the message names field and fix."""


def _fail(name: str, value: Any, fix: str) -> None:
    raise ConfigError(f"AutoLoCoConfig.{name}={value!r} is invalid: {fix}")


@dataclass
class AutoLoCoConfig:
    """All settings of a low-communication run.

    Args:
        method (`str`, defaults to `"autoloco"`):
            One of `ddp` (gradient all-reduce every step), `diloco` (fixed
            horizon, Nesterov outer step), `autoloco` (adaptive horizon and
            corrected outer step), `qsr` and `linear` (interval baselines with
            direct model averaging). docs/algorithm.md §6.
        h_base (`int`, defaults to 500):
            Recipe horizon in optimizer steps: DiLoCo's fixed `H`, AutoLoCo's
            starting and reference horizon (docs/algorithm.md §1).
        q_h (`int`, *optional*):
            Horizon granularity in steps; `h_base` must be a multiple of it.
            Defaults to `h_base // 10`, or the largest divisor of `h_base`
            below that (docs/algorithm.md §1).
        h_min (`int`, *optional*):
            Lower end of the token-equivalent horizon domain; defaults to `h_base`.
        h_max (`int`, *optional*):
            Upper end of the domain; defaults to `1.5 * h_base` rounded down to a
            multiple of `q_h`.
        outer_lr (`float`, defaults to 0.7):
            Base outer learning rate `eta_base^out` (docs/algorithm.md §4, 6).
        outer_momentum (`float`, *optional*):
            Base Nesterov momentum `mu_base`. Defaults to 0.9 for `diloco` (the
            paper's baseline) and 0.7 for `autoloco` (docs/algorithm.md §4). Set 0.7 with
            `diloco` for the fair comparator of docs/algorithm.md §6.
        mu_min (`float`, defaults to 0.5), mu_max (`float`, defaults to 0.9):
            Clip range of the retained momentum `mu_t = mu_base ** rho_t` (docs/algorithm.md §4).
        kappa_max (`float`, defaults to 1.5):
            Bound on the outer-step scale `kappa_t` *[reconstruction]* (docs/algorithm.md §4).
        eps (`float`, defaults to 1e-8):
            Epsilon of the ratios `C_t`, `d_t`, `rho_t`, normalization (docs/algorithm.md §2, 4).
        adjust_momentum (`bool`, defaults to `True`):
            Momentum retention switch (docs/algorithm.md §4); off gives `mu_t = mu_base`.
        scale_outer_lr (`bool`, defaults to `True`):
            Bounded outer-step scaling switch (docs/algorithm.md §4); off gives `eta_t = outer_lr`.
        normalize_pseudo_grad (`bool`, defaults to `False`):
            Divide the mean pseudo-gradient by `rho_t` (docs/algorithm.md §4); on for SFT.
        adaptive_horizon (`bool`, defaults to `True`):
            For `autoloco`, run the horizon controller; off keeps `h_base` (with
            all three switches off this is DiLoCo, docs/algorithm.md §4 "special case").
        map_tokens (`bool`, defaults to `True`):
            For `autoloco`, map token-equivalent horizons to steps with the
            observed token density (docs/algorithm.md §3); off executes `H_step = H_tok`.
        token_calibration_intervals (`int`, defaults to 3):
            Recipe-horizon intervals whose global token counts give `M_base` (docs/algorithm.md §3).
        token_ema_beta (`float`, defaults to 0.9):
            EMA factor of the tokens-per-step estimate (docs/algorithm.md §3).
        warmup_steps (`int`, *optional*):
            Inner-LR warm-up length; the controller keeps `h_base` until it ends
            (docs/algorithm.md §5.3.1). The integrations read it from the trainer when unset.
        calibration_delay_steps (`int`, defaults to 0):
            Extra steps after warm-up before the first calibration interval (docs/algorithm.md §5.3.1).
        calibration_intervals (`int`, defaults to 2):
            Intervals that set the reference levels at the start (docs/algorithm.md §5.3.2).
        recalibration_intervals (`int`, defaults to 1):
            Calibration intervals after a reduction, adoption or return (docs/algorithm.md §5.3.2).
        variability_intervals (`int`, defaults to 3):
            Intervals that fill the residual history after calibration (docs/algorithm.md §5.3.3).
        monitoring_holdoff (`int`, defaults to 1):
            Monitored intervals that must be consistent with the reference before
            an increase may be proposed (docs/algorithm.md §5.3.4).
        ref_ema_alpha (`float`, defaults to 0.2):
            Log-space EMA factor of the reference levels *[reconstruction]* (docs/algorithm.md §5.1).
        history_size (`int`, defaults to 16):
            Residuals kept per family (docs/algorithm.md §5.1).
        sigma_floor (`float`, defaults to 0.10):
            Floor of the robust residual scale *[reconstruction]* (docs/algorithm.md §5.1).
        k_moderate (`float`, defaults to 2.0), k_severe (`float`, defaults to 4.0):
            Adverse-score thresholds of moderate and severe deviations (docs/algorithm.md §5.2).
        min_history (`int`, defaults to 3):
            Residuals needed before moderate and severe can be assessed (docs/algorithm.md §5.2).
        candidate_max_intervals (`int`, defaults to 2):
            Intervals a candidate may run while consistent before it is adopted (docs/algorithm.md §5.3.6).
        moderate_confirmations (`int`, defaults to 2):
            Consecutive moderate deviations that trigger a reduction (docs/algorithm.md §5.3.4).
        reduce_moderate (`float`, defaults to 1.2), reduce_severe (`float`, defaults to 1.5):
            Reduction factors (docs/algorithm.md §5.3.4, 5.3.7).
        gamma_inc (`float`, defaults to 1.15):
            Candidate LR-mass budget relative to the accepted horizon (docs/algorithm.md §5.3.5).
        rejected_bound_release (`float`, defaults to 0.90):
            A rejected bound retires when its LR-mass preview falls to this
            fraction of the LR mass observed at its creation (docs/algorithm.md §5.3.5).
        rejected_bound_max_age (`int`, defaults to 20):
            ... or after this many intervals (docs/algorithm.md §5.3.5).
        increase_requires_support (`bool`, defaults to `False`):
            docs/algorithm.md §5.3.4 proposes an increase after a supporting *or* consistent
            monitored interval; `True` proposes only after a supporting one.
        qsr_alpha (`float`, *optional*):
            QSR's `alpha`; defaults to `sqrt(h_base) * eta_peak` (docs/algorithm.md §6).
        qsr_gamma (`float`, defaults to 2.0):
            QSR's exponent (docs/algorithm.md §6).
        linear_increment (`int`, defaults to 10):
            Linear Interval's `a` in `H_k = a * k` (docs/algorithm.md §6).
        wire_dtype (`str`, defaults to `"fp32"`):
            Pseudo-gradient wire format: `fp32`, `bf16` or `int8` (docs/algorithm.md §7).
        int8_block_size (`int`, defaults to 4096):
            Elements per INT8 block (docs/algorithm.md §7).
        error_feedback (`bool`, defaults to `False`):
            Carry the codec's residual to the next interval (costs one FP32
            model copy per worker). Not in the paper.
        outer_on_cpu (`bool`, defaults to `False`):
            Keep the FP32 outer parameters and momentum in host memory.
        bucket_size_mb (`float`, defaults to 64):
            Size of one all-reduce bucket of the flat pseudo-gradient.
        ranks_per_worker (`int`, defaults to 1):
            Ranks forming one worker (inner DDP inside, docs/algorithm.md §8.3).
        reference_clip (`str`, defaults to `"centre"`):
            Reference EMA update (docs/algorithm.md §5.1): `centre` moves the reference by
            `ref_ema_alpha * (c + clip(r - c, +-k_moderate * sigma))`, `c` the
            robust centre of the residual history (0 while it holds fewer than
            `min_history` residuals), so the reference follows drift of any
            speed; `zero` is the literal rule `ref_ema_alpha * clip(r, ...)`,
            which follows at most `ref_ema_alpha * k_moderate * sigma` per
            interval and reads faster drift as deviations.
        rejected_bound_min_age (`int`, defaults to 0):
            Beyond the paper, opt-in. A rejected bound retires on LR-mass decay
            (`rejected_bound_release`) only once it is at least this many
            intervals old, so a sharp blow-up is probed at most once per this
            many intervals; 0 is the spec's rule. `rejected_bound_max_age`
            still retires it.
        cumulative_check (`bool`, defaults to `False`):
            Beyond the paper, opt-in. At each adoption, add the candidate's
            standardized scores to a ladder of adopted horizons (reset by a
            reduction) and compare the new horizon with every lower rung: if
            `max(sum z_D, -sum z_C) > k_moderate` summed over the adoptions
            since some rung, return to that rung and make the candidate the
            rejected bound. Catches a slow blow-up that each one-step
            comparison reads as consistent.
        candidate_max_quanta (`int`, defaults to 0):
            Beyond the paper, opt-in. A candidate lies at most this many `q_h`
            above the accepted horizon (0: no cap, the spec's rule), so a
            budget that admits `h_max` late in training climbs step by step.
        hierarchical_sync (`bool`, defaults to `True`):
            With `ranks_per_worker = R > 1`, rank `r` of a worker owns shard `r`
            of the flat model: it syncs only that 1/R shard with the other
            workers and keeps the outer parameters and momentum of that shard
            only; the worker then all-gathers the shards over its fast link.
            Each node sends every byte across the slow link once instead of R
            times. `False`: every rank syncs the whole model (R copies per node).
        sync_timeout_s (`float`, defaults to 600):
            Upper bound, in seconds, on every collective AutoLoCo issues (the
            outer synchronization, the start-up broadcast, and the per-step
            gradient average inside a worker group). AutoLoCo runs them on its
            own process groups created with this timeout, so a dead or
            partitioned peer stops every survivor after at most this long with
            an error naming the step, the interval and the rank that did not
            answer, instead of waiting for `TrainingArguments.ddp_timeout`
            (30 minutes by default). Keep it above the slowest worker's lag at
            a boundary (see docs/reliability.md).
        max_consecutive_invalid (`int`, defaults to 3):
            Consecutive intervals with a non-finite loss or pseudo-gradient on
            any worker after which the run stops with an error (each one skips
            the outer step and restarts from the last synchronized parameters,
            docs/algorithm.md §5.2); the last checkpoint written before them stays intact.
        overlap (`str`, defaults to `"none"`):
            `none` blocks every worker at a boundary until the average arrives
            (the paper). `delayed` starts the collective asynchronously, trains
            on from the local replica and merges the outer result
            `overlap_steps` inner steps later with mixing factor `overlap_mix`
            (Streaming DiLoCo). `eager` lets the collective run behind the whole
            next interval: each worker starts it from an outer step that uses its
            own fresh pseudo-gradient in place of its stale contribution, and the
            horizon controller decides one interval later. docs/algorithm.md §11.
            Not in the paper.
        overlap_steps (`int`, defaults to 1):
            `delayed`: inner steps between a boundary and the merge of its outer
            result (`tau`); must be shorter than the shortest interval (`q_h`
            with the token mapper, `h_min` with `map_tokens=False`). Set it to
            at least one sync's duration in inner steps to hide the sync (see
            docs/results_overlap.md). `0` with `overlap_mix=0` is the blocking
            algorithm.
        overlap_mix (`float`, defaults to 0.5):
            `delayed`: weight `alpha` of the local replica in the merge
            `x <- alpha x + (1 - alpha) theta` (Streaming DiLoCo's mixing factor;
            0 replaces the replica by the outer parameters).
    """

    method: Method = Method.AUTOLOCO
    h_base: int = 500
    q_h: int | None = None
    h_min: int | None = None
    h_max: int | None = None
    outer_lr: float = 0.7
    outer_momentum: float | None = None
    mu_min: float = 0.5
    mu_max: float = 0.9
    kappa_max: float = 1.5
    eps: float = 1e-8
    adjust_momentum: bool = True
    scale_outer_lr: bool = True
    normalize_pseudo_grad: bool = False
    adaptive_horizon: bool = True
    map_tokens: bool = True
    token_calibration_intervals: int = 3
    token_ema_beta: float = 0.9
    warmup_steps: int | None = None
    calibration_delay_steps: int = 0
    calibration_intervals: int = 2
    recalibration_intervals: int = 1
    variability_intervals: int = 3
    monitoring_holdoff: int = 1
    ref_ema_alpha: float = 0.2
    history_size: int = 16
    sigma_floor: float = 0.10
    k_moderate: float = 2.0
    k_severe: float = 4.0
    min_history: int = 3
    candidate_max_intervals: int = 2
    moderate_confirmations: int = 2
    reduce_moderate: float = 1.2
    reduce_severe: float = 1.5
    gamma_inc: float = 1.15
    rejected_bound_release: float = 0.90
    rejected_bound_max_age: int = 20
    increase_requires_support: bool = False
    qsr_alpha: float | None = None
    qsr_gamma: float = 2.0
    linear_increment: int = 10
    wire_dtype: WireDtype = WireDtype.FP32
    int8_block_size: int = 4096
    error_feedback: bool = False
    outer_on_cpu: bool = False
    bucket_size_mb: float = 64.0
    ranks_per_worker: int = 1
    # --- controller robustness (issue 11) ---
    reference_clip: ReferenceClip = ReferenceClip.CENTRE
    rejected_bound_min_age: int = 0
    cumulative_check: bool = False
    candidate_max_quanta: int = 0
    hierarchical_sync: bool = True
    # --- reliability (issue 10) ---
    sync_timeout_s: float = 600.0
    max_consecutive_invalid: int = 3
    # --- overlap (issue 15) ---
    overlap: Overlap = Overlap.NONE
    overlap_steps: int = 1
    overlap_mix: float = 0.5

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            _fail("method", self.method, f"use one of {', '.join(METHODS)}")
        self.method = Method(self.method)
        for name in _SWITCHES:  # a string such as "false" would otherwise silently turn a switch on
            if not isinstance(getattr(self, name), bool):
                _fail(name, getattr(self, name), "pass True or False")
        self._check_int("h_base", 1)
        if self.q_h is None:  # h_base / 10, or the largest divisor of h_base below it
            self.q_h = next(q for q in range(max(1, self.h_base // 10), 0, -1) if self.h_base % q == 0)
        self._check_int("q_h", 1)
        if self.h_base % self.q_h:  # else the token mapper rounds H_base itself away (docs/algorithm.md §3)
            _fail("q_h", self.q_h, f"h_base={self.h_base} must be a multiple of it")
        if self.h_min is None:
            self.h_min = self.h_base
        if self.h_max is None:
            self.h_max = max(self.h_base, (int(1.5 * self.h_base) // self.q_h) * self.q_h)
        self._check_int("h_min", 1)
        self._check_int("h_max", 1)
        if self.h_min % self.q_h:  # else a reduction or fallback executes a horizon off the grid
            nearest = max(self.h_min // self.q_h, 1) * self.q_h
            _fail("h_min", self.h_min, f"it must be a multiple of q_h={self.q_h} (e.g. h_min={nearest})")
        if self.h_min > self.h_base:
            _fail("h_min", self.h_min, f"it must not exceed h_base={self.h_base} (h_min <= h_base <= h_max)")
        if self.h_max < self.h_base:
            _fail("h_max", self.h_max, f"it must be at least h_base={self.h_base} (h_min <= h_base <= h_max)")
        if self.outer_momentum is None:
            self.outer_momentum = 0.9 if self.method == Method.DILOCO else 0.7
        self._check_float("outer_lr", 0.0, math.inf, low_open=True)
        self._check_float("outer_momentum", 0.0, 1.0, high_open=True)
        self._check_float("mu_min", 0.0, 1.0, high_open=True)
        self._check_float("mu_max", 0.0, 1.0, high_open=True)
        if self.mu_min > self.mu_max:
            _fail("mu_min", self.mu_min, f"it must not exceed mu_max={self.mu_max}")
        if self.method == Method.AUTOLOCO and not self.mu_min <= self.outer_momentum <= self.mu_max:
            _fail(
                "outer_momentum",
                self.outer_momentum,
                f"AutoLoCo needs mu_min <= outer_momentum <= mu_max = [{self.mu_min}, {self.mu_max}] (docs/algorithm.md §4)",
            )
        self._check_float("kappa_max", 1.0, math.inf)
        self._check_float("eps", 0.0, 1.0, low_open=True)
        self._check_float("token_ema_beta", 0.0, 1.0, high_open=True)
        self._check_int("token_calibration_intervals", 1)
        if self.warmup_steps is not None:
            self._check_int("warmup_steps", 0)
        self._check_int("calibration_delay_steps", 0)
        self._check_int("calibration_intervals", 1)
        self._check_int("recalibration_intervals", 1)
        self._check_int("variability_intervals", 0)
        self._check_int("monitoring_holdoff", 1)
        self._check_float("ref_ema_alpha", 0.0, 1.0)
        self._check_int("history_size", 1)
        self._check_float("sigma_floor", 0.0, math.inf, low_open=True)
        self._check_float("k_moderate", 0.0, math.inf, low_open=True)
        if self.k_severe < self.k_moderate:
            _fail("k_severe", self.k_severe, f"it must be >= k_moderate={self.k_moderate}")
        self._check_int("min_history", 1)
        if self.min_history > self.history_size:
            _fail("min_history", self.min_history, f"it must not exceed history_size={self.history_size}")
        self._check_int("candidate_max_intervals", 1)
        self._check_int("moderate_confirmations", 1)
        self._check_float("reduce_moderate", 1.0, math.inf, low_open=True)
        self._check_float("reduce_severe", 1.0, math.inf, low_open=True)
        self._check_float("gamma_inc", 1.0, math.inf)
        self._check_float("rejected_bound_release", 0.0, 1.0, low_open=True)
        self._check_int("rejected_bound_max_age", 1)
        if self.qsr_alpha is not None:
            self._check_float("qsr_alpha", 0.0, math.inf, low_open=True)
        self._check_float("qsr_gamma", 0.0, math.inf, low_open=True)
        self._check_int("linear_increment", 1)
        if self.wire_dtype not in WIRE_DTYPES:
            _fail("wire_dtype", self.wire_dtype, f"use one of {', '.join(WIRE_DTYPES)}")
        self.wire_dtype = WireDtype(self.wire_dtype)
        self._check_int("int8_block_size", 1)
        if self.error_feedback and self.wire_dtype == WireDtype.FP32:
            _fail("error_feedback", True, "it only applies to a lossy wire: set wire_dtype='bf16' or 'int8'")
        self._check_float("bucket_size_mb", 0.0, math.inf, low_open=True)
        self._check_int("ranks_per_worker", 1)
        if (
            self.ranks_per_worker > 1
            and not self.hierarchical_sync
            and self.map_tokens
            and self.method == Method.AUTOLOCO
        ):
            # each outer group would count only its own ranks' tokens and could map them to another horizon
            # than the worker's other groups, splitting the worker (docs/algorithm.md §8.3)
            _fail(
                "hierarchical_sync",
                False,
                "with ranks_per_worker > 1 only the hierarchical layout sums the token counts over the worker: "
                "keep hierarchical_sync=True or set map_tokens=False",
            )
        self._check_controller_robustness()
        # --- reliability (issue 10) ---
        self._check_float("sync_timeout_s", 0.0, math.inf, low_open=True)
        self._check_int("max_consecutive_invalid", 1)
        self._check_overlap()

    def _check_overlap(self) -> None:
        """Overlap needs intervals, an exact wire without a residual, and a merge due before the next boundary."""
        if self.overlap not in OVERLAPS:
            _fail("overlap", self.overlap, f"use one of {', '.join(OVERLAPS)}")
        self.overlap = Overlap(self.overlap)
        self._check_int("overlap_steps", 0)
        self._check_float("overlap_mix", 0.0, 1.0, high_open=True)
        if self.overlap == Overlap.NONE:
            return
        if not self.is_interval_method:
            _fail(
                "overlap", self.overlap, "DDP averages gradients every step: use overlap='none' or an interval method"
            )
        if self.error_feedback:
            _fail("overlap", self.overlap, "it does not combine with error_feedback=True: turn one of them off")
        if self.overlap == Overlap.DELAYED and self.overlap_steps >= self.min_interval_steps:
            _fail(
                "overlap_steps",
                self.overlap_steps,
                f"the merge must land inside the next interval, whose shortest length for method={self.method} "
                f"is {self.min_interval_steps} steps: use overlap_steps < {self.min_interval_steps}",
            )

    # -- validation helpers -------------------------------------------------
    def _check_int(self, name: str, minimum: int) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(name, value, "pass an integer")
        if value < minimum:
            _fail(name, value, f"it must be >= {minimum}")

    def _check_float(self, name: str, low: float, high: float, low_open: bool = False, high_open: bool = False) -> None:
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            _fail(name, value, "pass a finite number")
        too_low = value <= low if low_open else value < low
        too_high = value >= high if high_open else value > high
        if too_low or too_high:
            lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
            _fail(name, value, f"it must lie in {lo}{low}, {high}{hi}")

    def _check_controller_robustness(self) -> None:
        choices = tuple(c.value for c in ReferenceClip)
        if self.reference_clip not in choices:
            _fail("reference_clip", self.reference_clip, f"use one of {', '.join(choices)}")
        self.reference_clip = ReferenceClip(self.reference_clip)
        self._check_int("rejected_bound_min_age", 0)
        if not isinstance(self.cumulative_check, bool):
            _fail("cumulative_check", self.cumulative_check, "pass True or False")
        self._check_int("candidate_max_quanta", 0)

    # -- derived properties -------------------------------------------------
    @property
    def is_interval_method(self) -> bool:
        """Whether workers run local intervals (everything but DDP)."""
        return self.method != Method.DDP

    @property
    def uses_nesterov_outer(self) -> bool:
        """DiLoCo and AutoLoCo use a Nesterov outer step; QSR and Linear average models (docs/algorithm.md §6)."""
        return self.method in (Method.DILOCO, Method.AUTOLOCO)

    @property
    def min_interval_steps(self) -> int:
        """Shortest interval a policy can plan before truncation at the budget (multiples of q_h for AutoLoCo)."""
        if self.method == Method.AUTOLOCO:
            return min(self.q_h, self.h_min) if self.map_tokens else self.h_min
        if self.method == Method.LINEAR:
            return self.linear_increment
        return self.h_base

    @property
    def outer_correction_enabled(self) -> bool:
        """The docs/algorithm.md §4 correction runs only for AutoLoCo."""
        return self.method == Method.AUTOLOCO

    # -- construction helpers -------------------------------------------------
    @classmethod
    def for_recipe(cls, recipe: str, **overrides: Any) -> AutoLoCoConfig:
        """Config preset of the paper's `c4` or `sft` recipe, with overrides."""
        if recipe not in RECIPES:
            raise ConfigError(f"unknown recipe {recipe!r}: use one of {', '.join(RECIPES)}")
        return cls(**{**RECIPES[recipe], **overrides})

    @classmethod
    def ablation(cls, variant: str, **overrides: Any) -> AutoLoCoConfig:
        """The paper's Table 7 ablation variants of AutoLoCo.

        `intervals_only` (adaptive horizon, no outer correction), `momentum`
        (+ momentum retention), `full` (+ bounded outer-step scaling),
        `full_normalized` (+ pseudo-gradient normalization).
        """
        variants = {
            "intervals_only": dict(adjust_momentum=False, scale_outer_lr=False, normalize_pseudo_grad=False),
            "momentum": dict(adjust_momentum=True, scale_outer_lr=False, normalize_pseudo_grad=False),
            "full": dict(adjust_momentum=True, scale_outer_lr=True, normalize_pseudo_grad=False),
            "full_normalized": dict(adjust_momentum=True, scale_outer_lr=True, normalize_pseudo_grad=True),
        }
        if variant not in variants:
            raise ConfigError(f"unknown ablation {variant!r}: use one of {', '.join(variants)}")
        return cls(**{"method": Method.AUTOLOCO, **variants[variant], **overrides})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AutoLoCoConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown AutoLoCoConfig field(s) {unknown}: known fields are {sorted(known)}")
        return cls(**values)
