"""benchmarks/testbeds/gpu_check.py: its CPU dry run stays
green, and a failing check makes it exit non-zero."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "testbeds", "gpu_check.py")
CHECKS = [
    "environment",
    "codec_bit_identity",
    "codec_throughput",
    "simulated_workers",
    "trainer_callback",
    "sft_recipe",
    "outer_state",
    "fsdp2_workers",
    "trainer_fsdp2",
]


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_cpu_dry_run(tmp_path):
    """Every step runs on CPU (the CI guard against rot);
    only CUDA-only parts are skipped, with a reason."""
    out = tmp_path / "report.json"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, SCRIPT, "--cpu-dry-run", "--out", str(out)],
        check=False,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert (
        list(checks) == CHECKS
        and report["mode"] == "cpu-dry-run"
        and report["passed"]
        and report["failed"] == []
    )
    assert {n for n, c in checks.items() if c["status"] == "skip"} == {"trainer_fsdp2"}
    assert "callback refused the sharded model" in checks["trainer_fsdp2"]["summary"]
    assert "DDP reference trained" in checks["trainer_fsdp2"]["summary"]
    fsdp = checks["fsdp2_workers"]["details"]["1x2"]  # the sharding over gloo: 1 worker x 2 ranks
    assert fsdp["intervals"] >= 4 and max(fsdp["worst"].values()) < 1e-4
    assert "peak memory: CUDA only" in checks["outer_state"]["summary"]
    identity = checks["codec_bit_identity"]["details"]
    means = {f"{kind}_mean_n{n}" for kind in ("owner", "gathered") for n in (3, 4)}
    # every blockwise wire, the 4- and 2-bit ones included
    for wire in ("int8", "int4", "fp4", "int2"):
        assert set(identity[wire]) == {"wire0", "wire1", "decoded"} | means
    assert all(
        v == 0 for wire in ("bf16", "int8", "int4", "fp4", "int2") for v in identity[wire].values()
    )
    simulated = checks["simulated_workers"]["details"]
    for name in ("diloco_fp32", "autoloco_fp32", "autoloco_int8"):
        assert simulated[name]["same_trajectory"] and simulated[name]["syncs"] >= 2
    assert checks["trainer_callback"]["details"]["records_written"]
    assert (
        checks["sft_recipe"]["details"]["wire_dtype"] == "int8"
        and checks["sft_recipe"]["details"]["syncs"] >= 2
    )
    assert "check" in done.stdout and "status" in done.stdout  # the table


def test_a_failing_check_fails_the_run(tmp_path, monkeypatch):
    gpu_check = load_script()

    def broken(ctx):
        raise RuntimeError("planted failure")

    # main() sets it in dry runs; monkeypatch restores it
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(
        gpu_check, "CHECKS", [("environment", gpu_check.check_environment), ("broken", broken)]
    )
    threads = torch.get_num_threads()
    try:
        assert gpu_check.main(["--cpu-dry-run", "--out", str(tmp_path / "r.json")]) == 1
    finally:
        torch.set_num_threads(threads)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["failed"] == ["broken"] and not report["passed"]
    assert report["checks"][1]["summary"] == "RuntimeError: planted failure"
    assert "planted failure" in report["checks"][1]["details"]["traceback"]


def test_unknown_check_is_a_usage_error():
    gpu_check = load_script()
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.parse_args(["--only", "environment,nope"])
    assert exit_info.value.code == 2


def test_bit_mismatches_sees_one_ulp():
    """The bit-identity check compares bit patterns: one ulp counts, and identical NaNs do not."""
    gpu_check = load_script()
    a = torch.tensor([1.0, math.nan, -0.0, 3.0])
    b = a.clone()
    assert gpu_check.bit_mismatches(a, b) == 0
    b[3] = torch.nextafter(b[3], torch.tensor(4.0))
    assert gpu_check.bit_mismatches(a, b) == 1
    assert gpu_check.bit_mismatches(a, torch.tensor([1.0, math.nan, 0.0, 3.0])) == 1  # -0.0 vs 0.0
    assert gpu_check.bit_mismatches(a.bfloat16(), a) == -1


def test_fsdp_layouts_follow_the_gpus():
    """One rank per GPU: 4+ GPUs shard 2 workers x 2; 2-3 run each
    half of that; one GPU runs the Trainer's plugin alone."""
    gpu_check = load_script()
    assert gpu_check.fsdp_layouts(8) == gpu_check.fsdp_layouts(4) == [(2, 2)]
    assert gpu_check.fsdp_layouts(3) == gpu_check.fsdp_layouts(2) == [(1, 2), (2, 1)]
    assert gpu_check.fsdp_layouts(1) == gpu_check.fsdp_layouts(0) == []
    assert gpu_check.trainer_layouts(1) == [(1, 1)] and gpu_check.trainer_layouts(2) == [
        (1, 2),
        (2, 1),
    ]
