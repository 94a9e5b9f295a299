"""FSDP2 workers (docs/algorithm.md#worker-groups): 2 workers x ``fully_shard`` over 2 gloo ranks ==
2 single-rank workers on the same data.

Rank ``r`` of worker ``g`` trains on half of the batch the single-rank worker ``g`` sees (FSDP
averages the two halves' gradients inside the worker), syncs only its shard with rank ``r`` of the
other worker, and sums its shard's squared norms with its worker's other rank, so ``D_t``, ``C_t``,
the horizons and the parameters match the unsharded run; each rank sends and keeps ``1/R`` of the
model. The same processes then resume from a mid-interval checkpoint, through ``AutoLoCoAccelerate``
this time, and must reproduce the uninterrupted run exactly.
"""

from __future__ import annotations

import math

import torch
from _dist import run_gloo

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.algorithm.schedule import SchedulerPreview
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

R, WORKERS = 2, 2
STEPS, WARMUP, SAVE_AT = 64, 6, 30  # SAVE_AT falls inside an interval (checked below)
RTOL, ATOL = 1e-4, 1e-6


def config(**overrides) -> AutoLoCoConfig:
    return AutoLoCoConfig(
        method="autoloco",
        controller="paper",
        h_base=4,
        q_h=2,
        h_max=8,
        ranks_per_worker=R,
        **overrides,
    )


def rank_batch(worker: int, rank_in_worker: int, step: int) -> dict:
    return batch_for(R * worker + rank_in_worker, step)


def worker_batch(worker: int, step: int) -> dict:
    """The single-rank worker's batch: its FSDP counterpart's ranks' batches, concatenated."""
    halves = [rank_batch(worker, r, step) for r in range(R)]
    return {key: torch.cat([h[key] for h in halves]) for key in halves[0]}


def _accelerate_wrapper(model, optimizer, scheduler, rank: int, world_size: int):
    """``AutoLoCoAccelerate`` around the FSDP2 model (the loop
    calls ``step``), on the group already initialized."""
    import os

    from accelerate import Accelerator

    from autoloco_hf.integrations.accelerate import AutoLoCoAccelerate

    os.environ.update(
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="1",
    )  # group exists
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == world_size
    return AutoLoCoAccelerate(
        accelerator,
        model,
        optimizer,
        scheduler,
        config(),
        total_steps=STEPS,
        warmup_steps=WARMUP,
        auto_step=False,
    )


def _sharded_run(
    save_dir: str | None,
    start: int,
    stop: int,
    resume_dir: str | None,
    accelerate: bool = False,
    **overrides,
):
    """Build an FSDP2 worker rank and its WorkerRuntime (or
    AutoLoCoAccelerate); train steps [start, stop)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from autoloco_hf.integrations.groups import build_topology, worker_mesh
    from autoloco_hf.integrations.runtime import WorkerRuntime

    topo = build_topology(R)
    model = make_model(seed=0)
    mesh = worker_mesh(R)
    for module in (model.embed, model.mlp, model.head):
        fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = adamw(model.parameters())
    scheduler = cosine(STEPS, WARMUP)(optimizer)
    wrapper = (
        _accelerate_wrapper(model, optimizer, scheduler, dist.get_rank(), dist.get_world_size())
        if accelerate
        else None
    )
    runtime = (
        wrapper.runtime
        if wrapper
        else WorkerRuntime(
            config(**overrides),
            model,
            model,
            optimizer,
            SchedulerPreview(scheduler, STEPS),
            STEPS,
            WARMUP,
            topology=topo,
        )
    )
    if resume_dir is not None:
        runtime.load(resume_dir)
        for _ in range(start):
            scheduler.step()
    saved_mid_interval = None
    for step in range(start, stop):
        model.train()
        loss = model(**rank_batch(topo.worker_index, topo.rank_in_worker, step)).loss
        loss.backward()
        lr = float(optimizer.param_groups[0]["lr"])
        optimizer.step()
        if wrapper:
            wrapper.step(loss=float(loss.detach()))
        else:
            # the toy's output is not a mapping the meter reads
            runtime.meter.add_external(loss=float(loss.detach()))
            runtime.after_optimizer_step(lr)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if save_dir is not None and runtime.step == SAVE_AT:
            interval = runtime.engine.current_interval
            saved_mid_interval = runtime.step != interval.start_step
            runtime.save(save_dir)
    full = [p.full_tensor().detach().clone() for p in model.parameters()]
    return runtime, full, saved_mid_interval


def _refusals(world_size: int) -> list[str]:
    """A model sharded over the whole world, and an HSDP (2-D) mesh, are not one worker:
    WorkerRuntime refuses both."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from autoloco_hf.algorithm.schedule import FunctionSchedule
    from autoloco_hf.integrations.groups import build_topology
    from autoloco_hf.integrations.runtime import WorkerRuntime

    topo = build_topology(R)
    messages = []
    for mesh in (
        init_device_mesh("cpu", (world_size,)),
        init_device_mesh("cpu", (WORKERS, R), mesh_dim_names=("replicate", "shard")),
    ):
        model = fully_shard(make_model(seed=0), mesh=mesh)
        try:
            WorkerRuntime(
                config(),
                model,
                model,
                adamw(model.parameters()),
                FunctionSchedule(lambda s: 1e-2, STEPS),
                STEPS,
                WARMUP,
                topology=topo,
            )
        except ValueError as err:
            messages.append(str(err))
    return messages


