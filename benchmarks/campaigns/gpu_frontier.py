"""The frontier of regime A (IID) on a larger model, sized to
a GPU's time limit from measured FLOPs.

Not a test. The CPU campaign (``benchmarks/campaigns/frontier.py``) uses a 197k-parameter
tiny Llama; this one trains a 14.5M-parameter Llama (``--model 14m``: hidden 384,
6 layers) or a 114M-parameter one (``--model 114m``: hidden 768, 12 layers) with
8 simulated workers on one GPU, on the same standard-library corpus and schedule
(T steps, warm-up 2% then cosine, H_base = T/100). ``--grid base`` runs the
first frontier's settings (momentum 0.7 at several H, the momentum axis, the
paper's rule); ``--grid tuned`` the tuned baseline of docs/results.md (outer LR
{0.35, 0.7, 1.0} x momentum {0.5, 0.7, 0.9} x H {5, 10, 20, 40}) with the
default rule and the paper's, seed by seed. Finished runs are skipped, so a
campaign longer than one call goes on in the next one.

The runs of one seed share the initialization, the batches and the inner
schedule, so up to ``--runs-per-group`` of them train as one batched
computation (:class:`~autoloco_hf.sync.workers.batched_workers.BatchedRuns`: one
vmapped forward/backward and one AdamW over ``runs x workers`` stacked
replicas, each run with its own sync engine); ``--per-worker-loop`` trains
them one by one with the loop of ``LocalWorkers`` instead. Before training it

1. counts the FLOPs of one worker step (``torch.utils.flop_counter``),
2. on a GPU, measures the memory of one run's replicas and sizes the groups to
   the free memory (``--runs-per-group`` caps it),
3. times a short probe of real training steps of one group on the device, so
   the achieved FLOP/s and the seconds per run are measured, not assumed,
4. keeps, in priority order, as many unfinished (setting, seed) runs as fit in
   ``--budget-s`` (default 480 s), in what is left of ``--time-limit-s``
   (default 560 s: one GPU call of at most 10 minutes) after the corpus build
   and the probe, and in ``--max-runs``.

It writes ``OUT/plan.json`` (FLOPs, measured rate, estimated and actual
seconds, chosen runs, the FLOP/s of the whole campaign), the run folders in
frontier.py's layout and ``OUT/frontier.md`` with the plot. ``--cpu-dry-run``
runs every stage at tiny sizes on the CPU, batched groups included (CI runs
it)::

    python benchmarks/campaigns/gpu_frontier.py --grid tuned --seeds 0,1,2 --out gpu_frontier_tuned
    python benchmarks/campaigns/gpu_frontier.py --model 114m --grid tuned --out gpu_frontier_114m
    python benchmarks/campaigns/gpu_frontier.py --cpu-dry-run --out /tmp/gpu_frontier
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

# benchmarks/: its kinds import as packages
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from campaigns import frontier, replicate  # noqa: E402

from autoloco_hf.config import ValueEnum  # noqa: E402
from autoloco_hf.toy import demo  # noqa: E402
from autoloco_hf.toy.llama import tiny_llama  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    hidden: int
    layers: int
    heads: int
    batch_size: int  # windows of demo.SEQ_LEN tokens per worker per step
    workers: int
    steps: int
    probe_steps: int
    val_windows: int
    max_docs: int | None


MODELS = {
    "14m": Sizes(
        hidden=384,
        layers=6,
        heads=6,
        batch_size=8,
        workers=8,
        steps=1000,
        probe_steps=20,
        val_windows=1024,
        max_docs=None,
    ),
    "114m": Sizes(
        hidden=768,
        layers=12,
        heads=12,
        batch_size=8,
        workers=8,
        steps=1000,
        probe_steps=10,
        val_windows=1024,
        max_docs=None,
    ),
}
DRY = Sizes(
    hidden=32,
    layers=1,
    heads=2,
    batch_size=2,
    workers=2,
    steps=30,
    probe_steps=3,
    val_windows=16,
    max_docs=300,
)

# default: one GPU call of at most 10 minutes, everything included, 40 s to spare
TIME_LIMIT_S = 560
BUDGET_S = 480.0
DRY_RUNS_PER_GROUP = 4  # the CPU dry run's group size (no GPU memory to size it from)
MEMORY_SHARE = 0.8  # of the free GPU memory, for the replicas of one group

# Most informative first: the two ends of the fixed-H curve,
# AutoLoCo, then more horizons, momenta and seeds.
PRIORITY = [
    ("diloco_mu0.7_h10", 0),
    ("autoloco", 0),
    ("diloco_mu0.7_h20", 0),
    ("diloco_mu0.7_h40", 0),
    ("diloco_mu0.7_h10", 1),
    ("autoloco", 1),
    ("diloco_mu0.7_h20", 1),
    ("diloco_mu0.7_h40", 1),
    ("diloco_mu0.01_h10", 0),
    ("diloco_mu0.01_h20", 0),
    ("diloco_mu0.9_h10", 0),
    ("diloco_mu0.7_h5", 0),
    ("diloco_mu0.7_h13", 0),
    ("diloco_mu0.7_h13", 1),
    ("diloco_mu0.01_h10", 1),
    ("diloco_mu0.01_h20", 1),
]


class Grid(ValueEnum):
    BASE = "base"  # the first frontier: momentum 0.7 over H, the momentum axis, the paper's rule
    # the tuned baseline (outer LR x momentum x H), the default rule and the paper's
    TUNED = "tuned"


# AutoLoCoConfig's own controller and options: what a user gets with h_base only
DEFAULT_RULE = "default"
TUNED_OUTER_LRS, TUNED_MOMENTA, TUNED_HORIZONS = (0.7, 1.0, 0.35), (0.5, 0.7, 0.9), (10, 20, 5, 40)


def points(grid: Grid, steps: int) -> dict[str, frontier.Point]:
    h_base, _ = replicate.schedule(steps)
    if grid is Grid.BASE:
        fixed = frontier.grid([5, 10, 13, 20, 40], 0.7, [0.01, 0.9], [10, 20])
        return {p.name: p for p in fixed + frontier.parse_adaptive(["autoloco"], h_base)}
    fixed = frontier.grid(
        [], 0.7, [], [], frontier.tuned_grid(TUNED_OUTER_LRS, TUNED_MOMENTA, TUNED_HORIZONS)
    )
    return {
        p.name: p
        for p in frontier.parse_adaptive([f"{DEFAULT_RULE}:controller=descent", "autoloco"], h_base)
        + fixed
    }


def queue(
    grid: Grid, names: dict[str, frontier.Point], seeds: Sequence[int]
) -> list[tuple[str, int]]:
    """Every run of the campaign, most informative first
    (``names`` is in that order for the tuned grid)."""
    if grid is Grid.BASE:
        return [(name, seed) for name, seed in PRIORITY if name in names]
    # seed by seed: a whole grid on one seed chooses the best settings; more seeds then test them
    return [(name, seed) for seed in seeds for name in names]


def finished(out: Path, name: str, seed: int) -> bool:
    return (out / frontier.Regime.IID.value / f"seed{seed}" / name / frontier.SUMMARY).exists()


def flops_per_worker_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=demo.PEAK_LR, weight_decay=demo.WEIGHT_DECAY)


def probe_seconds_per_step(
    sizes: Sizes, corpus: replicate.Corpus, device: torch.device, runs: int, per_worker_loop: bool
) -> float:
    """Seconds of one optimizer step of every worker of
    ``runs`` runs (DiLoCo H_base), after a warm-up."""
    from autoloco_hf.sync.communicators import SimulatedCommunicator
    from autoloco_hf.sync.workers.batched_workers import BatchedRuns
    from autoloco_hf.sync.workers.local_workers import LocalWorkers

    model = tiny_llama(
        len(corpus.tokenizer),
        sizes.hidden,
        sizes.layers,
        sizes.heads,
        max_position_embeddings=demo.SEQ_LEN,
    ).to(device)
    config = demo.scaled_config("diloco", sizes.steps, max(2, sizes.steps // 100))
    if per_worker_loop:
        loop = LocalWorkers(
            config,
            model,
            SimulatedCommunicator(sizes.workers),
            optimizer_factory=adamw,
            total_steps=sizes.steps,
        )
        step_all = loop.train_step
    else:
        step_all = BatchedRuns([config] * runs, model, sizes.workers, adamw, sizes.steps).train_step
    sampler = frontier.make_sampler(
        frontier.Regime.IID, corpus, argparse.Namespace(**asdict(sizes), device=device), 0
    )
    warmup = max(2, sizes.probe_steps // 4)
    for step in range(warmup + sizes.probe_steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
        step_all(sampler.next_batches())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - started) / sizes.probe_steps


def runs_per_group(
    sizes: Sizes, corpus: replicate.Corpus, device: torch.device, cap: int | None
) -> int:
    """How many runs' replicas fit one group: the peak memory
    of a probe of one run against the free memory."""
    if device.type != "cuda":
        return cap or DRY_RUNS_PER_GROUP
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    probe_seconds_per_step(replace(sizes, probe_steps=1), corpus, device, 1, per_worker_loop=False)
    per_run = torch.cuda.max_memory_allocated(device) - before
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    fits = max(1, int(MEMORY_SHARE * free // per_run))
    return min(fits, cap) if cap else fits


def group_runs(chosen: Sequence[tuple[str, int]], per_group: int) -> list[tuple[int, list[str]]]:
    """Consecutive runs of one seed, ``per_group`` at most:
    the runs of a group share init and batches."""
    groups: list[tuple[int, list[str]]] = []
    for name, seed in chosen:
        if groups and groups[-1][0] == seed and len(groups[-1][1]) < per_group:
            groups[-1][1].append(name)
        else:
            groups.append((seed, [name]))
    return groups


def train_group(
    args: argparse.Namespace, points: Sequence[frontier.Point], seed: int, corpus: replicate.Corpus
) -> None:
    """Train ``points`` on ``seed`` as one :class:`BatchedRuns`;
    write each run's folder as frontier.py does."""
    from transformers import get_cosine_schedule_with_warmup

    from autoloco_hf.state.run_folder import RunWriter
    from autoloco_hf.sync.workers.batched_workers import BatchedRuns
    from autoloco_hf.toy.text import eval_windows, mean_loss

    folders = [frontier.run_dir(args.out, frontier.Regime.IID, seed, p) for p in points]
    writers = [RunWriter(str(folder), p.name) for folder, p in zip(folders, points)]
    configs = [frontier.point_config(p, args.steps) for p in points]
    model = tiny_llama(
        len(corpus.tokenizer),
        args.hidden,
        args.layers,
        args.heads,
        max_position_embeddings=demo.SEQ_LEN,
        seed=seed,
    ).to(args.device)
    runs = BatchedRuns(
        configs,
        model,
        args.workers,
        adamw,
        args.steps,
        scheduler_factory=lambda o: get_cosine_schedule_with_warmup(
            o, demo.warmup_steps(args.steps), args.steps
        ),
        records_paths=[w.intervals_path for w in writers],
    )
    sampler = frontier.make_sampler(frontier.Regime.IID, corpus, args, seed)
    started, cpu_started = time.perf_counter(), time.process_time()
    for step in range(1, args.steps + 1):
        lr = float(runs.stack.optimizer.param_groups[0]["lr"])
        runs.train_step(sampler.next_batches())
        elapsed = time.perf_counter() - started
        for writer, engine, losses in zip(writers, runs.engines, runs.last_losses):
            writer.log_step(step, sum(losses) / len(losses), lr, engine.totals, elapsed)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    val = replicate.eval_subset(corpus.splits.val, demo.SEQ_LEN, args.val_windows)
    commit = replicate.git_commit()
    for point, folder, writer, engine, config, trained in zip(
        points, folders, writers, runs.engines, configs, runs.run_models()
    ):
        windows = eval_windows(val, demo.SEQ_LEN, demo.EVAL_BATCH)
        val_loss = mean_loss(
            trained, ({k: v.to(args.device) for k, v in b.items()} for b in windows)
        )
        summary = writer.finish(
            engine.totals,
            config.to_dict(),
            wall,
            val_loss=val_loss,
            cpu_seconds=cpu,
            workers=args.workers,
            params=sum(p.numel() for p in model.parameters()),
            description=f"{point.method} H_base {point.h_base} {point.overrides}",
            regime=frontier.Regime.IID.value,
            variant=point.name,
            seed=seed,
            batch_size=args.batch_size,
            seq_len=demo.SEQ_LEN,
            inner_lr=demo.PEAK_LR,
            corpus=corpus.info,
            git_commit=commit,
            command=args.command,
            batched_workers=True,
            batched_runs=len(points),  # the runs trained together: wall_seconds is the group's
        )
        replicate.compress_logs(folder)
        print(
            f"done {folder}: syncs {summary['totals']['syncs']}, val {val_loss:.4f}, {wall:.0f} s",
            flush=True,
        )


