"""Horizon-rule settings that more than one benchmark runs,
defined once so that their rows stay the same setting."""

from __future__ import annotations

from typing import Any

# The descent rule as it was first committed and measured (docs/algorithm.md#descent-rule), before
# it became the library's default rule (from 2 h_base, gain 0.9, guarded, outer momentum 0.5): from
# FIRST_DESCENT_H_MAX_FACTOR x h_base (rounded down to q_H), gain 1, no drift guard, outer momentum
# 0.7. replicate.py's descent rows and controller_scenarios.py's descent columns (a policy without
# an outer step: the momentum does not act there).
FIRST_DESCENT_H_MAX_FACTOR = 4
FIRST_DESCENT: dict[str, Any] = {
    "controller": "descent",
    "outer_momentum": 0.7,
    "rule_options": {"gain": 1.0, "drift_guard": False},
}


def first_descent(**options: Any) -> dict[str, Any]:
    """``AutoLoCoConfig`` fields of the first descent setting with
    ``options`` over its rule options (h_max: the caller's)."""
    return {**FIRST_DESCENT, "rule_options": {**FIRST_DESCENT["rule_options"], **options}}
