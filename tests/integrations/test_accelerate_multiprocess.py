"""AutoLoCoAccelerate around a plain Accelerate loop, 2 processes (torchrun, gloo, CPU)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from launch import torchrun

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerate")
    return torchrun("accelerate_worker.py", {"output_dir": str(out)}, nproc=2), out


@pytest.mark.parametrize("mode,steps", [("auto", 9), ("manual", 6)])
def test_accelerate_loop_intervals_and_traffic(results, mode, steps):
    runs, out = results
    r0, r1 = runs[0][mode], runs[1][mode]
    assert len(r0["fingerprints"]) == steps
    sync_at = [i + 1 for i, s in enumerate(r0["synced"]) if s]
    assert sync_at == list(range(3, steps + 1, 3)), "h_base=3 counted in true optimizer steps"
    for step, (a, b, synced) in enumerate(
        zip(r0["fingerprints"], r1["fingerprints"], r0["synced"]), start=1
    ):
        if synced:
            assert a == b
        elif step > 1:  # step 1 runs at learning rate 0 (warm-up)
            assert a != b
    for p0, p1 in zip(r0["params"], r1["params"]):
        assert torch.equal(p0, p1)
    # the LR of each step is the one the optimizer used,
    # whether the loop steps the scheduler before step() or not
    assert r0["lr_mass_warnings"] == r1["lr_mass_warnings"] == []
    for r in (r0, r1):
        big = [c for c in r["collectives"] if c[1] >= r["model_bytes"] // 2]
        # the engine's initial broadcast of theta_0, then one all-reduce per sync
        assert [c[0] for c in big] == ["broadcast"] + ["all_reduce"] * r["totals"]["syncs"]
        assert r["hook"]["group_bytes"] == 0 and r["hook"]["buckets"] == steps
    with open(os.path.join(out, mode, "autoloco_intervals.jsonl")) as f:
        assert len([json.loads(line) for line in f if line.strip()]) == steps // 3


def test_budget_pacing_each_rank_takes_its_share(results):
    """``pacing="budget"`` with rank 1 at half speed:
    ``autoloco.batches`` loops each rank to the run's end."""
    runs, _ = results
    r0, r1 = runs[0]["budget"], runs[1]["budget"]
    steps = [r["worker_steps"] for r in r0["records"]]
    # the first interval in lockstep; then floor(6 * 2/3) = 4
    # and floor(6 * 1/3) = 2 of the 6 inner steps
    assert steps == [[3, 3], [4, 2], [4, 2]]
    assert (len(r0["fingerprints"]), len(r1["fingerprints"])) == (11, 7)
    assert r0["finished_at"] == r1["finished_at"] == 9
    for p0, p1 in zip(r0["params"], r1["params"]):
        assert torch.equal(p0, p1)
    # every step runs at the learning rate of the run's step it belongs to (the pacer's split within
    # the interval), as the engine's simulated workers do, not at the rank's own step count
    from transformers import get_linear_schedule_with_warmup

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=3e-3)
    # accelerate: 2 steps per step
    factor = get_linear_schedule_with_warmup(optimizer, 1, 9 * 2).lr_lambdas[0]

    def lr(step):
        return 3e-3 * factor(2 * step)

    assert r0["lrs"] == [lr(s) for s in (0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 8)]
    assert r1["lrs"] == [lr(s) for s in (0, 1, 2, 4, 5, 7, 8)]
