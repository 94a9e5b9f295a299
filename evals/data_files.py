"""Local data files read with ``datasets.load_dataset``, and checked before any model loads.

The builder comes from the file name, as ``datasets`` itself picks it
(``.jsonl`` / ``.json`` -> json, ``.parquet`` -> parquet, ``.txt`` -> text;
a ``.gz`` / ``.bz2`` / ``.xz`` suffix is looked through, by fsspec). :func:`check_files`
reads each file to its end with the standard library's decompressors and
``json`` (Parquet: pyarrow), so an empty file, a corrupt or half-downloaded
``.gz``, a malformed line (named by file, line and column) or a missing field
costs one line and exit code 2, not a traceback after a minute of model
loading or a whole training epoch; it also counts the rows, so a run can tell
up front that its data will run out.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import EvalInputError

# the ``datasets`` builder of each file ending we take, as
# ``load_dataset(data_files=...)`` would pick it
BUILDERS = {
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".txt": "text",
}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst", ".lz4")  # looked through by fsspec, by name
FORMATS = ".jsonl, .json, .parquet or .txt (optionally compressed, e.g. .jsonl.gz)"


class DataFileError(EvalInputError):
    """A local data file that cannot be used: the message is
    one line naming the option, the file and the fix."""


def builder(paths: Sequence[str | os.PathLike], option: str) -> str:
    """The ``datasets`` builder of ``paths`` (one per split;
    mixing is refused, naming the files)."""
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
            f"{option}: files of one split must share a format, got "
            f"{', '.join(f'{p} ({k})' for p, k in found.items())}"
        )
    return next(iter(found.values()))


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """``datasets`` logs each failed JSON parse as an error
    before raising it: the raised one is reported once."""
    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


@dataclass(frozen=True)
class FileScan:
    """One local data file read to its end: how many rows it holds, and its first ones."""

    rows: int
    head: list[dict]


def _compressed(path: str | os.PathLike) -> bool:
    return str(path).endswith(COMPRESSIONS)


def _json_rows(lines: Iterator[str]) -> Iterator[dict]:
    """The rows of a JSON Lines (or one JSON array) text; a
    line that is not one object raises ``_BadLine``."""
    first = next(lines, "")
    while first and not first.strip():
        first = next(lines, "")
    if first.lstrip().startswith("["):  # one JSON array, not JSON Lines
        text = first + "".join(lines)
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise _BadLine(
                f"line {err.lineno} column {err.colno}: not valid JSON ({_reason(err)})"
            ) from None
        for number, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                raise _BadLine(f"item {number}: a JSON {type(row).__name__}, not an object")
            yield row
        return
    for number, line in enumerate(itertools.chain([first], lines), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            # a string cut short fails where the line ends, not where the string starts
            column = (
                len(line.rstrip("\r\n")) + 1 if err.msg.startswith("Unterminated") else err.colno
            )
            raise _BadLine(
                f"line {number} column {column}: not a JSON object ({_reason(err)})"
            ) from None
        if not isinstance(row, dict):
            raise _BadLine(f"line {number}: a JSON {type(row).__name__}, not an object")
        yield row


def _reason(err: json.JSONDecodeError) -> str:
    return err.msg.removesuffix(" at").removesuffix(" starting")


class _BadLine(ValueError):
    """A JSON line that is not one object (the message names the line and column)."""


def _intact(path: str | os.PathLike) -> str | None:
    """Why a compressed file cannot be decompressed to its
    end (corrupt or cut short), or None when it can."""
    import fsspec

    try:
        with fsspec.open(str(path), "rb", compression="infer") as f:
            while f.read(1 << 20):
                pass
    # BLE001: gzip, bz2, lzma raise OSError, EOFError, zlib.error, LZMAError
    except Exception as err:  # noqa: BLE001
        return _named(err)
    return None


def scan_file(path: str | os.PathLike, option: str, limit: int | None = None) -> FileScan:
    """Read ``path`` to its end (decompressing it), counting
    its rows and keeping the first ``limit`` (all when None).

    A corrupt or cut-short compressed file, text that is not UTF-8, a line that
    is not one JSON object or a Parquet file pyarrow cannot read is a
    :class:`DataFileError` naming ``option``, the file and (for JSON) the line.
    Everything is read and closed before returning: no reader outlives the check.
    """
    kind = builder([path], option)
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as err:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
            raise DataFileError(
                f"{option} {path}: not a readable Parquet file ({_first_line(err)}); "
                "download or copy the file again"
            ) from None
        return FileScan(table.num_rows, table.slice(0, limit).to_pylist())
    import fsspec

    head: list[dict] = []
    rows = 0
    try:
        with fsspec.open(str(path), "rt", encoding="utf-8", compression="infer") as f:
            records = (
                _json_rows(iter(f))
                if kind == "json"
                else ({"text": line.rstrip("\r\n")} for line in f)
            )
            for row in records:
                if limit is None or rows < limit:
                    head.append(row)
                rows += 1
    except _BadLine as err:
        # garbage from a corrupt stream is not the file's fault
        broken = _intact(path) if _compressed(path) else None
        if broken is None:
            raise DataFileError(
                f"{option} {path}: {err}; each line must be one JSON object"
            ) from None
        raise DataFileError(_corrupt(option, path, broken)) from None
    except UnicodeDecodeError as err:
        broken = _intact(path) if _compressed(path) else None
        if broken is None:
            raise DataFileError(
                f"{option} {path}: not UTF-8 text ({err.reason} at byte {err.start})"
            ) from None
        raise DataFileError(_corrupt(option, path, broken)) from None
    # BLE001: a decompressor's error (OSError, EOFError, zlib.error, LZMAError)
    except Exception as err:  # noqa: BLE001
        if _compressed(path):
            raise DataFileError(_corrupt(option, path, _named(err))) from None
        raise DataFileError(f"{option} {path}: cannot read it ({_first_line(err)})") from None
    return FileScan(rows, head)


def _corrupt(option: str, path: str | os.PathLike, reason: str) -> str:
    return (
        f"{option} {path}: the compressed data is corrupt or cut short ({reason}); "
        "download or copy the file again"
    )


def _named(err: BaseException) -> str:
    """``zlib.error: ...``, ``EOFError: ...``: the error as its module names it."""
    kind = type(err)
    return (
        f"{'' if kind.__module__ == 'builtins' else kind.__module__ + '.'}{kind.__name__}: "
        f"{_first_line(err)}"
    )


def _first_line(err: BaseException) -> str:
    return next(
        (line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__
    )


def load_rows(paths: Sequence[str | os.PathLike], option: str, *, streaming: bool = False) -> Any:
    """``datasets.load_dataset(builder, data_files=paths,
    split="train")``; a file it cannot read is a DataFileError."""
    from datasets import load_dataset

    kind = builder(paths, option)
    with _quiet_datasets():
        try:
            return load_dataset(
                kind, data_files=[str(p) for p in paths], split="train", streaming=streaming
            )
        except StopIteration:  # what load_dataset raises when the files hold no rows
            raise DataFileError(
                f"{option} {' '.join(map(str, paths))}: the file is empty; pass a file "
                "with one example per row"
            ) from None
        # BLE001: datasets / pyarrow raise many types; each is one line
        except Exception as err:  # noqa: BLE001
            for path in paths:  # the file (and line) at fault, when reading it on its own finds it
                scan_file(path, option, limit=0)
            cause = err.__cause__ or err.__context__
            first = _first_line(
                cause
                if cause is not None and "error occurred while generating" in str(err)
                else err
            )
            raise DataFileError(
                f"{option} {' '.join(map(str, paths))}: cannot read it as {kind} "
                f"({first}); pass {FORMATS}"
            ) from err


def inspect_files(
    paths: Sequence[str | os.PathLike],
    option: str,
    columns: Sequence[str],
    fix: str = "",
    limit: int | None = None,
) -> list[FileScan]:
    """Each file of ``paths`` read to its end (see :func:`scan_file`), after checking that it
    exists, and that its rows have ``columns``.

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
            raise DataFileError(
                f"{option} {path}: the file is empty; pass a file with one example per row"
            )
    scans = []
    for path in paths:  # each file on its own, so that the message names the file at fault
        scan = scan_file(path, option, limit)
        if not scan.rows:
            raise DataFileError(
                f"{option} {path}: the file is empty; pass a file with one example per row"
            )
        if limit != 0:
            missing = [c for c in columns if c not in scan.head[0]]
            if missing:
                raise DataFileError(
                    f"{option} {path}: rows have no {missing[0]!r} field (they have "
                    f"{', '.join(map(repr, scan.head[0]))}); pass rows with "
                    f"{', '.join(map(repr, columns))}{fix}"
                )
        scans.append(scan)
    return scans


def check_files(
    paths: Sequence[str | os.PathLike],
    option: str,
    columns: Sequence[str],
    fix: str = "",
    limit: int | None = None,
) -> list[dict]:
    """The first ``limit`` rows (all when None) of each file of
    ``paths``, each file checked by :func:`inspect_files`."""
    return [row for scan in inspect_files(paths, option, columns, fix, limit) for row in scan.head]


def find_split(folder: Path, split: str) -> list[Path]:
    """``folder``'s files of ``split``: ``split.jsonl``, ``split.json(.gz)``, ``split.parquet``, or
    the hub's ``data/split-*.parquet`` shards."""
    for name in (
        f"{split}.jsonl",
        f"{split}.jsonl.gz",
        f"{split}.json",
        f"{split}.json.gz",
        f"{split}.parquet",
    ):
        if (folder / name).is_file():
            return [folder / name]
    return sorted(folder.glob(f"data/{split}-*.parquet")) or sorted(
        folder.glob(f"{split}-*.parquet")
    )
