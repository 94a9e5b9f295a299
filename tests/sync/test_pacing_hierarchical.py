"""Budget pacing with worker groups (docs/algorithm.md#pacing-with-overlap):
2 workers x 2 ranks, each rank syncing its shard.

Real gloo processes. Worker 1's second rank is two times slower than the others,
so worker 1 runs at half of worker 0's speed (a node is as fast as its slowest
rank; the mean of its ranks would split 4:3): after the first interval the budget
splits 5:2. Both ranks of a worker must take the same steps (their gradients are
averaged every step), and the parameters and the records' per-worker tokens and
seconds must equal two simulated workers whose step averages the gradients of the
worker's two ranks' batches, bit for bit, blocking and with the delayed overlap.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _dist import run_gloo

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.algorithm.schedule import SchedulerPreview
from autoloco_hf.algorithm.token_mapper import count_non_padding_tokens
from autoloco_hf.integrations.groups import build_topology
from autoloco_hf.sync.communicators import SimulatedCommunicator, make_communicator
from autoloco_hf.sync.schedules.factory import make_engine
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

STEPS, R, WORKERS = 24, 2, 2
SECONDS_PER_STEP = [[1.0, 1.0], [1.0, 2.0]]  # [worker][rank in worker]
SCHEDULES = {"blocking": {}, "delayed": dict(overlap="delayed", overlap_steps=1)}
# unmeasured (lockstep), then floor(8 * 2/3) and floor(8 * 1/3) of the 2 * 4 inner steps; the
# delayed merge adopts the speeds one step into the second interval
SPLITS = {"blocking": [[4, 4]] + [[5, 2]] * 5, "delayed": [[4, 4], [5, 3]] + [[5, 2]] * 4}


def config(schedule: str, ranks_per_worker: int) -> AutoLoCoConfig:
    return AutoLoCoConfig(
        method="diloco",
        h_base=4,
        pacing="budget",
        ranks_per_worker=ranks_per_worker,
        **SCHEDULES[schedule],
    )


def gradients(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, float, int]:
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return flat, float(loss.detach()), int(count_non_padding_tokens(batch))


def apply(model: torch.nn.Module, flat: torch.Tensor) -> None:
    for p, g in zip(model.parameters(), torch.split(flat, [p.numel() for p in model.parameters()])):
        p.grad.copy_(g.view_as(p))


def _run_rank(topo, schedule: str) -> dict:
    cfg = config(schedule, R)
    # a worker's ranks start equal (DDP's broadcast at wrap time does this for users)
    model = make_model(seed=0)
    optimizer = adamw(model.parameters())
    scheduler = cosine(STEPS, 0)(optimizer)
    comm = make_communicator(
        cfg,
        distributed=True,
        group=topo.outer_group,
        inner_group=topo.inner_group,
        rank_in_worker=topo.rank_in_worker,
    )
    engine = make_engine(
        cfg, [model], SchedulerPreview(scheduler, STEPS), comm, STEPS, optimizers=[optimizer]
    )
    per_step = SECONDS_PER_STEP[topo.worker_index][topo.rank_in_worker]
    taken = 0
    for _ in range(STEPS):
        (due,) = engine.steps_due()
        lr = float(optimizer.param_groups[0]["lr"])
        losses, tokens = 0.0, 0
        for _ in range(due):
            grads, loss, count = gradients(model, batch_for(topo.rank, taken, padded=True))
            taken += 1
            dist.all_reduce(grads, group=topo.inner_group)  # inner DDP: average inside the worker
            apply(model, grads / R)
            optimizer.step()
            losses, tokens = losses + loss, tokens + count
        scheduler.step()
        engine.after_optimizer_step(
            [tokens], [losses], lr=lr, steps=[due], seconds=[due * per_step]
        )
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "splits": [r.worker_steps for r in engine.records],
        "tokens": [r.worker_tokens for r in engine.records],
        "seconds": [r.worker_seconds for r in engine.records],
        "taken": taken,
    }


def _worker(rank: int, world_size: int) -> dict:
    topo = build_topology(R)
    return {schedule: _run_rank(topo, schedule) for schedule in SCHEDULES}


def simulate(schedule: str) -> dict:
    """Two simulated workers; worker ``w``'s step averages
    the gradients of its ranks ``2w`` and ``2w + 1``."""
    cfg = config(schedule, 1)
    models = [make_model(seed=0) for _ in range(WORKERS)]
    optimizers = [adamw(m.parameters()) for m in models]
    schedulers = [cosine(STEPS, 0)(o) for o in optimizers]
    engine = make_engine(
        cfg,
        models,
        SchedulerPreview(schedulers[0], STEPS),
        SimulatedCommunicator(WORKERS),
        STEPS,
        optimizers=optimizers,
    )
    taken = [0] * WORKERS
    slowest = [max(ranks) for ranks in SECONDS_PER_STEP]
    for _ in range(STEPS):
        due = engine.steps_due()
        lr = float(optimizers[0].param_groups[0]["lr"])
        losses, tokens = [0.0] * WORKERS, [0] * WORKERS
        for w, (model, optimizer) in enumerate(zip(models, optimizers)):
            for _ in range(due[w]):
                both = [
                    gradients(model, batch_for(w * R + r, taken[w], padded=True)) for r in range(R)
                ]
                taken[w] += 1
                apply(model, (both[0][0] + both[1][0]) / R)
                optimizer.step()
                losses[w] += sum(b[1] for b in both)
                tokens[w] += sum(b[2] for b in both)
        for scheduler in schedulers:
            scheduler.step()
        seconds = [n * s for n, s in zip(due, slowest)]
        engine.after_optimizer_step(tokens, losses, lr=lr, steps=due, seconds=seconds)
    records = engine.records
    return {
        "models": models,
        "splits": [r.worker_steps for r in records],
        "tokens": [r.worker_tokens for r in records],
        "seconds": [r.worker_seconds for r in records],
        "taken": taken,
    }


@pytest.fixture(scope="module")
def runs():
    return run_gloo(_worker, WORKERS * R, timeout=300)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_worker_groups_split_by_their_slowest_rank_and_equal_the_simulation(
    runs, schedule: str
) -> None:
    simulated = simulate(schedule)
    splits = SPLITS[schedule]
    assert simulated["splits"] == splits
    for rank, result in enumerate(runs):
        worker = rank // R
        run = result[schedule]
        assert run["splits"] == splits, f"rank {rank}"
        assert run["taken"] == simulated["taken"][worker] == sum(s[worker] for s in splits)
        # every rank records the whole workers: tokens summed
        # over a worker's ranks, the slowest rank's seconds
        assert run["tokens"] == simulated["tokens"] and run["seconds"] == simulated["seconds"], (
            f"rank {rank}"
        )
        for p, q in zip(run["params"], simulated["models"][worker].parameters()):
            assert torch.equal(p, q), f"rank {rank} differs from simulated worker {worker}"
