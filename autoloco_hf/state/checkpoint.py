"""The AutoLoCo state file: safetensors, a JSON header,
atomic, versioned, checksummed; no pickle to load.

One file per rank (``<checkpoint>/autoloco/rank{r}.safetensors``). Tensors are
stored as safetensors; the safetensors metadata holds two JSON strings:

* ``autoloco``: the :class:`StateHeader` (format version, the
  :class:`AutoLoCoConfig`, launch layout, rank, step, tensor bytes, SHA-256);
* ``state``: the rest of the state (numbers, strings, lists, dicts), each tensor
  replaced by ``{"__tensor__": name}``.

The SHA-256 covers the ``state`` JSON and every tensor's name, dtype, shape and
bytes. :func:`read_state` refuses, with the file and the field named, a file
that is truncated or corrupted, that another format version wrote, that belongs
to another rank or launch layout, or whose algorithm settings differ from this
run's. :func:`write_state` writes a temporary file in the same folder, fsyncs
it, renames it over the target and fsyncs the folder, so a crash leaves the
previous file or the new one, never half of one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from autoloco_hf.config import AutoLoCoConfig
from autoloco_hf.errors import AutoLoCoError

FORMAT_VERSION = 3
FORMAT = "autoloco-state"
_MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit

# Config fields that may change between the run that wrote a state and the run that resumes it: they
# change how the same algorithm runs (memory placement, bucketing, waiting), not what it computes.
RESUMABLE_CONFIG_FIELDS = frozenset(
    {"outer_on_cpu", "bucket_size_mb", "sync_timeout_s", "snapshot_dir"}
)

_TENSOR, _TUPLE, _ITEMS = "__tensor__", "__tuple__", "__items__"


class CheckpointError(AutoLoCoError, ValueError):
    """An AutoLoCo state file cannot be used by this run; the
    message names the file and the field."""


class ConfigMismatchError(CheckpointError):
    """A sound state file written with other algorithm
    settings (an older file will not do either)."""


@dataclass(frozen=True)
class StateHeader:
    """What a state file says about itself (the ``autoloco`` metadata entry)."""

    format_version: int
    config: dict[str, Any]
    world_size: int
    ranks_per_worker: int
    rank: int
    step: int
    payload_bytes: int  # tensor bytes after the safetensors header
    sha256: str


def _json_default(value: Any) -> Any:
    return getattr(value, "value", str(value))  # enums as their values


def _jsonable(value: Any) -> Any:
    """``value`` as it reads back from JSON (enums as values, tuples as lists)."""
    return json.loads(json.dumps(value, default=_json_default))


def config_json(config: AutoLoCoConfig) -> dict[str, Any]:
    return _jsonable(config.to_dict())


# ------------------------------------------------------------------ the state tree
def _split(value: Any, tensors: dict[str, torch.Tensor], storages: set[int]) -> Any:
    """``value`` as JSON-able data, its tensors moved into
    ``tensors`` (int keys and tuples kept, e.g. optimizer state)."""
    if torch.is_tensor(value):
        # a DTensor (FSDP2 optimizer state): this rank's shard, re-wrapped on load
        if hasattr(value, "to_local"):
            value = value.to_local()
        tensor = value.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        # safetensors refuses tensors sharing memory (tied weights)
        if storage and storage in storages:
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        name = str(len(tensors))
        tensors[name] = tensor
        return {_TENSOR: name}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _split(v, tensors, storages) for k, v in value.items()}
        return {_ITEMS: [[k, _split(v, tensors, storages)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {_TUPLE: [_split(v, tensors, storages) for v in value]}
    if isinstance(value, list):
        return [_split(v, tensors, storages) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(
        f"cannot store a {type(value).__name__} in an AutoLoCo state file "
        "(tensors and JSON data only)"
    )


def _join(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if _TENSOR in value:
            return tensors[value[_TENSOR]]
        if _TUPLE in value:
            return tuple(_join(v, tensors) for v in value[_TUPLE])
        if _ITEMS in value:
            return {k: _join(v, tensors) for k, v in value[_ITEMS]}
        return {k: _join(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_join(v, tensors) for v in value]
    return value


def _digest(header: StateHeader, tree_json: str, tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the header (but its own checksum), the state tree and every tensor."""
    unsigned = dataclasses.replace(header, sha256="")
    sha = hashlib.sha256(json.dumps(dataclasses.asdict(unsigned), default=_json_default).encode())
    sha.update(tree_json.encode())
    for name in sorted(tensors, key=int):
        tensor = tensors[name]
        sha.update(f"{name}:{tensor.dtype}:{list(tensor.shape)}".encode())
        sha.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return sha.hexdigest()


