"""benchmarks/campaigns/wire_loss_report.py: the committed report
regenerates from the committed runs; one-sided targets."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "results" / "wire_loss"


def load():
    spec = importlib.util.spec_from_file_location(
        "wire_loss_report", ROOT / "benchmarks" / "campaigns" / "wire_loss_report.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_run(out: Path, seed: int, wire: str, val: float) -> None:
    folder = out / "iid" / f"seed{seed}" / f"diloco__{wire}"
    folder.mkdir(parents=True)
    summary = {"val_loss": val, "workers": 2, "totals": {"wire_bytes": 8000, "syncs": 2}}
    (folder / "summary.json").write_text(json.dumps(summary))


def test_the_committed_report_is_regenerated_from_the_committed_runs():
    assert load().report(COMMITTED, "results/wire_loss") == (COMMITTED / "report.md").read_text()


def test_targets_are_one_sided_and_paired_by_seed(tmp_path):
    fp32 = [4.0, 4.2, 4.1, 4.3, 3.9]  # s.e. of the FP32 runs: 0.0707
    for seed, val in enumerate(fp32):
        write_run(tmp_path, seed, "fp32", val)
        write_run(tmp_path, seed, "int4_ef", val + 0.05)  # above FP32, inside its s.e.
        write_run(tmp_path, seed, "int2_ef", val - 0.3)  # far below: nothing lost
        write_run(tmp_path, seed, "fp4_ef", val + 0.1 + 0.01 * seed)  # above by more than the s.e.
    rows = {
        line.split(" | ")[2]: line
        for line in load().report(tmp_path).splitlines()
        if line.startswith("| iid")
    }
    assert (
        "| +0.0500 ± 0.0000 | 0.0707 | 2.0 | at most 1 FP32 s.e. above | met |" in rows["int4_ef"]
    )
    assert "| -0.3000 ± 0.0000 |" in rows["int2_ef"] and rows["int2_ef"].endswith("| met |")
    assert rows["fp4_ef"].endswith("| missed |")
    assert "| 0,1,2,3,4 | 4.1000 ± 0.0707 | - |" in rows["fp32"]
