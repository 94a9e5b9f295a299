"""Outer-optimizer correction for the learning-rate mass of an interval
(docs/algorithm.md#outer-correction).

A longer interval carries more inner learning rate than the base interval at
the same schedule position. The ratio ``rho_t`` of the two masses drives three
independent switches: pseudo-gradient normalization, momentum retention and
bounded outer-step scaling.

Example (docs/algorithm.md#outer-correction: ``H = 1.5 H_base`` near peak LR)::

    >>> c = outer_correction(lr_mass=1.49, lr_mass_base=1.0, mu_base=0.7, outer_lr=0.7)
    >>> round(c.rho, 2), round(c.momentum, 3), round(c.outer_lr, 2)
    (1.49, 0.588, 0.96)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autoloco_hf.config import AutoLoCoConfig


@dataclass(frozen=True)
class OuterCorrection:
    """The outer step's settings for one interval."""

    rho: float  # interval ratio rho_t >= 1
    momentum: float  # mu_t
    outer_lr: float  # eta_t^out
    kappa: float  # eta_t^out / eta_base^out
    grad_divisor: float | None  # rho_t + eps with normalization, else None (no division at all)


def interval_ratio(lr_mass: float, lr_mass_base: float, eps: float = 1e-8) -> float:
    """``rho_t = max(Lambda_t / (Lambda_t^base + eps), 1)``: never below 1
    (docs/algorithm.md#outer-correction)."""
    return max(lr_mass / (lr_mass_base + eps), 1.0)


def outer_correction(
    lr_mass: float,
    lr_mass_base: float,
    mu_base: float,
    outer_lr: float,
    *,
    mu_min: float = 0.5,
    mu_max: float = 0.9,
    kappa_max: float = 1.5,
    eps: float = 1e-8,
    adjust_momentum: bool = True,
    scale_outer_lr: bool = True,
    normalize_pseudo_grad: bool = False,
) -> OuterCorrection:
    """docs/algorithm.md#outer-correction: ``mu_t = clip(mu_base**rho_t, mu_min, mu_max)``,
    ``kappa_t = min(kappa_max, (1 - mu_t) / (1 - mu_base))``, ``eta_t = outer_lr * kappa_t``.

    With a switch off its quantity stays at the base value (``mu_base``,
    ``kappa = 1``, no normalization), so all three off is plain DiLoCo.
    """
    rho = interval_ratio(lr_mass, lr_mass_base, eps)
    momentum = min(max(mu_base**rho, mu_min), mu_max) if adjust_momentum else mu_base
    kappa = min(kappa_max, (1.0 - momentum) / (1.0 - mu_base)) if scale_outer_lr else 1.0
    return OuterCorrection(
        rho=rho,
        momentum=momentum,
        outer_lr=outer_lr * kappa,
        kappa=kappa,
        grad_divisor=rho + eps if normalize_pseudo_grad else None,
    )


def correction_for(config: AutoLoCoConfig, lr_mass: float, lr_mass_base: float) -> OuterCorrection:
    """The outer step's settings of ``config.method`` for an interval of previewed LR masses
    ``lr_mass`` / ``lr_mass_base``."""
    if config.outer_correction_enabled:
        return outer_correction(
            lr_mass,
            lr_mass_base,
            config.outer_momentum,
            config.outer_lr,
            mu_min=config.mu_min,
            mu_max=config.mu_max,
            kappa_max=config.kappa_max,
            eps=config.eps,
            adjust_momentum=config.adjust_momentum,
            scale_outer_lr=config.scale_outer_lr,
            normalize_pseudo_grad=config.normalize_pseudo_grad,
        )
    rho = interval_ratio(lr_mass, lr_mass_base, config.eps)
    if config.uses_nesterov_outer:  # DiLoCo: fixed outer settings
        return OuterCorrection(rho, config.outer_momentum, config.outer_lr, 1.0, None)
    return OuterCorrection(rho, 0.0, 1.0, 1.0, None)  # direct model averaging
