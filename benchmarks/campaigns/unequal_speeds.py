"""Workers of unequal speed: lockstep against budget pacing,
on the virtual clock (docs/algorithm.md#pacing).

Not a test. Simulated workers (``LocalWorkers`` + ``SimulatedCommunicator``) train a
tiny next-token model on a synthetic second-order Markov source (32 tokens; each
pair of tokens is followed by one of 4 likely successors), every worker reading its own stream; a
held-out stream gives the validation loss at every sync. Each worker runs at the
speed of its profile on the virtual clock (docs/algorithm.md#virtual-clock),
so the comparison is the same on any machine:

- ``a``: one worker at 0.5, the others at 1;
- ``b``: speeds drawn log-normally with sigma 0.3 (per seed);
- ``c``: every worker at 1, the last one slowing to 0.25 at half the run.

Variants: DiLoCo and AutoLoCo, each in lockstep and with ``pacing="budget"``.
Every variant of a seed starts from the same initialization and reads the same
batches in the same order per worker. Each finished run is one JSON file
``OUT/N<workers>/<profile>/seed<k>/<variant>.json``; a rerun skips finished runs::

    nohup nice -n 15 python benchmarks/campaigns/unequal_speeds.py --out results/unequal_speeds &
    python benchmarks/campaigns/unequal_speeds.py --out results/unequal_speeds --report-only

The report (``OUT/report.md``) gives, per worker count and profile, the cluster's
tokens per virtual second, the final validation loss (mean ± standard error over
seeds), the validation loss at equal tokens, and the virtual time to lockstep
DiLoCo's final validation loss, with the issue's targets for profile (a) marked.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.algorithm.schedule import warmup_cosine
from autoloco_hf.config import Pacing, ValueEnum
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.workers.local_workers import LocalWorkers

VOCAB, SEQ, BATCH, HIDDEN, SUCCESSORS = 32, 32, 8, 32, 4
PEAK_LR = 1e-2


class Profile(ValueEnum):
    HALF = "a"  # one worker at 0.5
    LOGNORMAL = "b"  # log-normal speeds, sigma 0.3
    SLOWDOWN = "c"  # the last worker drops to 0.25 at half the run


@dataclass(frozen=True)
class Variant:
    name: str
    method: str
    pacing: Pacing


VARIANTS = (
    Variant("diloco_lockstep", "diloco", Pacing.LOCKSTEP),
    Variant("diloco_budget", "diloco", Pacing.BUDGET),
    Variant("autoloco_lockstep", "autoloco", Pacing.LOCKSTEP),
    Variant("autoloco_budget", "autoloco", Pacing.BUDGET),
)
REFERENCE = "diloco_lockstep"


def speeds_of(
    profile: Profile, workers: int, seed: int, steps: int
) -> tuple[list[float], list[list[Any]]]:
    """``worker_speeds`` and ``speed_changes`` of a profile."""
    if profile == Profile.HALF:
        return [1.0] * (workers - 1) + [0.5], []
    if profile == Profile.LOGNORMAL:
        g = torch.Generator().manual_seed(10_000 + seed)
        return torch.exp(0.3 * torch.randn(workers, generator=g, dtype=torch.float64)).tolist(), []
    return [1.0] * workers, [[steps // 2, workers - 1, 0.25]]


class MarkovSource:
    """A fixed random second-order source: a pair of tokens
    is followed by one of ``SUCCESSORS`` tokens, mostly.

    Hard enough for the tiny model that its validation loss
    falls over the whole run (1024 contexts).
    """

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(12345)
        logits = torch.full((VOCAB * VOCAB, VOCAB), -3.0)
        chosen = torch.rand(VOCAB * VOCAB, VOCAB, generator=g).argsort(dim=1)[:, :SUCCESSORS]
        logits.scatter_(1, chosen, 2.0 + torch.rand(VOCAB * VOCAB, SUCCESSORS, generator=g))
        self.probs = torch.softmax(logits, dim=1)

    def sequences(self, count: int, generator: torch.Generator) -> torch.Tensor:
        tokens = torch.empty(count, SEQ, dtype=torch.long)
        tokens[:, :2] = torch.randint(0, VOCAB, (count, 2), generator=generator)
        for i in range(2, SEQ):
            context = tokens[:, i - 2] * VOCAB + tokens[:, i - 1]
            tokens[:, i] = torch.multinomial(self.probs[context], 1, generator=generator).squeeze(1)
        return tokens


class TinyLM(torch.nn.Module):
    """The next token from the last two: two embeddings, one hidden layer."""

    def __init__(self) -> None:
        super().__init__()
        self.last = torch.nn.Embedding(VOCAB, HIDDEN)
        self.before = torch.nn.Embedding(VOCAB, HIDDEN)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 2 * HIDDEN), torch.nn.Tanh())
        self.head = torch.nn.Linear(2 * HIDDEN, VOCAB)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, labels=None
    ) -> Any:
        hidden = self.last(input_ids[:, 1:-1]) + self.before(input_ids[:, :-2])
        logits = self.head(self.mlp(hidden))
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), input_ids[:, 2:].reshape(-1)
        )
        return type("Output", (), {"loss": loss})()


class Streams:
    """Each worker's batches in its own order, from its own generator: paired across variants."""

    def __init__(self, source: MarkovSource, workers: int, seed: int) -> None:
        self.source = source
        self.generators = [torch.Generator().manual_seed(seed * 1000 + w) for w in range(workers)]

    def __call__(self, worker: int) -> dict[str, torch.Tensor]:
        ids = self.source.sequences(BATCH, self.generators[worker])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def run_one(
    workers: int, profile: Profile, seed: int, variant: Variant, args: argparse.Namespace
) -> dict:
    speeds, changes = speeds_of(profile, workers, seed, args.steps)
    # the committed runs' rule, on AutoLoCo's horizon grid (DiLoCo has none)
    rule = {"controller": "paper", "q_h": 1} if variant.method == "autoloco" else {}
    config = AutoLoCoConfig(
        method=variant.method,
        **rule,
        h_base=args.h_base,
        pacing=variant.pacing,
        worker_speeds=speeds,
        speed_changes=changes or None,
        warmup_steps=args.steps // 50,
    )
    source = MarkovSource()
    val = source.sequences(args.val_sequences, torch.Generator().manual_seed(999_999))
    torch.manual_seed(seed)
    schedule = warmup_cosine(1.0, args.steps // 50, args.steps)
    run = LocalWorkers(
        config,
        TinyLM(),
        SimulatedCommunicator(workers),
        optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=PEAK_LR, weight_decay=0.0),
        scheduler_factory=lambda o: torch.optim.lr_scheduler.LambdaLR(o, schedule.lr_at),
        total_steps=args.steps,
    )
    streams = Streams(source, workers, seed)
    curve: list[dict[str, float]] = []
    wall = tokens = 0.0
    for _ in range(args.steps):
        if variant.pacing == Pacing.BUDGET:
            record = run.train_paced(streams)
        else:
            record = run.train_step([streams(w) for w in range(workers)])
        if record is None:
            continue
        wall += max(record.worker_seconds)
        tokens += record.tokens
        with torch.no_grad():
            val_loss = float(run.models[0](input_ids=val).loss)
        curve.append(
            {
                "step": run.step,
                "tokens": tokens,
                "wall": wall,
                "val_loss": val_loss,
                "h": record.h_step,
            }
        )
    stragglers = sorted({s for r in run.engine.records for s in (r.stragglers or [])})
    return {
        "workers": workers,
        "profile": str(profile),
        "seed": seed,
        "variant": variant.name,
        "config": {
            k: str(v) if isinstance(v, ValueEnum) else v for k, v in config.to_dict().items()
        },
        "syncs": len(run.engine.records),
        "tokens": tokens,
        "virtual_seconds": wall,
        "tokens_per_second": tokens / wall,
        "final_val_loss": curve[-1]["val_loss"],
        "curve": curve,
        "stragglers": stragglers,
    }


