"""What makes an upward change of the horizon expensive:
open-loop horizon schedules with each suspect neutralized.

Not a test. Plain DiLoCo (outer momentum 0.7) executes a fixed horizon
schedule such as "10 until step 130, then 15", on the same model, corpus,
seeds and IID data as ``benchmarks/campaigns/frontier.py``; its fixed-H runs
(``OUT_FRONTIER/iid/seed<k>/diloco_mu0.7_h<H>``) are the references. At the
first outer step after the switch step (the change of H, if any) one suspect is neutralized:

- ``momentum_reset``: the Nesterov buffer (built from shorter intervals) is zeroed;
- ``momentum_rescale``: the buffer is multiplied by ``|Delta_t| / |Delta_{t-1}|``,
  so it has the size of the new intervals' pseudo-gradients;
- ``inner_reset``: every worker's AdamW state is cleared when the first long interval starts;
- ``paper_correction``: AutoLoCo's outer correction (momentum retention +
  outer-LR scaling against H_base, docs/algorithm.md#outer-correction) on every interval.

Each finished run is ``OUT/seed<k>/<variant>/`` (summary + gzipped logs, as
frontier.py writes them); a rerun skips finished runs::

    nohup nice -n 10 python benchmarks/campaigns/switch_cost.py &
    python benchmarks/campaigns/switch_cost.py --report-only
"""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

# benchmarks/: its kinds import as packages
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from campaigns import frontier, replicate  # noqa: E402

from autoloco_hf.algorithm.policies import IntervalPolicy, NextInterval, PolicyFactory  # noqa: E402
from autoloco_hf.algorithm.schedule import LRSchedule  # noqa: E402
from autoloco_hf.config import AutoLoCoConfig, ValueEnum  # noqa: E402
from autoloco_hf.state.run_folder import RunWriter  # noqa: E402
from autoloco_hf.sync.outer import OuterOptimizer  # noqa: E402
from autoloco_hf.sync.workers.local_workers import LocalWorkers  # noqa: E402
from autoloco_hf.toy import demo  # noqa: E402
from autoloco_hf.toy.llama import tiny_llama  # noqa: E402
from autoloco_hf.toy.text import eval_windows, mean_loss  # noqa: E402


class Treatment(ValueEnum):
    NONE = "none"
    MOMENTUM_RESET = "momentum_reset"
    MOMENTUM_RESCALE = "momentum_rescale"
    INNER_RESET = "inner_reset"
    PAPER_CORRECTION = "paper_correction"


@dataclass(frozen=True)
class Schedule:
    """``before`` steps per interval until ``switch_step``, ``after`` from then on."""

    before: int
    after: int
    switch_step: int

    @property
    def label(self) -> str:
        return f"{self.before}to{self.after}_at{self.switch_step}"

    def horizon(self, start_step: int) -> int:
        return self.before if start_step < self.switch_step else self.after

    def for_seed(self, seed: int, frontier_dir: str) -> Schedule:
        return self


@dataclass(frozen=True)
class Replay:
    """The horizons a recorded run of the frontier
    (``FRONTIER/iid/seed<k>/<source>``) executed, replayed open loop.

    ``before`` and ``after`` (H_base and the paper rule's
    H_max) only pick the report's fixed-H references.
    """

    source: str = "autoloco"
    before: int = 10
    after: int = 15
    switch_step: int = 0
    horizons: tuple[tuple[int, int], ...] = ()  # (start step, horizon) of each recorded interval

    @property
    def label(self) -> str:
        return f"replay_{self.source}"

    def horizon(self, start_step: int) -> int:
        return dict(self.horizons).get(start_step, self.horizons[-1][1])

    def for_seed(self, seed: int, frontier_dir: str) -> Replay:
        path = Path(frontier_dir) / "iid" / f"seed{seed}" / self.source / frontier.INTERVALS_GZ
        with gzip.open(path, "rt") as f:
            records = [json.loads(line) for line in f if line.strip()]
        return replace(self, horizons=tuple((r["start_step"], r["h_step"]) for r in records))


