"""torchrun's ``etcd-v2`` rendezvous on a real 3-member etcd cluster (loopback
ports): with one member lost (before the launch, or while the agents run) the
two left keep the quorum, and the agents rendezvous, fail and rendezvous again
through them; an endpoint that does not answer is named in one line.

Each agent talks to one member (torch's ``etcd-v2`` backend takes one endpoint), as each node's
agent would to its own node's member: a node that loses power loses both. An agent whose own member
dies while the agent lives cannot reach the rendezvous (docs/reliability.md).

Skipped when the ``etcd`` server is missing (the reason gives the apt command; .ci/run installs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch import free_port, worker_env
from testbeds.etcd_cluster import EtcdCluster, etcd_missing

from autoloco_hf.integrations.elastic.etcd_check import EtcdUnreachable, check_etcd

pytestmark = pytest.mark.slow
HELPERS = Path(__file__).resolve().parents[1]  # tests/integrations: the worker scripts
WAIT_LIMIT_S = 120.0
# a heartbeat is an etcd write: when the lost member led the cluster, writes wait
# for a new leader, which under load took longer than 3 missed heartbeats: the
# survivors then dropped a live agent from the round, and the next round waited for
# it (the hang seen with keep_alive_max_attempt=3, 3 of 4 runs; 10: 4 of 4 passed)
RDZV_CONF = (
    "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=10,"
    "read_timeout=5,join_timeout=60"
)


@pytest.fixture
def cluster(tmp_path):
    reason = etcd_missing()
    if reason:
        pytest.skip(reason)
    members = EtcdCluster(
        [("127.0.0.1", free_port(), free_port()) for _ in range(3)], str(tmp_path)
    )
    members.start()
    yield members
    members.stop()


def agent(endpoint: str, out: Path) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
        "--max-restarts", "1", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", endpoint,
        "--rdzv-id", f"etcd-test-{out.name}", "--rdzv-conf", RDZV_CONF, "--monitor-interval", "0.2",
        "--local-addr", "127.0.0.1", str(HELPERS / "etcd_worker.py"), str(out),
    ]  # fmt: skip
    return subprocess.Popen(  # its own session: a failed test ends the agent's workers too
        cmd,
        env=worker_env(1),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def rounds_of(agents: list[subprocess.Popen], out: Path, while_running=lambda: None) -> list[dict]:
    """Call ``while_running``, wait for both agents to exit 0
    (killed in any case), return the workers' attempts."""
    try:
        while_running()
        outputs = [a.communicate(timeout=WAIT_LIMIT_S)[0] for a in agents]
    finally:
        for a in agents:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(a.pid, signal.SIGKILL)
            a.wait()
    assert [a.returncode for a in agents] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    return [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]


def test_the_rendezvous_goes_on_after_an_etcd_member_is_lost(cluster, tmp_path):
    assert len(check_etcd(cluster.endpoints[1])) == 3  # one member lists the whole cluster
    out = tmp_path / "run"
    out.mkdir()
    cluster.kill(0)  # the third node's member loses power
    with pytest.raises(EtcdUnreachable, match=cluster.endpoints[0]):
        check_etcd(cluster.endpoints[0], timeout_s=1.0)
    # each agent talks to a member of its own, as each node's agent would to its local one
    rounds = rounds_of([agent(cluster.endpoints[k], out) for k in (1, 2)], out)
    got = sorted((a["first_round"], a["rank"], a["world"], a["sum"]) for a in rounds)
    assert got == [(False, 0, 2, 1.0), (False, 1, 2, 1.0), (True, 0, 2, 1.0), (True, 1, 2, 1.0)]


def test_the_agents_go_on_when_a_member_is_lost_while_they_run(cluster, tmp_path):
    """Member 0 (the third node's) is killed while both agents' first round trains; rank 1 then
    fails, and the agents' next round, through members 1 and 2, forms and finishes."""
    out = tmp_path / "run"
    out.mkdir()
    lost = out / "member_lost"
    (out / "fail_after").write_text(str(lost))

    def lose_a_member_once_the_first_round_trains() -> None:
        attempts = out / "attempts.jsonl"
        deadline = time.monotonic() + WAIT_LIMIT_S
        while not (attempts.exists() and len(attempts.read_text().splitlines()) >= 2):
            assert time.monotonic() < deadline, "the first round never trained"
            time.sleep(0.05)
        cluster.kill(0)
        lost.touch()

    agents = [agent(cluster.endpoints[k], out) for k in (1, 2)]
    rounds = rounds_of(agents, out, lose_a_member_once_the_first_round_trains)
    assert sorted((a["first_round"], a["rank"], a["world"]) for a in rounds) == [
        (False, 0, 2), (False, 1, 2), (True, 0, 2), (True, 1, 2)
    ]  # fmt: skip


def test_an_etcd_endpoint_that_does_not_answer_is_named_in_one_line():
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(
        EtcdUnreachable, match=rf"^etcd endpoint {endpoint} did not answer within 1 s"
    ):
        check_etcd(endpoint, timeout_s=1.0)
    run = subprocess.run(
        [sys.executable, "-m", "autoloco_hf.integrations.elastic.etcd_check", endpoint],
        capture_output=True, text=True, timeout=60, env=worker_env(),
    )  # fmt: skip
    assert run.returncode == 1 and run.stdout == ""
    [line] = run.stderr.splitlines()
    assert (
        line.startswith(f"EtcdUnreachable: etcd endpoint {endpoint} did not answer")
        and "--rdzv-endpoint" in line
    )
