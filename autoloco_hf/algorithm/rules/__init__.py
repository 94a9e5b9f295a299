"""Horizon rules as plug-ins (docs/algorithm.md#rule-plugins):
the interface, the registry, and the built-in rules.

Importing this package registers ``paper`` (:mod:`.paper`) and ``descent`` (:mod:`.descent`).
"""

from autoloco_hf.algorithm.rules import descent, paper
from autoloco_hf.algorithm.rules.base import Delivery, DisplacementAt, HorizonRule, Measured
from autoloco_hf.algorithm.rules.descent import DescentOptions, DescentRule
from autoloco_hf.algorithm.rules.paper import PaperOptions, PaperRule
from autoloco_hf.rule_registry import (
    RuleError,
    get_rule,
    import_rule_module,
    register_rule,
    rule_names,
    rule_options,
)

__all__ = [
    "Delivery",
    "DescentRule",
    "DescentOptions",
    "DisplacementAt",
    "PaperRule",
    "HorizonRule",
    "Measured",
    "PaperOptions",
    "RuleError",
    "descent",
    "get_rule",
    "import_rule_module",
    "paper",
    "register_rule",
    "rule_names",
    "rule_options",
]
