"""A small etcd cluster for torchrun's ``etcd-v2``
rendezvous: start, wait until it serves, stop (not a test).

    cluster = EtcdCluster(
        [("127.0.0.1", 23790, 23800), ("127.0.0.1", 23791, 23801), ("127.0.0.1", 23792, 23802)],
        workdir,
    )
    cluster.start()          # returns once every member answers with the whole cluster (bounded)
    ...                      # torchrun --rdzv-backend etcd-v2 --rdzv-endpoint 127.0.0.1:23790 ...
    cluster.stop()

One ``etcd`` process per member (the distribution's ``etcd-server`` 3.4, with the v2 API that torch
elastic's ``etcd-v2`` backend speaks switched on), optionally inside a network namespace
(``prefix``). A cluster of 3 keeps its quorum, and so the rendezvous, when one member is lost. Used
by tests/integrations/elastic/test_etcd_rendezvous.py and benchmarks/testbeds/elastic_testbed.py;
docs/hf.md shows the same command for users.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from autoloco_hf.integrations.elastic.etcd_check import EtcdUnreachable, check_etcd

INSTALL = "apt-get install -y etcd-server"
START_LIMIT_S = 60.0


def etcd_missing() -> str | None:
    """Why no cluster and etcd rendezvous can run here
    (``None`` when the server and the client are installed)."""
    if shutil.which("etcd") is None:
        return f"needs the etcd server (`{INSTALL}`)"
    if importlib.util.find_spec("etcd") is None:
        return (
            "needs the python-etcd client of torchrun's etcd-v2 rendezvous (`pip "
            "install -e '.[elastic]'`)"
        )
    return None


def member_command(
    name: str, host: str, client_port: int, peer_port: int, cluster: str, data_dir: str
) -> list[str]:
    """The ``etcd`` command of one member of a new cluster (``cluster``:
    ``name=http://host:peer,...``)."""
    return [
        "etcd",
        "--name",
        name,
        "--data-dir",
        data_dir,
        "--enable-v2=true",
        "--listen-client-urls",
        f"http://{host}:{client_port}",
        "--advertise-client-urls",
        f"http://{host}:{client_port}",
        "--listen-peer-urls",
        f"http://{host}:{peer_port}",
        "--initial-advertise-peer-urls",
        f"http://{host}:{peer_port}",
        "--initial-cluster",
        cluster,
        "--initial-cluster-state",
        "new",
        "--initial-cluster-token",
        "autoloco",
        "--heartbeat-interval",
        "100",
        "--election-timeout",
        "1000",
    ]


class EtcdCluster:
    """Members ``(host, client_port, peer_port)``; ``prefix(k)``:
    what runs member ``k``'s command (a namespace)."""

    def __init__(
        self,
        members: Sequence[tuple[str, int, int]],
        workdir: str,
        prefix: Callable[[int], list[str]] = lambda k: [],
    ) -> None:
        self.members = list(members)
        self.workdir = workdir
        self.prefix = prefix
        self.procs: dict[int, subprocess.Popen] = {}
        self._cluster = ",".join(f"m{k}=http://{h}:{p}" for k, (h, _, p) in enumerate(self.members))

    @property
    def endpoints(self) -> list[str]:
        return [f"{host}:{client}" for host, client, _ in self.members]

    def start(self) -> None:
        """Start every member and wait until each one answers
        with the whole cluster (``START_LIMIT_S``)."""
        for k in range(len(self.members)):
            shutil.rmtree(self._data_dir(k), ignore_errors=True)
            self._launch(k)
        for k in range(len(self.members)):
            self._wait_serving(k)

    def restart(self, k: int) -> None:
        """Member ``k`` powers on again: the same data folder,
        so it rejoins the cluster it left (bounded wait)."""
        self._launch(k)
        self._wait_serving(k)

    def _data_dir(self, k: int) -> str:
        return os.path.join(self.workdir, f"etcd-m{k}")

    def _launch(self, k: int) -> None:
        host, client, peer = self.members[k]
        log = open(os.path.join(self.workdir, f"etcd-m{k}.log"), "a")
        command = [
            *self.prefix(k),
            *member_command(f"m{k}", host, client, peer, self._cluster, self._data_dir(k)),
        ]
        self.procs[k] = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def _wait_serving(self, k: int) -> None:
        endpoint = self.endpoints[k]
        deadline = time.monotonic() + START_LIMIT_S
        while True:
            try:
                if self._members_seen(k) == len(self.members):
                    return
            except EtcdUnreachable:
                pass
            if self.procs[k].poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"etcd member m{k} ({endpoint}) did not serve within {START_LIMIT_S:.0f} s; "
                    f"see {os.path.join(self.workdir, f'etcd-m{k}.log')}"
                )
            time.sleep(0.1)

    def _members_seen(self, k: int) -> int:
        """How many members member ``k`` lists, asked from where
        it runs (its namespace, when ``prefix`` has one)."""
        if not self.prefix(k):
            return len(check_etcd(self.endpoints[k], timeout_s=2.0))
        code = (
            "import sys; from autoloco_hf.integrations.elastic.etcd_check import check_etcd, "
            "EtcdUnreachable\n"
            f"try: print(len(check_etcd({self.endpoints[k]!r}, timeout_s=2.0)))\n"
            "except EtcdUnreachable: print(0)"
        )
        out = subprocess.run(
            [*self.prefix(k), sys.executable, "-c", code], capture_output=True, text=True
        ).stdout
        return int(out.strip() or 0)

    def leader(self) -> int | None:
        """The member that leads now, from each member's own
        view (``None``: no member says it leads)."""
        for k, (host, client, _) in enumerate(self.members):
            if self.procs.get(k) is not None and self.procs[k].poll() is None:
                stats = self._http(k, f"http://{host}:{client}/v2/stats/self")
                if json.loads(stats or "{}").get("state") == "StateLeader":
                    return k
        return None

    def make_leader(self, k: int) -> None:
        """Move the leadership to member ``k`` (etcd's v3
        move-leader, asked of the leader), within 10 s."""
        deadline = time.monotonic() + 10.0
        while (current := self.leader()) != k:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"etcd member m{k} did not become the leader within 10 s (leader: m{current})"
                )
            if current is not None:
                host, client, _ = self.members[current]
                members = json.loads(self._http(current, f"http://{host}:{client}/v2/members"))[
                    "members"
                ]
                target = next(int(m["id"], 16) for m in members if m["name"] == f"m{k}")
                body = json.dumps({"targetID": str(target)})
                self._http(
                    current, f"http://{host}:{client}/v3/maintenance/transfer-leadership", body
                )
            time.sleep(0.2)

    def _http(self, k: int, url: str, body: str | None = None) -> str:
        """One HTTP request to ``url`` from where member
        ``k`` runs (its namespace); '' when it fails."""
        code = (
            "import sys, urllib.request\n"
            "data = sys.argv[2].encode() if len(sys.argv) > 2 else None\n"
            "try: print(urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=data), "
            "timeout=3).read().decode())\n"
            "except OSError: pass"
        )
        args = [url] if body is None else [url, body]
        return subprocess.run(
            [*self.prefix(k), sys.executable, "-c", code, *args], capture_output=True, text=True
        ).stdout

    def kill(self, k: int) -> None:
        """Member ``k`` loses power (SIGKILL)."""
        proc = self.procs[k]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for k in list(self.procs):
            self.kill(k)
        self.procs = {}
