"""Two "nodes" on one machine: two network namespaces joined
by a veth pair, one torchrun agent in each.

Needs root and ``ip netns``; :func:`netns_skip_reason` says why not when they
are missing. Taking the link down (``ip link set ... down`` on node 0's end)
is a partition: packets vanish, no connection is reset, as when a machine
loses power or its network.

    nodes = TwoNodes(k=0)          # namespaces alh-faults-0-{0,1}, veth alhf0 / alhfp0
    try:
        nodes.create()
        # launch_on_nodes: tests/integrations/launch.py
        procs = launch_on_nodes(nodes, "trainer_worker.py", spec_path, logs)
        ...
        nodes.link_down()
    finally:
        nodes.destroy()            # kills what it started, deletes the namespaces
"""

from __future__ import annotations

import os
import shutil
import subprocess

SUBNET_PREFIX = "10.231.0."  # the only subnet these tests use
MASTER_PORT = 29517  # inside fresh namespaces nothing else listens


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a process started in a namespace:
    one thread, offline, no inherited WORLD_SIZE."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "warning",
        **extra,
    }
    env.pop("WORLD_SIZE", None)
    return env


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def netns_skip_reason() -> str | None:
    """Why two-namespace tests cannot run here (``None`` when they can)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    probe = f"alh-probe-{os.getpid()}"  # one per process: pytest-xdist workers probe at once
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    return None


class TwoNodes:
    """Namespaces ``alh-faults-<k>-0/1``, veth ``alhf<k>`` (node
    0) / ``alhfp<k>`` (node 1), 10.231.0.(4k+1, 4k+2)/30."""

    def __init__(self, k: int = 0) -> None:
        self.ns = [f"alh-faults-{k}-0", f"alh-faults-{k}-1"]
        self.dev = [f"alhf{k}", f"alhfp{k}"]
        self.addr = [f"{SUBNET_PREFIX}{4 * k + 1}", f"{SUBNET_PREFIX}{4 * k + 2}"]
        self.procs: list[subprocess.Popen] = []

    def create(self) -> None:
        self.destroy()  # leftovers of an interrupted earlier run
        for ns in self.ns:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
        for ns, dev, addr in zip(self.ns, self.dev, self.addr):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")

    def link_down(self) -> None:
        _ip("-n", self.ns[0], "link", "set", self.dev[0], "down")

    def link_up(self) -> None:
        """The link back: node 0's end up again (its address and route come back with it)."""
        _ip("-n", self.ns[0], "link", "set", self.dev[0], "up")

    def destroy(self) -> None:
        for proc in self.procs:  # the agents and their workers (each agent leads its own session)
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
            proc.wait()
        self.procs = []
        for ns in self.ns:
            if _ip("netns", "pids", ns, check=False).returncode == 0:
                for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                    try:
                        os.kill(int(pid), 9)  # only processes inside our own namespace
                    except ProcessLookupError:
                        pass
                _ip("netns", "delete", ns, check=False)
        _ip("link", "delete", self.dev[0], check=False)
