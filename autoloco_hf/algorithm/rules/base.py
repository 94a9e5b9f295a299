"""The horizon-rule interface and its registry (docs/algorithm.md#rule-plugins).

A horizon rule chooses AutoLoCo's next token-equivalent horizon from the
statistics of the interval that just ended. Each rule is one class behind
:class:`HorizonRule`, with its own options dataclass, found by name in a
registry (as ``transformers.get_scheduler`` finds a schedule)::

    @register_rule
    class FixedSchedule(HorizonRule):
        name = "fixed_schedule"
        Options = FixedScheduleOptions
        ...

    AutoLoCoConfig(
        controller="fixed_schedule", rule_options={"start": 40}, rule_module="mypkg.rules"
    )

A rule that needs something measured *inside* an interval asks for it with
:meth:`HorizonRule.measurements` (:class:`DisplacementAt` requests); the engine
serves every rule's requests alike and hands shared results back through
:meth:`HorizonRule.on_measurement`, so the engine names no rule.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from autoloco_hf.algorithm.policies import NextInterval
    from autoloco_hf.algorithm.rules.decisions import IntervalObservation, Phase, RuleDecision
    from autoloco_hf.config import AutoLoCoConfig


# ------------------------------------------------------------------ measurement requests
class Delivery(str, Enum):
    """How the engine delivers a requested measurement."""

    # kept by each worker, summed with the interval's control message: in the observation
    BOUNDARY = "boundary"
    # summed over all workers at once (one small all-reduce): handed to on_measurement
    SHARED = "shared"


@dataclass(frozen=True)
class DisplacementAt:
    """Ask for every worker's displacement
    ``||theta - theta_t||^2`` after ``step`` steps of the interval.

    ``BOUNDARY``: at most one per interval; its worker mean and the LR mass of
    those steps reach the rule as ``IntervalObservation.anchor_drift_energy`` /
    ``anchor_lr_mass`` (no extra collective). ``SHARED``: the interval's shared
    requests are all-reduced together at the last one's step, and the sums go
    to :meth:`HorizonRule.on_measurement`.
    """

    step: int
    delivery: Delivery = Delivery.BOUNDARY


@dataclass(frozen=True)
class Measured:
    """A shared measurement's result: the displacement summed
    over all workers and the LR mass of its steps."""

    step: int
    sq_norm_sum: float
    lr_mass: float


# ------------------------------------------------------------------ the interface
class HorizonRule(ABC):
    """One horizon rule: a serializable state machine over token-equivalent horizons.

    Subclasses set ``name`` and ``Options`` (a dataclass of their options,
    with defaults; fields made with ``autoloco_hf.config.option`` get their
    range checked; an optional ``check()`` method relates them) and implement
    the abstract members. ``self.cfg`` gives the horizon domain (``h_base``,
    ``q_h``, ``h_min``, ``h_max``), ``self.options`` the ``Options`` instance.
    """

    name: ClassVar[str]
    Options: ClassVar[type]
    h_max_factor: ClassVar[float] = 1.5  # default h_max in h_base (rounded down to q_h)
    # default outer_momentum (docs/algorithm.md#outer-correction)
    base_outer_momentum: ClassVar[float] = 0.7
    # whether intervals at any horizon calibrate the token
    # mapper (a rule that starts away from h_base)
    calibrates_tokens_at_any_horizon: ClassVar[bool] = False

    def __init__(self, config: AutoLoCoConfig, warmup_steps: int = 0) -> None:
        self.cfg = config
        self.options = config.rule_options
        self.warmup_steps = warmup_steps

    @classmethod  # noqa: B027 (most rules combine with every setting)
    def check_config(cls, config: AutoLoCoConfig) -> None:
        """Refuse, with a :class:`RuleError`, settings of ``config``
        the rule cannot follow (called at construction)."""

    @property
    @abstractmethod
    def h_tok(self) -> int:
        """Token-equivalent horizon of the next interval."""

    @property
    def h_accepted(self) -> int:
        """The horizon the rule stands by (a rule that probes longer ones may run another)."""
        return self.h_tok

    @property
    @abstractmethod
    def phase(self) -> Phase: ...

    @abstractmethod
    def observe(self, obs: IntervalObservation, preview: Callable[[int], float]) -> RuleDecision:
        """Assess a completed interval and choose the next horizon.

        ``preview(h_tok)``: the LR mass the next interval would carry at ``h_tok``.
        """

    def measurements(self, interval: NextInterval) -> tuple[DisplacementAt, ...]:
        """What the engine should measure inside ``interval`` (default: nothing)."""
        return ()

    def on_measurement(self, interval: NextInterval, results: tuple[Measured, ...]) -> NextInterval:
        """The interval to run on, given the shared measurements
        (in step order, identical on every worker).

        A rule may end the interval early (a shorter ``h_step``, ``cut_short=True``; the policy
        updates its LR mass) or note ``probe_exponent`` for the record. Default: unchanged.
        """
        return interval

    def recalibrate_for_new_workers(self) -> None:  # noqa: B027 (rules without N-dependent state)
        """Another number of workers continues the run (docs/algorithm.md#boundary-snapshots)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