@dataclass(frozen=True)
class Variant:
    schedule: Schedule | Replay
    treatment: Treatment = Treatment.NONE

    @property
    def name(self) -> str:
        return self.schedule.label + (
            "" if self.treatment is Treatment.NONE else f"_{self.treatment.value}"
        )


class ScheduledPolicy(IntervalPolicy):
    """An open-loop horizon schedule; remembers each planned
    interval so the treatments can see the change."""

    def __init__(
        self, schedule_preview: LRSchedule, total_steps: int, h_base: int, plan: Schedule | Replay
    ) -> None:
        super().__init__(schedule_preview, total_steps, h_base)
        self.plan = plan
        self.planned: list[tuple[int, int, bool]] = []  # (start, h_step, truncated)
        self.on_switch: list[Callable[[], object]] = []  # called when the planned horizon changes

    def _length(self, start_step: int) -> tuple[int, int]:
        h = self.plan.horizon(start_step)
        return h, h

    def next_interval(self, start_step: int, min_steps: int = 1) -> NextInterval:
        interval = super().next_interval(start_step, min_steps)
        if self.planned and interval.h_step != self.planned[-1][1] and not interval.truncated:
            for hook in self.on_switch:
                hook()
        self.planned.append((start_step, interval.h_step, interval.truncated))
        return interval

    def first_after_switch(self) -> bool:
        """The interval being closed is the first (untruncated) one from the switch step on: the
        first at the new horizon when the schedule changes it, and the same point in time when it
        does not (a treatment alone)."""
        switch = self.plan.switch_step
        start, _, truncated = self.planned[-1]
        return (
            start >= switch
            and not truncated
            and (len(self.planned) < 2 or self.planned[-2][0] < switch)
        )


def scheduled(plan: Schedule | Replay) -> PolicyFactory:
    """The engine's policy factory for ``plan`` (the product has no horizon-schedule method)."""

    def make(
        config: AutoLoCoConfig, schedule_preview: LRSchedule, total_steps: int, warmup_steps: int
    ) -> IntervalPolicy:
        return ScheduledPolicy(schedule_preview, total_steps, config.h_base, plan)

    return make


def treat(workers: LocalWorkers, treatment: Treatment) -> None:
    """Install ``treatment`` through the engine's hooks: on
    the outer momentum, or the inner optimizers."""
    policy = workers.engine.policy
    assert isinstance(policy, ScheduledPolicy)
    if treatment is Treatment.INNER_RESET:
        policy.on_switch.append(lambda: [opt.state.clear() for opt in workers.optimizers])
        return
    if treatment not in (Treatment.MOMENTUM_RESET, Treatment.MOMENTUM_RESCALE):
        return
    last_norm: list[float | None] = [None]

    def before_outer_step(
        interval: NextInterval, mean: torch.Tensor, outer: OuterOptimizer
    ) -> None:
        norm = float(mean.norm())
        buffer = outer.momentum_buffer
        if buffer is not None and policy.first_after_switch():
            if treatment is Treatment.MOMENTUM_RESET:
                buffer.zero_()
            elif last_norm[0]:
                buffer.mul_(norm / last_norm[0])
        last_norm[0] = norm

    workers.engine.before_outer_step.append(before_outer_step)


