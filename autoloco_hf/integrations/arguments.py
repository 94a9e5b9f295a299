"""``AutoLoCoArguments``: :class:`~autoloco_hf.AutoLoCoConfig` as Hugging Face command-line / YAML arguments.

``TrainingArguments`` already owns names such as ``warmup_steps``, so the
config's fields cannot sit beside it in one ``HfArgumentParser``. This
dataclass is generated from :class:`AutoLoCoConfig` (every field, including
ones added later) with an ``autoloco_`` prefix, the field's docstring entry as
``--help``, enum choices for ``method`` / ``wire_dtype``, and ``None`` as
"not given", so a recipe preset fills what the user left out::

    from transformers import HfArgumentParser, TrainingArguments
    from autoloco_hf.integrations.arguments import AutoLoCoArguments

    training_args, autoloco_args = HfArgumentParser((TrainingArguments, AutoLoCoArguments)).parse_args_into_dataclasses()
    callback = AutoLoCoCallback(autoloco_args.to_config())

It composes the same way with TRL's ``SFTConfig`` and ``TrlParser`` (YAML
``--config`` files included). Numbers that YAML reads as strings (``7e-1``:
YAML 1.1 needs a dot) are converted by field type.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from enum import Enum
from typing import Any

from autoloco_hf.config import AutoLoCoConfig, ConfigError

PREFIX = "autoloco_"


def field_help(doc: str) -> dict[str, str]:
    """Each field's entry of a HF-style ``Args:`` docstring (``name (`type`, ...):`` then indented text)."""
    helps: dict[str, str] = {}
    names: list[str] = []
    header = re.compile(r"^\s{8}(\w+) \(`")
    for line in doc.splitlines():
        if header.match(line):
            names = re.findall(r"(?:^|, )(\w+) \(`[^)]*\)", line.strip())
            for name in names:
                helps[name] = ""
        elif names and line.startswith(" " * 12) and line.strip():
            for name in names:
                helps[name] = (helps[name] + " " + line.strip()).strip()
        elif not line.strip():
            continue
        else:
            names = []
    return helps


def _base_type(hint: Any) -> Any:
    """``Optional[X]`` -> ``X``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


def _coerce(name: str, value: Any, kind: Any) -> Any:
    """A YAML / dict value converted to the field's type where it arrived as text (``"7e-1"``, ``"true"``)."""
    if value is None or not isinstance(value, str):
        return value
    text = value.strip()
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered in ("true", "yes", "1", "on"):
                return True
            if lowered in ("false", "no", "0", "off"):
                return False
            raise ValueError(text)
        if kind is int:
            number = float(text)
            if number != int(number):
                raise ValueError(text)
            return int(number)
        if kind is float:
            return float(text)
    except ValueError:
        raise ConfigError(
            f"--{PREFIX}{name}={value!r} is not a valid {kind.__name__}: pass e.g. "
            f"{ {bool: 'true', int: '500', float: '0.7'}[kind] }"
        ) from None
    return value


def _build() -> type:
    hints = typing.get_type_hints(AutoLoCoConfig)
    helps = field_help(AutoLoCoConfig.__doc__ or "")
    fields = []
    for f in dataclasses.fields(AutoLoCoConfig):
        kind = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else None
        shown = default.value if isinstance(default, Enum) else default
        text = helps.get(f.name) or f"AutoLoCoConfig.{f.name}"
        metadata = {"help": f"{text} (AutoLoCoConfig.{f.name}; not given: the recipe's value, else {shown!r})"}
        fields.append((PREFIX + f.name, kind | None, dataclasses.field(default=None, metadata=metadata)))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(AutoLoCoConfig):
            kind = _base_type(hints[f.name])
            if not (isinstance(kind, type) and issubclass(kind, Enum)):
                setattr(self, PREFIX + f.name, _coerce(f.name, getattr(self, PREFIX + f.name), kind))

    def overrides(self) -> dict[str, Any]:
        """The config fields that were given (not ``None``), without the prefix."""
        values = {f.name[len(PREFIX) :]: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in values.items() if v is not None}

    def to_config(self, **preset: Any) -> AutoLoCoConfig:
        """``AutoLoCoConfig(**preset)`` with the given fields on top (e.g. ``preset=RECIPES["c4"]``)."""
        return AutoLoCoConfig(**{**preset, **self.overrides()})

    return dataclasses.make_dataclass(
        "AutoLoCoArguments",
        fields,
        namespace={
            "__post_init__": __post_init__,
            "overrides": overrides,
            "to_config": to_config,
            "__doc__": "Every AutoLoCoConfig field as an ``autoloco_``-prefixed argument (``None``: not given).",
            "__module__": __name__,
        },
    )


AutoLoCoArguments = _build()