# ------------------------------------------------------------------ writing
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
    """Write ``state`` to ``path`` atomically (temporary
    file, fsync, rename, fsync of the folder)."""
    tensors: dict[str, torch.Tensor] = {}
    tree_json = json.dumps(_split(state, tensors, set()), default=_json_default)
    header = StateHeader(
        FORMAT_VERSION,
        config_json(config),
        world_size,
        ranks_per_worker,
        rank,
        step,
        sum(t.numel() * t.element_size() for t in tensors.values()),
        "",
    )
    header = dataclasses.replace(header, sha256=_digest(header, tree_json, tensors))
    metadata = {
        "format": FORMAT,
        "autoloco": json.dumps(dataclasses.asdict(header), default=_json_default),
        "state": tree_json,
    }
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = temporary_path(path)
    try:
        save_file(tensors, tmp, metadata=metadata)
        _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync(folder, os.O_RDONLY)  # the rename itself survives a power loss


def machine_key() -> str:
    """This machine and pid namespace, 12 hex digits: whether
    a writer's pid can be checked from here.

    A folder on shared storage holds the temporary files of writers on several nodes; a pid means
    something only on the kernel (boot id) and in the pid namespace it was taken in.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts = [f.read().strip(), os.readlink("/proc/self/ns/pid")]
    except OSError:  # no procfs (macOS): the host name
        parts = [socket.gethostname()]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def temporary_path(path: str) -> str:
    """Where :func:`write_state` writes before the rename: ``<path>.tmp-<machine key>-<pid>``."""
    return f"{path}.tmp-{machine_key()}-{os.getpid()}"


def writer_is_gone(temporary: str) -> bool:
    """Whether the process that writes ``temporary`` (a :func:`temporary_path`) has certainly ended.

    Only a writer on this machine and pid namespace can be checked; another machine's (or an
    unreadable name) is never called gone. This process's own files are not gone.
    """
    key, _, pid = temporary.rpartition(".tmp-")[2].rpartition("-")
    if key != machine_key() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    return False


def _fsync(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------ reading
def _read_metadata(path: str) -> tuple[dict[str, str], int]:
    """The safetensors metadata of ``path`` and the offset
    where the tensor bytes start (reads the header only)."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
        if not 0 < length <= _MAX_HEADER_BYTES:
            raise CheckpointError(
                f"{path}: not an AutoLoCo state file (field format: no safetensors header); the "
                "file is corrupted or was written by an autoloco-hf that stored a pickle: resume "
                "with that version or start a new run"
            )
        raw = f.read(length)
    try:
        if len(raw) != length:
            raise ValueError(f"the header is cut after {len(raw)} of {length} bytes")
        metadata = json.loads(raw).get("__metadata__") or {}
    except (ValueError, AttributeError) as err:
        raise CheckpointError(
            f"{path}: unreadable header (field header: {err}); the file is truncated or corrupted: "
            "resume from an earlier checkpoint"
        ) from err
    if metadata.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: not an AutoLoCo state file (field format={metadata.get('format')!r}, "
            f"expected {FORMAT!r}): pass the autoloco/rank{{r}}.safetensors of a "
            "checkpoint written with AutoLoCo"
        )
    return metadata, 8 + length


def _parse_header(path: str, metadata: dict[str, str]) -> StateHeader:
    try:
        header = StateHeader(**json.loads(metadata["autoloco"]))
        json.loads(metadata["state"])
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(
            f"{path}: unreadable header (field autoloco: {err!r}); the file is corrupted: resume "
            "from an earlier checkpoint"
        ) from err
    if header.format_version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: field format_version={header.format_version}, this autoloco-hf reads "
            f"{FORMAT_VERSION}: resume with the autoloco-hf version that wrote it"
        )
    return header


def read_header(path: str) -> StateHeader:
    """The verified header of a complete state file (its size
    matches; the checksum is left to :func:`read_state`)."""
    return _open(path)[1]


def _open(path: str) -> tuple[dict[str, str], StateHeader]:
    metadata, start = _read_metadata(path)
    header = _parse_header(path, metadata)
    held = os.path.getsize(path) - start
    if held != header.payload_bytes:
        raise CheckpointError(
            f"{path}: field payload_bytes={header.payload_bytes} but the file holds {held} payload "
            "bytes (truncated write or disk full): resume from an earlier checkpoint"
        )
    return metadata, header


