"""``benchmarks/testbeds/wan.py`` keeps working: a few steps on 2 network namespaces (root only),
and its one-line refusal otherwise."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from testbeds.netns import netns_skip_reason

ROOT = Path(__file__).resolve().parents[2]
WAN = ROOT / "benchmarks" / "testbeds" / "wan.py"


def _load_wan():
    spec = importlib.util.spec_from_file_location("wan_benchmark", WAN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def _netns_unavailable() -> str | None:
    if reason := netns_skip_reason():
        return reason
    return "needs iproute2's `tc`" if shutil.which("tc") is None else None


def test_refuses_in_one_line_without_root(monkeypatch, capsys) -> None:
    wan = _load_wan()
    monkeypatch.setattr(wan.os, "geteuid", lambda: 1000)
    assert wan.main(["--smoke"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs root" in err


def test_time_to_target_uses_the_running_mean() -> None:
    wan = _load_wan()
    losses, times = [9.0, 1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    # running means: 9, 5, 3.67, 3, 2.6 (i = 4, t = 5), then 1 once the 9 leaves the window of 5
    assert wan.time_to_target(losses, times, 2.6) == 5.0
    assert wan.time_to_target(losses, times, 1.0) == 6.0
    assert wan.time_to_target(losses, times, 0.5) is None


def test_peak_rate_is_the_largest_mean_rate_over_a_window() -> None:
    wan = _load_wan()
    # one sample per time unit: idle, then 1 MB in 5 units, then idle
    samples = [(float(i), 200_000 * min(max(i - 10, 0), 5)) for i in range(40)]
    assert wan.peak_rate(samples, 10.0) == pytest.approx(1e5)  # the burst spread over the window
    assert wan.peak_rate(samples, 5.0) == pytest.approx(2e5)  # the burst's own rate
    assert wan.peak_rate([(0.0, 0), (0.05, 10)], 0.1) == 0.0  # no span as long as the window
    assert "stream-int8-f4-delayed" in wan.STREAM_ROWS and wan.ROWS["stream-f2"].fragments == 2


@pytest.mark.skipif(_netns_unavailable() is not None, reason=str(_netns_unavailable()))
def test_smoke_run_on_two_namespaces(tmp_path) -> None:
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(WAN), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())
    assert row["row"] == "diloco" and row["steps"] == 4 and row["syncs"] == 2
    # the engine's bytes crossed the link, plus TCP/IP headers, ACKs and the scalar vectors
    assert (
        row["engine_bytes_per_node"] > 0
        and 1.0 <= row["tx_bytes_per_node"] / row["engine_bytes_per_node"] < 1.5
    )
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "alh-lp-" not in names
