"""The AutoLoCo state file (sync/checkpoint.py): atomic write, and every way a file is refused names file and field."""

from __future__ import annotations

import json
import os

import pytest
import torch

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.sync import checkpoint
from autoloco_hf.sync.checkpoint import CheckpointError, read_state, write_state

CONFIG = AutoLoCoConfig(method="autoloco", h_base=4)
LAYOUT = {"world_size": 2, "ranks_per_worker": 1, "rank": 1}


def write(path, config=CONFIG, **layout) -> dict:
    state = {"engine": {"step": 7}, "params": [torch.arange(6.0).view(2, 3)]}
    write_state(str(path), state, config=config, step=7, **{**LAYOUT, **layout})
    return state


def read(path, config=CONFIG, **layout):
    return read_state(str(path), config=config, **{**LAYOUT, **layout})


def test_round_trip_and_header(tmp_path):
    path = tmp_path / "autoloco" / "rank1.pt"
    state = write(path)
    header, loaded = read(path)
    assert torch.equal(loaded["params"][0], state["params"][0]) and loaded["engine"] == {"step": 7}
    assert (header.format_version, header.world_size, header.rank, header.step) == (checkpoint.FORMAT_VERSION, 2, 1, 7)
    assert header.config["h_base"] == 4 and header.config["method"] == "autoloco"
    assert os.listdir(path.parent) == ["rank1.pt"], "no temporary file is left behind"


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "rank1.pt"
    write(path)
    before = path.read_bytes()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_state(str(path), {"other": 1}, config=CONFIG, step=9, **LAYOUT)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["rank1.pt"]


def test_truncated_file_refused(tmp_path):
    path = tmp_path / "rank1.pt"
    write(path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"rank1\.pt: field payload_bytes=\d+ but the file holds"):
        read(path)
    path.write_bytes(checkpoint.MAGIC + b'{"format_version": 2, "con')  # cut inside the header
    with pytest.raises(CheckpointError, match=r"rank1\.pt: unreadable header \(field header"):
        read(path)


def test_corrupted_payload_refused(tmp_path):
    path = tmp_path / "rank1.pt"
    write(path)
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # one flipped bit pattern inside the payload
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"rank1\.pt: field sha256 does not match"):
        read(path)


def test_not_a_state_file_or_other_version_refused(tmp_path):
    path = tmp_path / "rank1.pt"
    torch.save({"version": 1}, path)  # the format before the envelope
    with pytest.raises(CheckpointError, match=r"rank1\.pt: not an AutoLoCo state file \(field magic"):
        read(path)
    write(path)
    data = path.read_bytes()
    end = data.index(b"\n", len(checkpoint.MAGIC))
    header = json.loads(data[len(checkpoint.MAGIC) : end])
    header["format_version"] = 99
    path.write_bytes(checkpoint.MAGIC + json.dumps(header).encode() + data[end:])
    with pytest.raises(CheckpointError, match="field format_version=99"):
        read(path)


def test_other_world_size_or_rank_refused(tmp_path):
    path = tmp_path / "rank1.pt"
    write(path)
    with pytest.raises(CheckpointError, match=r"rank1\.pt: field world_size=2 .* this run has world_size=4") as info:
        read(path, world_size=4)
    assert "--nproc_per_node 2" in str(info.value) and "last synchronized parameters" in str(info.value)
    with pytest.raises(CheckpointError, match="field world_size=2 \\(ranks_per_worker=1\\)"):
        read(path, ranks_per_worker=2)
    with pytest.raises(CheckpointError, match="field rank=1 but it was loaded by rank 0"):
        read(path, rank=0)


def test_incompatible_config_refused_runtime_fields_may_change(tmp_path):
    path = tmp_path / "rank1.pt"
    write(path)
    with pytest.raises(CheckpointError, match=r"rank1\.pt: field config\.h_base=4 .* this run has h_base=8"):
        read(path, config=AutoLoCoConfig(method="autoloco", h_base=8))
    with pytest.raises(CheckpointError, match=r"field config\.method='autoloco' .* method='diloco'"):
        read(path, config=AutoLoCoConfig(method="diloco", h_base=4))
    with pytest.raises(CheckpointError, match=r"field config\.outer_lr=0\.7"):
        read(path, config=AutoLoCoConfig(method="autoloco", h_base=4, outer_lr=0.5))
    read(path, config=AutoLoCoConfig(method="autoloco", h_base=4, outer_on_cpu=True, bucket_size_mb=8.0))
