"""docs/reliability.md's live-membership table is what
benchmarks/testbeds/live_testbed.py reports from the committed runs."""

from __future__ import annotations

import json
from pathlib import Path

from testbeds.live_testbed import DEFAULT_OUT, STEPS, report

ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_table_is_the_report_of_the_committed_runs() -> None:
    runs = json.loads(DEFAULT_OUT.read_text())["runs"]
    table = report(runs).split("\n\n")[0]
    assert table in (ROOT / "docs" / "reliability.md").read_text()
    assert {r["scenario"] for r in runs} >= {
        "node_lost",
        "node_back",
        "partition",
        "two_lost",
        "store_member_lost",
    }
    for run in runs:
        for worker in run["seen"].values():
            assert worker["steps"][-1] == STEPS - 1, (run["scenario"], run["seed"], worker["name"])
