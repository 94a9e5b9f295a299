"""Per-interval statistics D, C, d, V (docs/algorithm.md#interval-statistics)."""

from __future__ import annotations

import math

import pytest
import torch

from autoloco_hf.algorithm.stats import drift_exponent, drift_growth, interval_statistics

EPS = 1e-8


def from_deltas(deltas: torch.Tensor, lr_mass: float = 1.0):
    """Statistics from explicit per-worker pseudo-gradients (rows), in float64."""
    deltas = deltas.double()
    n = deltas.shape[0]
    return interval_statistics(
        sum_local_sq_norms=float((deltas**2).sum()),
        mean_sq_norm=float((deltas.mean(0) ** 2).sum()),
        num_workers=n,
        lr_mass=lr_mass,
    )


def test_hand_computed_independent_workers() -> None:
    """Two orthogonal unit moves: D = 1, ||mean||^2 = 0.5, C = 2 * 0.5 / 1 = 1, V = 0.5."""
    s = from_deltas(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), lr_mass=0.5)
    assert s.drift_energy == 1.0
    assert s.coherence == pytest.approx(1.0, rel=1e-7)
    assert s.disagreement == pytest.approx(0.5, rel=1e-7)
    assert s.normalized_drift == pytest.approx(1.0 / (0.25 + EPS), rel=1e-12)
    assert s.lr_mass == 0.5
    assert s.log_normalized_drift == pytest.approx(math.log(1.0) - 2 * math.log(0.5))


def test_hand_computed_scalars() -> None:
    """N = 4, sum ||Delta_i||^2 = 8 -> D = 2; ||mean||^2 = 0.25 -> C = 4 * 0.25 / 2 = 0.5."""
    s = interval_statistics(sum_local_sq_norms=8.0, mean_sq_norm=0.25, num_workers=4, lr_mass=2.0)
    assert s.drift_energy == 2.0
    assert s.coherence == pytest.approx(4 * 0.25 / (2.0 + EPS), rel=1e-15)
    assert s.normalized_drift == pytest.approx(2.0 / (4.0 + EPS), rel=1e-15)
    assert s.disagreement == pytest.approx(2.0 * (1 - 0.5 / 4), rel=1e-7)


def test_identical_workers_have_full_coherence() -> None:
    s = from_deltas(torch.tensor([[0.3, -1.2, 2.0]] * 4))
    assert s.coherence == pytest.approx(4.0, rel=1e-7)
    assert s.disagreement == pytest.approx(0.0, abs=1e-7)


def test_opposite_workers_have_zero_coherence() -> None:
    s = from_deltas(torch.tensor([[1.0, 2.0], [-1.0, -2.0]]))
    assert s.coherence == 0.0
    assert s.disagreement == pytest.approx(s.drift_energy)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_random_deltas_match_definitions(seed: int, n: int) -> None:
    """C in [0, N] and V = D (1 - C/N) = (1/N) sum ||Delta_i - mean||^2
    (docs/algorithm.md#interval-statistics)."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(50, generator=g, dtype=torch.float64) * (seed % 3)
    deltas = common + torch.randn(n, 50, generator=g, dtype=torch.float64)
    s = from_deltas(deltas, lr_mass=0.01 * (seed + 1))
    d = float((deltas**2).sum(1).mean())
    assert s.drift_energy == pytest.approx(d, rel=1e-12)
    mean = deltas.mean(0)
    assert s.coherence == pytest.approx(n * float((mean**2).sum()) / (d + EPS), rel=1e-12)
    assert 0.0 <= s.coherence <= n
    direct_v = float(((deltas - mean) ** 2).sum(1).mean())
    assert s.disagreement == pytest.approx(direct_v, rel=1e-6, abs=1e-7)  # equal up to eps
    assert s.disagreement == pytest.approx(
        s.drift_energy * (1 - s.coherence / n), rel=1e-12, abs=1e-12
    )
    assert 0.0 <= s.disagreement <= s.drift_energy
    lam = 0.01 * (seed + 1)
    assert s.normalized_drift == pytest.approx(d / (lam**2 + EPS), rel=1e-12)
    assert s.log_normalized_drift == pytest.approx(math.log(d) - 2 * math.log(lam), rel=1e-12)


def test_non_finite_and_undefined() -> None:
    bad = interval_statistics(
        sum_local_sq_norms=math.nan, mean_sq_norm=1.0, num_workers=2, lr_mass=1.0
    )
    assert not bad.finite and math.isnan(bad.log_normalized_drift)
    assert not interval_statistics(1.0, math.inf, 2, 1.0).finite
    assert not interval_statistics(1.0, 1.0, 2, math.nan).finite
    zero_mass = interval_statistics(
        sum_local_sq_norms=2.0, mean_sq_norm=1.0, num_workers=2, lr_mass=0.0
    )
    assert zero_mass.finite and math.isnan(zero_mass.log_normalized_drift)
    zero_drift = interval_statistics(
        sum_local_sq_norms=0.0, mean_sq_norm=0.0, num_workers=2, lr_mass=1.0
    )
    assert zero_drift.coherence == 0.0 and math.isnan(zero_drift.log_normalized_drift)


def walk_sq_norm(steps: int, signal: float, noise: float, seed: int = 0) -> float:
    """``||sum of steps||^2`` of a walk: a constant
    ``signal`` direction plus unit-LR Gaussian ``noise``."""
    gen = torch.Generator().manual_seed(seed)
    moves = signal + noise * torch.randn(steps, 20_000, generator=gen, dtype=torch.float64)
    return float((moves.sum(0) ** 2).sum())


@pytest.mark.parametrize(("signal", "noise", "expected"), [(1.0, 0.0, 2.0), (0.0, 1.0, 1.0)])
def test_the_drift_exponent_is_two_for_a_ballistic_walk_and_one_for_a_diffusive_one(
    signal, noise, expected
) -> None:
    anchor, whole = walk_sq_norm(10, signal, noise), walk_sq_norm(40, signal, noise)
    fall, growth = drift_growth(whole, 40.0, anchor, 10.0)
    assert growth == pytest.approx(math.log(4.0))
    assert drift_exponent(fall, growth) == pytest.approx(expected, abs=0.02)


def test_the_drift_exponent_is_undefined_without_an_anchor_or_growth() -> None:
    assert all(math.isnan(v) for v in drift_growth(1.0, 1.0, math.nan, math.nan))
    assert all(math.isnan(v) for v in drift_growth(1.0, 1.0, 1.0, 1.0))  # no steps past the anchor
    assert all(math.isnan(v) for v in drift_growth(0.0, 2.0, 1.0, 1.0))
    assert math.isnan(drift_exponent(0.0, 0.0))
