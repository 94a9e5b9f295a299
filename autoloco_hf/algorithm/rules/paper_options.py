"""The paper rule's options, ``AutoLoCoConfig(rule_options=...)`` with ``controller="paper"``.

Apart from the rule (``paper.py``) so the state machine reads on its own; every default is
the spec's (docs/algorithm.md#phases).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoloco_hf.config import (
    ABOVE_ONE,
    AT_LEAST_ONE,
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    Range,
    ReferenceClip,
    option,
)
from autoloco_hf.rule_registry import check_range

__all__ = ["PaperOptions"]


@dataclass
class PaperOptions:
    """Options of the paper rule (``AutoLoCoConfig(rule_options=...)``
    with ``controller="paper"``)."""

    calibration_delay_steps: int = option(
        0,
        "Extra steps after warm-up before the first calibration interval "
        "(docs/algorithm.md#warm-up).",
        NON_NEGATIVE,
    )
    calibration_intervals: int = option(
        2,
        "Intervals that set the reference levels at the start "
        "(docs/algorithm.md#reference-calibration).",
        COUNT,
    )
    recalibration_intervals: int = option(
        1,
        "Calibration intervals after a reduction, adoption or return "
        "(docs/algorithm.md#reference-calibration).",
        COUNT,
    )
    variability_intervals: int = option(
        3,
        "Intervals that fill the residual history after calibration "
        "(docs/algorithm.md#variability).",
        NON_NEGATIVE,
    )
    monitoring_holdoff: int = option(
        1,
        "Monitored intervals consistent with the reference before an increase may be proposed "
        "(docs/algorithm.md#monitoring).",
        COUNT,
    )
    ref_ema_alpha: float = option(
        0.2,
        "Log-space EMA factor of the reference levels *[reconstruction]* "
        "(docs/algorithm.md#references-and-residuals).",
        Range(0.0, 1.0),
    )
    history_size: int = option(
        16, "Residuals kept per family (docs/algorithm.md#references-and-residuals).", COUNT
    )
    sigma_floor: float = option(
        0.10,
        "Floor of the robust residual scale *[reconstruction]* "
        "(docs/algorithm.md#references-and-residuals).",
        POSITIVE,
    )
    k_moderate: float = option(
        2.0,
        "Adverse-score threshold of a moderate deviation (docs/algorithm.md#interval-assessment).",
        POSITIVE,
    )
    k_severe: float = option(
        4.0,
        "Adverse-score threshold of a severe deviation, >= k_moderate "
        "(docs/algorithm.md#interval-assessment).",
        POSITIVE,
    )
    min_history: int = option(
        3,
        "Residuals needed before moderate and severe can be assessed, <= history_size "
        "(docs/algorithm.md#interval-assessment).",
        COUNT,
    )
    candidate_max_intervals: int = option(
        2,
        "Intervals a candidate may run while consistent before it is adopted "
        "(docs/algorithm.md#candidate-evaluation).",
        COUNT,
    )
    moderate_confirmations: int = option(
        2,
        "Consecutive moderate deviations that trigger a reduction (docs/algorithm.md#monitoring).",
        COUNT,
    )
    reduce_moderate: float = option(
        1.2, "Reduction factor after moderate deviations (docs/algorithm.md#monitoring).", ABOVE_ONE
    )
    reduce_severe: float = option(
        1.5, "Reduction factor after a severe deviation (docs/algorithm.md#reduction).", ABOVE_ONE
    )
    gamma_inc: float = option(
        1.15,
        "Candidate LR-mass budget relative to the accepted horizon "
        "(docs/algorithm.md#candidate-selection).",
        AT_LEAST_ONE,
    )
    rejected_bound_release: float = option(
        0.90,
        """A rejected bound retires when its LR-mass preview falls to this fraction of the LR mass
        observed at its creation (docs/algorithm.md#candidate-selection).""",
        Range(0.0, 1.0, low_open=True),
    )
    rejected_bound_max_age: int = option(
        20, "... or after this many intervals (docs/algorithm.md#candidate-selection).", COUNT
    )
    increase_requires_support: bool = option(
        False,
        """docs/algorithm.md#monitoring proposes an increase after a supporting *or* consistent
        monitored interval; True proposes only after a supporting one.""",
    )
    reference_clip: ReferenceClip = option(
        ReferenceClip.CENTRE,
        """Reference EMA update (docs/algorithm.md#references-and-residuals): `centre` moves the
        reference by `ref_ema_alpha * (c + clip(r - c, +-k_moderate * sigma))`, `c` the robust
        centre of the residual history (0 while it holds fewer than `min_history` residuals), so the
        reference follows drift of any speed; `zero` is the literal rule
        `ref_ema_alpha * clip(r, ...)`, which follows at most `ref_ema_alpha * k_moderate * sigma`
        per interval and reads faster drift as deviations.""",
    )
    rejected_bound_min_age: int = option(
        0,
        """A rejected bound retires on LR-mass decay (`rejected_bound_release`) only once it is at
        least this many intervals old, so a sharp blow-up is probed at most once per this many
        intervals; 0 is the spec's rule. `rejected_bound_max_age` still retires it.""",
        NON_NEGATIVE,
    )
    cumulative_check: bool = option(
        False,
        """At each adoption, add the candidate's standardized scores to a ladder of adopted horizons
        (reset by a reduction) and compare the new horizon with every lower rung: if
        `max(sum z_D, -sum z_C) > k_moderate` summed over the adoptions since some rung, return to
        that rung and make the candidate the rejected bound. Catches a slow blow-up that each
        one-step comparison reads as consistent.""",
    )
    candidate_max_quanta: int = option(
        0,
        """A candidate lies at most this many `q_h` above the accepted horizon (0: no cap, the
        spec's rule), so a budget that admits `h_max` late in training climbs step by step.""",
        NON_NEGATIVE,
    )

    def check(self) -> None:
        check_range(
            "paper",
            "k_severe",
            self.k_severe,
            self.k_severe >= self.k_moderate,
            f"it must be >= k_moderate={self.k_moderate}",
        )
        check_range(
            "paper",
            "min_history",
            self.min_history,
            self.min_history <= self.history_size,
            f"it must not exceed history_size={self.history_size}",
        )
