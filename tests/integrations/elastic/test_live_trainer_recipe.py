"""recipes/live_trainer.py as its docstring says to run it:
``torchrun --standalone`` per node, one command.

Two network namespaces joined by a veth pair (``netns.py``), a 3-member etcd cluster (m0, m1 on node
A, m2 on node B). The launch is one process on each node (``AUTOLOCO_WORLD_SIZE=2``); a third
process started on node B with the same command is one too many for the launch and is taken in at
the members' first boundary. All three end with exit status 0 on the same final model. Skipped
without root and ``ip netns``, or without etcd and python-etcd.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch import worker_env
from testbeds.etcd_cluster import EtcdCluster, etcd_missing
from testbeds.netns import TwoNodes, netns_skip_reason

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "live_trainer.py"
NODE = 44  # namespaces alh-faults-44-{0,1}: apart from the other namespace tests
WAIT_LIMIT_S = 240.0  # three torchrun launches and the run, on a loaded 2-core machine
# Long enough that the third process, whose imports may end seconds after the others' on a loaded
# machine, arrives while the run still trains: at 60 steps (1.5 s of training) it came after the
# end once in three runs and waited out round_timeout_s, "the run may be over" (correctly).
MAX_STEPS = 400


def _launch(
    nodes: TwoNodes, node: int, name: str, out: Path, env: dict[str, str]
) -> subprocess.Popen:
    command = [
        *["ip", "netns", "exec", nodes.ns[node]],
        *[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"],
        *[
            str(RECIPE),
            "--output-dir",
            str(out),
            "--method",
            "diloco",
            "--h-base",
            "4",
            "--max-steps",
            str(MAX_STEPS),
        ],
    ]
    member_env = {**env, "AUTOLOCO_MEMBER_ID": name, "GLOO_SOCKET_IFNAME": nodes.dev[node]}
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.Popen(
            command, env=member_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    nodes.procs.append(proc)  # destroy() ends it whatever happens
    return proc


def test_the_recipe_starts_a_run_on_two_nodes_and_takes_in_a_third_process_with_the_same_command(
    tmp_path,
) -> None:
    reason = netns_skip_reason() or etcd_missing()
    if reason:
        pytest.skip(reason)
    nodes = TwoNodes(k=NODE)
    nodes.create()
    try:
        a, b = nodes.addr
        members = [(a, 2379, 2380), (a, 2381, 2382), (b, 2379, 2380)]
        cluster = EtcdCluster(
            members,
            str(tmp_path),
            prefix=lambda k: ["ip", "netns", "exec", nodes.ns[0 if k < 2 else 1]],
        )
        cluster.start()
        env = worker_env(
            AUTOLOCO_ETCD_ENDPOINTS=",".join(cluster.endpoints),
            AUTOLOCO_RUN_ID="recipe",
            AUTOLOCO_WORLD_SIZE="2",
        )
        # a third process, the same command, beyond
        # AUTOLOCO_WORLD_SIZE: the run takes it in at a boundary
        procs = {
            name: _launch(nodes, node, name, tmp_path, env)
            for name, node in (("a0", 0), ("b0", 1), ("b1", 1))
        }
        deadline = time.monotonic() + WAIT_LIMIT_S
        for name, proc in procs.items():
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            log = (tmp_path / f"{name}.log").read_text()
            # the error lines first: torchrun's report after them fills the tail
            errors = [line for line in log.splitlines() if "Error" in line]
            assert proc.returncode == 0, (name, errors, log[-3000:])
            assert f"live_trainer: {name} finished at step {MAX_STEPS}, parameters " in log, (
                name,
                log[-3000:],
            )
        digests = {
            re.search(
                rf"finished at step {MAX_STEPS}, parameters (\w+)",
                (tmp_path / f"{n}.log").read_text(),
            )[1]
            for n in procs
        }
        assert len(digests) == 1, digests  # every member ends on the same model
        # one of them was taken in later, at a boundary: a round after the launch, of 3
        logs = [(tmp_path / f"{n}.log").read_text() for n in procs]
        taken_in = re.compile(r"is member \d of 3 in membership round 1\b")
        joined = [log for log in logs if taken_in.search(log)]
        assert len(joined) == 1, [log[:300] for log in logs]
        assert (tmp_path / "final" / "model.safetensors").exists()
    finally:
        nodes.destroy()


def test_the_recipe_names_the_missing_environment_variables(tmp_path) -> None:
    env = {k: v for k, v in worker_env().items() if not k.startswith("AUTOLOCO_")}
    done = subprocess.run(
        [sys.executable, str(RECIPE), "--output-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "live_trainer: set AUTOLOCO_ETCD_ENDPOINTS, AUTOLOCO_RUN_ID, AUTOLOCO_WORLD_SIZE (see the "
        "module's docstring); none may be empty"
    )
