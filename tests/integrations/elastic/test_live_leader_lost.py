"""The etcd leader's host lost with its worker, on a real
link (docs/reliability.md "A lost etcd leader").

Two network namespaces joined by a veth pair (``netns.py``): node A holds etcd members m0 and m1 and
workers w0 and w1; node B holds member m2, made the cluster's leader, and worker w2. Mid-interval
node B's two processes are killed together, as when a host loses power. The survivors' next store
writes go to a member whose leader has just died: etcd holds such a write for about 7 s, the
python-etcd client before gave up on it after 5 s (6.1-6.2 s to training again, against 1.3 s with a
follower lost). With ``etcd_store``'s ``request_timeout_s`` (2 s) the write goes to the next member
once the others have elected a new leader.

Skipped without root and ``ip netns``, or without the etcd
server and python-etcd (the reasons say which).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from live_netns import in_ns, start_live_worker
from testbeds.etcd_cluster import EtcdCluster, etcd_missing
from testbeds.live_testbed import STEPS
from testbeds.netns import TwoNodes, netns_skip_reason

NODE = 41  # namespaces alh-faults-41-{0,1}: apart from the other namespace tests
PAUSE_AT = 6  # mid-interval (H 4): the survivors meet the loss at the boundary of step 8
# start-up of 3 processes and 3 etcd members on a loaded 2-core machine, then the run
WAIT_LIMIT_S = 150.0
# the target: a lost leader costs no more than a lost follower (1.3 s measured)
TRAINING_AGAIN_S = 5.0


@pytest.fixture
def two_nodes():
    reason = netns_skip_reason() or etcd_missing()
    if reason:
        pytest.skip(reason)
    nodes = TwoNodes(k=NODE)
    nodes.create()
    yield nodes
    # every process still in the namespaces (workers, etcd members), then the namespaces
    nodes.destroy()


def test_the_etcd_leader_lost_with_its_worker_costs_the_survivors_under_5_s(
    two_nodes, tmp_path
) -> None:
    nodes = two_nodes
    a, b = nodes.addr
    members = [(a, 2379, 2380), (a, 2381, 2382), (b, 2379, 2380)]
    cluster = EtcdCluster(members, str(tmp_path), prefix=lambda k: in_ns(nodes, 0 if k < 2 else 1))
    cluster.start()
    cluster.make_leader(2)  # node B's member leads: the host lost holds the leader
    endpoints = ",".join(cluster.endpoints)
    procs = {
        "w0": start_live_worker(nodes, 0, tmp_path, "w0", 0, endpoints, NODE, PAUSE_AT),
        "w1": start_live_worker(nodes, 0, tmp_path, "w1", 1, endpoints, NODE, PAUSE_AT),
        "w2": start_live_worker(nodes, 1, tmp_path, "w2", 2, endpoints, NODE, PAUSE_AT),
    }
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not all((tmp_path / f"{n}.paused").exists() for n in procs):
        ended = {name: p.returncode for name, p in procs.items() if p.poll() is not None}
        if ended or time.monotonic() > deadline:
            logs = {name: (tmp_path / f"{name}.stderr").read_text()[-2000:] for name in procs}
            raise AssertionError(
                f"never saw all three paused at step {PAUSE_AT} (ended: {ended}); stderr: {logs}"
            )
        time.sleep(0.05)
    assert cluster.leader() == 2, "the leadership moved while the workers started"

    fault_at = time.time()  # node B loses power: its worker and its etcd member, the leader
    os.killpg(procs["w2"].pid, signal.SIGKILL)
    cluster.kill(2)
    (tmp_path / "resume").touch()

    seen = {}
    for name in ("w0", "w1"):  # the survivors train to the end, without w2, on identical parameters
        procs[name].wait(timeout=WAIT_LIMIT_S)
        assert procs[name].returncode == 0, (tmp_path / f"{name}.stderr").read_text()[-3000:]
        seen[name] = json.loads((tmp_path / f"{name}.json").read_text())
    again = {name: seen[name]["faults"][-1]["training_again_at"] - fault_at for name in seen}
    print(f"\nthe etcd leader lost with its worker: training again {again} s after the fault")
    for name in seen:
        rounds = [(r["round"], sorted(r["members"])) for r in seen[name]["rounds"]]
        assert rounds[0] == (0, ["w0", "w1", "w2"]) and rounds[-1][1] == ["w0", "w1"], rounds
        assert len(seen[name]["faults"]) == 1, seen[name]["faults"]
        assert seen[name]["steps"][-1] == STEPS - 1
        assert again[name] < TRAINING_AGAIN_S, (name, again[name])
    assert seen["w1"]["theta"] == seen["w0"]["theta"]
    assert seen["w1"]["params"] == seen["w0"]["params"]
