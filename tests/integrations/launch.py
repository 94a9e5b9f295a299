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


def torchrun(script: str, spec: dict, nproc: int, timeout: float = 300.0) -> list[dict]:
    """Run ``script spec.json`` on ``nproc`` local processes; return each rank's ``result_rank{r}.pt``."""
    out = Path(spec["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / f"spec_{int(time.time() * 1e6)}.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "warning"}
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(HERE / script), str(spec_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    results = [torch.load(out / f"result_rank{r}.pt", weights_only=False) for r in range(nproc)]
    for r in range(nproc):
        os.remove(out / f"result_rank{r}.pt")
    return results
