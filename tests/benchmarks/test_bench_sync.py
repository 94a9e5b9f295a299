"""bench_sync.py: the layout its timings assume, and a size too small for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from throughput.bench_sync import block_layout, transformer_layout

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("numel", [sum(block_layout(64)), 6_000_000, 16 * 2**20])
def test_the_layout_holds_exactly_the_asked_elements_in_24_blocks(numel):
    layout = transformer_layout(numel)
    assert sum(layout) == numel and len(layout) == 2 + 9 * 24 + 1 and min(layout) > 0


def test_a_size_below_the_layouts_floor_is_refused_in_one_line_with_exit_2():
    done = subprocess.run(
        [sys.executable, "benchmarks/throughput/bench_sync.py", "--sizes", "1M"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "bench_sync.py: error: --sizes 1M: 1048576 elements are too few for a 24-layer layout; "
        f"give at least {sum(block_layout(64))} (e.g. 6M)"
    )
