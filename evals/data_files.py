"""Local data files in the hub's formats: JSON Lines, JSON, either gzipped, and Parquet, told apart by content.

The real C4 shards are ``.json.gz``, and MMLU-Pro, BBH and UltraChat's
``test_sft`` are Parquet on the hub. Reading a file by its first bytes (gzip
and Parquet magic numbers, then ``{`` or ``[``) rather than by a list of
endings means a gzipped JSON Lines shard is never fed to a plain-text reader.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Sequence
from enum import Enum
from itertools import islice
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"


class FileFormat(str, Enum):
    """A ``datasets`` builder name for a local file."""

    JSON = "json"  # JSON Lines or one JSON array/object, optionally gzipped
    PARQUET = "parquet"
    TEXT = "text"  # one example per line


def _head(path: str | os.PathLike, size: int = 512) -> bytes:
    with open(path, "rb") as f:
        head = f.read(size)
    if head.startswith(GZIP_MAGIC):
        with gzip.open(path, "rb") as f:
            head = f.read(size)
    return head


def file_format(path: str | os.PathLike) -> FileFormat:
    """What ``path`` holds, from its content (gzip is looked through)."""
    head = _head(path)
    if head.startswith(PARQUET_MAGIC):
        return FileFormat.PARQUET
    return FileFormat.JSON if head.lstrip()[:1] in (b"{", b"[") else FileFormat.TEXT


def files_format(paths: Sequence[str | os.PathLike]) -> FileFormat:
    """The one format of ``paths``; mixing formats in one split is refused (naming the files)."""
    formats = {str(p): file_format(p) for p in paths}
    kinds = set(formats.values())
    if len(kinds) != 1:
        raise ValueError(
            f"files of one split must share a format, got {', '.join(f'{p} ({k.value})' for p, k in formats.items())}"
        )
    return kinds.pop()


def read_rows(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    """The first ``limit`` rows (all when ``None``) of a JSON Lines / JSON (gzipped or not) or Parquet file."""
    kind = file_format(path)
    if kind is FileFormat.PARQUET:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        return table.slice(0, len(table) if limit is None else limit).to_pylist()
    if kind is FileFormat.TEXT:
        raise ValueError(f"{path}: expected JSON Lines, JSON or Parquet rows, found plain text")
    opener = gzip.open if _is_gzip(path) else open
    with opener(path, "rt", encoding="utf-8") as f:
        text_head = f.read(1)
        while text_head.isspace():
            text_head = f.read(1)
        if text_head == "[":  # one JSON array
            rows = json.loads(text_head + f.read())
            return rows[:limit] if limit is not None else rows
        lines = (line for line in _prepend(text_head, f) if line.strip())
        return [json.loads(line) for line in islice(lines, limit)]


def _is_gzip(path: str | os.PathLike) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def _prepend(first: str, f) -> Iterator[str]:
    """The text stream with its already-read first character put back."""
    yield first + f.readline()
    yield from f


def find_split(folder: Path, split: str) -> list[Path]:
    """``folder``'s files of ``split``: ``split.jsonl``, ``split.json(.gz)``, ``split.parquet``, or the hub's ``data/split-*.parquet`` shards."""
    for name in (f"{split}.jsonl", f"{split}.jsonl.gz", f"{split}.json", f"{split}.json.gz", f"{split}.parquet"):
        if (folder / name).is_file():
            return [folder / name]
    return sorted(folder.glob(f"data/{split}-*.parquet")) or sorted(folder.glob(f"{split}-*.parquet"))
