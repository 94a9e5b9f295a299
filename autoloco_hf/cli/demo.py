"""``autoloco demo``: DiLoCo vs AutoLoCo on a laptop CPU, with nothing downloaded.

Trains a tiny Llama (built from a config) on Python's own documentation text
(``pydoc_data.topics``) with a BPE tokenizer trained on the spot, once per
method, with ``N`` simulated workers (:class:`~autoloco_hf.sync.workers.local_workers.LocalWorkers`
+ :class:`~autoloco_hf.sync.communicators.SimulatedCommunicator`). Every method starts from
the same initialization and sees the same batches in the same order, so the
differences in the table are the methods' own.

The recipe is the paper's C4 recipe scaled down with the same ratios:
``H_base = steps / 100``, warm-up 2% of the steps then cosine decay,
``q_H = H_base / 10``, ``H_max = 1.5 H_base``. The default (1,000 steps,
4 workers, 5 methods) needs about 6 minutes of CPU time on one thread
(measured 2026-12-04: 380 s CPU, 6 min 22 s wall, 521 MB peak memory; ``results/demo``).

    $ autoloco demo
    $ autoloco demo --steps 2000 --methods ddp,diloco,diloco_mu07,autoloco,qsr,linear --out runs/big
    $ autoloco demo --methods diloco_mu05,autoloco_descent   # the default and its comparator

The run folder holds ``report.md`` (tables, command, plots), one sub-folder
per method (``intervals.jsonl``, ``steps.jsonl``, ``summary.json``, see
:mod:`autoloco_hf.state.run_folder`) and the PNG plots. The methods, the scale
and the training loop are in :mod:`autoloco_hf.toy.demo`.
"""

from __future__ import annotations

import argparse
import shlex
import time

import torch

from autoloco_hf.cli.report import table1, write_report
from autoloco_hf.config import ConfigError, Method
from autoloco_hf.state.run_folder import find_runs
from autoloco_hf.toy.demo import (
    BATCH_SIZE,
    HIDDEN,
    LAYERS,
    METHODS,
    PEAK_LR,
    SEQ_LEN,
    build_setup,
    scaled_config,
    train_method,
    warmup_steps,
)
from autoloco_hf.usage import new_file_path, positive_int, usage_error

# each rule beside DiLoCo at its momentum
DEFAULT_METHODS = "diloco,diloco_mu07,autoloco,diloco_mu05,autoloco_descent"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=1000,
        help="optimizer steps per method (default 1000, at least 10)",
    )
    parser.add_argument(
        "--workers", type=positive_int, default=4, help="simulated workers (default 4)"
    )
    parser.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help=f"comma-separated, from {', '.join(METHODS)} (default {DEFAULT_METHODS})",
    )
    parser.add_argument(
        "--out", type=new_file_path, help="run folder (default runs/demo-<UTC timestamp>)"
    )
    parser.add_argument(
        "--h-base", type=positive_int, help="recipe horizon H_base (default steps/100, at least 2)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the initialization and the data order"
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch CPU threads (default 1: for a model this small, intra-op threads "
        "cost more than they give)",
    )


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        usage_error(
            f"--methods {args.methods}: unknown method(s) {unknown}; choose "
            f"from {', '.join(METHODS)}",
            "autoloco demo",
        )
    if args.steps < 10:
        usage_error(
            f"--steps {args.steps}: pass at least 10 (warm-up and one interval need room)",
            "autoloco demo",
        )
    if args.h_base is None:
        args.h_base = max(2, args.steps // 100)
    args.out = args.out or time.strftime("runs/demo-%Y%m%d-%H%M%S", time.gmtime())
    torch.set_num_threads(args.threads)
    command = shlex.join(
        [
            "autoloco",
            "demo",
            "--steps",
            str(args.steps),
            "--workers",
            str(args.workers),
            "--methods",
            ",".join(methods),
            "--h-base",
            str(args.h_base),
            "--seed",
            str(args.seed),
            "--out",
            args.out,
        ]
    )
    try:  # fail on a bad scale before training
        configs = {m: scaled_config(m, args.steps, args.h_base) for m in methods}
    except ConfigError as err:
        usage_error(f"--h-base {args.h_base} with --steps {args.steps}: {err}", "autoloco demo")

    started, cpu_started = time.perf_counter(), time.process_time()
    setup = build_setup(args.seed)
    with tqdm(
        total=len(methods) * args.steps, unit="step", dynamic_ncols=True, mininterval=1.0
    ) as bar:
        for name in methods:
            train_method(name, configs[name], setup, args, bar)
    total, cpu = time.perf_counter() - started, time.process_time() - cpu_started

    runs = find_runs([f"{args.out}/{m}" for m in methods])
    first = next(iter(configs.values()))
    h_max = ", ".join(
        f"{c.h_max} ({name})" for name, c in configs.items() if c.method == Method.AUTOLOCO
    )
    notes = (
        f"Tiny Llama ({setup.num_params:,} parameters, {LAYERS} layers, hidden {HIDDEN}, BPE "
        f"vocabulary {len(setup.tokenizer)} trained locally) on Python's `pydoc_data.topics` "
        f"({setup.splits.train.numel():,} training / {setup.splits.val.numel():,} held-out "
        f"validation tokens); {args.workers} simulated workers, batch {BATCH_SIZE} x {SEQ_LEN} "
        f"tokens per worker, {args.steps} steps, AdamW {PEAK_LR:g} with {warmup_steps(args.steps)} "
        f"warm-up steps then cosine; H_base {first.h_base}, q_H "
        f"{first.q_h}{f', H_max {h_max}' if h_max else ''}; seed {args.seed}, same initialization "
        f"and data order for every method. Total wall time {total:.0f} s, CPU time {cpu:.0f} s "
        "(with tokenizer training and validation; CPU time well below wall time means "
        "the machine was shared)."
    )
    path = write_report(runs, args.out, "autoloco demo", command, notes=notes)
    print(table1(runs))
    print(f"\nwall time {total:.0f} s, CPU time {cpu:.0f} s; report: {path}")
    return 0
