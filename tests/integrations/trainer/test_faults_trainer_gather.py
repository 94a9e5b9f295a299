"""A peer lost while the survivor is in the Trainer's own loss gather (a logging step, no boundary)
gives ``PeerLostError`` within ``sync_timeout_s``: a closed connection at once, a partition after
the bound, not after ``ddp_timeout`` (30 minutes here, the Trainer's default). Two network
namespaces, one torchrun agent each.

Rank 1 pauses at the end of step 6 before the Trainer logs it
(``logging_steps=3``; boundaries at 4 and 8), so rank 0 is alone in the
loss gather of step 6 when node 1's worker is killed or the link goes down.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from launch import launch_on_nodes, write_spec
from test_faults_two_nodes import MARGIN, T, base_spec, error_line, progress, wait_exit, wait_for
from testbeds.netns import TwoNodes, netns_skip_reason

pytestmark = pytest.mark.slow

GATHER_STEP = 6


def rank0_in_the_gather(nodes: TwoNodes, out: Path) -> None:
    spec = {**base_spec(out, pause={"step": GATHER_STEP, "ranks": [1]}), "logging_steps": 3}
    procs = launch_on_nodes(nodes, "trainer_worker.py", write_spec(spec), out)
    wait_for(lambda: (out / "paused_rank1").exists(), "rank 1 paused", procs)
    wait_for(
        lambda: progress(out, 0)["step"] == GATHER_STEP, f"rank 0 at step {GATHER_STEP}", procs
    )
    time.sleep(1.0)  # rank 0 is now blocked in the Trainer's loss gather, waiting for rank 1


def worker_killed_in_the_gather(nodes: TwoNodes, out: Path) -> float:
    rank0_in_the_gather(nodes, out)
    os.kill(progress(out, 1)["pid"], signal.SIGKILL)
    return wait_exit(nodes.procs[0], T + MARGIN)


def link_down_in_the_gather(nodes: TwoNodes, out: Path) -> float:
    rank0_in_the_gather(nodes, out)
    nodes.link_down()
    (out / "resume").touch()
    return wait_exit(nodes.procs[0], T + MARGIN)


SCENARIOS = [worker_killed_in_the_gather, link_down_in_the_gather]


def _run(scenario, k: int, out: Path) -> dict:
    nodes = TwoNodes(k)
    try:
        nodes.create()
        return {
            "elapsed": scenario(nodes, out),
            "returncode": nodes.procs[0].returncode,
            "out": out,
        }
    except BaseException as err:  # handed to the scenario's test
        return {"error": err, "out": out}
    finally:
        nodes.destroy()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    """Both faults at the same time in two namespace pairs of their own (4 and 5)."""
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        futures = {
            s.__name__: pool.submit(_run, s, 4 + k, tmp_path_factory.mktemp(s.__name__))
            for k, s in enumerate(SCENARIOS)
        }
        return {name: future.result() for name, future in futures.items()}


def survivor_line(result: dict) -> str:
    if "error" in result:
        raise result["error"]
    assert result["returncode"] != 0
    line = error_line(result["out"] / "node0.log")
    assert f"AutoLoCo: the Trainer's collectives at step {GATHER_STEP} failed: " in line, line
    assert "the loss gather, evaluation or checkpoint barrier on rank 0: rank 1" in line, line
    assert (
        "the outer state is the last synchronized one: restart from the last checkpoint" in line
    ), line
    return line


def test_a_worker_killed_during_the_loss_gather_is_named_at_once(outcomes):
    result = outcomes["worker_killed_in_the_gather"]
    line = survivor_line(result)
    assert "rank 1 closed its connection (its process ended)" in line, line
    assert result["elapsed"] < T, f"node 0 took {result['elapsed']:.1f} s for a closed connection"


def test_a_partition_during_the_loss_gather_ends_after_sync_timeout_s(outcomes):
    result = outcomes["link_down_in_the_gather"]
    line = survivor_line(result)
    assert f"rank 1 did not answer within sync_timeout_s={T:g}" in line, line
    assert result["elapsed"] >= T - 3.0, (
        f"node 0 exited after {result['elapsed']:.1f} s: before the bound"
    )
