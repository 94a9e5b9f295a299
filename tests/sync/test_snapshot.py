"""Boundary snapshots and elastic resume with another number of workers
(docs/algorithm.md#boundary-snapshots)."""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
import threading

import pytest
import torch
from toy import TIMING_FIELDS

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.state import checkpoint
from autoloco_hf.state.checkpoint import CheckpointError, ConfigMismatchError
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.snapshot import (
    BoundarySnapshot,
    SnapshotWriteError,
    latest_snapshot,
    snapshot_path,
    step_of,
)
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

DILOCO = AutoLoCoConfig(method="diloco", h_base=4)
AUTOLOCO = AutoLoCoConfig(
    method="autoloco",
    controller="paper",
    h_base=4,
    q_h=2,
    h_max=8,
    rule_options={"calibration_intervals": 2},
)


def runner(config, workers: int, total: int, **kwargs) -> LocalWorkers:
    return LocalWorkers(
        config,
        make_model(),
        SimulatedCommunicator(workers),
        optimizer_factory=adamw,
        scheduler_factory=cosine(total, 2),
        total_steps=total,
        warmup_steps=2,
        **kwargs,
    )


def advance(workers: LocalWorkers, until: int, padded: bool = True) -> LocalWorkers:
    while workers.step < until:
        workers.train_step([batch_for(w, workers.step, padded) for w in range(len(workers.models))])
    return workers


def written_steps(monkeypatch) -> list[int]:
    steps: list[int] = []
    real = checkpoint.write_state

    def counting(path, state, **kwargs):
        steps.append(kwargs["step"])
        real(path, state, **kwargs)

    monkeypatch.setattr(checkpoint, "write_state", counting)
    return steps


def test_a_snapshot_at_every_boundary_the_last_two_kept(tmp_path, monkeypatch):
    steps = written_steps(monkeypatch)
    workers = advance(runner(DILOCO, 2, 16, snapshot_dir=str(tmp_path)), 16)
    workers.close()
    assert steps == [4, 8, 12, 16]
    assert sorted(os.listdir(tmp_path)) == [
        os.path.basename(snapshot_path(str(tmp_path), s)) for s in (12, 16)
    ]
    snapshot = latest_snapshot(str(tmp_path), DILOCO)
    assert (snapshot.step, snapshot.workers) == (16, 2)
    assert torch.equal(
        snapshot.engine_state["outer"]["params"], workers.engine.outer.params.detach()
    )


def test_the_write_runs_off_the_training_thread(tmp_path, monkeypatch):
    started, release, threads = threading.Event(), threading.Event(), []
    real = checkpoint.write_state

    def slow(path, state, **kwargs):
        threads.append(threading.current_thread())
        started.set()
        assert release.wait(60)
        real(path, state, **kwargs)

    monkeypatch.setattr(checkpoint, "write_state", slow)
    workers = advance(runner(DILOCO, 2, 16, snapshot_dir=str(tmp_path)), 4)  # the first boundary
    assert started.wait(60)
    advance(workers, 7)  # training goes on while the write is blocked
    assert os.listdir(tmp_path) == []
    release.set()
    workers.close()
    assert threads and threads[0] is not threading.main_thread()
    assert latest_snapshot(str(tmp_path), DILOCO).step == 4


def test_a_failed_write_is_raised_at_the_next_boundary(tmp_path, monkeypatch):
    def full(path, state, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "write_state", full)
    workers = advance(runner(DILOCO, 2, 16, snapshot_dir=str(tmp_path)), 7)
    with pytest.raises(
        SnapshotWriteError, match=r"boundary snapshot of step 4 .*No space left on device"
    ):
        advance(workers, 8)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_newest_snapshot_is_refused_and_the_previous_one_used(tmp_path, caplog, damage):
    workers = advance(runner(DILOCO, 2, 16, snapshot_dir=str(tmp_path)), 8)
    workers.close()
    newest = snapshot_path(str(tmp_path), 8)
    data = bytearray(open(newest, "rb").read())
    if damage == "truncate":
        data = data[: len(data) - 100]
    else:
        data[-5] ^= 0xFF
    open(newest, "wb").write(bytes(data))
    with caplog.at_level(logging.WARNING, logger="autoloco_hf"):
        snapshot = latest_snapshot(str(tmp_path), DILOCO)
    assert snapshot.step == 4
    [line] = [r.getMessage() for r in caplog.records]
    assert "boundary snapshot refused" in line and newest in line and "\n" not in line


def test_a_second_copy_keeps_a_boundary_whose_first_copy_was_lost(tmp_path):
    workers = runner(DILOCO, 2, 16, snapshot_dir=str(tmp_path))
    second = BoundarySnapshot(str(tmp_path), workers.engine, copy=1)
    workers.engine.listeners.append(second)
    advance(workers, 8)
    workers.close()
    second.close()
    assert sorted(os.listdir(tmp_path)) == [
        "boundary-000000004.copy1.safetensors",
        "boundary-000000004.safetensors",
        "boundary-000000008.copy1.safetensors",
        "boundary-000000008.safetensors",
    ]
    assert latest_snapshot(str(tmp_path), DILOCO).path == snapshot_path(str(tmp_path), 8)
    os.remove(snapshot_path(str(tmp_path), 8))  # its writer died before the rename
    snapshot = latest_snapshot(str(tmp_path), DILOCO)
    assert snapshot.step == 8 and snapshot.path == snapshot_path(str(tmp_path), 8, copy=1)


