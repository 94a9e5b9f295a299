"""Throughput between syncs: AutoLoCo Trainer workers vs a
plain single-process Trainer (not a test).

    # runs all three ROUNDS times (default 2), prints the ratios
    python benchmarks/throughput/bench_trainer_throughput.py [ROUNDS]

* ``plain``: one process, ``Trainer`` without the callback;
* ``autoloco1``: one process, ``Trainer`` +
  ``AutoLoCoCallback`` (the callback's own cost between syncs);
* ``autoloco``: ``torchrun --nproc_per_node 2``, ``Trainer`` + ``AutoLoCoCallback`` (DiLoCo, H=20);
* ``ddp``: ``torchrun --nproc_per_node 2``, plain DDP ``Trainer`` (gradient all-reduce every step).

Each process uses one thread. Step time = median wall time between consecutive
``on_step_end`` calls after 5 warm-up steps; for AutoLoCo the steps that closed
an interval (sync) are excluded ("between syncs") and reported separately.
Model: the tiny Llama of the environment notes (vocab 2048, hidden 128, 3
layers, ~1.05M parameters), sequence 128, batch 8.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch

STEPS, H = 60, 20


def worker(mode: str, out: str) -> None:
    torch.set_num_threads(1)
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
    from autoloco_hf.toy.llama import tiny_llama

    model = tiny_llama(
        2048, 128, 3, 4, 256, max_position_embeddings=256, seed=0, tie_word_embeddings=False
    )
    g = torch.Generator().manual_seed(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    data = [
        {"input_ids": ids, "labels": ids}
        for ids in torch.randint(0, 2048, (STEPS * 8 * world, 128), generator=g)
    ]
    times: list[float] = []
    synced: list[bool] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter())
            engine = autoloco.engine if autoloco else None
            synced.append(
                bool(
                    engine
                    and engine.totals.syncs
                    and engine.records[-1].start_step + engine.records[-1].h_step
                    == state.global_step
                )
            )

    autoloco = (
        AutoLoCoCallback(AutoLoCoConfig(method="diloco", h_base=H))
        if mode.startswith("autoloco")
        else None
    )
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=8,
        max_steps=STEPS,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1000,
    )
    callbacks = [c for c in (autoloco, Clock()) if c is not None]
    Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks).train()
    gaps = [(b - a, s) for a, b, s in zip(times, times[1:], synced[1:])][5:]
    result = {
        "mode": mode,
        "between_syncs": statistics.median(g for g, s in gaps if not s),
        "sync_steps": [g for g, s in gaps if s],
    }
    if int(os.environ.get("RANK", "0")) == 0:
        with open(os.path.join(out, f"{mode}.json"), "w") as f:
            json.dump(result, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(mode: str, out: str, nproc: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        cmd = [sys.executable, __file__, "--worker", mode, out]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_port",
            str(_free_port()),
            __file__,
            "--worker",
            mode,
            out,
        ]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    with open(os.path.join(out, f"{mode}.json")) as f:
        return json.load(f)


def main(rounds: int = 2) -> None:
    """Alternate the three runs ``rounds`` times; keep each
    one's best median (the machine may be shared)."""
    out = tempfile.mkdtemp()
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for mode, nproc in (("plain", 1), ("autoloco1", 1), ("autoloco", 2), ("ddp", 2)):
            result = launch(mode, out, nproc)
            if mode not in best or result["between_syncs"] < best[mode]["between_syncs"]:
                best[mode] = result
    plain, auto, ddp, one = best["plain"], best["autoloco"], best["ddp"], best["autoloco1"]
    print(f"plain single-process Trainer: {1 / plain['between_syncs']:.2f} steps/s")
    print(
        f"single-process Trainer + AutoLoCoCallback between syncs: {1 / one['between_syncs']:.2f} "
        f"steps/s (ratio {plain['between_syncs'] / one['between_syncs']:.3f})"
    )
    print(
        f"AutoLoCo worker between syncs: {1 / auto['between_syncs']:.2f} steps/s per worker "
        f"(ratio {plain['between_syncs'] / auto['between_syncs']:.3f}); sync steps took "
        f"{[round(s, 3) for s in auto['sync_steps']]} s"
    )
    print(
        f"DDP worker (all-reduce every step): {1 / ddp['between_syncs']:.2f} steps/s per worker "
        f"(ratio {plain['between_syncs'] / ddp['between_syncs']:.3f})"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
