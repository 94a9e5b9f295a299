"""A live-membership worker in a network namespace, for the namespace tests of ``elastic/``.

Each worker is ``live_netns_worker.py`` started with ``ip netns exec`` (a ``multiprocessing`` child
cannot be placed in another namespace); it pauses at ``pause_at`` until ``<out>/resume`` exists, so
the test can cause its fault while every worker waits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from launch import worker_env
from testbeds.netns import TwoNodes

WORKER = Path(__file__).resolve().parent / "live_netns_worker.py"


def in_ns(nodes: TwoNodes, node: int) -> list[str]:
    return ["ip", "netns", "exec", nodes.ns[node]]


def start_live_worker(
    nodes: TwoNodes,
    node: int,
    out: Path,
    name: str,
    index: int,
    endpoints: str,
    run_id: int,
    pause_at: int,
) -> subprocess.Popen:
    """Worker ``name`` of a 3-process run ``run_id`` on the
    etcd ``endpoints``, in namespace ``node``."""
    spec = {
        "name": name,
        "data_index": index,
        "port": run_id,  # the run's id on the store
        "out": str(out),
        "first_world": 3,
        "store_kind": "etcd",
        "endpoints": endpoints,
        "pause_at": pause_at,
        "resume_file": str(out / "resume"),
    }
    spec_path = out / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    command = [*in_ns(nodes, node), sys.executable, str(WORKER), str(spec_path)]
    with open(out / f"{name}.stdout", "w") as stdout, open(out / f"{name}.stderr", "w") as stderr:
        proc = subprocess.Popen(
            command,
            env=worker_env(GLOO_SOCKET_IFNAME=nodes.dev[node]),
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    nodes.procs.append(proc)  # destroy() ends it whatever happens
    return proc
