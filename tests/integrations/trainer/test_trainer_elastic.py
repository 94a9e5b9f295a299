"""Trainer + AutoLoCoCallback in real processes: a run killed with N workers goes on from its last
boundary with N' (docs/algorithm.md#boundary-snapshots).

The first launch (``snapshot_dir`` set) loses a rank inside an interval; a second launch with
another number of processes calls ``callback.resume_point()``. Right after the resume every rank
holds what the library-level resume (``IntervalEngine.resume_at_boundary`` on N' simulated workers)
gives: the same outer state, policy, planned interval, totals and records; the model is ``theta_t``
and AdamW starts fresh; from there on the learning rates and batches are those of an uninterrupted
N'-process run at the same steps (the Trainer's own scheduler and ``skip_first_batches``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from launch import forked_ranks, torchrun_failing
from toy import TIMING_FIELDS
from transformers import get_cosine_schedule_with_warmup

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.snapshot import latest_snapshot, snapshot_paths, step_of
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.llama import tiny_llama
from autoloco_hf.toy.padded import LLAMA

pytestmark = pytest.mark.slow

STEPS, WARMUP, LR, KILL = 24, 2, 3e-3, 10
AUTOLOCO = {"method": "autoloco", "h_base": 4, "q_h": 1, "h_max": 6}


def spec(out: Path, **extra) -> dict:
    return {
        "output_dir": str(out),
        "steps": STEPS,
        "warmup": WARMUP,
        "lr": LR,
        "max_grad_norm": 0.0,
        "autoloco": {**AUTOLOCO, "snapshot_dir": str(out / "snapshots")},
        **extra,
    }


def library_resume(snapshot, workers: int) -> dict:
    """The library-level resume of ``snapshot`` on ``workers``
    simulated workers, over the Trainer's LR schedule."""
    runner = LocalWorkers(
        AutoLoCoConfig(**AUTOLOCO),
        tiny_llama(**LLAMA, seed=0),
        SimulatedCommunicator(workers),
        lambda params: torch.optim.AdamW(params, lr=LR),
        scheduler_factory=lambda optimizer: get_cosine_schedule_with_warmup(
            optimizer, WARMUP, STEPS
        ),
        total_steps=STEPS,
        warmup_steps=WARMUP,
    )
    # the LR schedule is the Trainer's business here
    runner.engine.resume_at_boundary(snapshot.engine_state)
    return runner.engine.boundary_state()


def assert_same(a, b, where: str = "boundary_state") -> None:
    if torch.is_tensor(a):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def kill_and_resume(out: Path, before: int, after: int) -> tuple[object, list[dict]]:
    """``before`` processes, rank ``before - 1`` killed after
    step KILL; then ``after`` processes resume."""
    torchrun_failing(
        "trainer_worker.py", spec(out, kill={"rank": before - 1, "step": KILL}), nproc=before
    )
    snapshot = latest_snapshot(str(out / "snapshots"), AutoLoCoConfig(**AUTOLOCO))
    # the killed rank is the last one, which writes the second copy: whether its copy of this
    # boundary was finished when it died is a race, so only the main process's snapshot is relied on
    # (the copy is tested in tests/sync/test_snapshot.py)
    assert snapshot.workers == before and 0 < snapshot.step <= KILL
    return snapshot, forked_ranks(
        "trainer_worker.py", spec(out, resume_point=True, record_batches=True), nproc=after
    )


def check_resumed(snapshot, results: list[dict], workers: int) -> None:
    expected = library_resume(snapshot, workers)
    theta = snapshot.engine_state["outer"]["params"]
    for rank, result in enumerate(results):
        begin = result["begin"]
        assert begin["step"] == snapshot.step and begin["optimizer_state"] == 0, f"rank {rank}"
        assert torch.equal(torch.cat([p.reshape(-1) for p in begin["params"]]), theta), (
            f"rank {rank}: not theta_t"
        )
        assert_same(begin["boundary_state"], expected, f"rank {rank} boundary_state")
        assert result["global_step"] == STEPS and result["totals"]["syncs"] > len(
            snapshot.engine_state["records"]
        )
    [line] = [x for x in results[0]["log_lines"] if "resumed step" in x]
    assert f"resumed step {snapshot.step} from the boundary snapshot" in line
    assert f"({snapshot.workers} workers, now {workers})" in line
    decisions = [
        [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in x["records"]]
        for x in results
    ]
    assert all(d == decisions[0] for d in decisions)  # every worker took the same decisions
    # two launches wrote into one folder: only the last two
    # boundaries stay, whoever wrote them, no temporary file
    folder = os.path.dirname(snapshot.path)
    last_two = [r["start_step"] + r["h_step"] for r in results[0]["records"]][-2:]
    assert sorted({step_of(p) for p in snapshot_paths(folder)}) == last_two
    assert not [name for name in os.listdir(folder) if ".tmp-" in name]


def test_three_workers_lose_one_and_two_go_on_from_the_last_boundary(tmp_path):
    snapshot, resumed = kill_and_resume(tmp_path / "elastic", 3, 2)
    check_resumed(snapshot, resumed, 2)
    full = forked_ranks("trainer_worker.py", spec(tmp_path / "full", record_batches=True), nproc=2)
    step = snapshot.step
    for rank in range(2):
        assert resumed[rank]["lrs"] == full[rank]["lrs"][step:], (
            f"rank {rank}: the LR scheduler at the boundary"
        )
        done, skipped = resumed[rank]["batches"], full[rank]["batches"][step:]
        assert len(done) == len(skipped) == STEPS - step, f"rank {rank}"
        # the data position: the boundary step's, in this launch's sharding
        for a, b in zip(done, skipped):
            assert all(torch.equal(a[k], b[k]) for k in a), f"rank {rank}: another batch"


def test_two_workers_grow_to_three_from_the_last_boundary(tmp_path):
    snapshot, resumed = kill_and_resume(tmp_path / "elastic", 2, 3)
    check_resumed(snapshot, resumed, 3)
