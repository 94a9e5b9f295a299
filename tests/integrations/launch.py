"""Helpers to run a worker script on several processes from pytest (free port, 1 thread per
process): under torchrun, or as ranks forked from the tests' forkserver with torchrun's environment
(:func:`forked_ranks`), for the tests whose subject is not the launcher."""

from __future__ import annotations

import json
import os
import runpy
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from _dist import START_METHOD, join
from testbeds.netns import MASTER_PORT, TwoNodes, process_env

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(max_restarts: int | None = None, **extra: str) -> dict[str, str]:
    """The environment of a torchrun launch from a test: one
    thread, offline, no inherited WORLD_SIZE."""
    env = process_env(**extra)
    if max_restarts:
        # A restarted worker that reaches init_process_group before its peer can read the previous
        # attempt's gloo address from the launcher's store and fail ("connectFullMesh ... Connection
        # refused"): the store is reused across restarts with the static rendezvous and shared by
        # default with c10d (pytorch/pytorch#135712). The c10d rendezvous with an unshared store
        # gives every attempt a fresh one.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def write_spec(spec: dict) -> Path:
    """Write ``spec`` as JSON into its ``output_dir`` (created) and return the file."""
    out = Path(spec["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / f"spec_{int(time.time() * 1e6)}.json"
    spec_path.write_text(json.dumps(spec))
    return spec_path


def torchrun_command(
    script: str,
    spec_path: Path,
    nproc: int,
    master_addr: str,
    master_port: int,
    nnodes: int | str = 1,
    node_rank: int = 0,
    max_restarts: int | None = None,
    local_addr: str | None = None,
    rdzv_conf: str = "",
) -> list[str]:
    """``python -m torch.distributed.run ...`` for one node;
    with ``max_restarts``, an elastic (c10d) rendezvous.

    ``nnodes``: a count, or ``"MIN:MAX"`` (elastic);
    ``rdzv_conf``: more ``key=value,...`` rendezvous settings.

    ``local_addr``: this node's address, which the elastic rendezvous hands to the
    workers as ``MASTER_ADDR`` (else torchrun looks up the host name, which does
    not resolve to the right interface inside a network namespace).
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--nnodes",
        str(nnodes),
    ]
    if max_restarts is None:
        cmd += [
            "--node_rank",
            str(node_rank),
            "--master_addr",
            master_addr,
            "--master_port",
            str(master_port),
        ]
    else:  # restarts need every agent to re-rendezvous, which the static rendezvous cannot do
        cmd += [
            "--max-restarts",
            str(max_restarts),
            "--rdzv-backend",
            "c10d",
            "--rdzv-id",
            "autoloco-test",
            "--rdzv-endpoint",
            f"{master_addr}:{master_port}",
            "--monitor-interval",
            "0.2",
            # node 0 hosts the rendezvous store (torchrun's
            # own host detection fails inside a namespace)
            "--rdzv-conf",
            ",".join(filter(None, [f"is_host={str(node_rank == 0).lower()}", rdzv_conf])),
        ]
        if local_addr is not None:
            cmd += ["--local-addr", local_addr]
    return cmd + [str(HERE / script), str(spec_path)]


def load_results(out: Path, ranks: int) -> list[dict]:
    """Each rank's ``result_rank{r}.pt`` (removed after
    reading, so a later run cannot pass with stale ones)."""
    results = [torch.load(out / f"result_rank{r}.pt", weights_only=False) for r in range(ranks)]
    for r in range(ranks):
        os.remove(out / f"result_rank{r}.pt")
    return results


def _run_local(
    script: str, spec: dict, nproc: int, timeout: float, max_restarts: int | None = None
) -> subprocess.CompletedProcess:
    cmd = torchrun_command(
        script, write_spec(spec), nproc, "127.0.0.1", free_port(), max_restarts=max_restarts
    )
    with subprocess.Popen(
        cmd, env=worker_env(max_restarts), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # torchrun starts each worker in a session of its own, so killing the launcher would
            # leave them running (and slowing every later test): SIGTERM makes it stop them first
            proc.terminate()
            try:
                stdout, stderr = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def torchrun(
    script: str, spec: dict, nproc: int, timeout: float = 300.0, max_restarts: int = 0
) -> list[dict]:
    """Run ``script spec.json`` on ``nproc`` local processes;
    return each rank's ``result_rank{r}.pt``.

    ``max_restarts``: torchrun restarts every worker (up to that many times) when one fails.
    """
    proc = _run_local(script, spec, nproc, timeout, max_restarts or None)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(proc.args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
            f"{proc.stderr[-8000:]}"
        )
    return load_results(Path(spec["output_dir"]), nproc)


def _forked_rank(rank: int, script: str, spec_path: str, env: dict[str, str], logs: str) -> None:
    """One rank of :func:`forked_ranks`: torchrun's environment, the script as ``__main__``."""
    os.environ.clear()
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank))
    log = os.open(os.path.join(logs, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)  # a rank's output goes to its log, not into pytest-xdist's channel
    os.dup2(log, 2)
    torch.set_num_threads(1)
    sys.argv = [script, spec_path]
    sys.path.insert(0, str(Path(script).parent))  # as ``python script`` would
    runpy.run_path(script, run_name="__main__")


def forked_ranks(script: str, spec: dict, nproc: int, timeout: float = 300.0) -> list[dict]:
    """:func:`torchrun`'s results, on ranks forked from the tests' forkserver.

    The forkserver has imported torch (``_dist.PRELOAD``), and no launcher
    process starts: a torchrun launch of two Trainer ranks pays torch's
    import three times (1.6 s each) before the ranks import the Trainer.
    Each rank gets the variables torchrun gives its workers (rank, world
    size, the rendezvous address, a first attempt) and runs ``script
    spec.json`` as ``__main__``, so the script patches ``torch.distributed``
    as it does under torchrun; its output is in
    ``output_dir/rank{r}.log``. Tests of the launcher itself (restarts, a
    rank killed, several nodes) use :func:`torchrun`.
    """
    spec_path = write_spec(spec)
    logs = Path(spec["output_dir"])
    env = worker_env(
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK="0",
        GROUP_WORLD_SIZE="1",
        ROLE_WORLD_SIZE=str(nproc),
        ROLE_NAME="default",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0",
    )
    env["WORLD_SIZE"] = str(nproc)  # worker_env drops an inherited one
    ctx = mp.start_processes(
        _forked_rank,
        args=(str(HERE / script), str(spec_path), env, str(logs)),
        nprocs=nproc,
        join=False,
        start_method=START_METHOD,
    )
    try:
        join(ctx, timeout, f"{nproc} forked ranks of {script}")
    except Exception as error:
        tails = "\n".join(
            f"--- rank {r}:\n{(logs / f'rank{r}.log').read_text()[-3000:]}"
            for r in range(nproc)
            if (logs / f"rank{r}.log").exists()
        )
        raise AssertionError(f"{script} on {nproc} forked ranks failed: {error}\n{tails}") from None
    return load_results(logs, nproc)


def torchrun_failing(script: str, spec: dict, nproc: int, timeout: float = 300.0) -> str:
    """Run a launch that must fail; return its stdout and
    stderr (the workers' tracebacks are in stderr)."""
    proc = _run_local(script, spec, nproc, timeout)
    assert proc.returncode != 0, (
        f"{' '.join(proc.args)} succeeded but was expected to fail:\n{proc.stderr[-4000:]}"
    )
    return proc.stdout + proc.stderr


def launch_on_nodes(
    nodes: TwoNodes, script: str, spec_path: Path, logs: Path, max_restarts: int | None = None
) -> list[subprocess.Popen]:
    """One torchrun agent per namespace (one worker each); stdout+stderr to ``logs/node{k}.log``."""
    for node in range(2):
        cmd = torchrun_command(
            script,
            spec_path,
            1,
            nodes.addr[0],
            MASTER_PORT,
            nnodes=2,
            node_rank=node,
            max_restarts=max_restarts,
            local_addr=nodes.addr[node],
        )
        env = worker_env(max_restarts, GLOO_SOCKET_IFNAME=nodes.dev[node])
        log = open(logs / f"node{node}.log", "w")
        nodes.procs.append(
            subprocess.Popen(
                ["ip", "netns", "exec", nodes.ns[node], *cmd],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()
    return nodes.procs
