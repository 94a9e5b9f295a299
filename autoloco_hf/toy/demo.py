"""The demo's methods, scale and training loop: one method's run folder from a shared start.

``autoloco demo`` (:mod:`autoloco_hf.cli.demo`) trains a tiny Llama on Python's own
documentation text, once per method, with ``N`` simulated workers
(:class:`~autoloco_hf.sync.workers.local_workers.LocalWorkers` +
:class:`~autoloco_hf.sync.communicators.SimulatedCommunicator`). Every method starts from the
same initialization and sees the same batches in the same order. The campaigns of
``benchmarks/`` train their methods with the same loop, at the same scale (the paper's C4
recipe scaled down with the same ratios, :func:`scaled_config`).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import torch

from autoloco_hf.config import AutoLoCoConfig, Controller, Method, nest_rule_options
from autoloco_hf.state.run_folder import RunWriter

# name -> (what it is, AutoLoCoConfig fields)
METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "ddp": ("gradient all-reduce every step", dict(method=Method.DDP)),
    "diloco": (
        "DiLoCo, outer Nesterov momentum 0.9 (the paper's baseline)",
        dict(method=Method.DILOCO),
    ),
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
        "AutoLoCo at its defaults: the descent rule (starts at 2 H_base, shortens as C_t "
        "falls; outer momentum 0.5)",
        dict(method=Method.AUTOLOCO, controller=Controller.DESCENT),
    ),
    "qsr": ("QSR: H = max(H_base, (alpha/lr)^2), model averaging", dict(method=Method.QSR)),
    "linear": ("Linear Interval: H_k = a k, model averaging", dict(method=Method.LINEAR)),
}

# The spec's CPU prototype (section 10): batch 8 x 64 per worker, AdamW 2e-3.
BATCH_SIZE, SEQ_LEN, PEAK_LR, WEIGHT_DECAY = 8, 64, 2e-3, 0.01
# ~394k parameters, ~30 ms of CPU per worker step
VOCAB_SIZE, HIDDEN, LAYERS, HEADS = 1024, 96, 2, 4
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
    from autoloco_hf.toy.llama import tiny_llama
    from autoloco_hf.toy.text import corpus_documents, split_tokens, train_tokenizer

    documents = corpus_documents()
    tokenizer = train_tokenizer("\n\n".join(documents), VOCAB_SIZE)
    splits = split_tokens(tokenizer, documents)
    model = tiny_llama(
        len(tokenizer), HIDDEN, LAYERS, HEADS, max_position_embeddings=SEQ_LEN, seed=seed
    )
    return DemoSetup(tokenizer, splits, model)


def method_of(name: str) -> Method:
    """The ``AutoLoCoConfig.method`` of the demo method
    ``name`` (only AutoLoCo's horizons round to ``q_H``)."""
    return METHODS[name][1]["method"]


def scaled_config(method: str, steps: int, h_base: int, **overrides: Any) -> AutoLoCoConfig:
    """The method's config at the demo scale (``q_H`` and ``H_max`` follow ``H_base`` by default).

    ``overrides`` are further ``AutoLoCoConfig`` fields (ablation switches, wire dtype, ``h_max``);
    rule options may keep their old flat spellings (``descent_gain=0.9``,
    :func:`~autoloco_hf.config.nest_rule_options`).
    """
    fields = dict(METHODS[method][1])
    # the paper's Linear Interval runs 100 intervals in 50k steps (a = 10)
    if fields["method"] == Method.LINEAR:
        fields["linear_increment"] = max(1, round(10 * steps / 50_000))
    fields.update(overrides)
    return AutoLoCoConfig(
        h_base=h_base, warmup_steps=warmup_steps(steps), **nest_rule_options(fields)
    )


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
    (``LocalWorkers(..., batched=True)``, recorded in the
    summary); ``extra`` goes into ``summary.json`` (the replication benchmark
    passes its own sampler, description and provenance).
    """
    from transformers import get_cosine_schedule_with_warmup

    from autoloco_hf.sync.communicators import make_communicator
    from autoloco_hf.sync.workers.local_workers import LocalWorkers
    from autoloco_hf.toy.text import WindowSampler, eval_windows, mean_loss

    writer = RunWriter(f"{args.out}/{name}", name)
    workers = LocalWorkers(
        config,
        setup.model,
        make_communicator(config, distributed=False, simulated_workers=args.workers),
        optimizer_factory=lambda params: torch.optim.AdamW(
            params, lr=peak_lr, weight_decay=WEIGHT_DECAY
        ),
        scheduler_factory=lambda opt: get_cosine_schedule_with_warmup(
            opt, warmup_steps(args.steps), args.steps
        ),
        total_steps=args.steps,
        records_path=writer.intervals_path,
        batched=batched_workers,
    )
    sampler = sampler or WindowSampler(
        setup.splits.train, SEQ_LEN, BATCH_SIZE, args.workers, seed=args.seed
    )
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
    # validation runs where the model is (a GPU campaign)
    device = next(workers.models[0].parameters()).device
    batches = (
        {k: v.to(device) for k, v in b.items()}
        for b in eval_windows(setup.splits.val, SEQ_LEN, EVAL_BATCH)
    )
    val_loss = mean_loss(workers.models[0], batches)
    return writer.finish(
        workers.engine.totals,
        config.to_dict(),
        wall,
        val_loss=val_loss,
        cpu_seconds=cpu,
        workers=args.workers,
        params=setup.num_params,
        # the loop's summaries stay as they were
        **({"batched_workers": True} if batched_workers else {}),
        **{"description": METHODS[name][0] if name in METHODS else name, **extra},
    )
