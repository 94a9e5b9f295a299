"""The torchrun helper of the multi-process tests: a launch
that times out leaves no worker behind."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from launch import _run_local


def test_a_timed_out_launch_stops_its_workers(tmp_path):
    """A hung test must not leave its workers spinning: they
    would slow, and time out, every test after it."""
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "spin.py"
    script.write_text(
        f"import os, time\n"
        f"open(os.path.join({str(pids)!r}, str(os.getpid())), 'w').close()\n"
        "while True:\n"
        "    time.sleep(0.05)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        _run_local(str(script), {"output_dir": str(tmp_path)}, nproc=2, timeout=15)
    workers = [int(name) for name in os.listdir(pids)]
    assert len(workers) == 2, "both workers started before the timeout"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in workers):
        time.sleep(0.2)
    assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")], (
        "a worker outlived its launch"
    )
