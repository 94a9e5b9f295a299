"""Local data files read with ``datasets.load_dataset``, and checked before any model loads.

The builder comes from the file name, as ``datasets`` itself picks it
(``.jsonl`` / ``.json`` -> json, ``.parquet`` -> parquet, ``.txt`` -> text;
a ``.gz`` / ``.zst`` / ... suffix is looked through, by fsspec). :func:`check_files`
reads the rows a run will use, so an empty file, a malformed line (named by
file and line) or a missing field costs one line and exit code 2, not a
traceback after a minute of model loading or a whole training epoch.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import EvalInputError

# the ``datasets`` builder of each file ending we take, as ``load_dataset(data_files=...)`` would pick it
BUILDERS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")  # looked through by fsspec, by name
FORMATS = ".jsonl, .json, .parquet or .txt (optionally compressed, e.g. .jsonl.gz)"


class DataFileError(EvalInputError):
    """A local data file that cannot be used: the message is one line naming the option, the file and the fix."""


def builder(paths: Sequence[str | os.PathLike], option: str) -> str:
    """The ``datasets`` builder of ``paths`` (one per split; mixing is refused, naming the files)."""
    found = {}
    for path in paths:
        name = Path(path).name
        for suffix in COMPRESSIONS:
            name = name.removesuffix(suffix)
        kind = BUILDERS.get(Path(name).suffix.lower())
        if kind is None:
            raise DataFileError(f"{option} {path}: unknown file type; pass {FORMATS}")
        found[str(path)] = kind
    if len(set(found.values())) > 1:
        raise DataFileError(
            f"{option}: files of one split must share a format, got {', '.join(f'{p} ({k})' for p, k in found.items())}"
        )
    return next(iter(found.values()))


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """``datasets`` logs each failed JSON parse as an error before raising it: the raised one is reported once."""
    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _first_bad_line(path: str | os.PathLike) -> str | None:
    """``line N: reason`` for the first line of a JSON Lines file that is not one JSON object (the error path only)."""
    import fsspec

    with fsspec.open(str(path), "rt", encoding="utf-8", compression="infer") as f:
        head = f.read(1)
        while head.isspace():
            head = f.read(1)
        if head == "[":  # one JSON array, not JSON Lines
            try:
                json.loads(head + f.read())
            except json.JSONDecodeError as err:
                return f"line {err.lineno}: not valid JSON ({err.msg})"
            return None
    with fsspec.open(str(path), "rt", encoding="utf-8", compression="infer") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                return f"line {number} column {err.colno}: not a JSON object ({err.msg.removesuffix(' at')})"
            if not isinstance(row, dict):
                return f"line {number}: a JSON {type(row).__name__}, not an object"
    return None


def load_rows(paths: Sequence[str | os.PathLike], option: str, *, streaming: bool = False) -> Any:
    """``datasets.load_dataset(builder, data_files=paths, split="train")``; a file it cannot read is a DataFileError."""
    from datasets import load_dataset

    kind = builder(paths, option)
    with _quiet_datasets():
        try:
            return load_dataset(kind, data_files=[str(p) for p in paths], split="train", streaming=streaming)
        except StopIteration:  # what load_dataset raises when the files hold no rows
            raise DataFileError(
                f"{option} {' '.join(map(str, paths))}: the file is empty; pass a file with one example per row"
            ) from None
        except Exception as err:  # noqa: BLE001 - datasets / pyarrow raise many types; each is one line
            raise DataFileError(_located(err, paths, option, kind)) from err


def _located(err: BaseException, paths: Sequence[str | os.PathLike], option: str, kind: str) -> str:
    """``OPTION FILE: reason``, with the first file (and line) at fault when it can be found."""
    for path in paths:
        if kind == "json":
            try:
                bad = _first_bad_line(path)
            except UnicodeDecodeError as decode:
                bad = f"not UTF-8 text ({decode.reason} at byte {decode.start})"
            if bad:
                return f"{option} {path}: {bad}; each line must be one JSON object"
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    cause = err.__cause__ or err.__context__
    if cause is not None and "error occurred while generating" in first:
        first = next((line.strip() for line in str(cause).splitlines() if line.strip()), first)
    return f"{option} {' '.join(map(str, paths))}: cannot read it as {kind} ({first}); pass {FORMATS}"


def check_files(
    paths: Sequence[str | os.PathLike], option: str, columns: Sequence[str], fix: str = "", limit: int | None = None
) -> list[dict]:
    """The first ``limit`` rows (all when None) of each file of ``paths``, after checking that it exists, parses and has ``columns``.

    ``fix`` ends the missing-field message (e.g. ", or set --text-field").
    Raises :class:`DataFileError` with one line naming ``option`` and the file (and line).
    """
    if not paths:
        raise DataFileError(f"{option}: no files given; pass {FORMATS}")
    for path in paths:
        if not os.path.exists(path):
            raise DataFileError(f"{option} {path}: no such file")
        if os.path.isdir(path):
            raise DataFileError(f"{option} {path}: a folder, not a file; pass {FORMATS}")
        if os.path.getsize(path) == 0:
            raise DataFileError(f"{option} {path}: the file is empty; pass a file with one example per row")
    rows = []
    for path in paths:  # each file on its own, so that the message names the file at fault
        stream = load_rows([path], option, streaming=True)
        with _quiet_datasets():
            try:
                head = list(itertools.islice(stream, limit))
            except StopIteration:
                head = []
            except Exception as err:  # noqa: BLE001 - a streamed file fails while it is read
                raise DataFileError(_located(err, [path], option, builder([path], option))) from err
        if not head:
            raise DataFileError(f"{option} {path}: the file is empty; pass a file with one example per row")
        missing = [c for c in columns if c not in head[0]]
        if missing:
            raise DataFileError(
                f"{option} {path}: rows have no {missing[0]!r} field (they have {', '.join(map(repr, head[0]))}); "
                f"pass rows with {', '.join(map(repr, columns))}{fix}"
            )
        rows += head
    return rows


def find_split(folder: Path, split: str) -> list[Path]:
    """``folder``'s files of ``split``: ``split.jsonl``, ``split.json(.gz)``, ``split.parquet``, or the hub's ``data/split-*.parquet`` shards."""
    for name in (f"{split}.jsonl", f"{split}.jsonl.gz", f"{split}.json", f"{split}.json.gz", f"{split}.parquet"):
        if (folder / name).is_file():
            return [folder / name]
    return sorted(folder.glob(f"data/{split}-*.parquet")) or sorted(folder.glob(f"{split}-*.parquet"))