def test_a_second_launch_keeps_the_last_two_boundaries_whoever_wrote_them(tmp_path):
    """Launch 1 (two copies) stops after step 9; launch 2 resumes step 8 with one writer: the
    boundaries of launch 1 that are no longer among the last two go, copies included."""
    first = runner(DILOCO, 2, 24, snapshot_dir=str(tmp_path))
    second_copy = BoundarySnapshot(str(tmp_path), first.engine, copy=1)
    first.engine.listeners.append(second_copy)
    advance(first, 9)
    first.close()
    second_copy.close()
    assert sorted({step_of(str(tmp_path / name)) for name in os.listdir(tmp_path)}) == [4, 8]
    resumed = runner(DILOCO, 3, 24, snapshot_dir=str(tmp_path))
    resumed.resume_from_snapshot(latest_snapshot(str(tmp_path), DILOCO))
    advance(resumed, 16)
    resumed.close()
    assert sorted(os.listdir(tmp_path)) == [
        os.path.basename(snapshot_path(str(tmp_path), s)) for s in (12, 16)
    ]


def test_temporary_files_of_dead_writers_go_live_ones_stay(tmp_path):
    """Temporary files a killed writer left: removed at the next write when the pid is this
    machine's and ended, or when the boundary is older than the kept ones; a live writer's (another
    process, this one, another machine's inside the kept boundaries) stays."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    try:
        ours = checkpoint.machine_key()
        folder = str(tmp_path)
        names = {
            "dead": f"{snapshot_path(folder, 8)}.tmp-{ours}-{ended.pid}",
            "live": f"{snapshot_path(folder, 8, copy=1)}.tmp-{ours}-{live.pid}",
            "this process": f"{snapshot_path(folder, 8, copy=1)}.tmp-{ours}-{os.getpid()}",
            "another machine, "
            "kept boundary": f"{snapshot_path(folder, 8)}.tmp-0123456789ab-{ended.pid}",
            "another machine, "
            "older boundary": f"{snapshot_path(folder, 4)}.tmp-0123456789ab-{live.pid}",
            "an older name without machine": f"{snapshot_path(folder, 8)}.tmp-{ended.pid}",
        }
        for path in names.values():
            open(path, "wb").write(b"half a snapshot")
        # writes 4, 8, 12, pruning after each
        advance(runner(DILOCO, 2, 24, snapshot_dir=folder), 12).close()
        left = {what for what, path in names.items() if os.path.exists(path)}
        assert left == {
            "live",
            "this process",
            "another machine, kept boundary",
            "an older name without machine",
        }
        assert latest_snapshot(folder, DILOCO).step == 12
    finally:
        live.kill()
        live.wait()


def test_every_snapshot_damaged_is_refused_not_a_fresh_start(tmp_path):
    advance(runner(DILOCO, 2, 16, snapshot_dir=str(tmp_path)), 8).close()
    for step in (4, 8):
        path = snapshot_path(str(tmp_path), step)
        open(path, "wb").write(open(path, "rb").read()[:-100])
    with pytest.raises(CheckpointError, match="none of its 2 boundary snapshots verifies"):
        latest_snapshot(str(tmp_path), DILOCO)


def test_a_changed_config_field_is_refused_naming_it(tmp_path):
    advance(runner(DILOCO, 2, 16, snapshot_dir=str(tmp_path)), 4).close()
    with pytest.raises(ConfigMismatchError, match=r"field config\.h_base=4 .* h_base=8"):
        latest_snapshot(str(tmp_path), AutoLoCoConfig(method="diloco", h_base=8))
    with pytest.raises(ConfigMismatchError, match=r"field config\.method='diloco'"):
        latest_snapshot(str(tmp_path), AutoLoCoConfig(method="qsr", h_base=4))
    moved = AutoLoCoConfig(method="diloco", h_base=4, snapshot_dir="/elsewhere", sync_timeout_s=30)
    assert latest_snapshot(str(tmp_path), moved).step == 4  # where the folder is mounted may change


def test_overlapped_schedules_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"overlap='none' \(got overlap='delayed'\)"):
        runner(
            AutoLoCoConfig(method="diloco", h_base=4, overlap="delayed"),
            2,
            16,
            snapshot_dir=str(tmp_path),
        )


@pytest.mark.parametrize("new_workers", [1, 2, 3])
def test_streaming_fragments_go_on_from_the_boundary_every_fragment_from_theta(
    tmp_path, new_workers
):
    """fragments=2: the snapshot is taken when the interval's last fragment
    has landed; any number of workers restarts every fragment from theta_t
    with each fragment's momentum slice, and streams on at its offsets."""
    config = AutoLoCoConfig(
        method="autoloco",
        h_base=4,
        q_h=2,
        h_max=8,
        rule_options={"calibration_intervals": 2},
        fragments=2,
    )
    old = advance(runner(config, 2, 40, snapshot_dir=str(tmp_path)), 13)
    old.close()
    snapshot = latest_snapshot(str(tmp_path), config)
    last = old.engine.records[-1]
    # a boundary, passed
    assert snapshot.step == last.start_step + last.h_step and snapshot.step < old.step
    resumed = runner(config, new_workers, 40)
    resumed.resume_from_snapshot(snapshot)
    engine, saved = resumed.engine, snapshot.engine_state
    assert torch.equal(engine.outer.params.detach(), saved["outer"]["params"])
    # one per fragment
    saved_buffers = [saved["outer"]["optimizer"]["state"][k]["momentum_buffer"] for k in range(2)]
    assert torch.equal(engine.outer.momentum_buffer, torch.cat(saved_buffers))
    for model in resumed.models:
        assert torch.equal(
            torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
            saved["outer"]["params"],
        )
    collectives, average = [], engine.comm.average
    engine.comm.average = lambda flats, *args, **kw: (
        collectives.append(flats[0].numel()) or average(flats, *args, **kw)
    )
    advance(resumed, 40)
    records = resumed.engine.records[len(saved["records"]) :]
    assert sum(r.h_step for r in records) == 40 - snapshot.step and all(
        r.outer_step_applied for r in records
    )
    # every interval streams both fragments, one collective
    # each, which together cover the model once
    numel = engine.outer.numel
    assert len(collectives) == 2 * len(records) and sum(collectives) == len(records) * numel
    assert all(0 < n < numel for n in collectives)


