"""N simulated workers == N real gloo processes
(docs/algorithm.md#simulation): same parameters, same interval records."""

from __future__ import annotations

import pytest
import torch
from _dist import run_gloo
from toy import TIMING_FIELDS

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.sync.communicators import ProcessGroupCommunicator, SimulatedCommunicator
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

STEPS, WARMUP = 70, 6


RULES = {
    "paper": dict(controller="paper", h_max=8),
    # the descent rule at its defaults, with its drift guard:
    # the anchor scalars travel in the control message
    "descent_guard": dict(controller="descent"),
    # the descent rule's start probe (from 4 h_base, where a probe fits): its own small all-reduce
    # between syncs, and an interval cut short
    "descent_probe": dict(controller="descent", h_max=16, rule_options={"start_probe": 2.0}),
}
CASES = [("fp32", "paper"), ("int8", "paper"), ("fp32", "descent_guard"), ("fp32", "descent_probe")]


def config(wire_dtype: str, rule: str = "paper") -> AutoLoCoConfig:
    return AutoLoCoConfig(method="autoloco", h_base=4, q_h=2, wire_dtype=wire_dtype, **RULES[rule])


def records_of(runner: LocalWorkers) -> list[dict]:
    return [
        {k: v for k, v in r.__dict__.items() if k not in TIMING_FIELDS}
        for r in runner.engine.records
    ]


def _run_case(rank: int, wire_dtype: str, rule: str) -> dict:
    runner = LocalWorkers(
        config(wire_dtype, rule),
        make_model(seed=rank),  # different inits: the engine broadcasts rank 0's
        ProcessGroupCommunicator(wire_dtype=wire_dtype),
        adamw,
        scheduler_factory=cosine(STEPS, WARMUP),
        total_steps=STEPS,
        warmup_steps=WARMUP,
    )
    for step in range(STEPS):
        runner.train_step([batch_for(rank, step, padded=True)])
    return {
        "params": [p.detach().clone() for p in runner.models[0].parameters()],
        "records": records_of(runner),
    }


def _process_worker(rank: int, world_size: int) -> dict:
    """Every case, one after the other, in one pair of
    processes: their start-up is paid once, not per case."""
    return {case: _run_case(rank, *case) for case in CASES}


@pytest.fixture(scope="module")
def gloo_runs() -> list[dict]:
    return run_gloo(_process_worker, 2, timeout=600)


@pytest.mark.parametrize(("wire_dtype", "rule"), CASES)
def test_two_gloo_processes_equal_two_simulated_workers(gloo_runs, wire_dtype, rule):
    simulated = LocalWorkers(
        config(wire_dtype, rule),
        make_model(seed=0),
        SimulatedCommunicator(2, wire_dtype=wire_dtype),
        adamw,
        scheduler_factory=cosine(STEPS, WARMUP),
        total_steps=STEPS,
        warmup_steps=WARMUP,
    )
    for step in range(STEPS):
        simulated.train_step([batch_for(w, step, padded=True) for w in range(2)])

    results = [run[(wire_dtype, rule)] for run in gloo_runs]
    assert len(simulated.engine.records) >= (8 if rule == "paper" else 4)
    assert len({r["h_step"] for r in results[0]["records"]}) > 1, "the run should adapt its horizon"
    if rule == "descent_guard":
        assert all(
            r["anchor_normalized_drift"] > 0
            for r in results[0]["records"]
            if r["h_step"] > r["h_ref"]
        )
        assert all(
            1.0 < r["drift_exponent"] < 2.0
            for r in results[0]["records"]
            if r["h_step"] > r["h_ref"]
        )
    if rule == "descent_probe":
        first = results[0]["records"][0]
        assert (first["assessment"], first["h_step"], first["next_h_tok"]) == ("bent", 8, 8)
        assert 0.0 < first["probe_exponent"] < 2.0
    for rank, result in enumerate(results):
        for p, q in zip(result["params"], simulated.models[rank].parameters()):
            assert torch.equal(p, q), f"rank {rank} parameters differ from simulated worker {rank}"
    sim_records = records_of(simulated)
    # wire bytes are per worker: rank 0's count is what the simulation reports
    assert results[0]["records"] == sim_records

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "wire_bytes"} for r in rows]

    assert strip(results[1]["records"]) == strip(sim_records)
