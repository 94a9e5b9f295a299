"""Elastic resume at the library level: 4 workers, a fault
mid-interval, the run resumed from the last boundary snapshot.

Not a test. ``LocalWorkers`` + ``SimulatedCommunicator`` on the toy language model
of ``autoloco_hf.toy.pattern`` (CPU, a minute). A 4-worker run is stopped inside an
interval; the newest :class:`~autoloco_hf.sync.snapshot.BoundarySnapshot` is at
the boundary before it, and 3, 4 or 5 workers go on from there with fresh inner
state (AdamW moments zero, LR schedule at the boundary step, the boundary step
as data position; docs/algorithm.md#boundary-snapshots). Reported: the steps redone, and the
held-out loss at the end against the uninterrupted 4-worker run (whose spread
over model seeds is the yardstick) and against uninterrupted runs with the new
number of workers from the start. Writes the raw losses as JSON (``--out``) and
prints the table of docs/reliability.md from it::

    # runs, writes results/elastic/elastic_resume.json
    PYTHONPATH=. python benchmarks/testbeds/elastic_resume.py
    # the table from the committed JSON
    PYTHONPATH=. python benchmarks/testbeds/elastic_resume.py --report-only
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
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

STEPS, WARMUP, WORKERS = 160, 10, 4
CONFIGS = {
    "diloco": AutoLoCoConfig(method="diloco", h_base=8),
    "autoloco": AutoLoCoConfig(
        method="autoloco",
        controller="paper",
        h_base=8,
        q_h=2,
        h_max=32,
        rule_options={"calibration_intervals": 2},
    ),
}
EVAL_BATCHES = [batch_for(10_000 + k, 0) for k in range(16)]  # workers no run trains on


def runner(
    config: AutoLoCoConfig, workers: int, seed: int = 0, steps: int = STEPS, **kwargs
) -> LocalWorkers:
    return LocalWorkers(
        config,
        make_model(seed),
        SimulatedCommunicator(workers),
        optimizer_factory=adamw,
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
    model = copy.deepcopy(workers.models[0])  # at the last boundary every replica holds theta_t
    return statistics.fmean(float(model(**batch).loss) for batch in EVAL_BATCHES)


def resumed_losses(
    config: AutoLoCoConfig, seed: int, fault_step: int, steps: int = STEPS
) -> tuple[int, int, dict[int, float], int]:
    """Stop a 4-worker run after ``fault_step``; go on from
    its newest snapshot with 3, 4 and 5 workers."""
    with tempfile.TemporaryDirectory() as folder:
        faulty = advance(runner(config, WORKERS, seed, steps, snapshot_dir=folder), fault_step)
        faulty.close()
        snapshot = latest_snapshot(folder, config)
        last = faulty.engine.records[-1]
        # the last boundary
        assert snapshot is not None and snapshot.step == last.start_step + last.h_step
        redone = fault_step - snapshot.step
        # only the interval the fault cut is redone
        assert redone < faulty.engine.current_interval.h_step
        losses = {}
        for workers in (WORKERS - 1, WORKERS, WORKERS + 1):
            resumed = runner(config, workers, seed, steps)
            resumed.resume_from_snapshot(snapshot)
            losses[workers] = held_out_loss(advance(resumed, steps))
        return snapshot.step, redone, losses, os.path.getsize(snapshot.path)


def measure(fault_step: int, seeds: range, steps: int = STEPS) -> dict:
    """Every run's held-out loss: uninterrupted with 3, 4, 5
    workers, and 4 -> 3, 4, 5 from the last boundary."""
    runs = {}
    for name, config in CONFIGS.items():
        scratch = {
            str(n): [
                held_out_loss(advance(runner(config, n, seed, steps), steps)) for seed in seeds
            ]
            for n in (WORKERS - 1, WORKERS, WORKERS + 1)
        }
        results = [resumed_losses(config, seed, fault_step, steps) for seed in seeds]
        step, redone, _, size = results[0]
        runs[name] = {
            "uninterrupted": scratch,
            "resumed": {
                str(n): [r[2][n] for r in results] for n in (WORKERS - 1, WORKERS, WORKERS + 1)
            },
            "resumed_at": step,
            "steps_redone": redone,
            "snapshot_bytes": size,
        }
    parameters = sum(p.numel() for p in make_model().parameters())
    return {
        "fault_step": fault_step,
        "steps": steps,
        "seeds": list(seeds),
        "workers": WORKERS,
        "parameters": parameters,
        "runs": runs,
    }


def table(result: dict) -> str:
    """The markdown table of docs/reliability.md ("Elastic
    resume") from :func:`measure`'s result."""
    lines = [
        "| method | run | resumed at | steps redone | held-out loss, mean over seeds | "
        f"vs uninterrupted {WORKERS} workers: mean (per seed) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, run in result["runs"].items():
        scratch, reference = run["uninterrupted"], run["uninterrupted"][str(WORKERS)]
        means = " / ".join(f"{statistics.fmean(scratch[n]):.4f}" for n in sorted(scratch, key=int))
        diffs = " / ".join(
            "0"
            if n == str(WORKERS)
            else f"{statistics.fmean(scratch[n]) - statistics.fmean(reference):+.3f}"
            for n in sorted(scratch, key=int)
        )
        spread = f"seed range of {WORKERS} workers: {min(reference):.4f}-{max(reference):.4f}"
        workers = " / ".join(sorted(scratch, key=int))
        lines.append(
            f"| {name} | uninterrupted, {workers} workers | - | 0 | {means} | {diffs} ({spread}) |"
        )
        for n in sorted(run["resumed"], key=int):
            losses = run["resumed"][n]
            lines.append(
                f"| {name} | {WORKERS} -> {n} workers | {run['resumed_at']} | "
                f"{run['steps_redone']} | {statistics.fmean(losses):.4f} | "
                f"{_diffs(losses, reference)} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--fault-step", type=int, default=61, help="the 4-worker run stops after this step"
    )
    parser.add_argument("--seeds", type=int, default=3, help="model seeds 0..n-1")
    parser.add_argument(
        "--steps",
        type=int,
        default=STEPS,
        help=f"steps of every run (default {STEPS}; fewer: a smoke run)",
    )
    parser.add_argument(
        "--out", default="results/elastic/elastic_resume.json", help="raw results (JSON)"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="print the table of --out, run nothing"
    )
    args = parser.parse_args()
    # a toy model: more threads only wait on each other (7x the CPU time on 2 loaded cores)
    torch.set_num_threads(1)
    if not args.report_only:
        if not 0 < args.fault_step < args.steps:
            parser.error(
                f"--fault-step {args.fault_step}: pass 0 < fault step < --steps ({args.steps})"
            )
        result = measure(args.fault_step, range(args.seeds), args.steps)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    with open(args.out) as f:
        result = json.load(f)
    print(table(result))
    for name, run in result["runs"].items():
        print(
            f"\n{name}: {result['parameters']} parameters (FP32); the boundary snapshot file: "
            f"{run['snapshot_bytes']} bytes"
        )


def _diffs(losses: list[float], reference: list[float]) -> str:
    diffs = [a - b for a, b in zip(losses, reference)]
    return f"{statistics.fmean(diffs):+.4f} ({', '.join(f'{d:+.4f}' for d in diffs)})"


if __name__ == "__main__":
    main()
