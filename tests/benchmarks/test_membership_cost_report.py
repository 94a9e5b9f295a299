"""docs/reliability.md's table of what a change of membership
costs is what benchmarks/campaigns/membership_cost.py reports from
the committed losses, and the exact resume in it costs nothing."""

from __future__ import annotations

import json
from pathlib import Path

from campaigns.membership_cost import DEFAULT_OUT, report

ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_table_is_the_report_of_the_committed_losses() -> None:
    result = json.loads((ROOT / DEFAULT_OUT).read_text())
    assert report(result) in (ROOT / "docs" / "reliability.md").read_text()
    assert len(result["losses"]) >= 5  # seeds
    # the redo from the boundary with each worker's own AdamW state: bit-exact
    for losses in result["losses"]:
        assert losses["4_to_4_exact"] == losses["uninterrupted_4"]