def _fsdp_worker(rank: int, world_size: int, checkpoint: str) -> dict:
    refusals = _refusals(world_size)
    runtime, full, mid = _sharded_run(checkpoint, 0, STEPS, None)
    engine = runtime.engine
    result = {
        "records": [r.__dict__.copy() for r in engine.records],
        "full": full,
        "outer_numel": engine.outer.numel,
        "local_numel": sum(p.numel() for p in runtime.trainable.params),
        "saved_mid_interval": mid,
        "refusals": refusals,
    }
    runtime.close()
    # the resumed run goes through AutoLoCoAccelerate (a
    # plain Accelerate loop) on the same FSDP2 layout
    resumed, resumed_full, _ = _sharded_run(None, SAVE_AT, STEPS, checkpoint, accelerate=True)
    result["resumed_full"] = resumed_full
    result["resumed_records"] = [r.__dict__.copy() for r in resumed.engine.records]
    return result


def _fsdp_fragments_worker(rank: int, world_size: int, checkpoint: str) -> dict:
    runtime, full, mid = _sharded_run(checkpoint, 0, STEPS, None, fragments=2)
    result = {
        "records": [r.__dict__.copy() for r in runtime.engine.records],
        "full": full,
        "saved_mid_round": mid,
    }
    result["pieces"] = runtime.engine.fragment_pieces
    runtime.close()
    resumed, resumed_full, _ = _sharded_run(None, SAVE_AT, STEPS, checkpoint, fragments=2)
    result["resumed_full"] = resumed_full
    result["resumed_records"] = [r.__dict__.copy() for r in resumed.engine.records]
    resumed.close()
    return result


def single_rank_reference(**overrides) -> LocalWorkers:
    """The same run with one rank per worker, each on the
    concatenation of its FSDP2 counterpart's batches."""
    reference = LocalWorkers(
        AutoLoCoConfig(
            method="autoloco", controller="paper", h_base=4, q_h=2, h_max=8, **overrides
        ),
        make_model(seed=0),
        SimulatedCommunicator(WORKERS),
        adamw,
        scheduler_factory=cosine(STEPS, WARMUP),
        total_steps=STEPS,
        warmup_steps=WARMUP,
    )
    for step in range(STEPS):
        reference.train_step([worker_batch(w, step) for w in range(WORKERS)])
    return reference


def untimed(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith("seconds")} for r in records]


