"""Where each field does something: a field set away from its
default outside its scope is refused."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from autoloco_hf.config.choices import Method, Pacing

if typing.TYPE_CHECKING:
    from autoloco_hf.config.autoloco_config import AutoLoCoConfig


@dataclass(frozen=True)
class Scope:
    """Where a field does something: ``applies(config)``, in words ``where`` (for the refusal).

    ``setting``: the field whose value the refusal quotes as the reason.
    """

    where: str
    applies: typing.Callable[[AutoLoCoConfig], bool]
    setting: str = "method"


_AUTOLOCO = Scope("method='autoloco'", lambda c: c.method == Method.AUTOLOCO)
_NESTEROV = Scope(
    "method='diloco' or 'autoloco' (QSR and Linear average models, DDP has no outer step)",
    lambda c: c.uses_nesterov_outer,
)
_RULE = Scope(
    "method='autoloco' and adaptive_horizon=True (a horizon rule runs)",
    lambda c: c.runs_horizon_rule,
)
_INTERVALS = Scope(
    "an interval method (method='ddp' averages gradients every step)",
    lambda c: c.is_interval_method,
)

# THE table of fields that do nothing outside some methods or settings: set away
# from the default there, they are refused at construction, naming where they apply.
# Defaults pass (a field set to its default is indistinguishable from one left
# unset), except where the input says what was typed (check_given: the command lines
# and YAML). Rule options need no entry: each rule's Options holds only its own.
FIELD_SCOPES: dict[str, Scope] = {
    # the horizon grid: AutoLoCo's token mapper and interval lengths round
    # to q_h; only a horizon rule reads h_min and h_max (fixed DiLoCo, QSR
    # and Linear set their horizons from h_base, qsr_* and linear_increment)
    "q_h": _AUTOLOCO,
    **dict.fromkeys(("h_min", "h_max"), _RULE),
    "adaptive_horizon": _AUTOLOCO,
    **dict.fromkeys(("map_tokens", "token_calibration_intervals", "token_ema_beta"), _AUTOLOCO),
    # the outer correction (docs/algorithm.md#outer-correction) runs for AutoLoCo only
    **dict.fromkeys(
        (
            "mu_min",
            "mu_max",
            "kappa_max",
            "adjust_momentum",
            "scale_outer_lr",
            "normalize_pseudo_grad",
        ),
        _AUTOLOCO,
    ),
    **dict.fromkeys(("outer_lr", "outer_momentum"), _NESTEROV),
    **dict.fromkeys(("controller", "rule_options", "rule_module"), _RULE),
    **dict.fromkeys(
        ("qsr_alpha", "qsr_gamma"), Scope("method='qsr'", lambda c: c.method == Method.QSR)
    ),
    "linear_increment": Scope("method='linear'", lambda c: c.method == Method.LINEAR),
    **dict.fromkeys(("wire_dtype", "error_feedback", "max_consecutive_invalid"), _INTERVALS),
    **dict.fromkeys(("pacing", "worker_speeds", "speed_changes"), _INTERVALS),
    **dict.fromkeys(
        ("straggler_fraction", "straggler_intervals"),
        Scope(
            "pacing='budget' (lockstep workers take equal steps)",
            lambda c: c.pacing == Pacing.BUDGET,
        ),
    ),
    # the layout of a worker's shards: a worker of one rank has none
    "hierarchical_sync": Scope(
        "ranks_per_worker > 1 (a worker of one rank syncs its whole model)",
        lambda c: c.ranks_per_worker > 1,
        setting="ranks_per_worker",
    ),
}
# Not in the table: int8_block_size (the communicator is built from it and
# checked against it whatever the wire) and overlap_steps / overlap_mix
# (one overlap setting is shared across the overlap modes in tests).
