"""Recipe settings: a dataclass of defaults, YAML files that override it, flags that override both.

Both recipes describe their settings as one dataclass. A YAML file may name a
``base:`` file (relative to itself) whose values it extends, so the method
configs under ``recipes/configs/`` only state what differs from the shared
recipe. Every dataclass field is also a command-line flag
(``batch_size`` -> ``--batch-size``); a nested ``autoloco:`` mapping holds
:class:`~autoloco_hf.AutoLoCoConfig` fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any, Optional, Sequence, TypeVar

import yaml

T = TypeVar("T")


def load_yaml(path: str) -> dict[str, Any]:
    """``path``'s mapping merged over its ``base:`` chain (``autoloco:`` sub-mappings merge key by key)."""
    with open(path) as f:
        values = yaml.safe_load(f) or {}
    base = values.pop("base", None)
    if base is None:
        return values
    merged = load_yaml(os.path.join(os.path.dirname(os.path.abspath(path)), base))
    autoloco = {**merged.get("autoloco", {}), **values.pop("autoloco", {})}
    merged.update(values)
    if autoloco:
        merged["autoloco"] = autoloco
    return merged


def _flag_type(field: dataclasses.Field) -> Any:
    kind = str(field.type)
    if "bool" in kind:
        return lambda text: text.lower() in ("1", "true", "yes", "on")
    if "int" in kind and "float" not in kind:
        return int
    if "float" in kind:
        return float
    return str


def parse_settings(cls: type[T], argv: Optional[Sequence[str]], description: str) -> T:
    """Build ``cls`` from its defaults, ``--config`` YAML and flags (later wins); ``--set-autoloco k=v`` for the engine."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", help="YAML file (see recipes/configs/)")
    parser.add_argument(
        "--autoloco", action="append", default=[], metavar="FIELD=VALUE",
        help="an AutoLoCoConfig field, e.g. --autoloco h_base=250 (repeatable; YAML-parsed value)",
    )
    fields = [f for f in dataclasses.fields(cls) if f.name != "autoloco"]
    for field in fields:
        flag = "--" + field.name.replace("_", "-")
        if "list" in str(field.type):
            parser.add_argument(flag, nargs="+", default=None)
        else:
            parser.add_argument(flag, type=_flag_type(field), default=None)
    args = parser.parse_args(argv)
    values = load_yaml(args.config) if args.config else {}
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        parser.error(f"{args.config}: unknown setting(s) {unknown}")
    for field in fields:
        given = getattr(args, field.name)
        if given is not None:
            values[field.name] = given
    autoloco = dict(values.get("autoloco") or {})
    for item in args.autoloco:
        key, _, text = item.partition("=")
        autoloco[key.strip()] = yaml.safe_load(text)
    values["autoloco"] = autoloco
    return cls(**values)