@pytest.mark.parametrize("new_workers", [1, 3])
def test_another_number_of_workers_goes_on_from_exactly_the_shared_state(tmp_path, new_workers):
    """N -> N-1 and N -> N+1: theta_t, momentum, policy and
    totals bit-equal right after the resume."""
    old = advance(runner(AUTOLOCO, 2, 40, snapshot_dir=str(tmp_path)), 12)
    old.close()
    snapshot = latest_snapshot(str(tmp_path), AUTOLOCO)
    assert snapshot.step == old.engine.records[-1].start_step + old.engine.records[-1].h_step
    resumed = runner(AUTOLOCO, new_workers, 40)
    resumed.resume_from_snapshot(snapshot)
    engine, saved = resumed.engine, snapshot.engine_state
    assert resumed.step == snapshot.step
    assert torch.equal(engine.outer.params.detach(), saved["outer"]["params"])
    assert torch.equal(
        engine.outer.momentum_buffer, saved["outer"]["optimizer"]["state"][0]["momentum_buffer"]
    )
    for model in resumed.models:  # every worker starts from theta_t
        assert torch.equal(
            torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
            saved["outer"]["params"],
        )
    assert engine.totals.as_dict() == saved["totals"] and len(engine.records) == len(
        saved["records"]
    )
    # the learning rate at the boundary step, fresh moments
    assert resumed.optimizers[0].param_groups[0]["lr"] == old.optimizers[0].param_groups[0]["lr"]
    assert resumed.optimizers[0].state == {}
    # token mapper: global token counts follow the new N;
    # controller: recalibrates at the accepted horizon
    mapper, before = engine.policy.mapper, snapshot.engine_state["policy"]["mapper"]
    assert mapper.tokens_per_step == pytest.approx(
        before["tokens_per_step"] * new_workers / 2, rel=1e-12
    )
    assert engine.policy.rule.phase == "calibration"
    advance(resumed, 40)  # and it trains on
    assert engine.records[-1].start_step + engine.records[-1].h_step == 40


def test_same_workers_with_the_inner_state_carried_is_bit_exact(tmp_path):
    uninterrupted = advance(runner(AUTOLOCO, 2, 40), 40)
    first = advance(runner(AUTOLOCO, 2, 40, snapshot_dir=str(tmp_path)), 12)
    first.close()
    snapshot = latest_snapshot(str(tmp_path), AUTOLOCO)
    assert snapshot.step == first.step  # 12 is a boundary of this run
    inner = [copy.deepcopy(o.state_dict()) for o in first.optimizers]
    resumed = runner(AUTOLOCO, 2, 40)
    resumed.resume_from_snapshot(snapshot, optimizer_states=inner)
    advance(resumed, 40)
    for a, b in zip(uninterrupted.models, resumed.models):
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert torch.equal(pa, pb)
    strip = lambda r: {k: v for k, v in r.__dict__.items() if k not in TIMING_FIELDS}  # noqa: E731
    assert [strip(r) for r in resumed.engine.records] == [
        strip(r) for r in uninterrupted.engine.records
    ]


def test_carried_inner_state_needs_the_same_workers(tmp_path):
    first = advance(runner(DILOCO, 2, 16, snapshot_dir=str(tmp_path)), 4)
    first.close()
    with pytest.raises(ValueError, match="2 optimizer states for 3 local workers"):
        runner(DILOCO, 3, 16).resume_from_snapshot(
            latest_snapshot(str(tmp_path), DILOCO), [o.state_dict() for o in first.optimizers]
        )
