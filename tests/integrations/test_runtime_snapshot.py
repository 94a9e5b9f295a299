"""WorkerRuntime writes boundary snapshots and resumes from one
(docs/algorithm.md#boundary-snapshots)."""

from __future__ import annotations

import pytest
import torch

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.algorithm.schedule import FunctionSchedule
from autoloco_hf.integrations.runtime import WorkerRuntime
from autoloco_hf.sync.snapshot import latest_snapshot
from autoloco_hf.toy.pattern import batch_for, make_model

CONFIG = AutoLoCoConfig(method="diloco", h_base=3)
STEPS = 12


def runtime(snapshot_dir=None, is_main_process=True):
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    worker = WorkerRuntime(
        CONFIG,
        model,
        model,
        optimizer,
        FunctionSchedule(lambda s: 1e-2, STEPS),
        STEPS,
        0,
        is_main_process=is_main_process,
        snapshot_dir=snapshot_dir,
    )
    return worker, model, optimizer


def train(worker, model, optimizer, until):
    while worker.step < until:
        model(**batch_for(0, worker.step)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        worker.after_optimizer_step(1e-2)


def test_the_main_process_snapshots_and_a_new_runtime_resumes_from_theta(tmp_path):
    worker, model, optimizer = runtime(str(tmp_path))
    train(worker, model, optimizer, 7)  # boundaries at 3 and 6, the fault in the third interval
    worker.close()
    theta = torch.cat([p.detach().reshape(-1) for p in worker.global_parameters()])
    snapshot = latest_snapshot(str(tmp_path), CONFIG)
    assert snapshot.step == 6 and torch.equal(snapshot.engine_state["outer"]["params"], theta)

    resumed, model2, optimizer2 = runtime()
    resumed.resume_from_snapshot(snapshot)
    assert resumed.step == 6 and len(resumed.engine.records) == 2
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in model2.parameters()]), theta)
    train(resumed, model2, optimizer2, STEPS)
    assert resumed.engine.totals.syncs == 4


def test_other_processes_write_no_snapshot(tmp_path):
    worker, model, optimizer = runtime(str(tmp_path), is_main_process=False)
    train(worker, model, optimizer, 6)
    worker.close()
    assert latest_snapshot(str(tmp_path), CONFIG) is None


def test_a_ddp_run_is_refused_naming_the_method(tmp_path):
    model = make_model()
    with pytest.raises(ValueError, match="method='ddp'"):
        WorkerRuntime(
            AutoLoCoConfig(method="ddp"),
            model,
            model,
            torch.optim.AdamW(model.parameters()),
            FunctionSchedule(lambda s: 1e-2, STEPS),
            STEPS,
            0,
            snapshot_dir=str(tmp_path),
        )


def test_an_fsdp2_sharded_model_is_refused(tmp_path, monkeypatch):
    from autoloco_hf.integrations import runtime as runtime_module

    # as if fully_shard had run
    monkeypatch.setattr(runtime_module, "fsdp2_mesh", lambda model: object())
    with pytest.raises(ValueError, match="sharded with FSDP2 fully_shard"):
        runtime(str(tmp_path))
