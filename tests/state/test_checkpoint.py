"""The AutoLoCo state file (sync/checkpoint.py): safetensors + JSON header, atomic write, every
refusal names file and field."""

from __future__ import annotations

import json
import math
import os
import struct

import pytest
import torch
from safetensors.torch import save_file

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.state import checkpoint
from autoloco_hf.state.checkpoint import CheckpointError, read_state, write_state
from autoloco_hf.sync.communicators import make_communicator
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, make_model

CONFIG = AutoLoCoConfig(method="autoloco", h_base=4)
LAYOUT = {"world_size": 2, "ranks_per_worker": 1, "rank": 1}
NAME = "rank1.safetensors"


def write(path, config=CONFIG, **layout) -> dict:
    state = {"engine": {"step": 7}, "params": [torch.arange(6.0).view(2, 3)]}
    write_state(str(path), state, config=config, step=7, **{**LAYOUT, **layout})
    return state


def read(path, config=CONFIG, **layout):
    return read_state(str(path), config=config, **{**LAYOUT, **layout})


def rewrite_metadata(path, change) -> None:
    """Edit the safetensors header's metadata in place (the
    tensor offsets are relative, so they stay valid)."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    change(header["__metadata__"])
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length :])


def test_round_trip_and_header(tmp_path):
    path = tmp_path / "autoloco" / NAME
    state = write(path)
    header, loaded = read(path)
    assert torch.equal(loaded["params"][0], state["params"][0]) and loaded["engine"] == {"step": 7}
    assert (header.format_version, header.world_size, header.rank, header.step) == (
        checkpoint.FORMAT_VERSION,
        2,
        1,
        7,
    )
    assert header.config["h_base"] == 4 and header.config["method"] == "autoloco"
    assert os.listdir(path.parent) == [NAME], "no temporary file is left behind"


def test_round_trip_is_exact_and_loads_no_pickle(tmp_path, monkeypatch):
    """Optimizer-style state (int keys, tuples, None, NaN), bf16
    and tied tensors come back exactly, without torch.load."""
    shared = torch.arange(4.0)
    state = {
        "optimizer": {
            "state": {
                0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2, dtype=torch.bfloat16)}
            }
        },
        "groups": [{"params": [0, 1], "betas": (0.9, 0.999), "foreach": None, "lr": 1e-3}],
        "tied": [shared, shared],
        "nan": math.nan,
        "flag": torch.tensor([True, False]),
    }
    path = tmp_path / NAME
    write_state(str(path), state, config=CONFIG, step=1, **LAYOUT)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("read_state must not unpickle"))
    _, loaded = read(path)
    assert set(loaded["optimizer"]["state"]) == {0} and loaded["groups"][0]["betas"] == (0.9, 0.999)
    assert loaded["groups"][0]["foreach"] is None and math.isnan(loaded["nan"])
    for key in ("step", "exp_avg"):
        a, b = state["optimizer"]["state"][0][key], loaded["optimizer"]["state"][0][key]
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert all(torch.equal(t, shared) for t in loaded["tied"]) and torch.equal(
        loaded["flag"], state["flag"]
    )


@pytest.mark.parametrize(
    "wire", [{}, {"wire_dtype": "int2", "topk_fraction": 0.1, "error_feedback": True}]
)
def test_resume_through_the_file_is_bit_exact(tmp_path, wire):
    """Engine, replicas and AdamW state through the file: the
    resumed run equals the uninterrupted one bit for bit.

    With a lossy wire and error feedback, the residuals travel through the file too
    (docs/algorithm.md#error-feedback).
    """
    config = AutoLoCoConfig(method="autoloco", controller="paper", h_base=4, q_h=2, h_max=8, **wire)

    def runner():
        comm = make_communicator(config, distributed=False, simulated_workers=2)
        return LocalWorkers(config, make_model(), comm, adamw, total_steps=20)

    full, first = runner(), runner()
    for step in range(20):
        full.train_step([batch_for(w, step) for w in range(2)])
        if step < 10:
            first.train_step([batch_for(w, step) for w in range(2)])
    path = tmp_path / NAME
    write_state(str(path), first.state_dict(), config=config, step=10, **LAYOUT)
    resumed = runner()
    resumed.load_state_dict(read(path, config=config)[1])
    for step in range(10, 20):
        resumed.train_step([batch_for(w, step) for w in range(2)])
    for a, b in zip(full.models, resumed.models):
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert torch.equal(full.engine.outer.params, resumed.engine.outer.params)
    for a, b in zip(full.engine.error_feedback, resumed.engine.error_feedback):
        assert torch.equal(a.residual, b.residual) and a.residual.abs().max() > 0
    timing = {
        "seconds",
        "sync_seconds",
        "controller_seconds",
        "encode_seconds",
        "collective_seconds",
        "decode_seconds",
    }

    def rows(runner):
        return [
            {k: v for k, v in r.__dict__.items() if k not in timing} for r in runner.engine.records
        ]

    assert rows(full) == rows(resumed)


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / NAME
    write(path)
    before = path.read_bytes()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_state(str(path), {"other": 1}, config=CONFIG, step=9, **LAYOUT)
    assert path.read_bytes() == before and os.listdir(tmp_path) == [NAME]


def test_truncated_file_refused(tmp_path):
    path = tmp_path / NAME
    write(path)
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(
        CheckpointError, match=rf"{NAME}: field payload_bytes=\d+ but the file holds"
    ):
        read(path)
    path.write_bytes(data[:40])  # cut inside the header
    with pytest.raises(CheckpointError, match=rf"{NAME}: unreadable header \(field header"):
        read(path)
    assert checkpoint.peek_header(str(path)) is None


def test_corrupted_tensor_or_state_refused(tmp_path):
    path = tmp_path / NAME
    write(path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # inside the tensor bytes
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{NAME}: field sha256 does not match"):
        read(path)
    write(path)
    rewrite_metadata(path, lambda m: m.update(state=m["state"].replace('"step": 7', '"step": 8')))
    with pytest.raises(CheckpointError, match=rf"{NAME}: field sha256 does not match"):
        read(path)


def test_not_a_state_file_or_other_version_refused(tmp_path):
    path = tmp_path / NAME
    torch.save({"version": 1}, path)  # a pickle
    with pytest.raises(
        CheckpointError, match=rf"{NAME}: not an AutoLoCo state file \(field format"
    ):
        read(path)
    save_file({"w": torch.zeros(2)}, str(path))  # safetensors, but not ours
    with pytest.raises(CheckpointError, match=r"field format=None, expected 'autoloco-state'"):
        read(path)
    write(path)

    def version_99(metadata):
        header = json.loads(metadata["autoloco"])
        metadata["autoloco"] = json.dumps({**header, "format_version": 99})

    rewrite_metadata(path, version_99)
    with pytest.raises(CheckpointError, match="field format_version=99"):
        read(path)


def test_other_world_size_or_rank_refused(tmp_path):
    path = tmp_path / NAME
    write(path)
    with pytest.raises(
        CheckpointError, match=rf"{NAME}: field world_size=2 .* this run has world_size=4"
    ) as info:
        read(path, world_size=4)
    assert "--nproc_per_node 2" in str(info.value) and "last synchronized parameters" in str(
        info.value
    )
    with pytest.raises(CheckpointError, match="field world_size=2 \\(ranks_per_worker=1\\)"):
        read(path, ranks_per_worker=2)
    with pytest.raises(CheckpointError, match="field rank=1 but it was loaded by rank 0"):
        read(path, rank=0)


def test_incompatible_config_refused_runtime_fields_may_change(tmp_path):
    path = tmp_path / NAME
    write(path)
    with pytest.raises(
        CheckpointError, match=rf"{NAME}: field config\.h_base=4 .* this run has h_base=8"
    ):
        read(path, config=AutoLoCoConfig(method="autoloco", h_base=8))
    with pytest.raises(
        CheckpointError, match=r"field config\.method='autoloco' .* method='diloco'"
    ):
        # named before h_max (8 there, 6 without a rule)
        read(path, config=AutoLoCoConfig(method="diloco", h_base=4))
    with pytest.raises(CheckpointError, match=r"field config\.outer_lr=0\.7"):
        read(path, config=AutoLoCoConfig(method="autoloco", h_base=4, outer_lr=0.5))
    read(
        path,
        config=AutoLoCoConfig(method="autoloco", h_base=4, outer_on_cpu=True, bucket_size_mb=8.0),
    )
