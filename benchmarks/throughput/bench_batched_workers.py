"""Seconds per optimizer step of N simulated workers: the per-worker loop against the batched step.

Not a test. Trains the tiny Llama of ``benchmarks/campaigns/replicate.py`` (batch 2 x 64 tokens per
worker, AdamW, DiLoCo at H 10, so every tenth step includes a sync) with
:class:`~autoloco_hf.sync.workers.local_workers.LocalWorkers` (``loop``),
``LocalWorkers(..., batched=True)`` (``batched``) and, with
``--compile``, the batched step's vmapped loss under ``torch.compile`` (``compiled``). The
variants alternate block by block (one block = one interval of 10 steps), so a shared
machine's load hits all of them alike; the JSON keeps every block's seconds per step::

    python benchmarks/throughput/bench_batched_workers.py --sizes 64x2 128x4 --repeats 3 \\
        --compile --json results/batched_workers/cpu.json
    python benchmarks/throughput/bench_batched_workers.py \\
        --from-json results/batched_workers/cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.demo import PEAK_LR, SEQ_LEN, WEIGHT_DECAY, scaled_config
from autoloco_hf.toy.llama import tiny_llama

VOCAB, HEADS, BATCH, H = 1024, 4, 2, 10  # replicate.py's model and batch; DiLoCo at H_base 10
VARIANTS = ("loop", "batched", "compiled")
WARMUP_BLOCKS = 1  # the allocator's first steps, and the compile of ``compiled``


def parse_size(text: str) -> tuple[int, int]:
    hidden, _, layers = text.partition("x")
    return int(hidden), int(layers)


def make_runner(variant: str, hidden: int, layers: int, workers: int, steps: int) -> LocalWorkers:
    model = tiny_llama(VOCAB, hidden, layers, HEADS, max_position_embeddings=SEQ_LEN)
    runner = LocalWorkers(
        scaled_config("diloco", steps, H),
        model,
        SimulatedCommunicator(workers),
        optimizer_factory=lambda p: torch.optim.AdamW(p, lr=PEAK_LR, weight_decay=WEIGHT_DECAY),
        total_steps=steps,
        batched=variant != "loop",
    )
    return runner


def compile_losses(runner: LocalWorkers, batches: Sequence[Any]) -> None:
    """Build the batched step's vmapped loss (one step), then wrap it in ``torch.compile``."""
    runner.train_step(batches)
    runner.replicas._losses = torch.compile(runner.replicas._losses)


def random_batches(workers: int, generator: torch.Generator) -> list[dict[str, torch.Tensor]]:
    out = []
    for _ in range(workers):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ_LEN), generator=generator)
        out.append({"input_ids": ids, "labels": ids})
    return out


def measure(args: argparse.Namespace, command: str) -> dict[str, Any]:
    variants = [v for v in VARIANTS if v != "compiled" or args.compile]
    steps = (args.repeats + WARMUP_BLOCKS) * H + 10  # a margin for compile_losses' step
    generator = torch.Generator().manual_seed(0)
    result: dict[str, Any] = dict(
        command=command,
        workers=args.workers,
        threads=args.threads,
        batch=BATCH,
        seq_len=SEQ_LEN,
        h=H,
        sizes={},
    )
    for hidden, layers in args.sizes:
        runners = {v: make_runner(v, hidden, layers, args.workers, steps) for v in variants}
        if "compiled" in runners:
            compile_losses(runners["compiled"], random_batches(args.workers, generator))
        params = sum(p.numel() for p in runners["loop"].models[0].parameters())
        seconds: dict[str, list[float]] = {v: [] for v in variants}
        for block in range(args.repeats + WARMUP_BLOCKS):
            for variant, runner in runners.items():
                data = [random_batches(args.workers, generator) for _ in range(H)]
                started = time.perf_counter()
                for batches in data:
                    runner.train_step(batches)
                if block >= WARMUP_BLOCKS:
                    seconds[variant].append((time.perf_counter() - started) / H)
        result["sizes"][f"{hidden}x{layers}"] = dict(
            hidden=hidden, layers=layers, params=params, seconds=seconds
        )
        result["load_average"] = os.getloadavg()  # at the end of the last size measured
        print(table(result), flush=True)
        if args.json:  # after every size: a run cut short keeps what it measured
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


def table(result: dict[str, Any]) -> str:
    rows = [
        "| model | params | variant | s per step (median) | range | loop / variant (median) |",
        "|---|---|---|---|---|---|",
    ]
    for size in result["sizes"].values():
        loop = statistics.median(size["seconds"]["loop"])
        for variant, values in size["seconds"].items():
            median = statistics.median(values)
            rows.append(
                f"| hidden {size['hidden']}, {size['layers']} layers | {size['params'] / 1e6:.2f}M "
                f"| {variant} | {median:.4f} | {min(values):.4f}-{max(values):.4f} "
                f"| {loop / median:.2f}x |"
            )
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", nargs="+", default=["64x2", "128x4"], help="HIDDENxLAYERS (default 64x2 128x4)"
    )
    p.add_argument("--workers", type=int, default=8, help="simulated workers (default 8)")
    p.add_argument(
        "--repeats", type=int, default=3, help="timed blocks of 10 steps per variant (default 3)"
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1, as the campaigns)"
    )
    p.add_argument(
        "--compile", action="store_true", help="also time the batched step under torch.compile"
    )
    p.add_argument("--json", help="write the raw seconds here")
    p.add_argument("--from-json", help="print the table of a saved run; train nothing")
    args = p.parse_args(argv)
    try:
        args.sizes = [parse_size(s) for s in args.sizes]
    except ValueError:
        p.exit(
            2,
            f"bench_batched_workers: --sizes {' '.join(args.sizes)}: pass "
            "HIDDENxLAYERS, e.g. 64x2 128x4\n",
        )
    for flag, value in (
        ("--workers", args.workers),
        ("--repeats", args.repeats),
        ("--threads", args.threads),
    ):
        if value < 1:
            p.exit(2, f"bench_batched_workers: {flag} {value}: pass a positive integer\n")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        print(table(json.loads(Path(args.from_json).read_text())))
        return 0
    torch.set_num_threads(args.threads)
    # SDPA falls back to a loop under vmap
    warnings.filterwarnings("ignore", message=".*batching rule.*")
    measure(
        args,
        " ".join(
            ["python", "benchmarks/throughput/bench_batched_workers.py", *(argv or sys.argv[1:])]
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