def test_fsdp2_workers_equal_single_rank_workers(tmp_path):
    results = run_gloo(_fsdp_worker, R * WORKERS, str(tmp_path))

    reference = single_rank_reference()
    expected = [r.__dict__ for r in reference.engine.records]
    numel = sum(p.numel() for p in reference.models[0].parameters())

    worst = {
        key: max(
            abs(m[key] - e[key]) / abs(e[key])
            for res in results
            for m, e in zip(res["records"], expected)
        )
        for key in ("drift_energy", "coherence")
    }
    print(
        f"FSDP2 vs single-rank: {len(expected)} intervals {[r['h_step'] for r in expected]}, max "
        f"relative difference D_t {worst['drift_energy']:.1e}, C_t {worst['coherence']:.1e}; wire "
        f"bytes per rank {results[0]['records'][0]['wire_bytes']} vs "
        f"{expected[0]['wire_bytes']} unsharded"
    )
    assert len(expected) >= 4
    assert len({r["h_step"] for r in expected}) > 1, "the run should adapt its horizon"
    for rank, result in enumerate(results):
        got = result["records"]
        assert [(r["start_step"], r["h_step"]) for r in got] == [
            (r["start_step"], r["h_step"]) for r in expected
        ]
        for mine, ref in zip(got, expected):
            for key in ("drift_energy", "coherence", "mean_loss", "rho", "mu", "eta"):
                assert math.isclose(mine[key], ref[key], rel_tol=RTOL, abs_tol=ATOL), (
                    rank,
                    mine["index"],
                    key,
                )
            assert mine["tokens"] == ref["tokens"]
            # each rank sends its 1/R shard across workers: 1/R of the unsharded worker's bytes
            assert mine["wire_bytes"] * R == ref["wire_bytes"]
        # outer params + momentum: 1/R
        assert result["outer_numel"] == result["local_numel"] == numel // R
        worker = rank // R
        for p, q in zip(result["full"], reference.models[worker].parameters()):
            torch.testing.assert_close(p, q.detach(), rtol=RTOL, atol=ATOL)
        print(
            f"rank {rank}: parameters max abs difference "
            # the f-string's field cannot break across lines before Python 3.12
            f"{max(float((p - q.detach()).abs().max()) for p, q in zip(result['full'], reference.models[worker].parameters())):.1e}"  # noqa: E501
        )
        # resume from the mid-interval checkpoint reproduces the uninterrupted run exactly
        assert result["saved_mid_interval"]
        assert all(torch.equal(p, q) for p, q in zip(result["resumed_full"], result["full"]))
        assert untimed(result["resumed_records"]) == untimed(got)
        world_mesh, hsdp = result["refusals"]
        assert "sharded over ranks [0, 1, 2, 3]" in world_mesh and "worker_mesh(2" in world_mesh
        assert "2-D device mesh" in hsdp and "HSDP" in hsdp


def test_fsdp2_workers_stream_the_same_fragments_as_single_rank_workers(tmp_path):
    """fragments=2: the cut falls at the same whole tensors on both ranks of a worker, each rank
    syncs its shards of them; statistics, horizons and parameters match single-rank workers, and a
    mid-round resume reproduces the uninterrupted run exactly."""
    results = run_gloo(_fsdp_fragments_worker, R * WORKERS, str(tmp_path))
    reference = single_rank_reference(fragments=2)
    expected = [r.__dict__ for r in reference.engine.records]
    whole_tensors = [(f.first, f.last) for f in reference.engine.fragments]
    assert len(expected) >= 4 and len(whole_tensors) == 2
    for rank, result in enumerate(results):
        got = result["records"]
        assert [(r["start_step"], r["h_step"]) for r in got] == [
            (r["start_step"], r["h_step"]) for r in expected
        ]
        for mine, ref in zip(got, expected):
            for key in ("drift_energy", "coherence", "mean_loss"):
                assert math.isclose(mine[key], ref[key], rel_tol=RTOL, abs_tol=ATOL), (
                    rank,
                    mine["index"],
                    key,
                )
        worker = rank // R
        for p, q in zip(result["full"], reference.models[worker].parameters()):
            torch.testing.assert_close(p, q.detach(), rtol=RTOL, atol=ATOL)
        assert result["saved_mid_round"]
        assert all(torch.equal(p, q) for p, q in zip(result["resumed_full"], result["full"]))
        assert untimed(result["resumed_records"]) == untimed(got)
