"""What every horizon rule reads and writes: phases, assessments, decisions, observations
(docs/algorithm.md#horizon-rule).

The rules themselves live in :mod:`autoloco_hf.algorithm.rules` (the paper's
state machine, the descent rule, and any registered from outside the package);
this module holds the vocabulary they share with the policies, the engine's
records and the loggers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoloco_hf.config import ValueEnum


class Phase(ValueEnum):
    """Rule phases (docs/algorithm.md#phases); ``FIXED``
    marks intervals of a policy without a rule."""

    WARMUP = "warmup"
    CALIBRATION = "calibration"
    VARIABILITY = "variability"
    MONITORING = "monitoring"
    CANDIDATE = "candidate"
    FIXED = "fixed"


class Assessment(ValueEnum):
    """How an interval's statistics compare with the reference
    (docs/algorithm.md#interval-assessment), or why none was made."""

    INVALID = "invalid"
    SEVERE = "severe"
    MODERATE = "moderate"
    SUPPORTING = "supporting"
    CONSISTENT = "consistent"
    UNUSED = "unused"
    TRUNCATED = "truncated"
    NO_DECISION = "no_decision"
    FIXED = "fixed"
    # opt-in cumulative check: the adoptions since a lower horizon add up to a deviation
    CUMULATIVE = "cumulative"
    # an in-interval probe ended it early: the workers' paths bent (docs/algorithm.md#descent-rule)
    BENT = "bent"
    # eager overlap: ran a horizon the rule has since replaced; not fed to it
    # (docs/algorithm.md#overlap-checkpoints)
    STALE = "stale"

    @property
    def code(self) -> float:
        """Numeric code for scalar loggers: higher is better
        for longer horizons (every member has one)."""
        return _ASSESSMENT_CODES[self]


class Decision(ValueEnum):
    """What the rule did with the horizon after an interval (docs/algorithm.md#phases)."""

    KEEP = "keep"
    PROPOSE = "propose"
    ADOPT = "adopt"
    CONTINUE = "continue"
    REJECT = "reject"
    FALLBACK = "fallback"
    RECALIBRATE = "recalibrate"
    REDUCE = "reduce"
    NONE = "none"
    FIXED = "fixed"


@dataclass
class IntervalObservation:
    """What the rule needs to know about a completed interval."""

    h_tok: int
    start_step: int
    end_step: int
    drift_energy: float  # D_t
    coherence: float  # C_t
    lr_mass: float  # Lambda_t (measured)
    mean_loss: float = 0.0
    pseudo_grad_finite: bool = True
    truncated: bool = False
    # D at the rule's BOUNDARY displacement request, if any (docs/algorithm.md#rule-plugins)
    anchor_drift_energy: float = math.nan
    anchor_lr_mass: float = math.nan  # the LR mass of the steps before that request
    # the rule's on_measurement ended it early (docs/algorithm.md#rule-plugins)
    cut_short: bool = False

    @property
    def finite(self) -> bool:
        """Whether the interval can be assessed at all; else it is ``invalid``
        (docs/algorithm.md#interval-assessment)."""
        return self.pseudo_grad_finite and all(
            math.isfinite(v)
            for v in (self.drift_energy, self.coherence, self.lr_mass, self.mean_loss)
        )


@dataclass
class RuleDecision:
    """The rule's reading of an interval and what it does next (logged per interval)."""

    phase: Phase
    assessment: Assessment
    decision: Decision
    next_h_tok: int
    residual_drift: float | None = None
    residual_coherence: float | None = None
    z_drift: float | None = None
    z_coherence: float | None = None
    adverse: float | None = None


_ASSESSMENT_CODES = {
    Assessment.SUPPORTING: 2.0,
    Assessment.CONSISTENT: 1.0,
    Assessment.FIXED: 0.0,
    Assessment.UNUSED: 0.0,
    Assessment.NO_DECISION: 0.0,
    Assessment.TRUNCATED: 0.0,
    Assessment.STALE: 0.0,
    Assessment.MODERATE: -1.0,
    Assessment.CUMULATIVE: -1.0,
    Assessment.BENT: -1.0,
    Assessment.SEVERE: -2.0,
    Assessment.INVALID: -3.0,
}
