"""``AutoLoCoArguments``: :class:`~autoloco_hf.AutoLoCoConfig`
as Hugging Face command-line / YAML arguments.

``TrainingArguments`` already owns names such as ``warmup_steps``, so the
config's fields cannot sit beside it in one ``HfArgumentParser``. This
dataclass is generated from the config's field metadata (every field, including
ones added later) with an ``autoloco_`` prefix, the field's help and range as
``--help``, enum choices from the field's type, and ``None`` as "not given", so
a recipe preset fills what the user left out::

    from transformers import HfArgumentParser, TrainingArguments
    from autoloco_hf import AutoLoCoArguments, AutoLoCoCallback

    training_args, autoloco_args = HfArgumentParser(
        (TrainingArguments, AutoLoCoArguments)
    ).parse_args_into_dataclasses()
    callback = AutoLoCoCallback(autoloco_args.to_config())

Any script built this way also takes the short form ``--autoloco h_base=100
--autoloco method=diloco`` (a YAML ``autoloco:`` mapping is the same thing).
It composes the same way with TRL's ``SFTConfig`` and ``TrlParser`` (YAML
``--config`` files included). A value that arrives as text (a YAML ``7e-1``:
YAML 1.1 needs a dot; a ``FIELD=VALUE`` item) is read exactly as the parser
reads that flag on the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

from autoloco_hf.config import AutoLoCoConfig, ConfigError, field_types, suggest

PREFIX = "autoloco_"
SHORT_FORM = "autoloco"  # the repeatable --autoloco FIELD=VALUE flag
CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(AutoLoCoConfig))


def _help(f: dataclasses.Field) -> str:
    default = f.default.value if isinstance(f.default, Enum) else f.default
    within = f.metadata["range"]
    bounds = f", {within}" if within is not None else ""
    return (
        f"{f.metadata['help']} (AutoLoCoConfig.{f.name}{bounds}; not given: the recipe's "
        f"value, else {default!r})"
    )


@functools.cache
def _readers() -> dict[str, Callable[[str], Any]]:
    """Each config field's command-line type function, as
    ``HfArgumentParser`` builds it (``string_to_bool``, ...)."""
    from transformers import HfArgumentParser

    actions = HfArgumentParser(AutoLoCoArguments)._actions
    return {
        a.dest[len(PREFIX) :]: a.type
        for a in actions
        if a.dest.startswith(PREFIX) and a.type is not None
    }


def _read(name: str, text: str) -> Any:
    """``text`` converted as ``--autoloco_<name> text`` would
    be on the command line; a bad one fails in one line."""
    try:
        return _readers()[name](text)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        kind = field_types(AutoLoCoConfig)[name][0]
        example = "true" if kind is bool else getattr(AutoLoCoConfig(), name)
        hint = f": write e.g. --{PREFIX}{name} {example}" if example is not None else ""
        raise ConfigError(
            f"--{PREFIX}{name}={text!r} is not a valid {kind.__name__}{hint}"
        ) from None


def _short_form_items(given: Any) -> list[tuple[str, Any]]:
    """``["h_base=100", ...]`` (flags) or ``{"h_base": 100}``
    (a YAML mapping) as ``(field, value)`` pairs."""
    if isinstance(given, Mapping):
        pairs = list(given.items())
    else:
        pairs = []
        for item in given:
            key, sep, value = str(item).partition("=")
            if not sep:
                raise ConfigError(
                    f"--{SHORT_FORM} {item!r}: write FIELD=VALUE, e.g. --{SHORT_FORM} h_base=250"
                )
            pairs.append((key.strip(), value))
    for key, value in pairs:
        if key not in CONFIG_FIELDS:
            raise ConfigError(
                f"--{SHORT_FORM} {key}={value}: AutoLoCoConfig has no field {key!r}; "
                f"{suggest(key, CONFIG_FIELDS)}"
            )
    return pairs


def __post_init__(self: Any) -> None:
    """Read text values as the command line would, and fold
    ``--autoloco FIELD=VALUE`` into the prefixed fields."""
    for name, value in _short_form_items(getattr(self, SHORT_FORM) or ()):
        if getattr(self, PREFIX + name) is not None:
            raise ConfigError(
                f"--{SHORT_FORM} {name}={value} repeats --{PREFIX}{name}: give the field once"
            )
        setattr(self, PREFIX + name, value)
    # now held by the prefixed fields, so the instance has one spelling of each
    setattr(self, SHORT_FORM, None)
    for name in CONFIG_FIELDS:
        value = getattr(self, PREFIX + name)
        if isinstance(value, str):
            setattr(self, PREFIX + name, _read(name, value))


def overrides(self: Any) -> dict[str, Any]:
    """The config fields that were given (not ``None``), without the prefix."""
    values = {name: getattr(self, PREFIX + name) for name in CONFIG_FIELDS}
    return {k: v for k, v in values.items() if v is not None}


def to_config(self: Any, **preset: Any) -> AutoLoCoConfig:
    """``AutoLoCoConfig(**preset)`` with the given fields on top (e.g. ``preset=RECIPES["c4"]``).

    A given field that does nothing under the config's method is refused, at its default value too.
    """
    given = self.overrides()
    config = AutoLoCoConfig(**{**preset, **given})
    config.check_given(given)
    return config


def _argument_type(name: str) -> type:
    """The field's type on the command line: ``rule_options``
    (any of several forms) arrives as text."""
    kind = field_types(AutoLoCoConfig)[name][0]
    return str if kind is Any else kind


def _build() -> type:
    fields: list[tuple[str, Any, Any]] = [
        (
            PREFIX + f.name,
            _argument_type(f.name) | None,
            dataclasses.field(default=None, metadata={"help": _help(f)}),
        )
        for f in dataclasses.fields(AutoLoCoConfig)
    ]
    short_help = (
        f"any AutoLoCoConfig field as FIELD=VALUE, repeatable: --{SHORT_FORM} h_base=100 "
        f"--{SHORT_FORM} method=diloco (the same as --autoloco_h_base 100 --autoloco_method diloco)"
    )
    fields.append(
        (
            SHORT_FORM,
            list[str] | None,
            dataclasses.field(default=None, metadata={"help": short_help, "action": "extend"}),
        )
    )
    return dataclasses.make_dataclass(
        "AutoLoCoArguments",
        fields,
        namespace={
            "__post_init__": __post_init__,
            "overrides": overrides,
            "to_config": to_config,
            "__doc__": "Every AutoLoCoConfig field as an ``autoloco_``-prefixed "
            "argument (``None``: not given).",
            "__module__": __name__,
        },
    )


AutoLoCoArguments = _build()
