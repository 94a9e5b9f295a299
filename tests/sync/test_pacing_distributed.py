"""Budget pacing on real gloo processes: each rank takes its own steps, weights by an all-reduce
(docs/algorithm.md#pacing)."""

from __future__ import annotations

import logging
import socket

import torch
from _dist import run_gloo
from toy import TIMING_FIELDS

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.sync.communicators import (
    Communicator,
    ProcessGroupCommunicator,
    SimulatedCommunicator,
)
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

STEPS = 24
# rank 1 at half speed, then at a quarter from step 12: each
# process reads its own entry of the shared lists
CONFIG = dict(
    method="diloco", h_base=4, pacing="budget", worker_speeds=[1.0, 0.5], speed_changes="12:1:0.25"
)


def train(comm: Communicator, ranks: list[int]) -> LocalWorkers:
    runner = LocalWorkers(
        AutoLoCoConfig(**CONFIG),
        make_model(seed=ranks[0]),  # different inits: the engine broadcasts rank 0's
        comm,
        adamw,
        scheduler_factory=cosine(STEPS, 0),
        total_steps=STEPS,
    )
    taken = dict.fromkeys(ranks, 0)

    def draw(worker: int) -> dict:
        rank = ranks[worker]
        taken[rank] += 1
        return batch_for(rank, taken[rank] - 1, padded=True)

    for _ in range(STEPS):
        runner.train_paced(draw)
    return runner


def records_of(runner: LocalWorkers) -> list[dict]:
    return [
        {k: v for k, v in r.__dict__.items() if k not in TIMING_FIELDS}
        for r in runner.engine.records
    ]


def _process_worker(rank: int, world_size: int) -> dict:
    log = Lines()
    logger = logging.getLogger("autoloco_hf")
    logger.addHandler(log)
    try:
        runner = train(ProcessGroupCommunicator(), [rank])
    finally:
        logger.removeHandler(log)
    params = [p.detach().clone() for p in runner.models[0].parameters()]
    return {"params": params, "records": records_of(runner), "log": log.lines}


class Lines(logging.Handler):
    """The warnings a process logged, as text (the straggler's is one)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_two_gloo_processes_at_different_speeds_equal_the_simulation():
    simulated = train(SimulatedCommunicator(2), [0, 1])
    results = run_gloo(_process_worker, 2)
    steps = [r["worker_steps"] for r in results[0]["records"]]
    # lockstep (unmeasured), then 2:1; the slowdown at step
    # 12 is seen at the sync of step 16, then 4:1
    assert steps == [[4, 4], [5, 2], [5, 2], [5, 2], [6, 1], [6, 1]]
    for rank, result in enumerate(results):
        for p, q in zip(result["params"], simulated.models[rank].parameters()):
            assert torch.equal(p, q), f"rank {rank} parameters differ from simulated worker {rank}"
    assert results[0]["records"] == results[1]["records"]
    # a straggler is named with its rank and the host it
    # reported at start-up, as simulated worker 1 is
    straggler = f"worker 1 (rank 1, host {socket.gethostname()})"
    assert [r["stragglers"] for r in results[0]["records"]] == [[]] * 5 + [[straggler]]
    assert results[0]["records"][-1]["worker_labels"][1] == straggler
    assert any(
        f"AutoLoCo: {straggler} ran below 0.5 of the median speed" in line
        for line in results[0]["log"]
    )
    assert results[0]["records"] == records_of(simulated)
    assert results[0]["records"][-1]["worker_seconds"] == [6.0, 4.0]