def peek_header(path: str) -> StateHeader | None:
    """The header of a complete state file, else ``None`` (cheap: reads the header only)."""
    try:
        return read_header(path)
    except (OSError, CheckpointError):
        return None


def check_layout(
    source: str,
    saved_world_size: int,
    saved_ranks_per_worker: int,
    world_size: int,
    ranks_per_worker: int,
) -> None:
    """Refuse a state written by another launch layout."""
    if (saved_world_size, saved_ranks_per_worker) != (world_size, ranks_per_worker):
        raise CheckpointError(
            f"{source}: field world_size={saved_world_size} "
            f"(ranks_per_worker={saved_ranks_per_worker}) but this run has world_size={world_size} "
            f"(ranks_per_worker={ranks_per_worker}). Resume with the same launch layout (e.g. "
            f"torchrun --nproc_per_node {saved_world_size} across all nodes), or start a new run "
            "from the checkpoint's model weights, which are the last synchronized parameters "
            "(load them with from_pretrained and train without resume_from_checkpoint)"
        )


def config_differences(
    saved: dict[str, Any], current: dict[str, Any]
) -> list[tuple[str, Any, Any]]:
    """``(field, saved value, current value)`` of every
    algorithm setting that differs (JSON forms), method first.

    Fields that may change between launches (:data:`RESUMABLE_CONFIG_FIELDS`) and fields the current
    version no longer has are not compared.
    """
    saved = _jsonable(saved)
    # the method first: which other fields apply depends on
    # it (another method's differ in fields it lacks)
    return [
        (name, value, current[name])
        for name, value in sorted(saved.items(), key=lambda item: (item[0] != "method", item[0]))
        if name not in RESUMABLE_CONFIG_FIELDS and name in current and value != current[name]
    ]


def check_config(source: str, saved: dict[str, Any], config: AutoLoCoConfig) -> None:
    """Refuse a state whose algorithm settings differ from
    this run's (the one rule for every resume path)."""
    differences = config_differences(saved, config_json(config))
    if differences:
        name, value, current = differences[0]
        raise ConfigMismatchError(
            f"{source}: field config.{name}={value!r} when the checkpoint was written, this run "
            f"has {name}={current!r}: resume with the same AutoLoCoConfig (fields that may change "
            f"on resume: {', '.join(sorted(RESUMABLE_CONFIG_FIELDS))})"
        )


def check_compatible(
    path: str,
    header: StateHeader,
    *,
    config: AutoLoCoConfig,
    world_size: int,
    ranks_per_worker: int,
    rank: int,
) -> None:
    """Refuse a state written by another launch layout, rank or algorithm configuration."""
    check_layout(path, header.world_size, header.ranks_per_worker, world_size, ranks_per_worker)
    if header.rank != rank:
        raise CheckpointError(
            f"{path}: field rank={header.rank} but it was loaded by rank {rank}: the state files "
            "of this checkpoint were renamed or copied over each other"
        )
    check_config(path, header.config, config)


def read_state(
    path: str, *, config: AutoLoCoConfig, world_size: int, ranks_per_worker: int, rank: int
) -> tuple[StateHeader, dict[str, Any]]:
    """Read and verify a state file written by :func:`write_state`
    for this run and rank (no pickle is loaded)."""
    metadata, header = _open(path)
    check_compatible(
        path,
        header,
        config=config,
        world_size=world_size,
        ranks_per_worker=ranks_per_worker,
        rank=rank,
    )
    return header, _verified_state(path, metadata, header)


def read_shared_state(path: str, *, config: AutoLoCoConfig) -> tuple[StateHeader, dict[str, Any]]:
    """Read and verify a state that any number of workers may resume (a boundary snapshot): the
    config is checked, the layout is not."""
    metadata, header = _open(path)
    # first: a corrupted config is corruption, not a mismatch
    state = _verified_state(path, metadata, header)
    check_config(path, header.config, config)
    return header, state


def _verified_state(path: str, metadata: dict[str, str], header: StateHeader) -> dict[str, Any]:
    try:
        tensors = load_file(path)
    except Exception as err:  # safetensors' own checks of offsets and sizes
        raise CheckpointError(
            f"{path}: unreadable tensors (field tensors: {err}); the file is corrupted: resume "
            "from an earlier checkpoint"
        ) from err
    digest = _digest(header, metadata["state"], tensors)
    if digest != header.sha256:
        raise CheckpointError(
            f"{path}: field sha256 does not match the contents ({digest[:12]} != "
            f"{header.sha256[:12]}): the file is corrupted; resume from an earlier checkpoint"
        )
    return _join(json.loads(metadata["state"]), tensors)
