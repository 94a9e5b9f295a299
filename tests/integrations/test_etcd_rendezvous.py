"""torchrun's ``etcd-v2`` rendezvous on a real 3-member etcd cluster (loopback ports): with one member lost the
two left keep the quorum, and the agents rendezvous, fail and rendezvous again through them; an endpoint that
does not answer is named in one line.

The member is lost before the launch. Lost while the agents run (tried with the agents pointed at the lost
member, then at the two others), the agents' next round hung in 2 of 3 runs each (torch 2.13, python-etcd
0.4.5, etcd 3.4.23): not yet understood, see docs/reliability.md.

Skipped when the ``etcd`` server is missing (the reason gives the apt command; .ci/run installs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from launch import free_port, worker_env

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from etcd_cluster import EtcdCluster, etcd_missing  # noqa: E402

from autoloco_hf.integrations.etcd_check import EtcdUnreachable, check_etcd  # noqa: E402

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
WAIT_LIMIT_S = 120.0
RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3,read_timeout=5,join_timeout=60"


@pytest.fixture
def cluster(tmp_path):
    reason = etcd_missing()
    if reason:
        pytest.skip(reason)
    members = EtcdCluster([("127.0.0.1", free_port(), free_port()) for _ in range(3)], str(tmp_path))
    members.start()
    yield members
    members.stop()


def agent(endpoint: str, out: Path) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
        "--max-restarts", "1", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", endpoint,
        "--rdzv-id", f"etcd-test-{out.name}", "--rdzv-conf", RDZV_CONF, "--monitor-interval", "0.2",
        "--local-addr", "127.0.0.1", str(HERE / "etcd_worker.py"), str(out),
    ]  # fmt: skip
    return subprocess.Popen(  # its own session: a failed test ends the agent's workers too
        cmd, env=worker_env(1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def test_the_rendezvous_goes_on_after_an_etcd_member_is_lost(cluster, tmp_path):
    assert len(check_etcd(cluster.endpoints[1])) == 3  # one member lists the whole cluster
    out = tmp_path / "run"
    out.mkdir()
    cluster.kill(0)  # the third node's member loses power
    with pytest.raises(EtcdUnreachable, match=cluster.endpoints[0]):
        check_etcd(cluster.endpoints[0], timeout_s=1.0)
    # each agent talks to a member of its own, as each node's agent would to its local one
    agents = [agent(cluster.endpoints[k], out) for k in (1, 2)]
    try:
        outputs = [a.communicate(timeout=WAIT_LIMIT_S)[0] for a in agents]
    finally:
        for a in agents:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(a.pid, signal.SIGKILL)
            a.wait()
    assert [a.returncode for a in agents] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    rounds = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
    got = sorted((a["first_round"], a["rank"], a["world"], a["sum"]) for a in rounds)
    assert got == [(False, 0, 2, 1.0), (False, 1, 2, 1.0), (True, 0, 2, 1.0), (True, 1, 2, 1.0)]


def test_an_etcd_endpoint_that_does_not_answer_is_named_in_one_line():
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(EtcdUnreachable, match=rf"^etcd endpoint {endpoint} did not answer within 1 s"):
        check_etcd(endpoint, timeout_s=1.0)
    run = subprocess.run(
        [sys.executable, "-m", "autoloco_hf.integrations.etcd_check", endpoint],
        capture_output=True, text=True, timeout=60, env=worker_env(),
    )  # fmt: skip
    assert run.returncode == 1 and run.stdout == ""
    [line] = run.stderr.splitlines()
    assert line.startswith(f"EtcdUnreachable: etcd endpoint {endpoint} did not answer") and "--rdzv-endpoint" in line
