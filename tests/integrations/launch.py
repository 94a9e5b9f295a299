"""Helpers to run a worker script under torchrun from pytest (free port, 1 thread per process)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: str, spec: dict, nproc: int, timeout: float = 300.0, max_restarts: int = 0) -> list[dict]:
    """Run ``script spec.json`` on ``nproc`` local processes; return each rank's ``result_rank{r}.pt``.

    ``max_restarts``: torchrun restarts every worker (up to that many times) when one fails.
    """
    out = Path(spec["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / f"spec_{int(time.time() * 1e6)}.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "warning"}
    env.pop("WORLD_SIZE", None)
    if max_restarts:
        # A restarted worker that reaches init_process_group before its peer can read the previous attempt's gloo
        # address from the launcher's store and fail ("connectFullMesh ... Connection refused"): the store is
        # reused across restarts with the static rendezvous and shared by default with c10d (pytorch/pytorch#135712).
        # The c10d rendezvous with an unshared store gives every attempt a fresh one.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        launch = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                  "--max-restarts", str(max_restarts)]
    else:
        launch = ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), *launch,
           str(HERE / script), str(spec_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    results = [torch.load(out / f"result_rank{r}.pt", weights_only=False) for r in range(nproc)]
    for r in range(nproc):
        os.remove(out / f"result_rank{r}.pt")
    return results
