"""Where the test suite's CPU goes: every Python process a pytest run starts, with its CPU seconds.

    python benchmarks/throughput/suite_cpu.py --out results/suite_cpu/slow.jsonl \\
        -- -q -n 2 --dist loadscope -m slow
    python benchmarks/throughput/suite_cpu.py --report results/suite_cpu/slow.jsonl

The first command runs pytest with the arguments after ``--``, with a ``sitecustomize.py`` on
``PYTHONPATH`` (a temporary folder) that every Python process of the run imports as it starts. At
its exit (``atexit``, or ``os._exit``, which the tests' helper processes use) each process appends
one JSON line: its pid and parent, its command line (``sys.orig_argv``), the test that was running
when it started (``PYTEST_CURRENT_TEST``, inherited from the pytest worker), and its CPU seconds
(user + system, ``getrusage``). A child forked without exec (``multiprocessing``'s fork and
forkserver children) writes its own line. The first line is the run's: wall seconds, and the CPU of
pytest and of every process it waited for. A process started with a ``PYTHONPATH`` that leaves the
folder out is not seen, and a forkserver's children carry the environment of the moment the
forkserver started, so the report does not name their test. The lines may add up to more CPU than
pytest waited for: a forkserver is stopped, not waited for.

The second prints the CPU by program (the script or module a process ran) and by test.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

# written as sitecustomize.py: runs at the start of every Python process of the measured run
HOOK = """
import atexit, json, os, resource, sys, time

_LOG, _start, _written = os.environ["SUITE_CPU_LOG"], time.time(), [False]
_real_exit, _real_fork = os._exit, os.fork


def _write():
    if _written[0]:
        return
    _written[0] = True
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "argv": [a[:200] for a in getattr(sys, "orig_argv", sys.argv)[:8]],
        "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "wall_s": round(time.time() - _start, 3),
    }
    with open(_LOG, "a") as f:
        f.write(json.dumps(line) + "\\n")


def _exit(code):
    try:
        _write()
    finally:
        _real_exit(code)


def _fork():
    global _start
    pid = _real_fork()
    if pid == 0:  # the child counts its own CPU from here (getrusage starts at zero)
        _written[0], _start = False, time.time()
    return pid


os._exit, os.fork = _exit, _fork
atexit.register(_write)
"""


def run(out: Path, pytest_args: Sequence[str]) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="suite_cpu_") as hook_dir:
        (Path(hook_dir) / "sitecustomize.py").write_text(HOOK)
        log = Path(hook_dir) / "processes.jsonl"
        env = {
            **os.environ,
            "SUITE_CPU_LOG": str(log),
            "PYTHONPATH": os.pathsep.join(filter(None, [hook_dir, os.environ.get("PYTHONPATH")])),
        }
        start = time.time()
        done = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], env=env)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        head = {
            "run": {
                "pytest_args": list(pytest_args),
                "returncode": done.returncode,
                "wall_s": round(time.time() - start, 1),
                "reaped_cpu_s": round(children.ru_utime + children.ru_stime, 1),
                "cpus": os.cpu_count(),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)),
            }
        }
        lines = log.read_text().splitlines() if log.exists() else []
    out.write_text("".join(json.dumps(x) + "\n" for x in [head, *map(json.loads, lines)]))
    return done.returncode


FORKSERVER = "-c (multiprocessing forkserver and its children)"
# its children inherit the environment the forkserver started with, not the test that asked for them
FORKSERVER_TEST = "- (a forkserver or its child: the test is not known)"


def program(argv: list[str]) -> str:
    """What a process ran: its script's file name, ``-m module``, or ``-c`` (an inline program:
    pytest-xdist's workers, the multiprocessing forkserver and the children it forks)."""
    args = argv[1:]
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
        args = args[1:]  # interpreter options (-u, -X ...)
    if not args:
        return "python"
    if args[0] == "-m":
        return f"-m {args[1]}" if len(args) > 1 else "-m"
    if args[0] == "-c":
        code = args[1] if len(args) > 1 else ""
        for marker, name in (
            ("forkserver", FORKSERVER),
            ("spawn_main", "-c (multiprocessing spawn child)"),
            ("sys.stdin", "-c (pytest-xdist worker, or a child it forked)"),
        ):
            if marker in code:
                return name
        return "-c"
    return Path(args[0]).name


def report(path: Path, top: int) -> str:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    head, procs = lines[0]["run"], lines[1:]
    total = sum(p["cpu_s"] for p in procs)
    by_program: dict[str, list[float]] = collections.defaultdict(list)
    by_test: dict[str, list[float]] = collections.defaultdict(list)
    for p in procs:
        name = program(p["argv"])
        by_program[name].append(p["cpu_s"])
        # "nodeid (setup)", "(call)" or "(teardown)": the phase dropped
        test = p["test"].rsplit(" (", 1)[0] or "- (no test running)"
        by_test[FORKSERVER_TEST if name == FORKSERVER else test].append(p["cpu_s"])
    out = [
        f"pytest {' '.join(head['pytest_args'])} ({head['date']}, {head['cpus']} CPUs, "
        f"exit {head['returncode']}): {head['wall_s']:.0f} s wall; pytest and the processes it "
        f"waited for: {head['reaped_cpu_s']:.0f} s CPU "
        f"({head['reaped_cpu_s'] / head['wall_s']:.2f} cores busy on average); "
        f"the {len(procs)} processes seen: {total:.0f} s CPU.",
        "",
        "| program | processes | CPU s | CPU s each |",
        "| --- | --- | --- | --- |",
    ]
    for name, cpu in sorted(by_program.items(), key=lambda kv: -sum(kv[1]))[:top]:
        out.append(f"| {name} | {len(cpu)} | {sum(cpu):.0f} | {sum(cpu) / len(cpu):.2f} |")
    out += [
        "",
        "The tests whose processes took the most CPU (the test running when each process started):",
        "",
        "| test | processes | CPU s |",
        "| --- | --- | --- |",
    ]
    for name, cpu in sorted(by_test.items(), key=lambda kv: -sum(kv[1]))[:top]:
        out.append(f"| {name} | {len(cpu)} | {sum(cpu):.0f} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="run pytest and write the processes here")
    parser.add_argument("--report", type=Path, help="print the tables of a written file")
    parser.add_argument("--top", type=int, default=15, help="rows per table (default 15)")
    args = parser.parse_args(own)
    if (args.out is None) == (args.report is None):
        parser.error("give one of --out FILE -- PYTEST_ARGS... or --report FILE")
    if args.out is not None:
        return run(args.out, pytest_args)
    if not args.report.is_file():
        parser.error(f"--report {args.report}: no such file; write one with --out first")
    print(report(args.report, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
