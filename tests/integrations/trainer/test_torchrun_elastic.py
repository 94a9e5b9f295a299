"""Under ``torchrun --nnodes 2:3`` a node leaves and one
joins, and the run goes on by itself (docs/reliability.md).

One torchrun agent per "node" on localhost (c10d rendezvous hosted by node 0, one worker each), the
real Trainer + AutoLoCoCallback with ``snapshot_dir``, and the script restartable as documented
(``trainer.train(resume_from_checkpoint=callback.resume_point())``):

1. three nodes train; all pause inside the second interval (step 6), node 3's agent is killed with
   its worker (SIGKILL to both), the others go on;
2. the survivors' next synchronization fails (``PeerLostError``), they exit non-zero, their agents
   restart them, the rendezvous closes with the two nodes left, and they resume from the boundary of
   step 4 with two workers; they pause at step 10;
3. node 3 starts again: the agents see a node waiting and restart their workers (a membership
   change, not counted as a retry), and all three resume from the boundary of step 8; the run ends
   at step 16 and every agent exits 0.

No timing is asserted: every wait is bounded generously and fails naming what never happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from launch import free_port, load_results, torchrun_command, worker_env, write_spec

pytestmark = pytest.mark.slow

STEPS = 16
WAIT_LIMIT = 180.0
# quick rendezvous for a test: close a round 1 s after the
# minimum joined; a silent node is dead after ~3 s
RDZV = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=120"


def start_agent(spec_path: Path, node: int, port: int, logs: Path) -> subprocess.Popen:
    cmd = torchrun_command(
        "trainer_worker.py",
        spec_path,
        1,
        "127.0.0.1",
        port,
        nnodes="2:3",
        node_rank=node,
        max_restarts=3,
        local_addr="127.0.0.1",
        rdzv_conf=RDZV,
    )
    log = open(logs / f"agent{node}_{time.monotonic_ns()}.log", "w")
    return subprocess.Popen(cmd, env=worker_env(3), stdout=log, stderr=subprocess.STDOUT)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts each
    worker in a session of its own: killpg misses it)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def kill_node(agent: subprocess.Popen) -> None:
    """SIGKILL an agent and every process below it at once, like a node that loses power."""
    for pid in [agent.pid, *descendants(agent.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    agent.wait()


def wait_for(condition, what: str, agents: list[subprocess.Popen], logs: Path) -> None:
    deadline = time.monotonic() + WAIT_LIMIT
    while not condition():
        if time.monotonic() > deadline or any(a.poll() not in (None, 0) for a in agents):
            tails = "\n".join(
                f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(logs.glob("agent*.log"))
            )
            raise AssertionError(
                f"never saw {what}; exit codes {[a.poll() for a in agents]}\n{tails}"
            )
        time.sleep(0.1)


def test_a_node_leaves_and_joins_and_the_run_goes_on_by_itself(tmp_path):
    out, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    spec = {
        "output_dir": str(out),
        "steps": STEPS,
        "batch": 2,
        "resume_point": True,
        "faults": {
            "pauses": [
                {"tag": "leave", "step": 6, "ranks": [0, 1, 2]},
                {"tag": "join", "step": 10, "ranks": [0, 1, 2]},
            ]
        },
        "autoloco": {
            "method": "diloco",
            "h_base": 4,
            "sync_timeout_s": 20.0,
            "snapshot_dir": str(out / "snapshots"),
        },
    }
    spec_path, port = write_spec(spec), free_port()
    agents = [start_agent(spec_path, node, port, logs) for node in range(3)]
    try:
        paused = lambda tag, ranks: (  # noqa: E731
            lambda: all((out / f"paused_{tag}_rank{r}").exists() for r in ranks)
        )
        wait_for(paused("leave", range(3)), "three workers at step 6", agents, logs)
        kill_node(agents[2])  # node 3 is gone: its agent and its worker
        (out / "resume_leave").touch()
        running = [agents[0], agents[1]]
        wait_for(paused("join", range(2)), "two workers at step 10 after the loss", running, logs)
        agents.append(start_agent(spec_path, 2, port, logs))  # node 3 comes back
        running.append(agents[3])
        wait_for(paused("join", [2]), "the third worker at step 10 after the join", running, logs)
        (out / "resume_join").touch()
        for agent in running:
            wait_for(lambda a=agent: a.poll() is not None, "every agent finished", running, logs)
        assert [a.returncode for a in running] == [0, 0, 0]
    finally:
        for agent in agents:
            if agent.poll() is None:
                kill_node(agent)
    lost = "".join(p.read_text() for p in logs.glob("agent[01]_*.log"))
    assert (
        "PeerLostError: AutoLoCo synchronization at step 8 (interval 1, steps 5-8) failed" in lost
    )
    assert "restart from the boundary snapshot of step 4 (any number of workers)" in lost
    launches = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
    starts = [(a["world"], a["step"]) for a in launches if a["rank"] == 0]
    assert starts == [(3, 0), (2, 4), (3, 8)], (
        "fresh with 3, resumed at the boundaries of step 4 with 2, 8 with 3"
    )
    results = load_results(out, 3)
    for result in results:
        assert result["world"] == 3 and result["global_step"] == STEPS
        # each interval closed once
        assert [r["start_step"] for r in result["records"]] == [0, 4, 8, 12]
    [line] = [x for x in results[0]["log_lines"] if "resumed step" in x]
    assert "resumed step 8 from the boundary snapshot" in line and "(2 workers, now 3)" in line
