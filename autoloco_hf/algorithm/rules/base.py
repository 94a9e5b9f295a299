"""The horizon-rule interface and its registry (docs/algorithm.md §5.7).

A horizon rule chooses AutoLoCo's next token-equivalent horizon from the
statistics of the interval that just ended. Each rule is one class behind
:class:`HorizonRule`, with its own options dataclass, found by name in a
registry (as ``transformers.get_scheduler`` finds a schedule)::

    @register_rule
    class FixedSchedule(HorizonRule):
        name = "fixed_schedule"
        Options = FixedScheduleOptions
        ...

    AutoLoCoConfig(controller="fixed_schedule", rule_options={"start": 40}, rule_module="mypkg.rules")

A rule that needs something measured *inside* an interval asks for it with
:meth:`HorizonRule.measurements` (:class:`DisplacementAt` requests); the engine
serves every rule's requests alike and hands shared results back through
:meth:`HorizonRule.on_measurement`, so the engine names no rule.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from autoloco_hf.config import ConfigError

if TYPE_CHECKING:
    from autoloco_hf.algorithm.policies import NextInterval
    from autoloco_hf.algorithm.rules.decisions import IntervalObservation, Phase, RuleDecision
    from autoloco_hf.config import AutoLoCoConfig


class RuleError(ConfigError):
    """An unknown rule or a bad rule option; the message names the rule, the option and the valid names."""


# ------------------------------------------------------------------ measurement requests
class Delivery(str, Enum):
    """How the engine delivers a requested measurement."""

    BOUNDARY = "boundary"  # kept by each worker, summed with the interval's control message: in the observation
    SHARED = "shared"  # summed over all workers at once (one small all-reduce): handed to on_measurement


@dataclass(frozen=True)
class DisplacementAt:
    """Ask for every worker's displacement ``||theta - theta_t||^2`` after ``step`` steps of the interval.

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
    """A shared measurement's result: the displacement summed over all workers and the LR mass of its steps."""

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
    base_outer_momentum: ClassVar[float] = 0.7  # default outer_momentum (docs/algorithm.md §4)
    # whether intervals at any horizon calibrate the token mapper (a rule that starts away from h_base)
    calibrates_tokens_at_any_horizon: ClassVar[bool] = False

    def __init__(self, config: AutoLoCoConfig, warmup_steps: int = 0) -> None:
        self.cfg = config
        self.options = config.rule_options
        self.warmup_steps = warmup_steps

    @classmethod  # noqa: B027 (most rules combine with every setting)
    def check_config(cls, config: AutoLoCoConfig) -> None:
        """Refuse, with a :class:`RuleError`, settings of ``config`` the rule cannot follow (called at construction)."""

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
        """The interval to run on, given the shared measurements (in step order, identical on every worker).

        A rule may end the interval early (a shorter ``h_step``, ``cut_short=True``; the policy updates its LR
        mass) or note ``probe_exponent`` for the record. Default: unchanged.
        """
        return interval

    def recalibrate_for_new_workers(self) -> None:  # noqa: B027 (rules without N-dependent state)
        """Another number of workers continues the run (docs/algorithm.md §8.5)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


# ------------------------------------------------------------------ the registry
_RULES: dict[str, type[HorizonRule]] = {}

R = typing.TypeVar("R", bound=type[HorizonRule])


def register_rule(cls: R) -> R:
    """Class decorator: make ``cls`` selectable as ``AutoLoCoConfig(controller=cls.name)``."""
    if not (dataclasses.is_dataclass(cls.Options) and isinstance(cls.Options, type)):
        raise RuleError(f"rule {cls.__name__}: Options must be a dataclass, got {cls.Options!r}")
    known = _RULES.get(cls.name)
    if known is not None and known.__qualname__ != cls.__qualname__:
        raise RuleError(f"rule name {cls.name!r} is taken by {known.__module__}.{known.__qualname__}")
    _RULES[cls.name] = cls
    return cls


def rule_names() -> tuple[str, ...]:
    return tuple(_RULES)


def import_rule_module(module: str | None) -> None:
    """Import the module that registers an out-of-package rule (``rule_module``); a failure names it."""
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or not (module == error.name or module.startswith(error.name + ".")):
            raise RuleError(f"rule_module={module!r} failed on import ({error}): fix that import") from None
        raise RuleError(f"rule_module={module!r} cannot be imported ({error}): put it on PYTHONPATH") from None
    except Exception as error:  # a syntax error, or any exception its top-level code raises
        kind = type(error).__name__
        raise RuleError(f"rule_module={module!r} failed on import ({kind}: {error}): fix the module") from None


def get_rule(name: str) -> type[HorizonRule]:
    """The rule registered as ``name``; an unknown one fails naming the registered ones."""
    if name not in _RULES:
        raise RuleError(
            f"controller={name!r} is not a registered horizon rule: use one of {', '.join(_RULES)}, or name the "
            "module that registers it in rule_module"
        )
    return _RULES[name]


def rule_options(name: str, given: Any) -> Any:
    """``given`` (None, a mapping, ``"a=1,b=2"`` / JSON text, or the Options instance) as rule ``name``'s Options.

    An unknown option fails naming the rule, the option, the rule it belongs to (if any) and the valid names.
    """
    options_cls = get_rule(name).Options
    if given is None:
        return options_cls()
    if isinstance(given, options_cls):
        values = {f.name: getattr(given, f.name) for f in dataclasses.fields(given)}
    elif dataclasses.is_dataclass(given):
        owner = next((r.name for r in _RULES.values() if isinstance(given, r.Options)), type(given).__name__)
        raise RuleError(f"rule_options is an option set of rule {owner!r}, but controller={name!r}")
    elif isinstance(given, str):
        values = _parse_text(given)
    elif isinstance(given, Mapping):
        values = dict(given)
    else:
        raise RuleError(f"rule_options={given!r}: pass a dict, 'name=value,...' text or {options_cls.__name__}")
    types = typing.get_type_hints(options_cls)
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    valid = list(fields)
    for key, value in values.items():
        if key not in types:
            owners = [r.name for r in _RULES.values() if r.name != name and key in typing.get_type_hints(r.Options)]
            where = f" (it is an option of rule {' / '.join(repr(o) for o in owners)})" if owners else ""
            raise RuleError(
                f"rule_options[{key!r}] is not an option of rule {name!r}{where}: "
                f"its options are {', '.join(valid) or 'none'}"
            )
        values[key] = _typed(name, key, value, types[key])
        within = fields[key].metadata.get("range")
        if within is not None and values[key] is not None and values[key] not in within:
            raise RuleError(f"rule_options[{key!r}]={values[key]!r} of rule {name!r} is invalid: it must be {within}")
    options = options_cls(**values)
    check = getattr(options, "check", None)
    if check is not None:
        check()
    return options


def _parse_text(text: str) -> dict[str, Any]:
    """``'{"gain": 0.9}'`` or ``gain=0.9,start_probe=1.85`` as a dict (values stay text until typed)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            return dict(json.loads(text))
        except json.JSONDecodeError as error:
            raise RuleError(f"rule_options={text!r} is not valid JSON ({error})") from None
    values = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise RuleError(f"rule_options item {item!r}: write NAME=VALUE, e.g. gain=0.9,start_probe=1.85")
        values[key.strip()] = value.strip()
    return values