def run_path(out: Path, workers: int, profile: Profile, seed: int, variant: str) -> Path:
    return out / f"N{workers}" / str(profile) / f"seed{seed}" / f"{variant}.json"


def run_all(args: argparse.Namespace) -> None:
    out = Path(args.out)
    for workers in args.workers:
        for profile in args.profiles:
            for seed in args.seeds:
                for variant in VARIANTS:
                    path = run_path(out, workers, profile, seed, variant.name)
                    if path.exists():
                        continue
                    result = run_one(workers, profile, seed, variant, args)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    # a name of its own, then a rename: two
                    # campaigns writing the same result never clash
                    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
                    with os.fdopen(handle, "w") as f:
                        f.write(json.dumps(result, indent=1))
                    os.replace(partial, path)
                    print(
                        f"{path}: val {result['final_val_loss']:.4f}, "
                        f"{result['tokens_per_second']:.1f} tok/s"
                    )


# ------------------------------------------------------------------ report
def mean_se(values: Sequence[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


def fmt(values: Sequence[float], digits: int = 4) -> str:
    mean, se = mean_se(values)
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def time_to(curve: list[dict[str, float]], target: float) -> float:
    """Virtual seconds at the first sync whose validation
    loss is at or below ``target`` (inf: never)."""
    return next((p["wall"] for p in curve if p["val_loss"] <= target), math.inf)


def val_at_tokens(curve: list[dict[str, float]], tokens: float) -> float:
    """Validation loss at ``tokens``, linear between syncs (the last one's past the end)."""
    previous = curve[0]
    for point in curve:
        if point["tokens"] >= tokens:
            if point is previous:
                return point["val_loss"]
            share = (tokens - previous["tokens"]) / (point["tokens"] - previous["tokens"])
            return previous["val_loss"] + share * (point["val_loss"] - previous["val_loss"])
        previous = point
    return curve[-1]["val_loss"]


def seeds_note(values: Sequence[float], seeds: Sequence[int]) -> str:
    """`` (k of n seeds)`` when only some seeds gave a value."""
    return f" ({len(values)} of {len(seeds)} seeds)" if len(values) < len(seeds) else ""


def mark(met: bool) -> str:
    return "**met**" if met else "**missed**"


def report(out: Path) -> Path:
    runs: dict[tuple[int, str], dict[int, dict[str, dict]]] = {}
    for path in sorted(out.glob("N*/*/seed*/*.json")):
        result = json.loads(path.read_text())
        runs.setdefault((result["workers"], result["profile"]), {}).setdefault(result["seed"], {})[
            result["variant"]
        ] = result
    lines = [
        "# Workers of unequal speed: lockstep against budget pacing",
        "",
        "Generated by `python benchmarks/campaigns/unequal_speeds.py --out "
        "results/unequal_speeds --report-only` from the",
        "JSON files next to this report (docs/algorithm.md#pacing; what is measured: the "
        "module's docstring). Times are",
        "virtual seconds (an inner step of a worker at speed `v` takes `1/v`; an "
        "interval lasts as long as its",
        "slowest worker's steps; syncs cost nothing). Mean ± standard error over the seeds.",
        "",
    ]
    for (workers, profile), seeds in sorted(runs.items()):
        complete = [
            s for s, variants in sorted(seeds.items()) if all(v.name in variants for v in VARIANTS)
        ]
        if not complete:
            continue
        lines += [
            f"## {workers} workers, profile ({profile}), seeds "
            f"{complete[0]}-{complete[-1]} ({len(complete)})",
            "",
            "| variant | tokens/s (cluster) | x lockstep DiLoCo | val loss at half of lockstep "
            "DiLoCo's tokens | at all of them | time to lockstep DiLoCo's "
            "final val loss | x shorter |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        summary: dict[str, dict[str, list[float]]] = {}
        for variant in VARIANTS:
            rate, ratio, final, half, at_tokens, times, speedup = [], [], [], [], [], [], []
            for seed in complete:
                ref, run = seeds[seed][REFERENCE], seeds[seed][variant.name]
                rate.append(run["tokens_per_second"])
                ratio.append(run["tokens_per_second"] / ref["tokens_per_second"])
                final.append(run["final_val_loss"])
                half.append(val_at_tokens(run["curve"], ref["tokens"] / 2))
                at_tokens.append(val_at_tokens(run["curve"], ref["tokens"]))
                reached = time_to(run["curve"], ref["final_val_loss"])
                times.append(reached)
                if math.isfinite(reached):
                    speedup.append(time_to(ref["curve"], ref["final_val_loss"]) / reached)
            summary[variant.name] = {
                "ratio": ratio,
                "final": final,
                "at_tokens": at_tokens,
                "times": times,
            }
            finite = [t for t in times if math.isfinite(t)]
            reached_text = (
                f"{fmt(finite, 0)} ({len(finite)}/{len(times)} reached)" if finite else "never"
            )
            lines.append(
                f"| {variant.name} | {fmt(rate, 1)} | {fmt(ratio, 2)} | {fmt(half)} | "
                f"{fmt(at_tokens)} | {reached_text} | "
                f"{fmt(speedup, 2) + seeds_note(speedup, complete) if speedup else 'never'} |"
            )
        lines.append("")
        for pacer, reference in (
            ("diloco_budget", "diloco_lockstep"),
            ("autoloco_budget", "autoloco_lockstep"),
        ):
            ratio = statistics.fmean(summary[pacer]["ratio"]) / statistics.fmean(
                summary[reference]["ratio"]
            )
            diff = [
                a - b for a, b in zip(summary[pacer]["at_tokens"], summary[reference]["at_tokens"])
            ]
            _, ref_se = mean_se(summary[reference]["final"])
            gap, _ = mean_se(diff)
            # the same pacing's lockstep time over its own,
            # where both reached lockstep DiLoCo's final loss
            speed = [
                b / a
                for a, b in zip(summary[pacer]["times"], summary[reference]["times"])
                if math.isfinite(a + b)
            ]
            text = (
                f"- `{pacer}` against `{reference}`: throughput {ratio:.2f}x; validation loss at "
                f"equal tokens {fmt(diff)} (paired difference; one standard error of "
                f"`{reference}`'s final loss: {ref_se:.4f}); time to lockstep DiLoCo's final loss "
                + (
                    f"{fmt(speed, 2)}x shorter{seeds_note(speed, complete)}"
                    if speed
                    else "not reached by both"
                )
            )
            if profile == str(Profile.HALF):
                text += (
                    f". Targets for (a): throughput >= 1.5x {mark(ratio >= 1.5)}, loss per token "
                    f"no worse than one standard error {mark(gap <= ref_se)}, time >= 1.4x shorter "
                    f"{mark(bool(speed) and statistics.fmean(speed) >= 1.4)}"
                )
            lines.append(text + ".")
        lines.append("")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/unequal_speeds")
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--profiles", type=Profile, nargs="+", default=list(Profile))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument(
        "--steps", type=int, default=300, help="steps of the run (each N inner steps)"
    )
    parser.add_argument("--h-base", type=int, default=10)
    parser.add_argument("--val-sequences", type=int, default=256)
    parser.add_argument("--report-only", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if not args.report_only:
        run_all(args)
    print(report(Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
