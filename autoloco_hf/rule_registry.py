"""The registry of horizon rules: a name in the config, a class in the algorithm
(docs/algorithm.md#rule-plugins).

It sits on the ground floor, beside the config, because the config checks
``controller`` and ``rule_options`` when it is built. The rules themselves live
in :mod:`autoloco_hf.algorithm.rules`, a floor above. The registry finds the
built-in ones the way it finds a rule of ``rule_module``: by importing their
module by name. So the config never imports the algorithm.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import typing
from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any

from autoloco_hf.errors import ConfigError

if TYPE_CHECKING:
    from autoloco_hf.algorithm.rules.base import HorizonRule

# The modules that register the built-in rules, imported on first use.
BUILT_IN_RULE_MODULES = ("autoloco_hf.algorithm.rules.paper", "autoloco_hf.algorithm.rules.descent")


class RuleError(ConfigError):
    """An unknown rule or a bad rule option; the message
    names the rule, the option and the valid names."""


def _import_built_in_rules() -> None:
    for module in BUILT_IN_RULE_MODULES:
        importlib.import_module(module)


_RULES: dict[str, type[HorizonRule]] = {}

R = typing.TypeVar("R", bound="type[HorizonRule]")


def register_rule(cls: R) -> R:
    """Class decorator: make ``cls`` selectable as ``AutoLoCoConfig(controller=cls.name)``."""
    if not (dataclasses.is_dataclass(cls.Options) and isinstance(cls.Options, type)):
        raise RuleError(f"rule {cls.__name__}: Options must be a dataclass, got {cls.Options!r}")
    known = _RULES.get(cls.name)
    if known is not None and known.__qualname__ != cls.__qualname__:
        raise RuleError(
            f"rule name {cls.name!r} is taken by {known.__module__}.{known.__qualname__}"
        )
    _RULES[cls.name] = cls
    return cls


def rule_names() -> tuple[str, ...]:
    _import_built_in_rules()
    return tuple(_RULES)


def import_rule_module(module: str | None) -> None:
    """Import the module that registers an out-of-package
    rule (``rule_module``); a failure names it."""
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or not (module == error.name or module.startswith(error.name + ".")):
            raise RuleError(
                f"rule_module={module!r} failed on import ({error}): fix that import"
            ) from None
        raise RuleError(
            f"rule_module={module!r} cannot be imported ({error}): put it on PYTHONPATH"
        ) from None
    except Exception as error:  # a syntax error, or any exception its top-level code raises
        kind = type(error).__name__
        raise RuleError(
            f"rule_module={module!r} failed on import ({kind}: {error}): fix the module"
        ) from None


def get_rule(name: str) -> type[HorizonRule]:
    """The rule registered as ``name``; an unknown one fails naming the registered ones."""
    _import_built_in_rules()
    if name not in _RULES:
        raise RuleError(
            f"controller={name!r} is not a registered horizon rule: use one of "
            f"{', '.join(_RULES)}, or name the module that registers it in rule_module"
        )
    return _RULES[name]


def rule_options(name: str, given: Any) -> Any:
    """``given`` (None, a mapping, ``"a=1,b=2"`` / JSON text,
    or the Options instance) as rule ``name``'s Options.

    An unknown option fails naming the rule, the option, the
    rule it belongs to (if any) and the valid names.
    """
    options_cls = get_rule(name).Options
    if given is None:
        return options_cls()
    if isinstance(given, options_cls):
        values = {f.name: getattr(given, f.name) for f in dataclasses.fields(given)}
    elif dataclasses.is_dataclass(given):
        owner = next(
            (r.name for r in _RULES.values() if isinstance(given, r.Options)), type(given).__name__
        )
        raise RuleError(f"rule_options is an option set of rule {owner!r}, but controller={name!r}")
    elif isinstance(given, str):
        values = _parse_text(given)
    elif isinstance(given, Mapping):
        values = dict(given)
    else:
        raise RuleError(
            f"rule_options={given!r}: pass a dict, 'name=value,...' text or {options_cls.__name__}"
        )
    types = typing.get_type_hints(options_cls)
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    valid = list(fields)
    for key, value in values.items():
        if key not in types:
            owners = [
                r.name
                for r in _RULES.values()
                if r.name != name and key in typing.get_type_hints(r.Options)
            ]
            where = (
                f" (it is an option of rule {' / '.join(repr(o) for o in owners)})"
                if owners
                else ""
            )
            raise RuleError(
                f"rule_options[{key!r}] is not an option of rule {name!r}{where}: "
                f"its options are {', '.join(valid) or 'none'}"
            )
        values[key] = _typed(name, key, value, types[key])
        within = fields[key].metadata.get("range")
        if within is not None and values[key] is not None and values[key] not in within:
            raise RuleError(
                f"rule_options[{key!r}]={values[key]!r} of rule {name!r} is "
                f"invalid: it must be {within}"
            )
    options = options_cls(**values)
    check = getattr(options, "check", None)
    if check is not None:
        check()
    return options


def _parse_text(text: str) -> dict[str, Any]:
    """``'{"gain": 0.9}'`` or ``gain=0.9,start_probe=1.85``
    as a dict (values stay text until typed)."""
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
            raise RuleError(
                f"rule_options item {item!r}: write NAME=VALUE, e.g. gain=0.9,start_probe=1.85"
            )
        values[key.strip()] = value.strip()
    return values


def _typed(rule: str, key: str, value: Any, hint: Any) -> Any:
    """``value`` as the option's type (text is read as the
    command line would); a mismatch fails in one line."""
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
    if kind is float and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    ):
        fail("pass a finite number")
    return value


def check_range(rule: str, key: str, value: Any, ok: bool, fix: str) -> None:
    """One line naming the rule and the option when ``ok`` is false (for an Options' ``check``)."""
    if not ok:
        raise RuleError(f"rule_options[{key!r}]={value!r} of rule {rule!r} is invalid: {fix}")
