"""Hierarchical sync of worker groups (docs/algorithm.md#worker-groups):
2 workers x 2 ranks, each rank syncing its 1/2 shard.

Real gloo processes, the same 4 ranks run today's layout (every outer group syncs
the whole model) and the hierarchical one on the same data: the controller
statistics agree within float tolerance, the horizon trajectories are identical,
the parameters agree (bit for bit on the FP32 wire with 2 workers), and each rank
holds and sends half of the outer state.
"""

from __future__ import annotations

import math
import socket

import pytest
import torch
import torch.distributed as dist
from _dist import run_gloo

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.algorithm.schedule import SchedulerPreview
from autoloco_hf.algorithm.token_mapper import count_non_padding_tokens
from autoloco_hf.integrations.groups import build_topology
from autoloco_hf.sync.communicators import (
    HierarchicalCommunicator,
    ProcessGroupCommunicator,
    make_communicator,
)
from autoloco_hf.sync.schedules.factory import make_engine
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

STEPS, WARMUP, R = 48, 6, 2
WIRES = ("fp32", "int8")
OVERLAPS = ("delayed", "eager")  # FP32 wire
# every lossy wire with error feedback: name -> (wire_dtype, topk_fraction)
LOWBIT = {
    "int4": ("int4", None),
    "fp4": ("fp4", None),
    "int2": ("int2", None),
    "int2+topk": ("int2", 0.25),
}


