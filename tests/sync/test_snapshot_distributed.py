"""Elastic resume with real processes: 3 gloo processes snapshot, 2 go on, as 3 -> 2 simulated
workers do (docs/algorithm.md#boundary-snapshots).

Two workers, because only a sum of two is the same in any order: the gloo
all-reduce of three adds in another order than the simulation, so three
processes and three simulated workers agree to rounding, not bit for bit.
"""

from __future__ import annotations

import os

import torch
from _dist import run_gloo
from toy import TIMING_FIELDS

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.sync.communicators import ProcessGroupCommunicator, SimulatedCommunicator
from autoloco_hf.sync.snapshot import latest_snapshot
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

CONFIG = AutoLoCoConfig(
    method="autoloco",
    controller="paper",
    h_base=4,
    q_h=2,
    h_max=8,
    rule_options={"calibration_intervals": 2},
)
STEPS, WARMUP, FAULT = 40, 2, 14


def runner(communicator, snapshot_dir=None) -> LocalWorkers:
    return LocalWorkers(
        CONFIG,
        make_model(),
        communicator,
        adamw,
        scheduler_factory=cosine(STEPS, WARMUP),
        total_steps=STEPS,
        warmup_steps=WARMUP,
        snapshot_dir=snapshot_dir,
    )


def records_of(workers: LocalWorkers) -> list[dict]:
    skip = TIMING_FIELDS | {"wire_bytes"}  # wire bytes are per worker
    return [{k: v for k, v in r.__dict__.items() if k not in skip} for r in workers.engine.records]


def _before_the_fault(rank: int, world_size: int, folder: str) -> int:
    workers = runner(ProcessGroupCommunicator(), snapshot_dir=folder if rank == 0 else None)
    while workers.step < FAULT:
        workers.train_step([batch_for(rank, workers.step, padded=True)])
    workers.close()
    return workers.step


def _after_the_fault(rank: int, world_size: int, folder: str) -> dict:
    workers = runner(ProcessGroupCommunicator())
    workers.resume_from_snapshot(latest_snapshot(folder, CONFIG))
    while workers.step < STEPS:
        workers.train_step([batch_for(rank, workers.step, padded=True)])
    return {
        "params": [p.detach().clone() for p in workers.models[0].parameters()],
        "records": records_of(workers),
    }


def test_three_processes_snapshot_and_two_go_on_like_simulated_workers(tmp_path):
    folder = str(tmp_path)
    run_gloo(_before_the_fault, 3, folder)
    assert len(os.listdir(folder)) == 2  # rank 0 wrote, nobody else: the last two boundaries
    snapshot = latest_snapshot(folder, CONFIG)
    assert snapshot.workers == 3 and snapshot.step < FAULT
    results = run_gloo(_after_the_fault, 2, folder)

    simulated = runner(SimulatedCommunicator(2))
    simulated.resume_from_snapshot(snapshot)
    while simulated.step < STEPS:
        simulated.train_step([batch_for(w, simulated.step, padded=True) for w in range(2)])
    assert len(simulated.engine.records) > len(snapshot.engine_state["records"])
    for rank, result in enumerate(results):
        for p, q in zip(result["params"], simulated.models[rank].parameters()):
            assert torch.equal(p, q), f"rank {rank} differs from simulated worker {rank}"
        assert result["records"] == records_of(simulated)