def run_variant(
    variant: Variant, seed: int, folder: Path, corpus: replicate.Corpus, args: argparse.Namespace
) -> dict:
    from transformers import get_cosine_schedule_with_warmup

    from autoloco_hf.sync.communicators import SimulatedCommunicator

    method = "autoloco" if variant.treatment is Treatment.PAPER_CORRECTION else "diloco"
    overrides = dict(outer_momentum=0.7) if method == "diloco" else dict(map_tokens=False, q_h=1)
    config = demo.scaled_config(method, args.steps, variant.schedule.before, **overrides)
    val = replicate.eval_subset(corpus.splits.val, demo.SEQ_LEN, args.val_windows)
    model = tiny_llama(
        len(corpus.tokenizer), replicate.HIDDEN, replicate.LAYERS, replicate.HEADS,
        max_position_embeddings=demo.SEQ_LEN, seed=seed,
    )  # fmt: skip
    sampler_args = argparse.Namespace(
        batch_size=args.batch_size, workers=args.workers, max_docs=args.max_docs
    )
    sampler = frontier.make_sampler(frontier.Regime.IID, corpus, sampler_args, seed)
    writer = RunWriter(str(folder), variant.name)
    plan = variant.schedule.for_seed(seed, args.frontier)
    workers = LocalWorkers(
        config,
        model,
        SimulatedCommunicator(args.workers),
        optimizer_factory=lambda p: torch.optim.AdamW(
            p, lr=demo.PEAK_LR, weight_decay=demo.WEIGHT_DECAY
        ),
        scheduler_factory=lambda o: get_cosine_schedule_with_warmup(
            o, demo.warmup_steps(args.steps), args.steps
        ),
        total_steps=args.steps,
        records_path=writer.intervals_path,
        policy_factory=scheduled(plan),
    )
    treat(workers, variant.treatment)
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        lr = float(workers.optimizers[0].param_groups[0]["lr"])
        workers.train_step(sampler.next_batches())
        writer.log_step(
            step,
            sum(workers.last_losses) / len(workers.last_losses),
            lr,
            workers.engine.totals,
            0.0,
        )
    val_loss = mean_loss(workers.models[0], eval_windows(val, demo.SEQ_LEN, demo.EVAL_BATCH))
    return writer.finish(
        workers.engine.totals,
        config.to_dict(),
        time.perf_counter() - started,
        val_loss=val_loss,
        seed=seed,
        variant=variant.name,
        schedule=plan.__dict__,
        treatment=variant.treatment.value,
        git_commit=replicate.git_commit(),
        command=args.command,
        workers=args.workers,
    )


def variants() -> list[Variant]:
    at130 = Schedule(10, 15, 130)
    return [
        Variant(at130),
        Variant(at130, Treatment.MOMENTUM_RESCALE),
        Variant(at130, Treatment.MOMENTUM_RESET),
        Variant(at130, Treatment.INNER_RESET),
        Variant(at130, Treatment.PAPER_CORRECTION),
        Variant(Schedule(15, 10, 130)),
        Variant(Schedule(10, 15, 400)),
        Variant(Schedule(10, 15, 400), Treatment.MOMENTUM_RESCALE),
        Variant(Schedule(10, 20, 130)),
        Variant(Schedule(10, 20, 130), Treatment.MOMENTUM_RESCALE),
        Variant(Schedule(20, 10, 130)),
        Variant(Schedule(40, 20, 130)),
        Variant(Schedule(30, 15, 130)),
        Variant(Schedule(15, 10, 400)),
        Variant(Schedule(15, 10, 130), Treatment.MOMENTUM_RESET),
        Variant(Schedule(10, 10, 130), Treatment.MOMENTUM_RESET),  # the shock alone, no change of H
        Variant(Schedule(15, 15, 130), Treatment.MOMENTUM_RESET),
        # the paper rule's own horizons without its controller (probing, calibration)
        Variant(Replay()),
        Variant(Replay(), Treatment.PAPER_CORRECTION),
    ]


