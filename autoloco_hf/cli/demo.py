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
    $ autoloco demo --methods diloco_mu05,autoloco_descent              # the default and its comparator

The run folder holds ``report.md`` (tables, command, plots), one sub-folder
per method (``intervals.jsonl``, ``steps.jsonl``, ``summary.json``, see
:mod:`autoloco_hf.cli.report`) and the PNG plots.
"""

from __future__ import annotations

import argparse
import shlex
import time
from dataclasses import dataclass
from typing import Any

import torch

from autoloco_hf.cli import new_file_path, positive_int, usage_error
from autoloco_hf.cli.report import RunWriter, find_runs, table1, write_report
from autoloco_hf.config import AutoLoCoConfig, ConfigError, Controller, Method, nest_rule_options

# name -> (what it is, AutoLoCoConfig fields)
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "ddp": ("gradient all-reduce every step", dict(method=Method.DDP)),
    "diloco": ("DiLoCo, outer Nesterov momentum 0.9 (the paper's baseline)", dict(method=Method.DILOCO)),
    "diloco_mu07": (
        "DiLoCo at outer momentum 0.7, the paper rule's base momentum (its fair comparator)",
        dict(method=Method.DILOCO, outer_momentum=0.7),
    ),
    "diloco_mu05": (
        "DiLoCo at outer momentum 0.5, the default rule's base momentum (its fair comparator)",
        dict(method=Method.DILOCO, outer_momentum=0.5),
    ),
    "autoloco": (
        "AutoLoCo with the paper's horizon rule + outer correction",
        dict(method=Method.AUTOLOCO, controller=Controller.PAPER),
    ),
    "autoloco_descent": (
        "AutoLoCo at its defaults: the descent rule (starts at 2 H_base, shortens as C_t falls; outer momentum 0.5)",
        dict(method=Method.AUTOLOCO, controller=Controller.DESCENT),
    ),
    "qsr": ("QSR: H = max(H_base, (alpha/lr)^2), model averaging", dict(method=Method.QSR)),
    "linear": ("Linear Interval: H_k = a k, model averaging", dict(method=Method.LINEAR)),
}
DEFAULT_METHODS = "diloco,diloco_mu07,autoloco,diloco_mu05,autoloco_descent"  # each rule beside DiLoCo at its momentum

# The spec's CPU prototype (section 10): batch 8 x 64 per worker, AdamW 2e-3.
BATCH_SIZE, SEQ_LEN, PEAK_LR, WEIGHT_DECAY = 8, 64, 2e-3, 0.01
VOCAB_SIZE, HIDDEN, LAYERS, HEADS = 1024, 96, 2, 4  # ~394k parameters, ~30 ms of CPU per worker step
WARMUP_FRACTION = 0.02
EVAL_BATCH = 32


@dataclass
class DemoSetup:
    """Everything the methods share: tokenizer, token splits and the one initial model."""

    tokenizer: Any
    splits: Any
    model: torch.nn.Module

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def build_setup(seed: int) -> DemoSetup:
    from autoloco_hf.cli.demo_data import corpus_documents, split_tokens, tiny_llama, train_tokenizer

    documents = corpus_documents()
    tokenizer = train_tokenizer("\n\n".join(documents), VOCAB_SIZE)
    splits = split_tokens(tokenizer, documents)
    model = tiny_llama(len(tokenizer), HIDDEN, LAYERS, HEADS, max_position_embeddings=SEQ_LEN, seed=seed)
    return DemoSetup(tokenizer, splits, model)


def method_of(name: str) -> Method:
    """The ``AutoLoCoConfig.method`` of the demo method ``name`` (only AutoLoCo's horizons round to ``q_H``)."""
    return METHODS[name][1]["method"]


def scaled_config(method: str, steps: int, h_base: int, **overrides: Any) -> AutoLoCoConfig:
    """The method's config at the demo scale (``q_H`` and ``H_max`` follow ``H_base`` by default).

    ``overrides`` are further ``AutoLoCoConfig`` fields (ablation switches, wire dtype, ``h_max``); rule
    options may keep their old flat spellings (``descent_gain=0.9``, :func:`~autoloco_hf.config.nest_rule_options`).
    """
    fields = dict(METHODS[method][1])
    if fields["method"] == Method.LINEAR:  # the paper's Linear Interval runs 100 intervals in 50k steps (a = 10)
        fields["linear_increment"] = max(1, round(10 * steps / 50_000))
    fields.update(overrides)
    return AutoLoCoConfig(h_base=h_base, warmup_steps=warmup_steps(steps), **nest_rule_options(fields))


def warmup_steps(steps: int) -> int:
    return max(1, round(WARMUP_FRACTION * steps))


def train_method(
    name: str,
    config: AutoLoCoConfig,
    setup: DemoSetup,
    args: argparse.Namespace,
    bar: Any,
    sampler: Any = None,
    peak_lr: float = PEAK_LR,
    batched_workers: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """Train one method from the shared initialization; write its run folder; return its summary.

    ``sampler`` (anything with ``next_batches()``) replaces the demo's random
    windows; ``peak_lr`` is the inner AdamW's peak learning rate;
    ``batched_workers`` steps the workers as one batched computation
    (:class:`~autoloco_hf.sync.workers.batched_workers.BatchedWorkers`, recorded in the
    summary); ``extra`` goes into ``summary.json`` (the replication benchmark
    passes its own sampler, description and provenance).
    """
    from transformers import get_cosine_schedule_with_warmup

    from autoloco_hf.cli.demo_data import WindowSampler, eval_windows, mean_loss
    from autoloco_hf.sync.communicators import make_communicator
    from autoloco_hf.sync.workers.batched_workers import BatchedWorkers
    from autoloco_hf.sync.workers.local_workers import LocalWorkers

    writer = RunWriter(f"{args.out}/{name}", name)
    workers = (BatchedWorkers if batched_workers else LocalWorkers)(
        config,
        setup.model,
        make_communicator(config, distributed=False, simulated_workers=args.workers),
        optimizer_factory=lambda params: torch.optim.AdamW(params, lr=peak_lr, weight_decay=WEIGHT_DECAY),
        scheduler_factory=lambda opt: get_cosine_schedule_with_warmup(opt, warmup_steps(args.steps), args.steps),
        total_steps=args.steps,
        records_path=writer.intervals_path,
    )
    sampler = sampler or WindowSampler(setup.splits.train, SEQ_LEN, BATCH_SIZE, args.workers, seed=args.seed)
    bar.set_description(name)
    started, cpu_started = time.perf_counter(), time.process_time()
    for step in range(1, args.steps + 1):
        lr = float(workers.optimizers[0].param_groups[0]["lr"])
        workers.train_step(sampler.next_batches())
        loss = sum(workers.last_losses) / len(workers.last_losses)
        totals = workers.engine.totals
        writer.log_step(step, loss, lr, totals, time.perf_counter() - started)
        bar.update(1)
        if step % 10 == 0 or step == args.steps:
            bar.set_postfix(loss=f"{loss:.3f}", syncs=totals.syncs)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    # The budget ends on a sync, so every replica now holds the synchronized model.
    device = next(workers.models[0].parameters()).device  # validation runs where the model is (a GPU campaign)
    batches = ({k: v.to(device) for k, v in b.items()} for b in eval_windows(setup.splits.val, SEQ_LEN, EVAL_BATCH))
    val_loss = mean_loss(workers.models[0], batches)
    return writer.finish(
        workers.engine.totals,
        config.to_dict(),
        wall,
        val_loss=val_loss,
        cpu_seconds=cpu,
        workers=args.workers,
        params=setup.num_params,
        **({"batched_workers": True} if batched_workers else {}),  # the loop's summaries stay as they were
        **{"description": METHODS[name][0] if name in METHODS else name, **extra},
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--steps", type=positive_int, default=1000, help="optimizer steps per method (default 1000, at least 10)"
    )
    parser.add_argument("--workers", type=positive_int, default=4, help="simulated workers (default 4)")
    parser.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help=f"comma-separated, from {', '.join(METHODS)} (default {DEFAULT_METHODS})",
    )
    parser.add_argument("--out", type=new_file_path, help="run folder (default runs/demo-<UTC timestamp>)")
    parser.add_argument("--h-base", type=positive_int, help="recipe horizon H_base (default steps/100, at least 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initialization and the data order")
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch CPU threads (default 1: for a model this small, intra-op threads cost more than they give)",
    )


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        usage_error(
            f"--methods {args.methods}: unknown method(s) {unknown}; choose from {', '.join(METHODS)}", "autoloco demo"
        )
    if args.steps < 10:
        usage_error(f"--steps {args.steps}: pass at least 10 (warm-up and one interval need room)", "autoloco demo")
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
    with tqdm(total=len(methods) * args.steps, unit="step", dynamic_ncols=True, mininterval=1.0) as bar:
        for name in methods:
            train_method(name, configs[name], setup, args, bar)
    total, cpu = time.perf_counter() - started, time.process_time() - cpu_started

    runs = find_runs([f"{args.out}/{m}" for m in methods])
    first = next(iter(configs.values()))
    h_max = ", ".join(f"{c.h_max} ({name})" for name, c in configs.items() if c.method == Method.AUTOLOCO)
    notes = (
        f"Tiny Llama ({setup.num_params:,} parameters, {LAYERS} layers, hidden {HIDDEN}, BPE vocabulary "
        f"{len(setup.tokenizer)} trained locally) on Python's `pydoc_data.topics` "
        f"({setup.splits.train.numel():,} training / {setup.splits.val.numel():,} held-out validation tokens); "
        f"{args.workers} simulated workers, batch {BATCH_SIZE} x {SEQ_LEN} tokens per worker, {args.steps} steps, "
        f"AdamW {PEAK_LR:g} with {warmup_steps(args.steps)} warm-up steps then cosine; "
        f"H_base {first.h_base}, q_H {first.q_h}{f', H_max {h_max}' if h_max else ''}; seed {args.seed}, same initialization "
        f"and data order for every method. Total wall time {total:.0f} s, CPU time {cpu:.0f} s (with tokenizer training and validation; "
        "CPU time well below wall time means the machine was shared)."
    )
    path = write_report(runs, args.out, "autoloco demo", command, notes=notes)
    print(table1(runs))
    print(f"\nwall time {total:.0f} s, CPU time {cpu:.0f} s; report: {path}")
    return 0
