"""Faults between two nodes (two network namespaces, a veth
link, one torchrun agent each) through the real Trainer.

Every run is a tiny-Llama DiLoCo job (``trainer_worker.py``, 12 steps, syncs at
steps 4, 8 and 12, a checkpoint at step 4) with ``sync_timeout_s=T`` and the
Trainer's default ``ddp_timeout`` (30 minutes): whatever stops the survivor is
AutoLoCo's bound. Faults are placed with ``fault_injection.py`` (pauses at a
step, progress files that give the step and the pid of each rank).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from launch import launch_on_nodes, torchrun, write_spec
from testbeds.netns import TwoNodes, netns_skip_reason

pytestmark = pytest.mark.slow

T = 10.0  # sync_timeout_s in these tests
MARGIN = 25.0  # exception, teardown and the agent's exit on a loaded 2-core machine
WAIT_LIMIT = 240.0


@pytest.fixture
def nodes():
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    two = TwoNodes(k=0)
    two.create()
    yield two
    two.destroy()


def base_spec(out: Path, **faults) -> dict:
    return {
        "output_dir": str(out),
        "steps": 12,
        "batch": 2,
        "save_steps": 4,
        "faults": faults,
        "autoloco": {"method": "diloco", "h_base": 4, "sync_timeout_s": T},
    }


def wait_for(condition, what: str, procs=()) -> None:
    deadline = time.monotonic() + WAIT_LIMIT
    while not condition():
        dead = [p.args[-1] for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise AssertionError(f"never saw {what} (exited early: {dead})")
        time.sleep(0.05)


def progress(out: Path, rank: int) -> dict:
    try:
        return json.loads((out / f"progress_rank{rank}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"step": -1, "pid": None}


def wait_exit(proc: subprocess.Popen, limit: float) -> float:
    """Seconds until ``proc`` exits (fails the test after ``limit``)."""
    start = time.monotonic()
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"node 0 still running {limit:.0f} s after the fault (sync_timeout_s={T})"
        ) from None
    return time.monotonic() - start


def error_line(log: Path) -> str:
    lines = [line for line in log.read_text().splitlines() if "PeerLostError:" in line]
    assert lines, f"no PeerLostError in {log}:\n{log.read_text()[-3000:]}"
    return lines[-1]


def check_survivor(
    out: Path, line: str, what: str = f"rank 1 did not answer within sync_timeout_s={T:g}"
) -> None:
    """Node 0's one-line error names the step-8 sync and rank
    1; nothing of interval 1 was written."""
    assert "AutoLoCo synchronization at step 8 (interval 1, steps 5-8) failed" in line, line
    assert what in line, line
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]
    records = (out / "autoloco_intervals.jsonl").read_text().splitlines()
    assert [json.loads(r)["start_step"] for r in records] == [0], (
        "only the interval before the fault is recorded"
    )


def run_until_paused(nodes: TwoNodes, out: Path, ranks: list[int], **faults):
    spec_path = write_spec(base_spec(out, **faults))
    procs = launch_on_nodes(nodes, "trainer_worker.py", spec_path, out)
    wait_for(
        lambda: all((out / f"paused_rank{r}").exists() for r in ranks),
        f"ranks {ranks} paused",
        procs,
    )
    return procs


def link_down_during_an_interval(nodes: TwoNodes, out: Path) -> float:
    """Partition at step 6 (mid-interval); both ranks then reach the step-8 sync."""
    procs = run_until_paused(nodes, out, [0, 1], pause={"step": 6, "ranks": [0, 1]})
    nodes.link_down()
    (out / "resume").touch()
    return wait_exit(procs[0], T + MARGIN)


def link_down_during_a_collective(nodes: TwoNodes, out: Path) -> float:
    """Rank 0 is inside the step-8 collective (rank 1 held
    back before it) when the link goes down."""
    procs = run_until_paused(nodes, out, [1], pause={"step": 8, "ranks": [1]})
    wait_for(lambda: progress(out, 0)["step"] == 8, "rank 0 at the step-8 sync", procs)
    time.sleep(1.0)  # rank 0 is now blocked in the collective, waiting for rank 1
    nodes.link_down()
    (out / "resume").touch()
    return wait_exit(procs[0], T + MARGIN)


def node1_worker_killed(nodes: TwoNodes, out: Path) -> float:
    """SIGKILL of node 1's worker at step 6 (mid-interval)."""
    procs = run_until_paused(nodes, out, [1], pause={"step": 6, "ranks": [1]})
    os.kill(progress(out, 1)["pid"], signal.SIGKILL)
    return wait_exit(procs[0], T + MARGIN)


