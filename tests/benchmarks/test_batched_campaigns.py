"""The campaigns' batched workers reproduce their per-worker
loop: frontier.py's switch, the GPU dry run.

Tolerance: the batched step matches the loop within float rounding
(tests/sync/workers/test_batched_workers.py). Measured here (2 runs of frontier.py, 3 of the GPU
dry run): the validation losses identical, the final training losses (mean of the last
2 % of steps) within 4.8e-7, the sync counts equal. ``LOSS_TOL`` sits a margin above.
The break tried: every run of a batched group logged run 0's losses (6.60 against 6.39).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOSS_TOL = 1e-5  # a margin above the measured 4.8e-7
TINY = [
    "--steps",
    "20",
    "--workers",
    "2",
    "--max-docs",
    "300",
    "--vocab",
    "300",
    "--val-windows",
    "16",
    "--hidden",
    "32",
    "--layers",
    "1",
    "--heads",
    "2",
    "--quiet",
    "--no-report",
]


def summaries(out: Path) -> dict[str, dict]:
    return {
        p.parent.name: json.loads(p.read_text())
        for p in sorted(out.glob("iid/seed*/*/summary.json"))
    }


def assert_same_runs(batched: dict[str, dict], loop: dict[str, dict]) -> None:
    assert batched.keys() == loop.keys() and batched
    for name, summary in batched.items():
        assert summary["totals"]["syncs"] == loop[name]["totals"]["syncs"], name
        assert summary["val_loss"] == pytest.approx(loop[name]["val_loss"], abs=LOSS_TOL, rel=0), (
            name
        )
        assert summary["train_loss_last"] == pytest.approx(
            loop[name]["train_loss_last"], abs=LOSS_TOL, rel=0
        )
        assert summary["batched_workers"] is True and "batched_workers" not in loop[name]


def run_frontier(out: Path, cache: Path, *extra: str) -> None:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "campaigns" / "frontier.py"),
        "--out",
        str(out),
        "--cache-dir",
        str(cache),
        "--regimes",
        "iid",
        "--seeds",
        "0",
        "--h-list",
        "4",
        "--mu-list",
        "",
        "--mu-h-list",
        "",
        "--h-base",
        "2",
        *TINY,
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]


def test_frontier_batched_workers_switch_reproduces_the_loop(tmp_path: Path) -> None:
    """``--batched-workers`` gives the runs of the per-worker
    loop (an adaptive rule and a fixed H)."""
    cache = tmp_path / "cache"
    run_frontier(tmp_path / "loop", cache)
    run_frontier(tmp_path / "batched", cache, "--batched-workers")
    loop, batched = summaries(tmp_path / "loop"), summaries(tmp_path / "batched")
    assert set(loop) == {"autoloco", "diloco_mu0.7_h4"}
    assert_same_runs(batched, loop)


def run_gpu_dry(out: Path, cache: Path, *extra: str) -> dict:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "campaigns" / "gpu_frontier.py"),
        "--cpu-dry-run",
        "--grid",
        "tuned",
        "--max-runs",
        "3",
        "--out",
        str(out),
        "--cache-dir",
        str(cache),
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "plan.json").read_text())


def test_gpu_dry_run_trains_a_group_as_one_batch_and_matches_the_loop(tmp_path: Path) -> None:
    """The GPU command's code path on the CPU: 3 runs of one
    seed in one batched group, as the loop gives them."""
    cache = tmp_path / "cache"
    plan = run_gpu_dry(tmp_path / "batched", cache, "--runs-per-group", "3")
    assert plan["batched"] is True and plan["runs_per_group"] == 3
    assert plan["runs"] == ["default seed 0", "autoloco seed 0", "diloco_mu0.5_h10 seed 0"]
    assert plan["campaign_tflops"] > 0 and plan["achieved_tflops"] > 0
    loop_plan = run_gpu_dry(tmp_path / "loop", cache, "--per-worker-loop")
    assert loop_plan["batched"] is False and loop_plan["runs"] == plan["runs"]
    batched, loop = summaries(tmp_path / "batched"), summaries(tmp_path / "loop")
    assert {s["batched_runs"] for s in batched.values()} == {3}  # one group
    assert_same_runs(batched, loop)
