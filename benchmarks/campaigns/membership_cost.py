"""What a change of membership costs in final loss, cause by
cause: the redo, AdamW's state, a worker fewer.

Not a test. ``LocalWorkers`` + ``SimulatedCommunicator`` (CPU, a few minutes) on a tiny Llama
(2 layers, hidden 32, the 32-token pattern data of ``autoloco_hf.toy.pattern``), DiLoCo at H 8, 4
workers, 160 steps, cosine LR 1e-2 with 10 warm-up steps. A fault after step 61 cuts the interval
that began at the boundary of step 56; every variant goes on from that boundary (``theta_t``, outer
momentum, LR schedule, the data of step 56 on: each worker reads the same batches as in the
uninterrupted run) and differs in one thing at a time:

* the AdamW state each worker goes on with: the one it had at the boundary (exact), the one it
  had after the cut steps (what live membership keeps), or none (fresh moments: the restart
  path, which reads the boundary snapshot);
* the workers: 4 again, or 3 (worker 3 lost).

Each variant's final held-out loss (16 batches no worker trains on) is paired per seed with the
uninterrupted 4-worker run; the seed spread of that run is the yardstick. Raw losses:
``results/elastic/membership_cost.json``::

    PYTHONPATH=. python benchmarks/campaigns/membership_cost.py
    PYTHONPATH=. python benchmarks/campaigns/membership_cost.py --report-only
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile

import torch

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.snapshot import latest_snapshot
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.llama import tiny_llama
from autoloco_hf.toy.pattern import VOCAB, batch_for, cosine

STEPS, WARMUP, WORKERS, FAULT_STEP = 160, 10, 4, 61
CONFIG = AutoLoCoConfig(method="diloco", h_base=8)
EVAL_BATCHES = [batch_for(10_000 + k, 0) for k in range(16)]  # workers no run trains on
ADAMW = ("exact", "after_cut", "fresh")  # the AdamW state each worker goes on with
DEFAULT_OUT = "results/elastic/membership_cost.json"


def runner(workers: int, seed: int, steps: int = STEPS, **kwargs) -> LocalWorkers:
    return LocalWorkers(
        CONFIG,
        tiny_llama(
            VOCAB, 32, 2, 4, 64, max_position_embeddings=32, seed=seed, tie_word_embeddings=False
        ),
        SimulatedCommunicator(workers),
        optimizer_factory=lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01),
        scheduler_factory=cosine(steps, WARMUP),
        total_steps=steps,
        warmup_steps=WARMUP,
        **kwargs,
    )


def advance(workers: LocalWorkers, until: int) -> LocalWorkers:
    while workers.step < until:
        workers.train_step(
            [batch_for(w, workers.step, padded=True) for w in range(len(workers.models))]
        )
    return workers


@torch.no_grad()
def held_out_loss(workers: LocalWorkers) -> float:
    model = workers.models[0]  # at the last boundary every replica holds theta_t
    return statistics.fmean(float(model(**batch).loss) for batch in EVAL_BATCHES)


def seed_losses(seed: int, fault_step: int, steps: int = STEPS) -> dict[str, float]:
    """The uninterrupted runs (3 and 4 workers) and every
    variant resumed from the boundary before ``fault_step``."""
    losses = {
        "uninterrupted_4": held_out_loss(advance(runner(WORKERS, seed, steps), steps)),
        "uninterrupted_3": held_out_loss(advance(runner(WORKERS - 1, seed, steps), steps)),
    }
    with tempfile.TemporaryDirectory() as folder:
        faulty = runner(WORKERS, seed, steps, snapshot_dir=folder)
        boundary = None
        while faulty.step < fault_step:  # the AdamW states at each boundary, the last one kept
            advance(faulty, faulty.step + 1)
            if (
                faulty.engine.records
                and faulty.engine.records[-1].start_step + faulty.engine.records[-1].h_step
                == faulty.step
            ):
                boundary = [copy.deepcopy(o.state_dict()) for o in faulty.optimizers]
        faulty.close()
        snapshot = latest_snapshot(folder, CONFIG)
        states = {
            "exact": boundary,
            "after_cut": [copy.deepcopy(o.state_dict()) for o in faulty.optimizers],
        }
        for workers in (WORKERS, WORKERS - 1):
            for adamw in ADAMW:
                resumed = runner(workers, seed, steps)
                resumed.resume_from_snapshot(snapshot)
                # the survivors' own states (workers 0 .. n-1); the lost worker's is gone
                if adamw != "fresh":
                    for optimizer, scheduler, state in zip(
                        resumed.optimizers, resumed.schedulers, states[adamw]
                    ):
                        optimizer.load_state_dict(state)
                        for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
                            # the boundary's (a state saved later holds a later one)
                            group["lr"] = lr
                losses[f"{WORKERS}_to_{workers}_{adamw}"] = held_out_loss(advance(resumed, steps))
    return losses


def report(result: dict) -> str:
    runs = result["losses"]
    reference = [r["uninterrupted_4"] for r in runs]
    labels = {
        "uninterrupted_3": "3 workers from the start",
        **{f"{WORKERS}_to_{n}_{a}": f"{WORKERS} -> {n} workers, AdamW {a.replace('_', ' ')}"
           for n in (WORKERS, WORKERS - 1) for a in ADAMW},
    }  # fmt: skip
    lines = [
        f"| run (fault after step {result['fault_step']}, resumed at {result['resumed_at']}) | "
        f"held-out loss, mean | minus uninterrupted {WORKERS} workers: mean ± s.e. | per seed |",
        "| --- | --- | --- | --- |",
        f"| uninterrupted, {WORKERS} workers | {statistics.fmean(reference):.4f} | 0 | seed range "
        f"{min(reference):.4f}-{max(reference):.4f} (sd "
        f"{statistics.stdev(reference) if len(runs) > 1 else 0:.4f}) |",
    ]
    for key, label in labels.items():
        diffs = [r[key] - r["uninterrupted_4"] for r in runs]
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0
        lines.append(
            f"| {label} | {statistics.fmean(r[key] for r in runs):.4f} | "
            f"{statistics.fmean(diffs):+.4f} ± {se:.4f} | {', '.join(f'{d:+.4f}' for d in diffs)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="model seeds 0..n-1")
    parser.add_argument("--steps", type=int, default=STEPS, help="steps of every run")
    parser.add_argument("--fault-step", type=int, default=FAULT_STEP)
    parser.add_argument("--out", default=DEFAULT_OUT, help="raw losses (JSON)")
    parser.add_argument(
        "--report-only", action="store_true", help="print the table of --out, run nothing"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.report_only:
        if not CONFIG.h_base < args.fault_step < args.steps:
            parser.error(
                f"--fault-step {args.fault_step}: pass {CONFIG.h_base} < fault step < "
                f"--steps {args.steps}"
            )
        losses = [seed_losses(seed, args.fault_step, args.steps) for seed in range(args.seeds)]
        resumed_at = args.fault_step - args.fault_step % CONFIG.h_base
        result = {
            "fault_step": args.fault_step,
            "resumed_at": resumed_at,
            "steps": args.steps,
            "losses": losses,
        }
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    with open(args.out) as f:
        print(report(json.load(f)))


if __name__ == "__main__":
    main()
