"""benchmarks/throughput/suite_cpu.py: every Python process of a pytest run is seen, with the test
that started it, and the report adds them up by program."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "throughput" / "suite_cpu.py"

# a test that starts a child process, forks one and starts a forkserver child (which exit in the
# three ways the suite's processes do: at the end, by os._exit, and the forkserver's own way)
MEASURED = """
import multiprocessing
import os
import subprocess
import sys


def burn():
    sum(range(3_000_000))


def test_starts_processes():
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
    pid = os.fork()
    if pid == 0:
        burn()
        os._exit(0)
    os.waitpid(pid, 0)
    child = multiprocessing.get_context("forkserver").Process(target=burn)
    child.start()
    child.join()
    assert child.exitcode == 0
"""


def test_every_process_is_logged_with_its_test_and_the_report_adds_them_up(tmp_path):
    suite_cpu = importlib.import_module("throughput.suite_cpu")
    (tmp_path / "test_measured.py").write_text(textwrap.dedent(MEASURED))
    out = tmp_path / "cpu.jsonl"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--", "-q", "-p", "no:cacheprovider",
         str(tmp_path / "test_measured.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    head, *procs = [json.loads(line) for line in out.read_text().splitlines()]
    assert head["run"]["returncode"] == 0 and head["run"]["wall_s"] > 0
    test = "test_measured.py::test_starts_processes"
    started = [p for p in procs if p["argv"][1:3] == ["-c", "sum(range(3_000_000))"]]
    assert len(started) == 1 and started[0]["test"].startswith(test)
    assert started[0]["cpu_s"] > 0.01
    programs = [suite_cpu.program(p["argv"]) for p in procs]
    assert programs.count("-m pytest") == 2  # pytest, and the child it forked (os._exit)
    assert "-c (multiprocessing forkserver and its children)" in programs
    assert all(p["cpu_s"] >= 0 for p in procs)
    text = suite_cpu.report(out, top=10)
    assert f"the {len(procs)} processes seen" in text
    assert "| -m pytest | 2 |" in text


def test_the_program_of_a_command_line():
    suite_cpu = importlib.import_module("throughput.suite_cpu")
    assert suite_cpu.program(["python", "-u", "benchmarks/x.py", "--a"]) == "x.py"
    assert suite_cpu.program(["python", "-m", "torch.distributed.run", "w.py"]) == (
        "-m torch.distributed.run"
    )
    assert suite_cpu.program(["python", "-c", "import sys;exec(eval(sys.stdin.readline()))"]) == (
        "-c (pytest-xdist worker, or a child it forked)"
    )
    assert suite_cpu.program(["python"]) == "python"
