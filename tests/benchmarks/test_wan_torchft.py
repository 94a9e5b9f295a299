"""``benchmarks/testbeds/wan.py``'s torchft rows run end to
end on loopback: a Lighthouse and two 1-rank replica groups.

No namespaces and no root (``wan.Loopback``): the same ``run_row`` the link
benchmark calls, so the launch, the quorum, torchft's syncs, the timing and
the bytes are the ones a link run gets. Skipped without torchft.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WAN = ROOT / "benchmarks" / "testbeds" / "wan.py"
TORCHFT = importlib.util.find_spec("torchft") is not None


def _load_wan():
    spec = importlib.util.spec_from_file_location("wan_benchmark_torchft", WAN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def _args(steps: int, h_base: int) -> argparse.Namespace:
    """What ``run_row`` reads of wan.py's options: a model as small as ``--smoke``'s."""
    return argparse.Namespace(
        steps=steps,
        h_base=h_base,
        batch=4,
        seq=16,
        hidden=32,
        layers=2,
        vocab=128,
        threads=1,
        overlap_steps=1,
        nice=0,
        run_timeout=120.0,
    )


def test_torchft_rows_are_refused_in_one_line_where_they_cannot_run(monkeypatch) -> None:
    wan = _load_wan()
    row = wan.ROWS["torchft-diloco-f4-delayed"]
    assert wan.torchft_unavailable(wan.ROWS["diloco"], 10) is None
    assert "divisible by 4" in wan.torchft_unavailable(row, 10)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert wan.torchft_unavailable(row, 8) == wan.TORCHFT_MISSING
    assert "pip install torchft" in wan.TORCHFT_MISSING


# run_row launches torchrun and a Lighthouse
# (benchmarks/testbeds/wan.py: the conftest rule cannot see it)
@pytest.mark.slow
@pytest.mark.skipif(not TORCHFT, reason="torchft is not installed (pip install torchft)")
@pytest.mark.parametrize("name", ["torchft-diloco", "torchft-diloco-f4-delayed"])
def test_torchft_row_on_loopback(tmp_path, name) -> None:
    wan = _load_wan()
    # 2 rounds; 4 fragments: one every 2 steps, its all-reduce started 1 step early
    steps, h_base = 16, 8
    row = wan.ROWS[name]
    out = wan.run_row(wan.Loopback(2), row, "loopback", _args(steps, h_base), str(tmp_path))
    fragments = max(row.fragments, 1)
    assert out["steps"] == steps and out["syncs"] == steps // h_base
    assert out["sync_events"] == fragments * steps // h_base
    assert 0.0 < out["sync_share"] < 1.0
    # every sync event crossed lo: each node sends at least its fragment's FP32 bytes (lo counts
    # both nodes) the FP32 backup of the parameters, plus as many momentum bytes
    model_bytes = out["outer_state_bytes"] / 2
    assert out["tx_bytes_per_node"] >= out["syncs"] * model_bytes
    assert out["engine_bytes_per_node"] == 0 and out["method"] == "torchft"
    assert out["fragments"] == row.fragments
    assert wan.final_loss(out["losses"]) < out["losses"][0]
