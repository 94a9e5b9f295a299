"""Validation loss of the overlapped variants (docs/algorithm.md#overlap)
vs blocking AutoLoCo and DiLoCo, paired seeds.

Not a test. Trains the demo's tiny Llama (``autoloco_hf.toy``) on
Python's ``pydoc_data.topics`` with ``LocalWorkers`` + ``SimulatedCommunicator``
(nothing downloaded). Every variant of a seed starts from the same
initialization and reads the same batches, so differences are paired. The
simulation applies each average at the step it is due, so the loss numbers are
the ones a real overlapped run gets; wall time on a link is not measured here.

    python benchmarks/campaigns/overlap_quality.py --seeds 0,1,2 --out results/overlap \\
        --report docs/results_overlap.md

Each finished run is one JSON file in ``--out`` (committed under results/overlap); a rerun reuses
them, so the report regenerates without training.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from autoloco_hf.algorithm.schedule import warmup_cosine
from autoloco_hf.config import AutoLoCoConfig

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "diloco": ("DiLoCo, outer momentum 0.9, blocking", dict(method="diloco")),
    "autoloco": (
        "AutoLoCo, blocking (the reference of the paired differences)",
        dict(method="autoloco", controller="paper"),
    ),
    "autoloco_delayed": (
        "AutoLoCo + delayed merge (tau 1, alpha 0.5)",
        dict(
            method="autoloco",
            controller="paper",
            overlap="delayed",
            overlap_steps=1,
            overlap_mix=0.5,
        ),
    ),
    "autoloco_delayed_a0": (
        "AutoLoCo + delayed merge (tau 1, alpha 0)",
        dict(
            method="autoloco",
            controller="paper",
            overlap="delayed",
            overlap_steps=1,
            overlap_mix=0.0,
        ),
    ),
    "autoloco_eager": (
        "AutoLoCo + eager update (controller one interval late)",
        dict(method="autoloco", controller="paper", overlap="eager"),
    ),
    "diloco_eager": (
        "DiLoCo (momentum 0.9) + eager update",
        dict(method="diloco", overlap="eager"),
    ),
    # a merge later than q_H - 1 steps needs intervals of at
    # least h_min steps: without the token mapper
    "autoloco_fixed_tokens": (
        "AutoLoCo without the token mapper, blocking (the reference of the tau 3 rows)",
        dict(method="autoloco", controller="paper", map_tokens=False),
    ),
    "autoloco_delayed_tau3": (
        "AutoLoCo without the token mapper + delayed merge (tau 3, alpha 0.5)",
        dict(
            method="autoloco",
            controller="paper",
            map_tokens=False,
            overlap="delayed",
            overlap_steps=3,
            overlap_mix=0.5,
        ),
    ),
    "autoloco_int8_delayed_tau3": (
        "as autoloco_delayed_tau3, INT8 wire",
        dict(
            method="autoloco",
            controller="paper",
            map_tokens=False,
            overlap="delayed",
            overlap_steps=3,
            wire_dtype="int8",
        ),
    ),
}
SEQ_LEN, BATCH, PEAK_LR, WEIGHT_DECAY = 64, 4, 2e-3, 0.01
VOCAB, HIDDEN, LAYERS, HEADS = 1024, 64, 2, 4
EVAL_BATCH = 32


def run_variant(name: str, args: argparse.Namespace, seed: int, data: Any) -> dict[str, Any]:
    from autoloco_hf.sync.communicators import make_communicator
    from autoloco_hf.sync.workers.local_workers import LocalWorkers
    from autoloco_hf.toy.llama import tiny_llama
    from autoloco_hf.toy.text import WindowSampler, eval_windows, mean_loss

    warmup = max(1, round(0.02 * args.steps))
    fields = VARIANTS[name][1]
    # only AutoLoCo's horizons round to q_H
    grid = {"q_h": args.q_h} if fields["method"] == "autoloco" else {}
    config = AutoLoCoConfig(h_base=args.h_base, warmup_steps=warmup, **grid, **fields)
    schedule = warmup_cosine(1.0, warmup, args.steps)
    model = tiny_llama(VOCAB, HIDDEN, LAYERS, HEADS, max_position_embeddings=SEQ_LEN, seed=seed)
    workers = LocalWorkers(
        config,
        model,
        make_communicator(config, distributed=False, simulated_workers=args.workers),
        optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=PEAK_LR, weight_decay=WEIGHT_DECAY),
        scheduler_factory=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule.lr_at),
        total_steps=args.steps,
    )
    sampler = WindowSampler(data.train, SEQ_LEN, BATCH, args.workers, seed=seed)
    started = time.perf_counter()
    for _ in range(args.steps):
        workers.train_step(sampler.next_batches())
    wall = time.perf_counter() - started
    records = workers.engine.records
    return {
        "variant": name,
        "seed": seed,
        "val_loss": mean_loss(workers.models[0], eval_windows(data.val, SEQ_LEN, EVAL_BATCH)),
        "syncs": workers.engine.totals.syncs,
        "skipped_outer_steps": workers.engine.totals.skipped_outer_steps,
        "stale": sum(1 for r in records if str(r.assessment) == "stale"),
        "mean_h_step": statistics.fmean(r.h_step for r in records),
        "wall_seconds": wall,
    }


def report(
    results: list[dict[str, Any]], variants: list[str], command: str, args: argparse.Namespace
) -> str:
    by = {(r["variant"], r["seed"]): r for r in results}
    seeds = sorted({r["seed"] for r in results})
    lines = [
        "# Overlapped synchronization: validation loss (issue 15)",
        "",
        f"Command: `{command}`",
        "",
        f"Tiny Llama (hidden {HIDDEN}, {LAYERS} layers, vocabulary {VOCAB}) on "
        f"`pydoc_data.topics`, {args.workers} simulated workers, batch {BATCH} x {SEQ_LEN} per "
        f"worker, {args.steps} steps, AdamW {PEAK_LR:g}, 2% warm-up then cosine, H_base "
        f"{args.h_base}, q_H {args.q_h}; seeds {', '.join(map(str, seeds))} (each seed: same "
        "initialization and batches for every variant). Paired difference = variant minus "
        "blocking AutoLoCo of the same seed; 'paired std' is the standard deviation of those "
        "differences over seeds. The simulation applies every average at the step it is due, so "
        "these losses are those of a real overlapped run; wall time on a bandwidth-limited link "
        "is measured by benchmarks/testbeds/wan.py (docs/benchmarks.md).",
        "",
        "| variant | val loss (mean ± std) | paired diff vs AutoLoCo (mean ± std) | syncs | mean "
        "H_step | stale intervals |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for v in variants:
        rows = [by[(v, s)] for s in seeds if (v, s) in by]
        if not rows:
            continue
        losses = [r["val_loss"] for r in rows]
        diffs = [
            by[(v, s)]["val_loss"] - by[("autoloco", s)]["val_loss"]
            for s in seeds
            if (v, s) in by and ("autoloco", s) in by
        ]

        def std(xs):
            return statistics.stdev(xs) if len(xs) > 1 else float("nan")

        lines.append(
            f"| {v} ({VARIANTS[v][0]}) | {statistics.fmean(losses):.4f} ± {std(losses):.4f} | "
            f"{statistics.fmean(diffs):+.4f} ± {std(diffs):.4f} | "
            f"{statistics.fmean(r['syncs'] for r in rows):.1f} | "
            f"{statistics.fmean(r['mean_h_step'] for r in rows):.2f} | "
            f"{statistics.fmean(r['stale'] for r in rows):.1f} |"
        )
    lines += [
        "",
        "Per run:",
        "",
        "| variant | seed | val loss | syncs | wall s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in sorted(results, key=lambda r: (variants.index(r["variant"]), r["seed"])):
        lines.append(
            f"| {r['variant']} | {r['seed']} | {r['val_loss']:.4f} | {r['syncs']} | "
            f"{r['wall_seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--h-base", type=int, default=20)
    parser.add_argument(
        "--q-h", type=int, default=2, help="2 so that the delayed merge (tau 1 < q_H) is admissible"
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default="results/overlap")
    parser.add_argument("--report", help="markdown file for the table (default: print only)")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, data = [], None
    for seed in [int(s) for s in args.seeds.split(",")]:
        for v in variants:  # interleaved: the machine's speed drifts
            path = out / f"{v}_seed{seed}.json"
            if path.exists():
                results.append(json.loads(path.read_text()))
                continue
            # built only when something is left to train: a report of finished runs needs none
            if data is None:
                from autoloco_hf.toy.text import corpus_documents, split_tokens, train_tokenizer

                documents = corpus_documents()
                data = split_tokens(train_tokenizer("\n\n".join(documents), VOCAB), documents)
            result = run_variant(v, args, seed, data)
            path.write_text(json.dumps(result))
            results.append(result)
            print(json.dumps(result), flush=True)
    command = shlex.join(["python", "benchmarks/campaigns/overlap_quality.py", *argv])
    text = report(results, variants, command, args)
    print(text)
    if args.report:
        Path(args.report).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