def plan(
    budget_s: float, run_s: float, todo: Sequence[tuple[str, int]], max_runs: int
) -> list[tuple[str, int]]:
    """The longest prefix of ``todo`` whose estimated time fits
    ``budget_s`` (at least one run), ``max_runs`` at most."""
    return list(todo[: min(max_runs, max(1, int(budget_s // run_s)))])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out",
        default="gpu_frontier",
        help="folder for plan.json, the run folders and frontier.md",
    )
    p.add_argument(
        "--model", choices=sorted(MODELS), default="14m", help="model size (default 14m)"
    )
    p.add_argument(
        "--grid",
        type=Grid,
        choices=list(Grid),
        default=Grid.BASE,
        help="which settings (default base)",
    )
    p.add_argument(
        "--seeds", default="0,1,2", help="seeds of --grid tuned, in order (default 0,1,2)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=BUDGET_S,
        help=f"seconds of training to plan for (default {BUDGET_S:g})",
    )
    p.add_argument(
        "--time-limit-s",
        type=float,
        default=TIME_LIMIT_S,
        help=f"the call's whole time, corpus build and probe included (default {TIME_LIMIT_S})",
    )
    p.add_argument(
        "--max-runs",
        type=int,
        default=10**6,
        help="runs in this call at most (a campaign in pieces)",
    )
    p.add_argument(
        "--runs-per-group",
        type=int,
        help="runs trained as one batched computation at most (default: as many as fit the GPU's "
        f"memory; {DRY_RUNS_PER_GROUP} in the dry run)",
    )
    p.add_argument(
        "--per-worker-loop",
        action="store_true",
        help="train run by run with LocalWorkers' loop (the old path)",
    )
    p.add_argument(
        "--cpu-dry-run", action="store_true", help="tiny sizes on the CPU (what CI runs)"
    )
    p.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "autoloco"))
    args = p.parse_args(argv)
    for flag, value in (
        ("--budget-s", args.budget_s),
        ("--time-limit-s", args.time_limit_s),
        ("--max-runs", args.max_runs),
        ("--runs-per-group", args.runs_per_group or 1),
    ):
        if value <= 0:
            p.exit(2, f"gpu_frontier: {flag} {value:g}: pass a positive number, e.g. {flag} 420\n")
    try:
        args.seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        p.exit(
            2,
            f"gpu_frontier: --seeds {args.seeds!r}: pass comma-separated "
            "integers, e.g. --seeds 0,1,2\n",
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    if args.cpu_dry_run:
        sizes, device = DRY, torch.device("cpu")
        torch.set_num_threads(1)
    else:
        if not torch.cuda.is_available():
            print(
                "gpu_frontier: no CUDA device is visible; run with --cpu-dry-run to "
                "check the script on a CPU",
                file=sys.stderr,
            )
            return 2
        sizes, device = MODELS[args.model], torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = True
    corpus = replicate.load_corpus(args.cache_dir, replicate.VOCAB_SIZE, sizes.max_docs)
    model = tiny_llama(
        len(corpus.tokenizer),
        sizes.hidden,
        sizes.layers,
        sizes.heads,
        max_position_embeddings=demo.SEQ_LEN,
    )
    window = corpus.splits.train[: sizes.batch_size * demo.SEQ_LEN].view(
        sizes.batch_size, demo.SEQ_LEN
    )
    worker_flops = flops_per_worker_step(model, {"input_ids": window, "labels": window})
    per_group = (
        1 if args.per_worker_loop else runs_per_group(sizes, corpus, device, args.runs_per_group)
    )
    step_s = probe_seconds_per_step(sizes, corpus, device, per_group, args.per_worker_loop)
    run_s = 1.05 * sizes.steps * step_s / per_group  # +5%: the syncs and the validation pass
    names = points(args.grid, sizes.steps)
    out = Path(args.out)
    todo = [
        (name, seed)
        for name, seed in queue(args.grid, names, args.seeds)
        if not finished(out, name, seed)
    ]
    # the time limit includes the corpus build and the probe:
    # plan only what is left of it (30 s kept for the report)
    budget = min(args.budget_s, args.time_limit_s - 30 - (time.perf_counter() - started))
    chosen = plan(budget, run_s, todo, args.max_runs) if todo else []
    report = dict(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
        model=args.model,
        grid=args.grid.value,
        sizes=asdict(sizes),
        params=sum(p.numel() for p in model.parameters()),
        flops_per_worker_step=worker_flops,
        batched=not args.per_worker_loop,
        runs_per_group=per_group,
        seconds_per_step=step_s,  # of all the workers of one group
        achieved_tflops=per_group * sizes.workers * worker_flops / step_s / 1e12,
        estimated_seconds_per_run=run_s,
        budget_s=round(budget, 1),
        runs=[f"{n} seed {s}" for n, s in chosen],
        runs_left_after=len(todo) - len(chosen),
    )
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(report, indent=1), flush=True)
    run_args = frontier.parse_args(
        ["--out", str(out), "--regimes", "iid", "--steps", str(sizes.steps), "--quiet"]
    )
    for key in ("workers", "batch_size", "hidden", "layers", "heads", "val_windows", "max_docs"):
        setattr(run_args, key, getattr(sizes, key))
    run_args.device = device
    actual = {}
    training_began = time.perf_counter()
    if args.per_worker_loop:
        for name, seed in chosen:
            run_args.seeds = [seed]
            began = time.perf_counter()
            frontier.run_all(run_args, [names[name]], corpus)
            actual[f"{name} seed {seed}"] = round(time.perf_counter() - began, 1)
    else:
        for seed, group in group_runs(chosen, per_group):
            began = time.perf_counter()
            train_group(run_args, [names[name] for name in group], seed, corpus)
            for name in group:  # each run's share of its group's time
                actual[f"{name} seed {seed}"] = round((time.perf_counter() - began) / len(group), 1)
    training_s = time.perf_counter() - training_began
    report.update(
        actual_seconds=actual,
        training_seconds=round(training_s, 1),
        # the FLOP/s of the whole campaign: every step of
        # every worker of every run, over the training time
        campaign_tflops=len(chosen)
        * sizes.steps
        * sizes.workers
        * worker_flops
        / max(training_s, 1e-9)
        / 1e12,
        total_seconds=round(time.perf_counter() - started, 1),
    )
    report["within_time_limit"] = report["total_seconds"] <= args.time_limit_s
    (out / "plan.json").write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"report: {frontier.write_report(run_args)}; total {report['total_seconds']} s", flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
