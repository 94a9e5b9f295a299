"""The overlapped lossy average by asynchronous all-gathers
(docs/algorithm.md#overlap), in real gloo processes.

Each worker encodes its buffer by the owner parts and all-gathers it with
``async_op=True``; the merge decodes the ``N`` buffers and sums them in worker order.
These tests pin that N processes reproduce the simulation bit for bit, that a resume
with an average in flight equals the uninterrupted run, that error feedback keeps
exactly what was sent, and that the all-gather (not the background thread) ran.
"""

from __future__ import annotations

import io

import pytest
import torch
from _dist import run_gloo
from test_overlap import STEPS, config, params_of, records_of, runner_for, train

from autoloco_hf.sync.communicators import (
    ALL_GATHER,
    OWNER_REDUCE,
    ProcessGroupCommunicator,
    SimulatedCommunicator,
    gathered_bytes_sent,
)
from autoloco_hf.wire.codec import (
    ErrorFeedback,
    gathered_mean,
    owner_reduce_mean,
    roundtrip_as_sent,
)

# small blocks: several per tensor of the toy model
LOSSY = dict(error_feedback=True, int8_block_size=64)


def lossy_config(overlap: str, wire: str):
    return config(overlap=overlap, wire_dtype=wire, overlap_steps=2, **LOSSY)


def test_gathered_mean_rounds_once_less_than_owner_reduce():
    """The two aggregations differ in bits (one encoding of
    the mean fewer), so the choice is kept selectable."""
    comm = SimulatedCommunicator(3, wire_dtype="int4", block_size=16)
    codec = comm.codec([40, 50])
    flats = [torch.randn(90, generator=torch.Generator().manual_seed(w)) for w in range(3)]
    exact = torch.stack(flats).mean(dim=0)
    gathered, owner = gathered_mean(codec, flats), owner_reduce_mean(codec, flats)
    assert not torch.equal(gathered, owner)
    assert (gathered - exact).norm() < (owner - exact).norm()
    assert torch.equal(comm.start_average(flats, [], [40, 50]).wait().mean, gathered)
    # the blocking average keeps owner-reduce
    assert torch.equal(comm.average(flats, [], [40, 50]).mean, owner)
    old = SimulatedCommunicator(
        3, wire_dtype="int4", block_size=16, overlap_aggregation=OWNER_REDUCE
    )
    assert torch.equal(old.start_average(flats, [], [40, 50]).wait().mean, owner)


def test_a_bad_overlap_aggregation_names_the_value_and_the_choices():
    with pytest.raises(
        ValueError, match="overlap_aggregation='ring' is not an aggregation: use 'all_gather'"
    ):
        SimulatedCommunicator(2, wire_dtype="int4", overlap_aggregation="ring")


def _sent_and_received(rank: int, world_size: int) -> dict:
    """Each rank compensates its own contribution with error
    feedback and starts the overlapped average."""
    comm = ProcessGroupCommunicator(wire_dtype="int4", block_size=16)
    segments = [40, 50]
    codec = comm.codec(segments)
    feedback = ErrorFeedback(90)
    feedback.residual.copy_(
        torch.randn(90, generator=torch.Generator().manual_seed(100 + rank)) * 0.1
    )
    delta = torch.randn(90, generator=torch.Generator().manual_seed(rank))
    compensated = feedback.apply(codec, delta, world_size)
    pending = comm.start_average([compensated], [torch.tensor([float(rank)])], segments)
    result = pending.wait()
    return {
        "mean": result.mean.clone(),
        "residual": feedback.residual.clone(),
        "compensated": compensated,
        "wire_bytes": result.traffic.wire_bytes,
        "aggregations": dict(comm.aggregations),
        "thread": comm._background is not None,
    }


def test_error_feedback_keeps_exactly_what_the_all_gather_sent():
    results = run_gloo(_sent_and_received, 2)
    codec = SimulatedCommunicator(2, wire_dtype="int4", block_size=16).codec([40, 50])
    sent = [roundtrip_as_sent(codec, r["compensated"], 2) for r in results]
    for r, s in zip(results, sent):
        # the residual is x minus what this worker sent
        assert torch.equal(r["residual"], r["compensated"] - s)
        assert torch.equal(r["mean"], gathered_mean(codec, [x["compensated"] for x in results]))
        assert torch.equal(r["mean"], (s_sum := sent[0] + sent[1]) / 2) and s_sum.abs().sum() > 0
        assert r["aggregations"] == {ALL_GATHER: 1} and not r["thread"]
        # one whole encoded buffer for two workers: parts [0, 45) and [45,
        # 90) cut at the tensors, so pieces of 40, 5 and 45 elements: 20 +
        # 3 + 23 bytes of codes and 3 + 1 + 3 FP32 scales (blocks of 16)
        assert r["wire_bytes"] == gathered_bytes_sent(codec, 2) == 46 + 4 * 7


