"""benchmarks/testbeds/link_floor.py: the 2 % link speed of a
wire from its measured bytes, step time and fixed cost."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location(
        "link_floor", ROOT / "benchmarks" / "testbeds" / "link_floor.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def row(rate: str, steady_share: float, fragments: int = 1) -> dict:
    # 4 intervals of H = 10 steps of 0.1 s, F events each, 1 MB per event
    return {
        "row": f"wire-x-f{fragments}-delayed",
        "rate": rate,
        "fragments": fragments,
        "sync_events": 4 * fragments,
        "step_seconds": 0.1,
        "train_seconds": 4.0,
        "steady_share": steady_share,
        "tx_bytes_per_event": 1e6,
    }


def test_the_model_hides_the_transfer_behind_the_delay_and_solves_for_two_percent():
    link_floor = load()
    # c: 0.01 s per steady event (3 of the 4 events) = 0.03 s of 4 s
    x = link_floor.floors(row("unlimited", 0.0075), row("100mbit", 0.06), h=10, tau=3, step=None)
    assert x["c"] == pytest.approx(0.01) and x["tau"] == 3
    # 8 Mbit at 100 Mbit/s = 0.08 s, hidden behind 3 steps of
    # 0.1 s: only c blocks, 0.01 s per 1 s interval
    assert x["predicted"] == pytest.approx(0.01)
    # 2 % of 1 s = 0.02 s: B = 8e6 / (0.3 + 0.02 - 0.01); no
    # overlap: 8e6 / 0.01; busy link: 8e6 / 1 s
    assert x["b2"] == pytest.approx(8e6 / 0.31) and x["blocking"] == pytest.approx(8e6 / 0.01)
    assert x["physical"] == pytest.approx(8e6)


def test_fragments_shorten_the_delay_and_a_fixed_cost_above_the_budget_never_reaches_two_percent():
    link_floor = load()
    x = link_floor.floors(row("unlimited", 0.0, 4), row("100mbit", 0.0, 4), h=10, tau=3, step=None)
    assert x["tau"] == 1  # min(3, 10 // 4 - 1)
    slow = link_floor.floors(row("unlimited", 0.1), row("100mbit", 0.2), h=10, tau=3, step=0.01)
    assert slow["b2"] == float("inf") and link_floor.mbit(slow["b2"]) == "never"