def _typed(rule: str, key: str, value: Any, hint: Any) -> Any:
    """``value`` as the option's type (text is read as the command line would); a mismatch fails in one line."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = len(args) < len(typing.get_args(hint))
    kind = args[0] if optional else hint

    def fail(fix: str) -> typing.NoReturn:
        raise RuleError(f"rule_options[{key!r}]={value!r} of rule {rule!r} is invalid: {fix}")

    if isinstance(value, str) and kind is not str:
        if optional and value.lower() in ("none", "null", ""):
            return None
        if kind is bool:
            if value.lower() not in ("true", "false"):
                fail("pass true or false")
            return value.lower() == "true"
        if isinstance(kind, type) and issubclass(kind, Enum):
            pass  # checked below
        else:
            try:
                value = kind(value)
            except (TypeError, ValueError):
                fail(f"pass a {kind.__name__}")
    if value is None:
        if not optional:
            fail("it cannot be None")
        return None
    if isinstance(kind, type) and issubclass(kind, Enum):
        choices = [c.value for c in kind]
        if value not in choices:
            fail(f"use one of {', '.join(choices)}")
        return kind(value)
    if kind is bool and not isinstance(value, bool):
        fail("pass True or False")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        fail("pass an integer")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
        fail("pass a finite number")
    return value


def check_range(rule: str, key: str, value: Any, ok: bool, fix: str) -> None:
    """One line naming the rule and the option when ``ok`` is false (for an Options' ``check``)."""
    if not ok:
        raise RuleError(f"rule_options[{key!r}]={value!r} of rule {rule!r} is invalid: {fix}")