def _run(
    topo, wire: str, hierarchical: bool, overlap: str = "none", h_max: int = 8, **overrides
) -> dict:
    # map_tokens=False: today's layout counts only its outer
    # group's tokens, the hierarchical sync every rank's
    config = AutoLoCoConfig(
        method="autoloco",
        h_base=4,
        q_h=2,
        h_max=h_max,
        wire_dtype=wire,
        ranks_per_worker=R,
        hierarchical_sync=hierarchical,
        map_tokens=False,
        overlap=overlap,
        **{"controller": "paper", **overrides},
    )
    # a worker's ranks start equal (DDP's broadcast at wrap time does this for users)
    model = make_model(seed=0)
    optimizer = adamw(model.parameters())
    scheduler = cosine(STEPS, WARMUP)(optimizer)
    comm = ProcessGroupCommunicator(
        group=topo.outer_group, wire_dtype=wire, topk_fraction=config.topk_fraction
    )
    if hierarchical:
        comm = HierarchicalCommunicator(comm, topo.inner_group, R, topo.rank_in_worker)
    engine = make_engine(
        config,
        [model],
        SchedulerPreview(scheduler, STEPS),
        comm,
        STEPS,
        warmup_steps=WARMUP,
        optimizers=[optimizer],
    )
    params = list(model.parameters())
    for step in range(STEPS):
        batch = batch_for(topo.rank, step, padded=True)  # every rank of a worker sees its own data
        loss = model(**batch).loss
        loss.backward()
        # inner DDP: average inside the worker
        grads = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(grads, group=topo.inner_group)
        grads /= R
        for p, g in zip(params, torch.split(grads, [p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))
        lr = float(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        engine.after_optimizer_step(
            [count_non_padding_tokens(batch)], [float(loss.detach())], lr=lr
        )
    momentum = engine.outer.momentum_buffer
    return {
        "records": [
            (r.start_step, r.h_step, r.drift_energy, r.coherence, r.outer_step_applied)
            for r in engine.records
        ],
        "params": [p.detach().clone() for p in params],
        "probe_exponents": [r.probe_exponent for r in engine.records],
        "wire_bytes": engine.totals.wire_bytes,
        "outer_numel": engine.outer.numel,
        "momentum_numel": momentum.numel() if momentum is not None else 0,
        "model_numel": sum(p.numel() for p in params),
        "residual": engine.error_feedback[0].residual.clone() if engine.error_feedback else None,
    }


def _worker(rank: int, world_size: int) -> dict:
    topo = build_topology(R)
    runs = {(wire, hier): _run(topo, wire, hier) for wire in WIRES for hier in (False, True)}
    runs.update(
        {
            (overlap, hier): _run(topo, "fp32", hier, overlap)
            for overlap in OVERLAPS
            for hier in (False, True)
        }
    )
    # the descent rule's start probe: squared norms summed over the shards, then over the workers
    probe = dict(controller="descent", h_max=16, rule_options={"start_probe": 2.0})
    runs.update({("probe", hier): _run(topo, "fp32", hier, **probe) for hier in (False, True)})
    # a lossy wire with error feedback: each rank keeps the residual of its shard
    # (docs/algorithm.md#error-feedback)
    runs.update(
        {
            (name, hier): _run(topo, wire, hier, error_feedback=True, topk_fraction=topk)
            for name, (wire, topk) in LOWBIT.items()
            for hier in (False, True)
        }
    )
    return runs


@pytest.fixture(scope="module")
def runs():
    return run_gloo(_worker, 2 * R, timeout=300)


@pytest.mark.parametrize("wire", WIRES)
def test_same_horizons_and_statistics_as_the_unsharded_run(runs, wire: str) -> None:
    # INT8 blocks start at different offsets once the model is sharded
    tol = 1e-9 if wire == "fp32" else 5e-2
    for rank, result in enumerate(runs):
        flat, hier = result[wire, False]["records"], result[wire, True]["records"]
        assert len(flat) >= 8 and len({h for _, h, *_ in flat}) > 1, (
            "the run should adapt its horizon"
        )
        assert [r[:2] for r in hier] == [r[:2] for r in flat], (
            f"rank {rank}: horizon trajectories differ"
        )
        assert [r[4] for r in hier] == [r[4] for r in flat]
        for (_, _, d_flat, c_flat, _), (_, _, d_hier, c_hier, _) in zip(flat, hier):
            assert math.isclose(d_hier, d_flat, rel_tol=1e-12 if wire == "fp32" else 1e-2), (
                rank,
                d_hier,
                d_flat,
            )
            assert math.isclose(c_hier, c_flat, rel_tol=tol, abs_tol=tol), (rank, c_hier, c_flat)
        assert hier == runs[0][wire, True]["records"], "every rank runs the same intervals"


@pytest.mark.parametrize("wire", WIRES)
def test_parameters_agree_and_worker_ranks_stay_identical(runs, wire: str) -> None:
    for rank, result in enumerate(runs):
        for p_flat, p_hier in zip(result[wire, False]["params"], result[wire, True]["params"]):
            # the outer all-reduce of 2 workers and the outer step are elementwise
            if wire == "fp32":
                assert torch.equal(p_hier, p_flat), rank
            else:
                assert torch.allclose(p_hier, p_flat, rtol=0, atol=2e-2), (
                    rank,
                    (p_hier - p_flat).abs().max(),
                )
        partner = runs[rank ^ 1][wire, True]["params"]  # the other rank of the same worker
        assert all(torch.equal(a, b) for a, b in zip(result[wire, True]["params"], partner))


@pytest.mark.parametrize("wire", WIRES)
def test_each_rank_holds_and_sends_half(runs, wire: str) -> None:
    for result in runs:
        flat, hier = result[wire, False], result[wire, True]
        numel = flat["model_numel"]
        assert flat["outer_numel"] == flat["momentum_numel"] == numel
        assert hier["outer_numel"] == hier["momentum_numel"] == numel // R  # numel is even here
        ratio = hier["wire_bytes"] / flat["wire_bytes"]
        # FP32: exactly half; INT8: half the codes, plus a block scale where a shard cuts a tensor
        assert ratio == 0.5 if wire == "fp32" else 0.5 <= ratio < 0.52, ratio


@pytest.mark.parametrize("overlap", OVERLAPS)
def test_overlapped_sync_of_shards_equals_the_unsharded_overlapped_run(runs, overlap: str) -> None:
    """The shard's in-flight average, merge (delayed) and eager start point, gathered in the worker
    (docs/algorithm.md#overlap-on-the-wire)."""
    for rank, result in enumerate(runs):
        flat, hier = result[overlap, False], result[overlap, True]
        assert len(hier["records"]) >= 8 and hier["records"] != result["fp32", True]["records"], (
            "overlap should act"
        )
        assert [r[:2] for r in hier["records"]] == [r[:2] for r in flat["records"]], rank
        for (_, _, d_flat, c_flat, _), (_, _, d_hier, c_hier, _) in zip(
            flat["records"], hier["records"]
        ):
            assert math.isclose(d_hier, d_flat, rel_tol=1e-12) and math.isclose(
                c_hier, c_flat, abs_tol=1e-9
            )
        assert all(torch.equal(a, b) for a, b in zip(hier["params"], flat["params"])), rank
        assert hier["outer_numel"] == flat["outer_numel"] // R
        partner = runs[rank ^ 1][overlap, True]["params"]
        assert all(torch.equal(a, b) for a, b in zip(hier["params"], partner))


def test_the_start_probe_of_a_sharded_worker_cuts_where_the_unsharded_one_does(runs) -> None:
    for rank_runs in runs:
        flat, sharded = (
            rank_runs[("probe", False)]["records"],
            rank_runs[("probe", True)]["records"],
        )
        assert flat[0][:2] == (0, 8)  # h_max 16, cut at 2 h_ref
        exponents = rank_runs[("probe", True)]["probe_exponents"]
        assert exponents[0] == pytest.approx(
            rank_runs[("probe", False)]["probe_exponents"][0], rel=1e-9
        )
        assert [r[:2] for r in sharded] == [r[:2] for r in flat]
        for a, b in zip(sharded, flat):
            assert a[2] == pytest.approx(b[2], rel=1e-5) and a[3] == pytest.approx(b[3], rel=1e-5)


@pytest.mark.parametrize("lossy", LOWBIT)
def test_error_feedback_residual_is_the_ranks_shard_and_worker_ranks_stay_identical(
    runs, lossy: str
) -> None:
    for rank, result in enumerate(runs):
        flat, hier = result[lossy, False], result[lossy, True]
        assert flat["residual"].numel() == flat["model_numel"]
        assert hier["residual"].numel() == hier["outer_numel"] == flat["model_numel"] // R
        assert hier["residual"].abs().max() > 0 and torch.isfinite(hier["residual"]).all()
        partner = runs[rank ^ 1][lossy, True]  # the other rank of the same worker: the other shard
        assert all(torch.equal(a, b) for a, b in zip(hier["params"], partner["params"]))
        assert not torch.equal(hier["residual"], partner["residual"])
        assert all(applied for *_, applied in hier["records"])
        assert hier["wire_bytes"] < 0.6 * flat["wire_bytes"]  # each rank sends its shard's part


def _labels(rank: int, world_size: int) -> dict:
    topo = build_topology(R)
    made = {}
    for hierarchical in (False, True):
        config = AutoLoCoConfig(method="diloco", ranks_per_worker=R, hierarchical_sync=hierarchical)
        comm = make_communicator(
            config,
            True,
            group=topo.outer_group,
            inner_group=topo.inner_group,
            rank_in_worker=topo.rank_in_worker,
        )
        made[hierarchical] = comm.worker_labels()
    return made


def test_a_worker_of_several_ranks_is_named_by_its_first_rank_on_every_rank() -> None:
    """Rank 1 syncs with rank 3 (outer group {1, 3}) and still names the workers by ranks 0 and 2
    (docs/algorithm.md#stragglers)."""
    host = socket.gethostname()
    expected = [f"worker 0 (rank 0, host {host})", f"worker 1 (rank 2, host {host})"]
    assert run_gloo(_labels, 2 * R, timeout=120) == [{False: expected, True: expected}] * (2 * R)