SCENARIOS = [link_down_during_an_interval, link_down_during_a_collective, node1_worker_killed]


def _run_scenario(scenario, k: int, out: Path) -> dict:
    nodes = TwoNodes(k)
    try:
        nodes.create()
        elapsed = scenario(nodes, out)
        return {"elapsed": elapsed, "returncode": nodes.procs[0].returncode, "out": out}
    except BaseException as err:  # handed to the scenario's test
        return {"error": err, "out": out}
    finally:
        nodes.destroy()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    """The three faults, run at the same time in three namespace pairs (their timeouts overlap)."""
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        futures = {
            s.__name__: pool.submit(_run_scenario, s, k + 1, tmp_path_factory.mktemp(s.__name__))
            for k, s in enumerate(SCENARIOS)
        }
        return {name: future.result() for name, future in futures.items()}


def outcome(outcomes: dict, name: str, **expected) -> dict:
    result = outcomes[name]
    if "error" in result:
        raise result["error"]
    line = error_line(result["out"] / "node0.log")
    assert result["returncode"] != 0
    check_survivor(result["out"], line, **expected)
    return result


def test_link_down_during_an_interval(outcomes):
    """Both ranks start the sync after the partition: node 0
    stops after T, not before, with the named error."""
    elapsed = outcome(outcomes, "link_down_during_an_interval")["elapsed"]
    assert elapsed >= T - 0.5, (
        f"node 0 exited after {elapsed:.1f} s: before the timeout, so not because of it"
    )


def test_link_down_during_a_collective(outcomes):
    elapsed = outcome(outcomes, "link_down_during_a_collective")["elapsed"]
    assert elapsed >= T - 3.0, (
        f"node 0 exited after {elapsed:.1f} s: before the timeout, so not because of it"
    )


def test_node1_worker_killed(outcomes):
    """A killed peer closes its connections: node 0 fails at the next sync, well within the bound.

    gloo words it "Connection closed by peer [addr]:port" or, when the
    kernel resets the socket first, "Read error [addr]:port: Connection
    reset by peer" (seen 1 in 4 runs): both name the peer's address.
    """
    result = outcome(
        outcomes, "node1_worker_killed", what="rank 1 closed its connection (its process ended) ("
    )
    line = error_line(result["out"] / "node0.log")
    assert "[10.231.0." in line and (
        "Connection closed by peer" in line or "Connection reset by peer" in line
    ), line


def test_restart_resumes_from_the_last_checkpoint(nodes, tmp_path):
    # (runs alone: it needs namespace pair 0 while nothing else loads the machine's 2 cores)
    """``torchrun --max-restarts 1``: kill rank 1 mid-interval; both
    workers restart from checkpoint-4 and finish with exactly the
    parameters of an uninterrupted run resumed from that checkpoint."""
    out = tmp_path / "restarted"
    spec = {**base_spec(out, pause={"step": 6, "ranks": [0, 1]}), "resume_last": True}
    procs = launch_on_nodes(nodes, "trainer_worker.py", write_spec(spec), out, max_restarts=1)
    wait_for(
        lambda: all((out / f"paused_rank{r}").exists() for r in (0, 1)), "both ranks paused", procs
    )
    # before anything rewrites it
    shutil.copytree(out / "checkpoint-4", tmp_path / "reference" / "checkpoint-4")
    os.kill(progress(out, 1)["pid"], signal.SIGKILL)
    for node, proc in enumerate(procs):
        try:
            proc.wait(timeout=WAIT_LIMIT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node {node} did not finish after the restart") from None
        assert proc.returncode == 0, (out / f"node{node}.log").read_text()[-4000:]
    restarted = [torch.load(out / f"result_rank{r}.pt", weights_only=False) for r in range(2)]

    ref_dir = tmp_path / "reference"
    reference = torchrun(
        "trainer_worker.py",
        {**base_spec(ref_dir), "faults": None, "resume_from": str(ref_dir / "checkpoint-4")},
        nproc=2,
    )
    for a, b in zip(restarted, reference):
        assert a["global_step"] == b["global_step"] == 12
        assert a["totals"]["syncs"] == b["totals"]["syncs"] == 3
        for p, q in zip(a["params"], b["params"]):
            assert torch.equal(p, q)
