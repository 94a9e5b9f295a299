"""Outer-optimizer correction: rho, mu, kappa and the three switches
(docs/algorithm.md#outer-correction)."""

from __future__ import annotations

import math

import pytest

from autoloco_hf.algorithm.correction import interval_ratio, outer_correction

EPS = 1e-8
BASE = dict(mu_base=0.7, outer_lr=0.7)


@pytest.mark.parametrize(
    "lam, lam_base, expected",
    [
        (1.0, 1.0, 1.0),
        (0.5, 1.0, 1.0),
        (0.0, 1.0, 1.0),
        (1.49, 1.0, 1.49),
        (3.0, 2.0, 1.5),
        (1.0, 0.0, 1.0 / EPS),
    ],
)
def test_interval_ratio(lam: float, lam_base: float, expected: float) -> None:
    """docs/algorithm.md#outer-correction: rho = max(Lambda / (Lambda_base + eps), 1)."""
    assert interval_ratio(lam, lam_base) == pytest.approx(
        max(lam / (lam_base + EPS), 1.0), rel=1e-15
    )
    assert interval_ratio(lam, lam_base) == pytest.approx(expected, rel=1e-7)
    assert interval_ratio(lam, lam_base) >= 1.0


def test_spec_worked_example() -> None:
    """docs/algorithm.md#outer-correction: at H = 1.5 H_base near peak LR, rho ~ 1.49, mu ~ 0.588,
    eta ~ 0.96; kappa_max does not bind."""
    c = outer_correction(lr_mass=1.49, lr_mass_base=1.0, **BASE)
    assert c.rho == pytest.approx(1.49, rel=1e-7)
    assert c.momentum == pytest.approx(0.7**1.49, rel=1e-7)
    assert round(c.momentum, 3) == 0.588
    assert c.kappa == pytest.approx((1 - 0.7**1.49) / 0.3, rel=1e-7) and c.kappa < 1.5
    assert round(c.outer_lr, 2) == 0.96
    assert c.outer_lr == pytest.approx(0.7 * c.kappa)
    assert c.grad_divisor is None  # normalization off by default (pretraining)


@pytest.mark.parametrize("rho", [1.0, 1.1, 1.3, 1.49, 1.6, 1.7, 2.0, 3.0, 10.0])
def test_formulas_and_bounds(rho: float) -> None:
    """docs/algorithm.md#outer-correction: mu = clip(mu_base**rho, mu_min, mu_max); kappa =
    min(kappa_max, (1-mu)/(1-mu_base)); eta = eta_base kappa."""
    c = outer_correction(lr_mass=rho, lr_mass_base=1.0, **BASE, normalize_pseudo_grad=True)
    mu = min(max(0.7**c.rho, 0.5), 0.9)
    kappa = min(1.5, (1 - mu) / 0.3)
    assert c.momentum == pytest.approx(mu, rel=1e-12)
    assert c.kappa == pytest.approx(kappa, rel=1e-12)
    assert c.outer_lr == pytest.approx(0.7 * kappa, rel=1e-12)
    assert c.grad_divisor == pytest.approx(c.rho + EPS, rel=1e-15)
    assert 0.5 <= c.momentum <= 0.9 and 1.0 <= c.kappa <= 1.5


def test_kappa_max_binds_only_beyond_the_domain() -> None:
    """kappa reaches 1.5 when (1 - mu)/0.3 > 1.5, i.e. mu <
    0.55, rho > log 0.55 / log 0.7 ~ 1.676."""
    threshold = math.log(0.55) / math.log(0.7)
    below = outer_correction(lr_mass=threshold - 0.01, lr_mass_base=1.0, **BASE)
    above = outer_correction(lr_mass=threshold + 0.01, lr_mass_base=1.0, **BASE)
    assert below.kappa < 1.5
    assert above.kappa == 1.5 and above.outer_lr == pytest.approx(1.05)
    # mu_min binds at rho = log 0.5 / log 0.7 ~ 1.94
    far = outer_correction(lr_mass=5.0, lr_mass_base=1.0, **BASE)
    assert far.momentum == 0.5 and far.kappa == 1.5
    looser = outer_correction(lr_mass=5.0, lr_mass_base=1.0, **BASE, kappa_max=10.0)
    assert looser.kappa == pytest.approx(0.5 / 0.3)


def test_mu_max_clips() -> None:
    c = outer_correction(lr_mass=1.0, lr_mass_base=1.0, mu_base=0.95, outer_lr=0.7)
    assert c.momentum == 0.9
    assert c.kappa == 1.5  # (1 - 0.9) / 0.05 = 2 -> kappa_max


def test_rho_below_one_is_identity() -> None:
    """A shorter or cheaper interval never weakens the step: rho = 1 -> base settings exactly."""
    c = outer_correction(lr_mass=0.3, lr_mass_base=1.0, **BASE, normalize_pseudo_grad=True)
    assert c.rho == 1.0 and c.momentum == 0.7 and c.kappa == 1.0 and c.outer_lr == 0.7
    assert c.grad_divisor == 1.0 + EPS


@pytest.mark.parametrize("rho", [1.0, 1.3, 1.49, 2.5])
def test_all_switches_off_is_diloco(rho: float) -> None:
    """docs/algorithm.md#outer-correction special case: all three
    switches off -> mu_base, eta_base, no normalization."""
    c = outer_correction(
        lr_mass=rho,
        lr_mass_base=1.0,
        **BASE,
        adjust_momentum=False,
        scale_outer_lr=False,
        normalize_pseudo_grad=False,
    )
    assert (c.momentum, c.kappa, c.outer_lr, c.grad_divisor) == (0.7, 1.0, 0.7, None)


def test_switches_are_independent() -> None:
    """docs/algorithm.md#outer-correction: each switch off keeps its base value; the divisor exists
    only with normalization on."""
    kw = dict(lr_mass=1.49, lr_mass_base=1.0, **BASE)
    full = outer_correction(**kw)
    no_mom = outer_correction(**kw, adjust_momentum=False)
    assert no_mom.momentum == 0.7
    assert no_mom.kappa == 1.0  # kappa follows mu_t, which stays at mu_base
    no_scale = outer_correction(**kw, scale_outer_lr=False)
    assert no_scale.momentum == full.momentum
    assert no_scale.kappa == 1.0 and no_scale.outer_lr == 0.7
    assert outer_correction(**kw, normalize_pseudo_grad=False).grad_divisor is None
    normed = outer_correction(**kw, normalize_pseudo_grad=True)
    assert normed.grad_divisor == pytest.approx(1.49 + EPS)
    assert (normed.momentum, normed.outer_lr) == (full.momentum, full.outer_lr)


def test_custom_eps() -> None:
    c = outer_correction(lr_mass=2.0, lr_mass_base=1.0, **BASE, eps=0.5, normalize_pseudo_grad=True)
    assert c.rho == pytest.approx(2.0 / 1.5)
    assert c.grad_divisor == pytest.approx(2.0 / 1.5 + 0.5)
