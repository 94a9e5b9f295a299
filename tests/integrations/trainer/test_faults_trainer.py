"""Faults inside one machine through the real Trainer + callback (2 gloo processes, tiny Llama:
forked with torchrun's environment, ``launch.forked_ranks``, or under torchrun where the launch
must fail)."""

from __future__ import annotations

import json
import socket

import pytest
import torch
from launch import forked_ranks, torchrun_failing

pytestmark = pytest.mark.slow


def test_nan_on_rank1_skips_the_outer_step_and_training_goes_on(tmp_path):
    """A NaN written into rank 1's weights at step 6: the step-8 boundary keeps theta and the outer
    momentum of step 4 bit for bit on both ranks, the controller takes its invalid path, the event
    names rank 1, the next intervals are valid and the run finishes."""
    spec = {
        "output_dir": str(tmp_path),
        "steps": 16,
        "batch": 2,
        "faults": {"nan": {"step": 6, "rank": 1}},
        "autoloco": {
            "method": "autoloco",
            "controller": "paper",
            "h_base": 4,
            "q_h": 1,
            "h_max": 6,
        },
    }
    results = forked_ranks("trainer_worker.py", spec, nproc=2)
    records = results[0]["records"]
    assert (
        records[0]["start_step"] == 0
        and records[1]["start_step"] == 4
        and records[1]["h_step"] == 4
    )
    assert [r["outer_step_applied"] for r in records] == [True, False] + [True] * (len(records) - 2)
    assert records[1]["assessment"] == "invalid"
    for result in results:
        before, after = result["snapshots"][0], result["snapshots"][1]
        assert (before["step"], after["step"]) == (4, 8)
        for p, q in zip(before["params"], after["params"]):
            assert torch.equal(p, q), "the global parameters moved across the invalid boundary"
        assert torch.equal(before["momentum"], after["momentum"])
        assert result["global_step"] == 16
        assert all(torch.isfinite(p).all() for p in result["params"])
    assert all(torch.equal(p, q) for p, q in zip(results[0]["params"], results[1]["params"]))
    lines = (tmp_path / "autoloco_intervals.jsonl").read_text().splitlines()
    assert [json.loads(line)["outer_step_applied"] for line in lines] == [
        r["outer_step_applied"] for r in records
    ]


def test_rank1_with_another_horizon_is_stopped_at_the_first_boundary(tmp_path):
    """Rank 1 runs h_base=6 (another config, another decision): rank 0's boundary at step 4 meets
    rank 1's at step 6; both stop there with the per-rank values, before any outer step.

    (No checkpoint in this run: a Trainer save at step 4 would hold rank 1
    in the Trainer's own barrier while rank 0 waits at its boundary; then
    rank 0 stops after sync_timeout_s with PeerLostError instead.)"""
    spec = {
        "output_dir": str(tmp_path),
        "steps": 12,
        "batch": 2,
        "faults": {},
        "autoloco": {"method": "diloco", "h_base": 4, "sync_timeout_s": 60},
        "autoloco_rank": {"1": {"h_base": 6}},
    }
    output = torchrun_failing("trainer_worker.py", spec, nproc=2)
    lines = [line for line in output.splitlines() if "WorkerDisagreement:" in line]
    assert len(lines) == 2, output[-4000:]  # every rank stops, with the same message
    first, second = (f"worker {r} (rank {r}, host {socket.gethostname()})" for r in (0, 1))
    for line in lines:
        for expected in (
            f"step: {first}=4, {second}=6",
            f"h_step: {first}=4, {second}=6",
            f"h_tok: {first}=4, {second}=6",
            f"config_fingerprint: {first}=",
        ):
            assert expected in line, line
        assert "interval_index" not in line and "start_step" not in line, (
            "fields that agree are not listed"
        )
    records = tmp_path / "autoloco_intervals.jsonl"
    assert not records.exists() or not records.read_text().strip(), "no interval may be recorded"
