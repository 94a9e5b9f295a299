"""Recipe settings through Hugging Face's ``HfArgumentParser``: defaults, YAML files that override
them, flags that override both.

A recipe lists its dataclasses (its own settings; TRL's ``SFTConfig`` for the
SFT recipe, so that every ``TrainingArguments`` field is settable;
:class:`~autoloco_hf.integrations.trainer.arguments.AutoLoCoArguments` for the engine).
Every field is a flag (``--batch_size`` or ``--batch-size``) and a YAML key.
A YAML file may name a ``base:`` file (relative to itself) whose values it
extends, so the method configs under ``recipes/configs/`` only state what
differs from the shared recipe; a nested ``autoloco:`` mapping holds
``AutoLoCoConfig`` fields (``autoloco: {h_base: 250}`` is ``autoloco_h_base:
250``), and so does the repeatable flag ``--autoloco h_base=250``.

Usage errors (an unknown key or flag, a missing file, a bad value) print one
line naming the flag or key, the value and the fix, and exit with code 2.
Every input is checked in ``parse_args``, before a model or a dataset loads:
:func:`check_data_files` reads each local data file to its end
(exists, not empty, decompresses, parses, has the field) and counts its rows,
:func:`check_local_path` refuses a local-looking model or tokenizer path that is not there, and
:func:`check_at_least` the counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from autoloco_evals.data_files import DataFileError, inspect_files, load_rows
from autoloco_hf.config import AutoLoCoConfig
from autoloco_hf.integrations.trainer.arguments import PREFIX
from autoloco_hf.usage import usage_error

AUTOLOCO_FIELDS = tuple(f.name for f in dataclasses.fields(AutoLoCoConfig))


def setting(default: Any, help: str) -> Any:
    """A settings field with its ``--help`` text."""
    return dataclasses.field(default=default, metadata={"help": help})


def _suggest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"did you mean {close[0]}?" if close else "see --help for the known names"


def load_yaml(path: str, option: str = "--config") -> dict[str, Any]:
    """``path``'s mapping merged over its ``base:`` chain, with
    ``autoloco:`` sub-mappings flattened to ``autoloco_*`` keys."""
    if not os.path.isfile(path):
        example = (
            "recipes/configs/c4_autoloco.yaml" if option == "--config" else "a JSON or YAML file"
        )
        usage_error(f"{option} {path}: no such file; pass {example}")
    try:
        with open(path) as f:
            values = yaml.safe_load(f) or {}
    except yaml.YAMLError as err:
        usage_error(f"{option} {path}: not valid YAML ({str(err).splitlines()[0]})")
    if not isinstance(values, dict):
        usage_error(f"{option} {path}: expected a mapping of settings, got {type(values).__name__}")
    for key, value in (values.pop("autoloco", None) or {}).items():
        values[PREFIX + key] = value
    base = values.pop("base", None)
    if base is None:
        return values
    return {
        **load_yaml(os.path.join(os.path.dirname(os.path.abspath(path)), base), option),
        **values,
    }


def _expand_autoloco_flags(argv: Sequence[str]) -> list[str]:
    """``--autoloco FIELD=VALUE`` -> ``--autoloco_FIELD VALUE``
    (the short form the recipe docs use)."""
    out: list[str] = []
    items = iter(argv)
    for arg in items:
        if arg == "--autoloco" or arg.startswith("--autoloco="):
            item = arg.partition("=")[2] if "=" in arg else next(items, "")
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in AUTOLOCO_FIELDS:
                hint = (
                    _suggest(key, AUTOLOCO_FIELDS)
                    if sep
                    else "write FIELD=VALUE, e.g. --autoloco h_base=250"
                )
                usage_error(f"--autoloco {item}: {key!r} is not an AutoLoCoConfig field; {hint}")
            out += [f"--{PREFIX}{key}", value]
        else:
            out.append(arg)
    return out


def parse_settings(
    types: Sequence[type],
    argv: Sequence[str] | None,
    description: str,
    defaults: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """One instance per dataclass in ``types``, from their defaults,
    ``defaults``, ``--config`` YAML and flags (later wins)."""
    from transformers import HfArgumentParser

    argv = _expand_autoloco_flags(list(sys.argv[1:] if argv is None else argv))
    parser = HfArgumentParser(list(types), description=description, allow_abbrev=False)
    # one line, not argparse's full usage block (the recipes have ~200 flags)
    parser.error = usage_error
    parser.add_argument(
        "--config", help="YAML file of settings (see recipes/configs/); flags override it"
    )
    known = {action.dest for action in parser._actions} - {"help", "config"}
    values = dict(defaults or {})
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    config_path = pre.parse_known_args(argv)[0].config
    if config_path:
        from_file = load_yaml(config_path)
        unknown = sorted(set(from_file) - known)
        if unknown:
            usage_error(
                f"--config {config_path}: unknown setting {unknown[0]!r}; "
                f"{_suggest(unknown[0], sorted(known))}"
            )
        values.update(from_file)
    parser.set_defaults(**values)
    _, rest = parser.parse_known_args(argv)
    if rest:
        flag = next((a for a in rest if a.startswith("--")), rest[0])
        name = flag.lstrip("-").split("=")[0].replace("-", "_")
        usage_error(f"unrecognized argument {flag}; {_suggest(name, sorted(known))}")
    try:
        parsed = parser.parse_args_into_dataclasses(args=argv)
    # a dataclass's __post_init__ refused a combination of values
    except (ValueError, TypeError) as err:
        usage_error(str(err).splitlines()[0])
    return tuple(p for p in parsed if not isinstance(p, argparse.Namespace))


def check_data_files(files: Sequence[str], option: str, column: str, fix: str = "") -> list[int]:
    """Each local data file parses to its end and its rows
    hold ``column``; returns each file's row count.

    See ``autoloco_evals.data_files.inspect_files``: a corrupt or cut-short file is a usage error.
    """
    try:
        return [scan.rows for scan in inspect_files(files, option, [column], fix, limit=1)]
    except DataFileError as err:
        usage_error(str(err))


def rows_per_worker(file_rows: Sequence[int], workers: int) -> list[int]:
    """The rows ``datasets.distributed.split_dataset_by_node``
    gives each of ``workers`` from files of ``file_rows`` rows.

    Its rule for a streamed dataset: whole files (worker ``w`` gets files ``w, w + N, ...``)
    when the file count is a multiple of ``N``, else every ``N``-th row.
    """
    if len(file_rows) % workers == 0:
        return [sum(file_rows[w::workers]) for w in range(workers)]
    return [len(range(w, sum(file_rows), workers)) for w in range(workers)]


def load_data_files(files: Sequence[str], option: str, *, streaming: bool = False) -> Any:
    """``datasets.load_dataset`` of local files (builder by
    name); a file it cannot read is a usage error."""
    try:
        return load_rows(files, option, streaming=streaming)
    except DataFileError as err:
        usage_error(str(err))


def check_local_path(value: str | None, option: str, needs: str | None = None) -> None:
    """A value that reads as a local path (``/``, ``.``, ``~``)
    must exist (and hold ``needs``); others are hub ids."""
    if value is None or not value.startswith(("/", ".", "~")):
        return
    path = os.path.expanduser(value)
    if not os.path.exists(path):
        usage_error(
            f"{option} {value}: no such file or folder; pass a local path that exists, or a hub id"
        )
    if needs and not os.path.exists(os.path.join(path, needs)):
        usage_error(
            f"{option} {value}: no {needs} in it; pass a folder written by "
            "save_pretrained, or a hub id"
        )


def check_at_least(settings: Any, minimum: int, *names: str) -> None:
    """Each named setting (when set) is a whole number >= ``minimum``."""
    for name in names:
        value = getattr(settings, name)
        if value is not None and value < minimum:
            usage_error(f"--{name.replace('_', '-')} {value}: pass a whole number >= {minimum}")
