"""A horizon rule written outside the package (docs/algorithm.md#rule-plugins):
the tests register it by importing this module.

``fixed_schedule`` runs ``start`` steps (default ``h_max``), then halves the
horizon after every interval down to ``h_min``: 40, 20, 10, ... It also asks the
engine for two shared displacements in every interval long enough and records the
second sum as ``probe_exponent``, so the tests see the generic measurement path.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from autoloco_hf.algorithm.rules import Delivery, DisplacementAt, HorizonRule, register_rule
from autoloco_hf.algorithm.rules.decisions import Assessment, Decision, Phase, RuleDecision


@dataclass
class FixedScheduleOptions:
    start: int = 0  # first horizon; 0: h_max
    factor: float = 0.5


@register_rule
class FixedSchedule(HorizonRule):
    name = "fixed_schedule"
    Options = FixedScheduleOptions
    h_max_factor = 4
    calibrates_tokens_at_any_horizon = True

    def __init__(self, config, warmup_steps: int = 0) -> None:
        super().__init__(config, warmup_steps)
        self.h = self.options.start or config.h_max

    @property
    def h_tok(self) -> int:
        return self.h

    @property
    def phase(self) -> Phase:
        return Phase.MONITORING

    def observe(self, obs, preview) -> RuleDecision:
        q = self.cfg.q_h
        self.h = max(self.cfg.h_min, q * math.floor(self.h * self.options.factor / q))
        return RuleDecision(Phase.MONITORING, Assessment.CONSISTENT, Decision.REDUCE, self.h)

    def measurements(self, interval) -> tuple[DisplacementAt, ...]:
        if interval.h_step < 3:
            return ()
        return (DisplacementAt(1, Delivery.SHARED), DisplacementAt(2, Delivery.SHARED))

    def on_measurement(self, interval, results):
        first, second = results
        assert (first.step, second.step) == (1, 2) and second.lr_mass >= first.lr_mass
        return replace(interval, probe_exponent=second.sq_norm_sum)

    def state_dict(self) -> dict[str, Any]:
        return {"h": self.h, "options": asdict(self.options)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.h = int(state["h"])