def strip(records: list[dict]) -> list[dict]:
    """Without the wire bytes: a blocking owner-reduce counts
    each rank's own parts, the simulation worker 0's."""
    return [{k: v for k, v in r.items() if k != "wire_bytes"} for r in records]


def _overlapped_run(rank: int, world_size: int, overlap: str, wire: str) -> dict:
    comm = ProcessGroupCommunicator(wire_dtype=wire, block_size=LOSSY["int8_block_size"])
    runner = runner_for(lossy_config(overlap, wire), comm, seed=rank)
    train(runner, 0, STEPS, (rank,))
    return {
        "params": params_of(runner.models[0]),
        "records": records_of(runner),
        "residual": runner.engine.error_feedback[0].residual.clone(),
        "aggregations": dict(comm.aggregations),
    }


@pytest.mark.parametrize(
    ("overlap", "wire"), [("delayed", "int4"), ("eager", "int8"), ("delayed", "int2")]
)
def test_two_gloo_processes_equal_two_simulated_workers_through_the_all_gather(overlap, wire):
    sim = runner_for(
        lossy_config(overlap, wire), SimulatedCommunicator(2, wire_dtype=wire, block_size=64)
    )
    train(sim, 0, STEPS, (0, 1))
    results = run_gloo(_overlapped_run, 2, overlap, wire)
    sim_records = records_of(sim)
    assert len(sim_records) >= 4
    for rank, result in enumerate(results):
        for p, q in zip(result["params"], sim.models[rank].parameters()):
            assert torch.equal(p, q), f"rank {rank} parameters differ from simulated worker {rank}"
        assert strip(result["records"]) == strip(sim_records)
        assert torch.equal(result["residual"], sim.engine.error_feedback[rank].residual)
        # every overlapped average went through the all-gather;
        # eager's last boundary blocks (owner-reduce)
        assert (
            result["aggregations"].get(ALL_GATHER, 0) >= 3
            and OWNER_REDUCE not in result["aggregations"]
        )


def _resumed_run(rank: int, world_size: int, overlap: str, wire: str, cut: int) -> dict:
    """The whole run, then the run cut at ``cut`` (an average
    in flight), saved and resumed on fresh objects."""
    cfg = lossy_config(overlap, wire)
    block = LOSSY["int8_block_size"]
    full = runner_for(cfg, ProcessGroupCommunicator(wire_dtype=wire, block_size=block), seed=rank)
    train(full, 0, STEPS, (rank,))
    first = runner_for(cfg, ProcessGroupCommunicator(wire_dtype=wire, block_size=block), seed=rank)
    train(first, 0, cut, (rank,))
    in_flight = first.engine.in_flight is not None
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    comm = ProcessGroupCommunicator(wire_dtype=wire, block_size=block)
    resumed = runner_for(cfg, comm, seed=rank + 7)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    train(resumed, cut, STEPS, (rank,))
    return {
        "in_flight": in_flight,
        "full": params_of(full.models[0]),
        "resumed": params_of(resumed.models[0]),
        "records": (records_of(full), records_of(resumed)),
        "aggregations": dict(comm.aggregations),
    }


def _cut_with_an_average_in_flight(overlap: str, wire: str) -> int:
    """A step after which the simulated run has an average in
    flight (the processes follow its schedule)."""
    sim = runner_for(
        lossy_config(overlap, wire), SimulatedCommunicator(2, wire_dtype=wire, block_size=64)
    )
    for step in range(STEPS):
        train(sim, step, step + 1, (0, 1))
        if step >= 12 and sim.engine.in_flight is not None:
            return sim.step
    raise AssertionError("no average in flight after step 12")


@pytest.mark.parametrize(("overlap", "wire"), [("delayed", "int4"), ("eager", "int4")])
def test_resume_with_an_all_gather_in_flight_equals_the_uninterrupted_run(overlap, wire):
    cut = _cut_with_an_average_in_flight(overlap, wire)
    for result in run_gloo(_resumed_run, 2, overlap, wire, cut):
        assert result["in_flight"]
        assert all(torch.equal(p, q) for p, q in zip(result["full"], result["resumed"]))
        assert result["records"][0] == result["records"][1]
        assert result["aggregations"].get(ALL_GATHER, 0) >= 1
