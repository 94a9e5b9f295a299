"""Workers of unequal speed on real gloo processes, timed by
the wall clock (docs/algorithm.md#pacing).

Not a test. ``--workers`` processes (one worker each, ``LocalWorkers`` on a
``ProcessGroupCommunicator`` over loopback gloo) train the tiny model of
``benchmarks/campaigns/unequal_speeds.py`` with DiLoCo, in lockstep and with
``pacing="budget"``. Every inner step sleeps ``--delay-ms`` (an injected delay per
step, standing for a step's compute), and the last rank sleeps twice as long: it
runs at half speed. Budget pacing measures every worker's speed with the wall
clock (no virtual clock), so this checks the mechanism end to end::

    python benchmarks/campaigns/unequal_speeds_processes.py \\
        --out results/unequal_speeds/processes.json

Writes one JSON object (one entry per pacing: wall seconds, tokens, tokens per
second, final validation loss, the last interval's steps per worker) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

# benchmarks/: its kinds import as packages
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the source, the model and the batches are that benchmark's
from campaigns import unequal_speeds  # noqa: E402

from autoloco_hf import AutoLoCoConfig  # noqa: E402
from autoloco_hf.algorithm.schedule import warmup_cosine  # noqa: E402
from autoloco_hf.config import Pacing  # noqa: E402
from autoloco_hf.sync.communicators import ProcessGroupCommunicator  # noqa: E402
from autoloco_hf.sync.workers.local_workers import LocalWorkers  # noqa: E402


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(
    rank: int, world: int, port: int, pacing: str, args: argparse.Namespace, out_dir: str
) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    delay = args.delay_ms / 1000 * (2 if rank == world - 1 else 1)

    def loss_fn(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        time.sleep(delay)  # the injected delay of one inner step
        return model(**batch).loss

    schedule = warmup_cosine(1.0, args.steps // 50, args.steps)
    torch.manual_seed(args.seed)
    runner = LocalWorkers(
        AutoLoCoConfig(
            method="diloco", h_base=args.h_base, pacing=pacing, warmup_steps=args.steps // 50
        ),
        unequal_speeds.TinyLM(),
        ProcessGroupCommunicator(),
        optimizer_factory=lambda ps: torch.optim.AdamW(
            ps, lr=unequal_speeds.PEAK_LR, weight_decay=0.0
        ),
        scheduler_factory=lambda o: torch.optim.lr_scheduler.LambdaLR(o, schedule.lr_at),
        total_steps=args.steps,
        loss_fn=loss_fn,
    )
    source = unequal_speeds.MarkovSource()
    streams = unequal_speeds.Streams(source, world, args.seed)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(args.steps):
        if pacing == Pacing.BUDGET:
            runner.train_paced(lambda _: streams(rank))
        else:
            runner.train_step([streams(rank)])
    dist.barrier()
    wall = time.perf_counter() - started
    if rank == 0:
        val = source.sequences(args.val_sequences, torch.Generator().manual_seed(999_999))
        with torch.no_grad():
            val_loss = float(runner.models[0](input_ids=val).loss)
        records = runner.engine.records
        tokens = sum(r.tokens for r in records)
        result = {
            "pacing": pacing,
            "wall_seconds": wall,
            "tokens": tokens,
            "tokens_per_second": tokens / wall,
            "final_val_loss": val_loss,
            "syncs": len(records),
            "last_worker_steps": records[-1].worker_steps,
            "stragglers": sorted({s for r in records for s in (r.stragglers or [])}),
        }
        torch.save(result, os.path.join(out_dir, "result.pt"))
    dist.barrier()
    dist.destroy_process_group()


def run(pacing: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            worker,
            (args.workers, free_port(), pacing, args, out_dir),
            nprocs=args.workers,
            start_method="spawn",
        )
        return torch.load(os.path.join(out_dir, "result.pt"))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/unequal_speeds/processes.json")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--h-base", type=int, default=10)
    parser.add_argument(
        "--delay-ms", type=float, default=50.0, help="sleep per inner step (the last rank: twice)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-sequences", type=int, default=256)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = {str(pacing): run(str(pacing), args) for pacing in (Pacing.LOCKSTEP, Pacing.BUDGET)}
    lock, budget = results[str(Pacing.LOCKSTEP)], results[str(Pacing.BUDGET)]
    summary = {
        "workers": args.workers,
        "steps": args.steps,
        "h_base": args.h_base,
        "delay_ms": args.delay_ms,
        "runs": results,
        "throughput_ratio": budget["tokens_per_second"] / lock["tokens_per_second"],
        "wall_ratio": lock["wall_seconds"] / budget["wall_seconds"],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print("| pacing | wall s | tokens/s | final val loss | last interval's steps per worker |")
    print("| --- | --- | --- | --- | --- |")
    for pacing, r in results.items():
        print(
            f"| {pacing} | {r['wall_seconds']:.2f} | {r['tokens_per_second']:.0f} | "
            f"{r['final_val_loss']:.4f} | {r['last_worker_steps']} |"
        )
    print(
        f"budget / lockstep: {summary['throughput_ratio']:.2f}x tokens/s, "
        f"{summary['wall_ratio']:.2f}x shorter"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
