"""The field machinery of the config: admissible ranges,
typed checks, and the parsers of list fields.

Each field of ``AutoLoCoConfig`` carries its help text and range in its metadata (``option``); one
loop checks them all when the object is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

from autoloco_hf.errors import ConfigError


def _fail(name: str, value: Any, fix: str) -> typing.NoReturn:
    raise ConfigError(f"AutoLoCoConfig.{name}={value!r} is invalid: {fix}")


# ---------------------------------------------------------------- field metadata
@dataclass(frozen=True)
class Range:
    """The admissible values of a numeric field: from ``low`` to ``high``, either end open."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {self.low}"
        return (
            f"in {'(' if self.low_open else '['}{self.low}, "
            f"{self.high}{')' if self.high_open else ']'}"
        )


COUNT = Range(1)  # an integer count of one or more
NON_NEGATIVE = Range(0)
POSITIVE = Range(0.0, low_open=True)
ABOVE_ONE = Range(1.0, low_open=True)
AT_LEAST_ONE = Range(1.0)
FRACTION = Range(0.0, 1.0, high_open=True)  # a momentum, an EMA factor, a mixing weight


def option(default: Any, help: str, within: Range | None = None) -> Any:
    """A config field with its ``--help`` text and, for
    numbers, its admissible range (checked on construction)."""
    return dataclasses.field(
        default=default, metadata={"help": " ".join(help.split()), "range": within}
    )


@functools.cache
def field_types(cls: type) -> dict[str, tuple[type, bool]]:
    """``{name: (type, accepts None)}`` of a dataclass's
    fields: ``int | None`` -> ``(int, True)``."""
    types = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        types[name] = (args[0] if optional else hint, optional)
    return types


def _checked(name: str, value: Any, kind: type, within: Range | None) -> Any:
    """``value`` if it has the field's type and lies in its
    range (an enum's text as the enum); else ConfigError."""
    if issubclass(kind, Enum):
        choices = [c.value for c in kind]
        if value not in choices:
            _fail(name, value, f"use one of {', '.join(choices)}")
        return kind(value)
    # "false" or 0 would otherwise decide a switch by truthiness
    if kind is bool and not isinstance(value, bool):
        _fail(name, value, "pass True or False")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        _fail(name, value, "pass an integer")
    if kind is float and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    ):
        _fail(name, value, "pass a finite number")
    if within is not None and value not in within:
        _fail(name, value, f"it must be {within}")
    return value


def _numbers(name: str, value: Any) -> list[Any]:
    """``value`` as a list: a sequence as it is, text split at commas (the command line's form)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    _fail(name, value, "pass a list or comma-separated text")


def _speed(name: str, value: Any, text: Any) -> float:
    try:
        speed = float(value)
    except (TypeError, ValueError):
        _fail(name, text, f"{value!r} is not a number")
    if not (math.isfinite(speed) and speed > 0):
        _fail(name, text, f"every speed must be a finite number > 0, got {value!r}")
    return speed


def _speed_list(value: Any) -> list[float]:
    """``worker_speeds`` as floats, each finite and positive."""
    speeds = [_speed("worker_speeds", v, value) for v in _numbers("worker_speeds", value)]
    if not speeds:
        _fail("worker_speeds", value, "give one speed per worker, e.g. 1,1,1,0.5")
    return speeds


def _speed_changes(value: Any, workers: int) -> list[list[Any]]:
    """``speed_changes`` as ``[step, worker, speed]`` triples, sorted by step."""
    changes = []
    for entry in _numbers("speed_changes", value):
        parts = (
            entry.split(":")
            if isinstance(entry, str)
            else list(entry)
            if isinstance(entry, (list, tuple))
            else []
        )
        if len(parts) != 3:
            _fail("speed_changes", value, f"{entry!r} is not step:worker:speed")
        try:
            step, worker = int(parts[0]), int(parts[1])
        except (TypeError, ValueError):
            _fail("speed_changes", value, f"{entry!r}: step and worker must be integers")
        if step < 0 or not 0 <= worker < workers:
            _fail(
                "speed_changes",
                value,
                f"{entry!r}: step >= 0 and worker in 0..{workers - 1} (worker_speeds)",
            )
        changes.append([step, worker, _speed("speed_changes", parts[2], value)])
    return sorted(changes)


def suggest(name: str, known: typing.Iterable[str]) -> str:
    """``did you mean h_base?`` for a misspelt field, else where the names are listed."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {close[0]}?" if close else "help(AutoLoCoConfig) lists the fields"
