"""The AutoLoCo state file: atomic, versioned, self-describing, checksummed.

One file per rank (``<checkpoint>/autoloco/rank{r}.pt``). Layout::

    AUTOLOCO-STATE\\n                      magic line
    {"format_version": 2, ...}\\n          one JSON header line (see :class:`StateHeader`)
    <payload_bytes bytes>                 ``torch.save`` of the state (engine, meter, local replica, inner optimizer)

The header carries the format version, the :class:`AutoLoCoConfig` the state
was made with, the launch layout (world size, ranks per worker, rank), the
payload length and its SHA-256. :func:`read_state` refuses, with the file and
the field named, a file that is truncated or corrupted, that another format
version wrote, that belongs to another rank or launch layout, or whose
algorithm settings differ from this run's. :func:`write_state` writes a
temporary file in the same folder, fsyncs it, renames it over the target and
fsyncs the folder, so a crash leaves the previous file or the new one, never
half of one.

The payload is a pickle (``torch.load(weights_only=False)``): load AutoLoCo
state only from checkpoints you wrote yourself, like any PyTorch checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from dataclasses import dataclass
from typing import Any

import torch

from autoloco_hf.config import AutoLoCoConfig

FORMAT_VERSION = 2
MAGIC = b"AUTOLOCO-STATE\n"

# Config fields that may change between the run that wrote a state and the run that resumes it: they
# change how the same algorithm runs (memory placement, bucketing, waiting), not what it computes.
RESUMABLE_CONFIG_FIELDS = frozenset({"outer_on_cpu", "bucket_size_mb", "sync_timeout_s"})


class CheckpointError(ValueError):
    """An AutoLoCo state file cannot be used by this run; the message names the file and the field."""


@dataclass(frozen=True)
class StateHeader:
    """What a state file says about itself (the JSON header line)."""

    format_version: int
    config: dict[str, Any]
    world_size: int
    ranks_per_worker: int
    rank: int
    step: int
    payload_bytes: int
    sha256: str


def _json_default(value: Any) -> Any:
    return getattr(value, "value", str(value))  # enums as their values


def _jsonable(value: Any) -> Any:
    """``value`` as it reads back from JSON (enums as values, tuples as lists)."""
    return json.loads(json.dumps(value, default=_json_default))


def _config_json(config: AutoLoCoConfig) -> dict[str, Any]:
    return _jsonable(config.to_dict())


def write_state(
    path: str,
    state: dict[str, Any],
    *,
    config: AutoLoCoConfig,
    world_size: int,
    ranks_per_worker: int,
    rank: int,
    step: int,
) -> None:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, rename, fsync of the folder)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    header = StateHeader(
        FORMAT_VERSION,
        _config_json(config),
        world_size,
        ranks_per_worker,
        rank,
        step,
        len(payload),
        hashlib.sha256(payload).hexdigest(),
    )
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(json.dumps(dataclasses.asdict(header), default=_json_default).encode() + b"\n")
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power loss
    finally:
        os.close(dir_fd)


def _parse_header(path: str, data: bytes) -> tuple[StateHeader, int]:
    """The header at the start of ``data`` and the offset of the payload."""
    if not data.startswith(MAGIC):
        raise CheckpointError(
            f"{path}: not an AutoLoCo state file (field magic: expected {MAGIC!r} at the start); "
            "the file is corrupted or was written by autoloco-hf < 0.2: start a new run or "
            "resume from another checkpoint"
        )
    end = data.find(b"\n", len(MAGIC))
    try:
        if end < 0:
            raise ValueError("no end of header line")
        header = StateHeader(**json.loads(data[len(MAGIC) : end]))
    except (ValueError, TypeError) as err:
        raise CheckpointError(
            f"{path}: unreadable header (field header: {err}); the file is truncated or "
            "corrupted: resume from an earlier checkpoint"
        ) from err
    if header.format_version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: field format_version={header.format_version}, this autoloco-hf reads "
            f"{FORMAT_VERSION}: resume with the autoloco-hf version that wrote it"
        )
    return header, end + 1


def read_header(path: str, data: bytes) -> tuple[StateHeader, bytes]:
    """Parse and verify the envelope of a state file's bytes; returns the header and the payload."""
    header, start = _parse_header(path, data)
    payload = data[start:]
    if len(payload) != header.payload_bytes:
        raise CheckpointError(
            f"{path}: field payload_bytes={header.payload_bytes} but the file holds "
            f"{len(payload)} payload bytes (truncated write or disk full): resume from an "
            "earlier checkpoint"
        )
    digest = hashlib.sha256(payload).hexdigest()
    if digest != header.sha256:
        raise CheckpointError(
            f"{path}: field sha256 does not match the payload ({digest[:12]} != "
            f"{header.sha256[:12]}): the file is corrupted; resume from an earlier checkpoint"
        )
    return header, payload


def peek_header(path: str, limit: int = 1 << 20) -> StateHeader | None:
    """The header of a state file whose size matches it, else ``None`` (cheap: the checksum is left to loading)."""
    try:
        with open(path, "rb") as f:
            header, start = _parse_header(path, f.read(limit))
        complete = os.path.getsize(path) == start + header.payload_bytes
    except (OSError, CheckpointError):
        return None
    return header if complete else None


def check_compatible(
    path: str, header: StateHeader, *, config: AutoLoCoConfig, world_size: int, ranks_per_worker: int, rank: int
) -> None:
    """Refuse a state written by another launch layout, rank or algorithm configuration."""
    if (header.world_size, header.ranks_per_worker) != (world_size, ranks_per_worker):
        raise CheckpointError(
            f"{path}: field world_size={header.world_size} (ranks_per_worker={header.ranks_per_worker}) but this "
            f"run has world_size={world_size} (ranks_per_worker={ranks_per_worker}). Resume with the same "
            f"launch layout (e.g. torchrun --nproc_per_node {header.world_size} across all nodes), or start a "
            "new run from the checkpoint's model weights, which are the last synchronized parameters (load them "
            "with from_pretrained and train without resume_from_checkpoint)"
        )
    if header.rank != rank:
        raise CheckpointError(
            f"{path}: field rank={header.rank} but it was loaded by rank {rank}: the state files "
            "of this checkpoint were renamed or copied over each other"
        )
    check_config(path, header.config, config)


def check_config(source: str, saved: dict[str, Any], config: AutoLoCoConfig) -> None:
    """Refuse a state whose algorithm settings differ from this run's (the one rule for every resume path)."""
    saved, current = _jsonable(saved), _config_json(config)
    for name, value in sorted(saved.items()):
        if name in RESUMABLE_CONFIG_FIELDS or name not in current:
            continue  # a field this version no longer has cannot change what it computes
        if value != current[name]:
            raise CheckpointError(
                f"{source}: field config.{name}={value!r} when the checkpoint was written, this run has "
                f"{name}={current[name]!r}: resume with the same AutoLoCoConfig (fields that may change on resume: "
                f"{', '.join(sorted(RESUMABLE_CONFIG_FIELDS))})"
            )


def read_state(
    path: str, *, config: AutoLoCoConfig, world_size: int, ranks_per_worker: int, rank: int
) -> tuple[StateHeader, dict[str, Any]]:
    """Read, verify and unpickle a state file written by :func:`write_state` for this run and rank."""
    with open(path, "rb") as f:
        data = f.read()
    header, payload = read_header(path, data)
    check_compatible(path, header, config=config, world_size=world_size, ranks_per_worker=ranks_per_worker, rank=rank)
    state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    return header, state
