"""Per-interval statistics from all-reduced scalars (docs/algorithm.md#interval-statistics).

Plain floats in, plain floats out: every worker computes the same numbers from
the same all-reduced sums, so these functions decide nothing on their own.

Example::

    >>> s = interval_statistics(
    ...     sum_local_sq_norms=2.0, mean_sq_norm=1.0, num_workers=2, lr_mass=1.0
    ... )
    >>> s.drift_energy, round(s.coherence, 6), round(s.disagreement, 6)
    (1.0, 2.0, 0.0)
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def log_normalized_drift(drift_energy: float, lr_mass: float) -> float:
    """``log d_t = log D_t - 2 log Lambda_t`` in float64
    (docs/algorithm.md#references-and-residuals); NaN when undefined.

    Undefined means non-finite, ``D_t <= 0`` or ``Lambda_t <= 0``: such an
    interval takes no decision (the controller treats it like truncation).
    """
    if not (
        math.isfinite(drift_energy) and math.isfinite(lr_mass) and drift_energy > 0 and lr_mass > 0
    ):
        return math.nan
    return math.log(drift_energy) - 2.0 * math.log(lr_mass)


def drift_growth(
    drift_energy: float, lr_mass: float, anchor_drift_energy: float, anchor_lr_mass: float
) -> tuple[float, float]:
    """``(log d - log d_anchor, log Lambda - log Lambda_anchor)`` from an interval's anchor to its
    end (docs/algorithm.md#descent-rule).

    NaNs when either ``d`` is undefined or the interval did not run past its anchor. Their ratio
    gives the drift exponent (:func:`drift_exponent`); sums of both pool several intervals.
    """
    fall = log_normalized_drift(drift_energy, lr_mass) - log_normalized_drift(
        anchor_drift_energy, anchor_lr_mass
    )
    if math.isnan(fall) or not lr_mass > anchor_lr_mass:
        return math.nan, math.nan
    return fall, math.log(lr_mass) - math.log(anchor_lr_mass)


def drift_exponent(fall: float, growth: float) -> float:
    """``p`` in ``D ~ Lambda^p`` between anchor and end
    (docs/algorithm.md#descent-rule); NaN when undefined.

    ``p = 2`` is ballistic (every step adds in the same direction), ``p = 1``
    diffusive (the steps add like noise); ``D = s Lambda^2 + n Lambda`` has
    ``p = 1 + f`` locally, ``f`` the ballistic share of ``D``.
    """
    return 2.0 + fall / growth if growth > 0 else math.nan


@dataclass(frozen=True)
class IntervalStatistics:
    """``D_t``, ``C_t``, ``d_t`` and ``V_t`` of one interval
    (docs/algorithm.md#interval-statistics)."""

    drift_energy: float  # D_t = mean_i ||Delta_i||^2
    coherence: float  # C_t = N ||Delta_bar||^2 / (D_t + eps), in [0, N]
    normalized_drift: float  # d_t = D_t / (Lambda_t^2 + eps)
    disagreement: float  # V_t = D_t (1 - C_t / N)
    lr_mass: float  # Lambda_t

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in (self.drift_energy, self.coherence, self.lr_mass))

    @property
    def log_normalized_drift(self) -> float:
        """``log d_t = log D_t - 2 log Lambda_t`` in float64
        (docs/algorithm.md#references-and-residuals); NaN when undefined."""
        return log_normalized_drift(self.drift_energy, self.lr_mass) if self.finite else math.nan


def interval_statistics(
    sum_local_sq_norms: float,
    mean_sq_norm: float,
    num_workers: int,
    lr_mass: float,
    eps: float = 1e-8,
) -> IntervalStatistics:
    """Statistics of one interval.

    Args:
        sum_local_sq_norms: ``sum_i ||Delta_t^i||^2`` (all-reduced scalar).
        mean_sq_norm: ``||Delta_bar_t||^2`` of the averaged (decoded) pseudo-gradient.
        num_workers: ``N``.
        lr_mass: ``Lambda_t``, the interval's accumulated inner learning rate.
        eps: ratio epsilon (docs/algorithm.md#outer-correction defaults).
    """
    drift = sum_local_sq_norms / num_workers
    coherence = num_workers * mean_sq_norm / (drift + eps)
    disagreement = (
        max(drift * (1.0 - coherence / num_workers), 0.0) if math.isfinite(coherence) else math.nan
    )
    return IntervalStatistics(
        drift_energy=drift,
        coherence=coherence,
        normalized_drift=drift / (lr_mass * lr_mass + eps),
        disagreement=disagreement,
        lr_mass=lr_mass,
    )


def robust_centre_scale(history: list[float], sigma_floor: float) -> tuple[float, float]:
    """Median and ``max(1.4826 * MAD, sigma_floor)`` of a residual history
    (docs/algorithm.md#references-and-residuals)."""
    if not history:
        return 0.0, sigma_floor
    centre = statistics.median(history)
    mad = statistics.median(abs(r - centre) for r in history)
    return centre, max(1.4826 * mad, sigma_floor)
