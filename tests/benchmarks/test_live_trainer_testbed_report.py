"""docs/reliability.md's table of the Trainer on live membership is what
benchmarks/testbeds/live_trainer_testbed.py reports from the committed runs."""

from __future__ import annotations

import json
from pathlib import Path

from testbeds.live_trainer_testbed import DEFAULT_OUT, STEPS, report

ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_table_is_the_report_of_the_committed_runs() -> None:
    runs = json.loads(DEFAULT_OUT.read_text())
    assert report(runs) in (ROOT / "docs" / "reliability.md").read_text()
    assert {(r["scenario"], r["seed"]) for r in runs} >= {
        (s, seed) for s in ("fault_free", "lost_and_joined") for seed in (0, 1, 2)
    }
    for run in runs:
        for process in run["seen"].values():
            assert process["global_step"] == STEPS and process["steps"][-1] == STEPS, (
                run["scenario"],
                run["seed"],
            )
