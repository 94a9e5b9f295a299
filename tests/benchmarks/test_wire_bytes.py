"""benchmarks/campaigns/wire_bytes.py: the committed bytes-per-sync data is what the package counts
today, and docs/benchmarks.md shows the table generated from it."""

from __future__ import annotations

import json

from test_frontier import ROOT, load


def test_committed_wire_bytes_equal_the_accounting_and_the_docs_table() -> None:
    wire_bytes = load("wire_bytes")
    committed = json.loads(wire_bytes.RESULT.read_text())
    assert committed == wire_bytes.measure()
    assert wire_bytes.table(committed) in (ROOT / "docs" / "benchmarks.md").read_text()


def test_all_gather_limit_is_where_it_stops_beating_the_fp32_ring() -> None:
    wire_bytes = load("wire_bytes")
    numel = 1000
    for whole in (4000, 2000, 1001, 500, 46):
        limit = wire_bytes.all_gather_limit(whole, numel)
        for n in range(2, 400):
            assert ((n - 1) * whole < 2 * (n - 1) * 4 * numel / n) == (n <= limit), (whole, n)