# ------------------------------------------------------------------ report
def report(args: argparse.Namespace) -> Path:
    out, ref = Path(args.out), Path(args.frontier) / "iid"
    rows = []
    names = [v.name for v in variants()]
    for v in variants():
        seeds = sorted(
            int(p.parent.parent.name.removeprefix("seed"))
            for p in out.glob(f"seed*/{v.name}/{frontier.SUMMARY}")
            if all(
                (ref / p.parent.parent.name / f"diloco_mu0.7_h{h}" / frontier.SUMMARY).exists()
                for h in (v.schedule.before, v.schedule.after)
            )
        )
        if not seeds:
            continue
        own = {s: frontier.load_result(out / f"seed{s}" / v.name) for s in seeds}
        before = {
            s: frontier.load_result(ref / f"seed{s}" / f"diloco_mu0.7_h{v.schedule.before}")
            for s in seeds
        }
        after = {
            s: frontier.load_result(ref / f"seed{s}" / f"diloco_mu0.7_h{v.schedule.after}")
            for s in seeds
        }
        plain = Variant(v.schedule)
        rows.append(
            [
                v.name,
                str(len(seeds)),
                f"{statistics.fmean(own[s].syncs for s in seeds):.1f}",
                frontier.fmt([own[s].val - before[s].val for s in seeds]),
                frontier.fmt([own[s].val - after[s].val for s in seeds]),
                frontier.fmt(
                    [
                        own[s].val - frontier.load_result(out / f"seed{s}" / plain.name).val
                        for s in seeds
                        if (out / f"seed{s}" / plain.name / frontier.SUMMARY).exists()
                    ]
                )
                if v != plain
                else "-",
                frontier.fmt(
                    [
                        own[s].val - frontier.load_result(ref / f"seed{s}" / v.schedule.source).val
                        for s in seeds
                    ]
                )
                if isinstance(v.schedule, Replay)
                else "-",
            ]
        )
    rows.sort(key=lambda r: names.index(r[0]))
    headers = [
        "schedule + treatment",
        "seeds",
        "syncs",
        "val - H_before",
        "val - H_after",
        "val - untreated",
        "val - replayed run",
    ]
    text = "\n".join(
        [
            "# Switch cost (generated by benchmarks/campaigns/switch_cost.py)",
            "",
            f"DiLoCo mu 0.7, {args.workers} workers, T {args.steps}, IID; references are the "
            f"frontier runs under `{args.frontier}/iid`. Paired differences over seeds (mean ± "
            "s.e.; negative = better). `replay_<run>`: the horizons the frontier's `<run>` "
            "executed, replayed open loop (H_before / H_after: 10 / 15, H_base and "
            "the paper rule's H_max).",
            "",
            replicate.markdown_table(headers, rows),
            "",
            f"Regenerate: `python benchmarks/campaigns/switch_cost.py --out {args.out} --frontier "
            f"{args.frontier} --report-only`.",
            "",
        ]
    )
    path = out / "switch_cost.md"
    path.write_text(text)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/switch_cost")
    p.add_argument(
        "--frontier", default="results/frontier", help="the frontier runs (fixed-H references)"
    )
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=replicate.BATCH_SIZE)
    p.add_argument("--val-windows", type=int, default=1024)
    p.add_argument("--variants", help="comma-separated variant names (default all)")
    p.add_argument("--max-docs", type=int, help="use only the first N documents (smoke runs)")
    p.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "autoloco"))
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)
    args.command = shlex.join(
        [
            "python",
            "benchmarks/campaigns/switch_cost.py",
            *(argv if argv is not None else sys.argv[1:]),
        ]
    )
    if not args.report_only:
        torch.set_num_threads(1)
        corpus = replicate.load_corpus(args.cache_dir, replicate.VOCAB_SIZE, args.max_docs)
        wanted = set(args.variants.split(",")) if args.variants else None
        for seed in frontier.int_list(args.seeds):
            for v in variants():
                folder = Path(args.out) / f"seed{seed}" / v.name
                if (wanted and v.name not in wanted) or (folder / frontier.SUMMARY).exists():
                    continue
                if not replicate.take_lock(folder):
                    continue
                try:
                    started = time.perf_counter()
                    summary = run_variant(v, seed, folder, corpus, args)
                    replicate.compress_logs(folder)
                    print(
                        f"done {folder}: val {summary['val_loss']:.4f}, "
                        f"{time.perf_counter() - started:.0f} s",
                        flush=True,
                    )
                finally:
                    (folder / "run.lock").unlink(missing_ok=True)
    print(f"report: {report(args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
