"""The fixed-horizon frontier: DiLoCo over a grid of (outer
momentum, H), with AutoLoCo's variants placed on it.

Not a test. Same model, corpus, schedule and seeds as ``benchmarks/campaigns/replicate.py``
(tiny Llama, Python standard library text, T steps, warm-up 2% then cosine),
in two data regimes:

- ``iid``: every worker reads disjoint random windows of the whole training
  stream (replicate.py's Table 1 setting);
- ``noniid``: every worker reads only its own disjoint set of whole documents,
  grouped by standard-library package and balanced by tokens (the
  cross-datacenter case: the workers' data differ).

Each finished run is one folder ``OUT/<regime>/seed<k>/<variant>/`` with
``summary.json`` and gzipped interval and step logs; a rerun skips finished
runs and several copies of the command share the work through lock files::

    nohup nice -n 10 python benchmarks/campaigns/frontier.py --out results/frontier &
    python benchmarks/campaigns/frontier.py --out results/frontier --report-only

The report (``OUT/frontier.md`` + one plot per regime) gives, per regime, first the comparators a
reader assumes (:class:`Comparison`: each rule against the tuned DiLoCo at its ``h_base``, against
the tuned frontier at its own sync count, and its syncs at equal loss), then the fixed-H curve at
each momentum (mean ± standard error over paired seeds), each AutoLoCo variant's excess over the
curve at its own sync count, and over the best fixed setting of any momentum.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shlex
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# benchmarks/: its kinds import as packages
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# the corpus, the model and the run machinery are replicate.py's
from campaigns import replicate  # noqa: E402

from autoloco_hf.config import Method, ValueEnum  # noqa: E402
from autoloco_hf.errors import ConfigError  # noqa: E402
from autoloco_hf.toy import demo  # noqa: E402
from autoloco_hf.toy.llama import tiny_llama  # noqa: E402
from autoloco_hf.toy.text import DisjointWindowSampler, TokenSplits  # noqa: E402

SUMMARY, STEPS_GZ, INTERVALS_GZ = replicate.SUMMARY, replicate.STEPS_GZ, replicate.INTERVALS_GZ
# the variant the others are paired against (the paper's rule at its defaults)
REFERENCE = "autoloco"


class Regime(ValueEnum):
    IID = "iid"
    NONIID = "noniid"


@dataclass(frozen=True)
class Point:
    """One run setting: a demo method at a horizon with ``AutoLoCoConfig`` overrides."""

    name: str
    method: str
    h_base: int
    overrides: dict[str, Any] = field(default_factory=dict)


BASE_OUTER_LR = 0.7  # the outer learning rate of every fixed setting whose name carries none


def fixed_name(mu: float, h: int, outer_lr: float = BASE_OUTER_LR) -> str:
    return (
        f"diloco_mu{mu:g}_h{h}"
        if outer_lr == BASE_OUTER_LR
        else f"diloco_lr{outer_lr:g}_mu{mu:g}_h{h}"
    )


def grid(
    h_list: Sequence[int],
    base_mu: float,
    mu_list: Sequence[float],
    mu_h_list: Sequence[int],
    tuned: Sequence[tuple[float, float, int]] = (),
) -> list[Point]:
    """DiLoCo at ``base_mu`` over ``h_list``, every ``mu_list`` momentum at each ``mu_h_list``
    horizon, then the ``tuned`` (outer LR, momentum, H) settings."""
    triples = [(BASE_OUTER_LR, base_mu, h) for h in h_list]
    triples += [(BASE_OUTER_LR, mu, h) for h in mu_h_list for mu in mu_list] + list(tuned)
    seen: dict[str, Point] = {}
    for lr, mu, h in triples:
        name = fixed_name(mu, h, lr)
        overrides = (
            dict(outer_momentum=mu) if lr == BASE_OUTER_LR else dict(outer_momentum=mu, outer_lr=lr)
        )
        seen.setdefault(name, Point(name, "diloco", h, overrides))
    return list(seen.values())


def tuned_grid(
    outer_lrs: Sequence[float], momenta: Sequence[float], horizons: Sequence[int]
) -> list[tuple[float, float, int]]:
    """The tuned baseline's settings, the most informative
    first: the middle horizons, then the ends."""
    order = sorted(horizons, key=lambda h: (h not in (10, 20), h))
    return [(lr, mu, h) for h in order for lr in outer_lrs for mu in momenta]


def parse_adaptive(specs: Sequence[str], h_base: int) -> list[Point]:
    """``NAME[:field=value,...]`` -> an AutoLoCo point from the
    paper's H_base (values parsed as JSON when they can be)."""
    points = []
    for spec in specs:
        name, _, body = spec.partition(":")
        fields = dict(replicate.parse_beyond([spec])[0][1]) if body else {}
        # method=diloco gives a fixed-H variant with overrides (e.g.
        # fragments), reported next to the adaptive ones; h_base=N runs the
        # variant at its own H_base (the size ladder's 2x and 4x curves)
        method, own_h_base = (
            str(fields.pop("method", "autoloco")),
            int(fields.pop("h_base", h_base)),
        )
        points.append(Point(name, method, own_h_base, fields))
    return points


# ------------------------------------------------------------------ non-IID data
def package_of(doc_name: str) -> str:
    """``email/mime/text.py`` -> ``email``; ``json.py`` ->
    ``json``; ``pydoc:topic`` -> ``pydoc``."""
    if doc_name.startswith("pydoc:"):
        return "pydoc"
    return Path(doc_name).parts[0].removesuffix(".py")


def train_documents(max_docs: int | None) -> list[str]:
    """Names of the training documents, in the order replicate.py encoded them."""
    docs = replicate.stdlib_documents(max_docs)
    every = max(2, round(1 / replicate.VAL_FRACTION))
    return [name for i, (name, _) in enumerate(docs) if i % every != every // 2]


def document_tokens(train: torch.Tensor, eos_id: int, count: int) -> list[torch.Tensor]:
    """The training stream cut back into its documents (each was encoded followed by one EOS)."""
    ends = (train == eos_id).nonzero().flatten().tolist()
    if len(ends) != count:
        raise SystemExit(
            f"frontier: the token cache holds {len(ends)} documents, the corpus "
            f"{count}: rebuild the cache"
        )
    starts = [0] + [e + 1 for e in ends[:-1]]
    return [train[s : e + 1] for s, e in zip(starts, ends)]


def shard_by_package(
    names: Sequence[str], docs: Sequence[torch.Tensor], workers: int
) -> list[torch.Tensor]:
    """Whole packages to workers, largest first to the worker
    with the fewest tokens so far (balanced, disjoint)."""
    packages: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        packages.setdefault(package_of(name), []).append(i)
    sizes = {p: sum(docs[i].numel() for i in idx) for p, idx in packages.items()}
    shards: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for package in sorted(packages, key=lambda p: (-sizes[p], p)):
        w = loads.index(min(loads))
        shards[w] += packages[package]
        loads[w] += sizes[package]
    return [torch.cat([docs[i] for i in sorted(shard)]) for shard in shards]


class OnDevice:
    """Hands another sampler's batches over on ``device``."""

    def __init__(self, sampler: Any, device: torch.device) -> None:
        self.sampler, self.device = sampler, device

    def capacity_steps(self) -> int:
        return self.sampler.capacity_steps()

    def next_batches(self) -> list[dict[str, torch.Tensor]]:
        return [
            {k: v.to(self.device, non_blocking=True) for k, v in b.items()}
            for b in self.sampler.next_batches()
        ]


class ShardedWindowSampler:
    """Worker ``w`` reads only windows of its own shard,
    shuffled once by ``seed``; no window is read twice."""

    def __init__(
        self, shards: Sequence[torch.Tensor], seq_len: int, batch_size: int, seed: int
    ) -> None:
        self.samplers = [
            DisjointWindowSampler(s, seq_len, batch_size, 1, seed=seed + w)
            for w, s in enumerate(shards)
        ]

    def capacity_steps(self) -> int:
        return min(s.capacity_steps() for s in self.samplers)

    def next_batches(self) -> list[dict[str, torch.Tensor]]:
        return [s.next_batches()[0] for s in self.samplers]


# ------------------------------------------------------------------ running
def run_dir(out: str, regime: Regime, seed: int, point: Point) -> Path:
    return Path(out) / regime.value / f"seed{seed}" / point.name


def make_sampler(
    regime: Regime, corpus: replicate.Corpus, args: argparse.Namespace, seed: int
) -> Any:
    if regime is Regime.IID:
        sampler = DisjointWindowSampler(
            corpus.splits.train, demo.SEQ_LEN, args.batch_size, args.workers, seed=seed
        )
    else:
        names = train_documents(args.max_docs)
        docs = document_tokens(corpus.splits.train, corpus.tokenizer.eos_token_id, len(names))
        sampler = ShardedWindowSampler(
            shard_by_package(names, docs, args.workers), demo.SEQ_LEN, args.batch_size, seed
        )
    device = torch.device(getattr(args, "device", "cpu"))
    return sampler if device.type == "cpu" else OnDevice(sampler, device)


def point_config(point: Point, steps: int) -> Any:
    """The point's config; q_H (H_base / 10 for the paper's
    AutoLoCo, else 1) where it applies, AutoLoCo's only."""
    if demo.method_of(point.method) != Method.AUTOLOCO:
        return demo.scaled_config(point.method, steps, point.h_base, **point.overrides)
    q_h = max(1, point.h_base // 10) if point.method == "autoloco" else 1
    return demo.scaled_config(point.method, steps, point.h_base, q_h=q_h, **point.overrides)


def run_configs(points: Sequence[Point], steps: int) -> dict[str, Any]:
    """Every run's config; a bad setting ends the campaign before it trains, in one line, exit 2."""
    configs = {}
    for point in points:
        try:
            configs[point.name] = point_config(point, steps)
        except (ConfigError, TypeError) as err:  # TypeError: a field AutoLoCoConfig does not have
            print(
                f"frontier: the run {point.name!r} (--adaptive or a grid flag): {err}",
                file=sys.stderr,
            )
            raise SystemExit(2) from None
    return configs


def run_all(args: argparse.Namespace, points: Sequence[Point], corpus: replicate.Corpus) -> None:
    from tqdm.auto import tqdm

    configs = run_configs(points, args.steps)
    commit = replicate.git_commit()
    val = replicate.eval_subset(corpus.splits.val, demo.SEQ_LEN, args.val_windows)
    for seed in args.seeds:
        for regime in args.regimes:
            for point in points:
                folder = run_dir(args.out, regime, seed, point)
                if (folder / SUMMARY).exists() or not replicate.take_lock(folder):
                    continue
                try:
                    sampler = make_sampler(regime, corpus, args, seed)
                    if sampler.capacity_steps() < args.steps:
                        raise SystemExit(
                            f"frontier: {regime} feeds {sampler.capacity_steps()} "
                            f"steps < --steps {args.steps}"
                        )
                    model = tiny_llama(
                        len(corpus.tokenizer), args.hidden, args.layers, args.heads,
                        max_position_embeddings=demo.SEQ_LEN, seed=seed,
                    ).to(getattr(args, "device", "cpu"))  # fmt: skip
                    setup = demo.DemoSetup(
                        corpus.tokenizer, TokenSplits(corpus.splits.train, val), model
                    )
                    run_args = argparse.Namespace(
                        out=str(folder.parent), steps=args.steps, workers=args.workers, seed=seed
                    )
                    started = time.perf_counter()
                    with tqdm(
                        total=args.steps, unit="step", mininterval=60, disable=args.quiet
                    ) as bar:
                        summary = demo.train_method(
                            point.name,
                            configs[point.name],
                            setup,
                            run_args,
                            bar,
                            sampler=sampler,
                            description=f"{point.method} H_base {point.h_base} {point.overrides}",
                            regime=regime.value,
                            peak_lr=args.lr,
                            variant=point.name,
                            seed=seed,
                            batch_size=args.batch_size,
                            seq_len=demo.SEQ_LEN,
                            inner_lr=args.lr,
                            corpus=corpus.info,
                            git_commit=commit,
                            command=args.command,
                            batched_workers=args.batched_workers,
                        )
                    replicate.compress_logs(folder)
                    print(
                        f"done {folder}: syncs {summary['totals']['syncs']}, val "
                        f"{summary['val_loss']:.4f}, {time.perf_counter() - started:.0f} s",
                        flush=True,
                    )
                finally:
                    (folder / "run.lock").unlink(missing_ok=True)


# ------------------------------------------------------------------ report
@dataclass
class Result:
    syncs: float
    val: float
    train_mean: float  # mean training loss over the whole run (the paper's measure)
    train_last10: float
    horizons: list[int]
    outer_momentum: float  # the base momentum (AutoLoCo: the one its correction starts from)
    config: dict[str, Any]
    # the first interval's drift exponent, where the start probe measured it
    start_probe: float | None = None
    start_cut: bool = False  # the probe ended the first interval early


def load_result(folder: Path) -> Result:
    summary = json.loads((folder / SUMMARY).read_text())
    with gzip.open(folder / STEPS_GZ, "rt") as f:
        losses = [json.loads(line)["loss"] for line in f]
    with gzip.open(folder / INTERVALS_GZ, "rt") as f:
        records = [json.loads(line) for line in f]
    tail = losses[-max(1, len(losses) // 10) :]
    return Result(
        summary["totals"]["syncs"],
        summary["val_loss"],
        statistics.fmean(losses),
        statistics.fmean(tail),
        [r["h_step"] for r in records],
        summary["config"]["outer_momentum"],
        summary["config"],
        records[0].get("probe_exponent"),
        records[0]["assessment"] == "bent",
    )


def collect(out: str) -> dict[Regime, dict[str, dict[int, Result]]]:
    """regime -> variant -> seed -> result, for every finished run under ``out``."""
    found: dict[Regime, dict[str, dict[int, Result]]] = {}
    for summary in sorted(Path(out).glob(f"*/seed*/*/{SUMMARY}")):
        folder = summary.parent
        regime, seed = (
            Regime(folder.parent.parent.name),
            int(folder.parent.name.removeprefix("seed")),
        )
        found.setdefault(regime, {}).setdefault(folder.name, {})[seed] = load_result(folder)
    return found


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    # NaN: a variant outside the curve's range of syncs
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    return mean, (
        statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    )


def fmt(values: Sequence[float], digits: int = 4) -> str:
    mean, se = mean_se(values)
    return (
        "-"
        if math.isnan(mean)
        else f"{mean:+.{digits}f}" + ("" if math.isnan(se) else f" ± {se:.{digits}f}")
    )


def parse_setting(name: str) -> tuple[float, float, int] | None:
    """``diloco_lr1_mu0.5_h20`` -> (1.0, 0.5, 20);
    ``diloco_mu0.7_h10`` -> (BASE_OUTER_LR, 0.7, 10); else None."""
    body = name.removeprefix("diloco_")
    outer_lr = BASE_OUTER_LR
    if body.startswith("lr"):
        lr_text, _, body = body.removeprefix("lr").partition("_")
        outer_lr = float(lr_text)
    if not body.startswith("mu"):
        return None
    mu, _, h = body.removeprefix("mu").partition("_h")
    return outer_lr, float(mu), int(h)


def parse_fixed(name: str) -> tuple[float, int] | None:
    """(momentum, H) of a fixed setting at the base outer LR:
    the momentum curves of the first tables."""
    setting = parse_setting(name)
    return (setting[1], setting[2]) if setting and setting[0] == BASE_OUTER_LR else None


def curve_at(curve: dict[int, float], syncs: float, sync_counts: dict[int, float]) -> float:
    """The fixed-H curve (val loss against syncs) linearly
    interpolated at ``syncs``; NaN outside its range."""
    points = sorted((sync_counts[h], curve[h]) for h in curve)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= syncs <= x1:
            return y0 + (y1 - y0) * (syncs - x0) / (x1 - x0) if x1 > x0 else y0
    return math.nan


def same_but_fragments(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two run configs differ in ``fragments`` only
    (a field one of them predates is not a difference)."""
    return all(a[k] == b[k] for k in a.keys() & b.keys() if k != "fragments")


def common_seeds(cells: dict[str, dict[int, Result]], names: Sequence[str]) -> list[int]:
    """The seeds every one of ``names`` finished."""
    return sorted(set.intersection(*(set(cells[n]) for n in names))) if names else []


def curve_over(
    cells: dict[str, dict[int, Result]], curve: dict[int, str], seeds: Sequence[int]
) -> tuple[list[int], dict[int, str]]:
    """The longest prefix of ``seeds`` on which at least two
    horizons of ``curve`` finished, and those horizons.

    A horizon still running, or run on fewer seeds, is left
    out of the comparison rather than shrinking it.
    """
    seeds = list(seeds)
    while seeds:
        points = {h: n for h, n in curve.items() if set(seeds) <= set(cells[n])}
        if len(points) >= 2:
            return seeds, points
        seeds.pop()
    return [], {}


def fragment_pairs(cells: dict[str, dict[int, Result]]) -> list[str]:
    """Each streaming-fragments variant minus the run of the
    same setting at F = 1, paired over their common seeds."""
    rows = []
    for name, runs in cells.items():
        config = next(iter(runs.values())).config
        if config.get("fragments", 1) == 1:
            continue
        whole = [
            n
            for n, r in cells.items()
            if next(iter(r.values())).config.get("fragments", 1) == 1
            and same_but_fragments(next(iter(r.values())).config, config)
        ]
        for ref in whole[:1]:
            seeds = common_seeds(cells, [name, ref])
            rows.append([
                name, ref, str(config["fragments"]), seed_list(seeds),
                f"{statistics.fmean(cells[name][s].syncs for s in seeds):.1f}",
                fmt([cells[name][s].val - cells[ref][s].val for s in seeds]),
            ])  # fmt: skip
    if not rows:
        return []
    return [
        "Each streaming-fragments variant minus the same setting at F = 1, paired over "
        "the seeds both finished:",
        "",
        replicate.markdown_table(
            ["variant", "F = 1 run", "F", "seeds", "syncs", "val loss minus F = 1"], rows
        ),
        "",
    ]


def seed_list(seeds: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 4]`` -> ``0-4``."""
    if seeds and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])
    return ",".join(map(str, seeds))


def lowest_mean_val(
    cells: dict[str, dict[int, Result]], names: Iterable[str], seeds: list[int]
) -> str | None:
    """The setting with the lowest mean val loss over ``seeds``:
    chosen once (a per-seed minimum would select noise)."""
    return min(names, key=lambda n: statistics.fmean(cells[n][s].val for s in seeds), default=None)


def start_probe_threshold(config: dict[str, Any]) -> float:
    """The descent rule's start-probe threshold of a run's config: nested (``rule_options``) or, in
    runs committed before rules were plug-ins, the flat ``descent_start_probe``."""
    if "descent_start_probe" in config:
        return config["descent_start_probe"]
    return config["rule_options"]["start_probe"]


def start_probes(cells: dict[str, dict[int, Result]]) -> list[str]:
    """Per seed, the first interval's drift exponent of each
    variant with the start probe, and whether it cut."""
    probed = {
        name: runs
        for name, runs in cells.items()
        if any(r.start_probe is not None for r in runs.values())
    }
    if not probed:
        return []
    seeds = sorted({s for runs in probed.values() for s in runs})
    rows = [
        [name, f"{start_probe_threshold(next(iter(runs.values())).config):g}"]
        + [
            f"{runs[s].start_probe:.3f}{' cut' if runs[s].start_cut else ''}" if s in runs else "-"
            for s in seeds
        ]
        for name, runs in probed.items()
    ]
    return [
        "The start probe: the drift exponent of the first interval between 1.5 and 2 h_ref, per "
        "seed ('cut': below the threshold, the interval ended at 2 h_ref):",
        "",
        replicate.markdown_table(["variant", "threshold"] + [f"seed {s}" for s in seeds], rows),
        "",
    ]


def regime_report(
    regime: Regime, cells: dict[str, dict[int, Result]], base_mu: float, plot_dir: Path
) -> list[str]:
    """The tables and the plot of one regime."""
    fixed = {name: parse_fixed(name) for name in cells if parse_fixed(name)}
    adaptive = [name for name in cells if parse_setting(name) is None]
    lines = [
        f"## Regime {regime.value}",
        "",
        "Every comparison below is paired over the seeds that all its runs finished (column "
        "'seeds'); the first table lists every setting over all of its seeds.",
        "",
    ]
    frontier = TunedFrontier.of(cells)
    if frontier:
        lines += comparisons_report(cells, frontier, adaptive)
    rows = []
    for name, runs in sorted(
        cells.items(), key=lambda kv: (kv[0] not in fixed, fixed.get(kv[0]) or (0, 0), kv[0])
    ):
        r = list(runs.values())
        rows.append([
            name, seed_list(sorted(runs)), f"{statistics.fmean(x.syncs for x in r):.1f}",
            fmt([x.val for x in r]).lstrip("+"), fmt([x.train_mean for x in r]).lstrip("+"),
            fmt([x.train_last10 for x in r]).lstrip("+"),
        ])  # fmt: skip
    headers = [
        "setting",
        "seeds",
        "syncs",
        "val loss (± s.e.)",
        "mean train loss",
        "train loss, last 10%",
    ]
    lines += [replicate.markdown_table(headers, rows), ""]
    by_mu: dict[float, dict[int, str]] = {}  # momentum -> H -> fixed setting
    for name, (mu, h) in fixed.items():
        by_mu.setdefault(mu, {})[h] = name
    # fixed H: exact
    syncs_of = {name: statistics.fmean(r.syncs for r in cells[name].values()) for name in fixed}
    diff_rows = []
    for name in adaptive:
        r = cells[name]
        # the curve at the variant's own base momentum where the grid has one, else at --base-mu
        own_mu = next(iter(r.values())).outer_momentum
        curve_mu = own_mu if len(by_mu.get(own_mu, {})) >= 2 else base_mu
        seeds, base = curve_over(cells, by_mu.get(curve_mu, {}), sorted(r))
        if not seeds:
            continue
        base_syncs = {h: syncs_of[n] for h, n in base.items()}
        own_syncs = statistics.fmean(r[s].syncs for s in seeds)
        finished = [n for n in fixed if set(seeds) <= set(cells[n])]
        best = lowest_mean_val(
            cells, [n for n in finished if syncs_of[n] <= own_syncs * 1.0001], seeds
        )
        best_any = lowest_mean_val(cells, finished, seeds)  # the whole grid, whatever its syncs
        # target (b): the best fixed H at the curve's momentum, whatever its syncs
        best_h = lowest_mean_val(cells, base.values(), seeds)
        diff_rows.append(
            [
                name,
                seed_list(seeds),
                f"{curve_mu:g}",
                f"{own_syncs:.1f}",
                fmt(
                    [
                        r[s].val
                        - curve_at(
                            {h: cells[n][s].val for h, n in base.items()}, r[s].syncs, base_syncs
                        )
                        for s in seeds
                    ]
                ),
                f"{fmt([r[s].val - cells[best_h][s].val for s in seeds])} ({best_h})"
                if best_h
                else "-",
                f"{fmt([r[s].val - cells[best][s].val for s in seeds])} ({best})" if best else "-",
                f"{fmt([r[s].val - cells[best_any][s].val for s in seeds])} ({best_any})"
                if best_any
                else "-",
                fmt(
                    [
                        r[s].train_mean
                        - curve_at(
                            {h: cells[n][s].train_mean for h, n in base.items()},
                            r[s].syncs,
                            base_syncs,
                        )
                        for s in seeds
                    ]
                ),
            ]
        )
    lines += [
        "Excess of each adaptive variant (mean ± s.e. over the seeds the variant and its whole "
        "curve finished): over the fixed-H DiLoCo curve at the variant's own base momentum "
        f"(column 'curve mu'; mu {base_mu:g} where the grid has no curve at it) interpolated at "
        "the variant's own sync count; over the best fixed H at that momentum (any syncs); over "
        "the fixed setting (any momentum, no more syncs than the variant, finished on those "
        "seeds) with the lowest mean val loss over those seeds; over the same without the sync "
        "limit (the whole grid); and the mean-training-loss excess over the mu-curve.",
        "",
        replicate.markdown_table(
            [
                "variant",
                "seeds",
                "curve mu",
                "syncs",
                "val excess over mu-curve",
                "val excess over best fixed H at mu",
                "val excess over best fixed",
                "val excess over best fixed, any syncs",
                "mean-train excess",
            ],
            diff_rows,
        ),
        "",
    ]
    others = (
        [n for n in adaptive if n != REFERENCE and common_seeds(cells, [n, REFERENCE])]
        if REFERENCE in cells
        else []
    )
    if others:  # e.g. fragments or the descent rule against the paper rule
        rows = []
        for name in others:
            seeds = common_seeds(cells, [name, REFERENCE])
            rows.append(
                [
                    name,
                    seed_list(seeds),
                    f"{statistics.fmean(cells[name][s].syncs for s in seeds):.1f}",
                    fmt([cells[name][s].val - cells[REFERENCE][s].val for s in seeds]),
                ]
            )
        lines += [
            f"Each adaptive variant minus `{REFERENCE}` (the paper's rule), paired over "
            "the seeds both finished:",
            "",
            replicate.markdown_table(
                ["variant", "seeds", "syncs", "val loss minus " + REFERENCE], rows
            ),
            "",
        ]
    lines += fragment_pairs({n: cells[n] for n in adaptive}) + start_probes(
        {n: cells[n] for n in adaptive}
    )
    if frontier:
        lines += frontier.report(cells, adaptive)
    plot_path = plot_dir / f"frontier_{regime.value}.png"
    plot(regime, cells, by_mu, adaptive, plot_path, frontier)
    lines += [f"![frontier {regime.value}](frontier/{plot_path.name})", ""]
    return lines


@dataclass
class TunedFrontier:
    """The tuned baseline: at each horizon, the fixed (outer
    LR, momentum) with the lowest mean val loss.

    Each horizon's settings are compared over the seeds all of them finished (``choice_seeds``),
    chosen once by the mean (a per-seed minimum would select noise). The frontier at a sync count is
    the lower envelope of those winners: the best of the horizons with no more syncs, interpolated
    linearly between the grid's sync counts.
    """

    best: dict[int, str]  # H -> the winning setting
    choice_seeds: dict[int, list[int]]  # H -> the seeds its choice was made on
    syncs: dict[int, float]  # H -> sync count

    @classmethod
    def of(cls, cells: dict[str, dict[int, Result]]) -> TunedFrontier | None:
        """None unless the grid varies the outer LR (older campaigns have no tuned baseline)."""
        settings = {n: s for n in cells if (s := parse_setting(n))}
        if all(lr == BASE_OUTER_LR for lr, _, _ in settings.values()):
            return None
        best, seeds_of, syncs = {}, {}, {}
        # a horizon joins once its piece of the campaign is complete: every
        # (outer LR, momentum) that the tuned grid runs at another LR than the
        # base one is there, else its best would be chosen among a few settings
        tuned = {(lr, mu) for lr, mu, _ in settings.values() if lr != BASE_OUTER_LR}
        for h in sorted({h for _, _, h in settings.values()}):
            at_h = [n for n, (_, _, sh) in settings.items() if sh == h]
            seeds = common_seeds(cells, at_h)
            if len(at_h) < 2 or not seeds or not tuned <= {settings[n][:2] for n in at_h}:
                continue
            best[h], seeds_of[h] = lowest_mean_val(cells, at_h, seeds), seeds
            syncs[h] = statistics.fmean(r.syncs for r in cells[best[h]].values())
        # ... whose winner ran every seed of the best-covered choice: a winner on fewer seeds would
        # cut every pairing to those (a horizon chosen on fewer seeds, its winner on all, cuts none)
        widest = max(map(set, seeds_of.values()), key=len, default=set())
        for h in [h for h, name in best.items() if not widest <= set(cells[name])]:
            del best[h], seeds_of[h], syncs[h]
        return cls(best, seeds_of, syncs) if len(best) >= 2 else None

    def envelope(self, cells: dict[str, dict[int, Result]], seeds: Sequence[int]) -> dict[int, str]:
        """H -> the setting that is the frontier at H's sync
        count on ``seeds``: no worse than any longer H."""
        mean = {h: statistics.fmean(cells[n][s].val for s in seeds) for h, n in self.best.items()}
        return {
            h: self.best[
                min((g for g in self.best if self.syncs[g] <= self.syncs[h]), key=mean.__getitem__)
            ]
            for h in self.best
        }

    def at(
        self, cells: dict[str, dict[int, Result]], seeds: Sequence[int], seed: int, syncs: float
    ) -> float:
        envelope = self.envelope(cells, seeds)
        return curve_at({h: cells[n][seed].val for h, n in envelope.items()}, syncs, self.syncs)

    def report(self, cells: dict[str, dict[int, Result]], adaptive: Sequence[str]) -> list[str]:
        rows = []
        for h, name in self.best.items():
            settings = [n for n in cells if (s := parse_setting(n)) and s[2] == h]
            seeds = self.choice_seeds[h]
            runner_up = lowest_mean_val(cells, [n for n in settings if n != name], seeds)
            # the margin on every seed both ran: a close runner-up
            # gets more seeds than the choice was made on
            both = common_seeds(cells, [name, runner_up])
            rows.append(
                [
                    f"{h}",
                    f"{self.syncs[h]:.0f}",
                    name,
                    seed_list(sorted(cells[name])),
                    fmt([r.val for r in cells[name].values()]).lstrip("+"),
                    seed_list(seeds),
                    f"{fmt([cells[runner_up][s].val - cells[name][s].val for s in both])} "
                    f"({runner_up}; {seed_list(both)})",
                ]
            )
        grid = sorted({(lr, mu) for n in cells if (st := parse_setting(n)) for lr, mu in [st[:2]]})
        grid_rows = []
        for h, seeds in self.choice_seeds.items():
            val = {
                st[:2]: statistics.fmean(cells[n][s].val for s in seeds)
                for n in cells
                if (st := parse_setting(n)) and st[2] == h and set(seeds) <= set(cells[n])
            }
            grid_rows.append(
                [f"{h}", seed_list(seeds)] + [f"{val[k]:.3f}" if k in val else "-" for k in grid]
            )
        lines = [
            "### Tuned baseline",
            "",
            "Mean val loss of every fixed setting over the seeds every setting "
            "at that horizon finished:",
            "",
            replicate.markdown_table(
                ["H", "seeds"] + [f"LR {lr:g}, mu {mu:g}" for lr, mu in grid], grid_rows
            ),
            "",
            "The best fixed (outer LR, momentum) at each horizon, chosen by the mean val loss "
            "over the seeds every setting at that horizon finished (column 'chosen on'), and the "
            "runner-up's margin paired over every seed both ran:",
            "",
            replicate.markdown_table(
                [
                    "H",
                    "syncs",
                    "best setting",
                    "its seeds",
                    "val loss (± s.e.)",
                    "chosen on",
                    "runner-up minus best (seeds)",
                ],
                rows,
            ),
            "",
        ]
        diff_rows, held_out_rows = [], []
        chosen_on = set().union(*map(set, self.choice_seeds.values()))
        for name in adaptive:
            r = cells[name]
            seeds = common_seeds(cells, [name, *self.best.values()])
            if not seeds:
                continue
            own_syncs = statistics.fmean(r[s].syncs for s in seeds)
            h_base = next(iter(r.values())).config["h_base"]
            diff_rows.append([
                name, seed_list(seeds), f"{own_syncs:.1f}",
                f"{own_syncs / self.syncs[h_base]:.2f}x" if h_base in self.syncs else "-",
                fmt([r[s].val - self.at(cells, seeds, s, r[s].syncs) for s in seeds]),
            ])  # fmt: skip
            if held_out := [s for s in seeds if s not in chosen_on]:
                excess = [r[s].val - self.at(cells, held_out, s, r[s].syncs) for s in held_out]
                held_out_rows.append(
                    [name, seed_list(held_out), fmt(excess), ", ".join(f"{e:+.3f}" for e in excess)]
                )
        held_out_table = [
            "The same on the held-out seeds alone (those no horizon's choice was made on), the "
            "envelope taken over them:",
            "",
            replicate.markdown_table(
                ["variant", "held-out seeds", "val excess over tuned frontier", "per seed"],
                held_out_rows,
            ),
            "",
        ]
        return (
            lines
            + [
                "Each adaptive variant against the tuned frontier (the lower envelope of the "
                "table above, interpolated at the variant's own sync count; '-' outside the "
                "grid's sync range), and its syncs against the tuned DiLoCo at the variant's "
                "`h_base`, paired over the seeds all of them finished:",
                "",
                replicate.markdown_table(
                    [
                        "variant",
                        "seeds",
                        "syncs",
                        "syncs vs tuned DiLoCo",
                        "val excess over tuned frontier",
                    ],
                    diff_rows,
                ),
                "",
            ]
            + (held_out_table if held_out_rows else [])
        )


# ------------------------------------------------------------------ the
# comparators a reader assumes the default rule's run names: the ladder's
# and the GPU campaign's, then the 197k campaigns' (docs/results.md)
DEFAULT_NAMES = ("default", "descent_k0.9_guard_mu0.5_hmax20")
# default_hb20: the default at h_base 20, one point of its loss-against-syncs curve
HB_SUFFIX = "_hb"


def log_interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """y at ``x`` on the line through the ``(x, y)`` points, linear in log(x) between neighbours;
    NaN outside their range (no extrapolation)."""
    points = sorted(points)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * math.log(x / x0) / math.log(x1 / x0)
    return next((y for px, y in points if px == x), math.nan)


@dataclass(frozen=True)
class Crossing:
    """Where a loss-against-syncs curve reaches a loss: at
    ``syncs``, or at most there when ``bound``."""

    syncs: float
    bound: bool = False


def syncs_at_loss(curve: Sequence[tuple[float, float]], loss: float) -> Crossing | None:
    """The fewest syncs at which the curve of ``(syncs, loss)`` points reaches ``loss``, linear in
    log(syncs) between neighbours. A bound when its fewest-syncs point is already at or below
    ``loss`` (the crossing lies beyond what was measured); None when no point reaches it."""
    points = sorted(curve)
    if points[0][1] <= loss:
        return Crossing(points[0][0], bound=True)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if y1 <= loss:  # and y0 > loss: the curve crosses between the two
            return Crossing(x0 * math.exp((loss - y0) / (y1 - y0) * math.log(x1 / x0)))
    return None


def h_base_of(runs: dict[int, Result]) -> int:
    return next(iter(runs.values())).config["h_base"]


@dataclass
class Comparison:
    """One rule against the tuned DiLoCo of its regime, each
    comparator paired over the seeds it can use.

    (a) the rule minus the tuned DiLoCo at the rule's ``h_base``; (b) the rule minus the tuned
    frontier (its lower envelope) interpolated in log(syncs) at the rule's own sync count, NaN
    outside the grid's range; (c) the syncs at which the rule's curve over ``h_base`` (its ``_hbN``
    variants) reaches the loss of (a)'s DiLoCo, per seed as a ratio to that DiLoCo's syncs.
    """

    rule: str
    tuned: str | None  # the tuned DiLoCo at the rule's h_base: (a)'s and (c)'s comparator
    chosen_on: list[int]  # the seeds the tuned DiLoCo was chosen on (every setting at its H ran)
    a_seeds: list[int]
    a: list[float]
    b_seeds: list[int]
    b: list[float]
    b_syncs: list[float]  # the rule's syncs on b_seeds
    b_range: tuple[float, float]  # the tuned grid's range of syncs
    curve: list[str]  # the rule's runs over h_base, most syncs first: (c)'s curve
    c_seeds: list[int]
    c: list[Crossing | None]
    c_ratio: list[float]  # crossing syncs / the DiLoCo's syncs (NaN where not reached)

    @classmethod
    def of(
        cls, cells: dict[str, dict[int, Result]], frontier: TunedFrontier, rule: str
    ) -> Comparison:
        tuned = frontier.best.get(h_base_of(cells[rule]))
        a_seeds = common_seeds(cells, [rule, tuned]) if tuned else []
        b_seeds = common_seeds(cells, [rule, *frontier.best.values()])
        envelope = frontier.envelope(cells, b_seeds) if b_seeds else {}
        b = [
            cells[rule][s].val
            - log_interpolate(
                [(frontier.syncs[h], cells[n][s].val) for h, n in envelope.items()],
                cells[rule][s].syncs,
            )
            for s in b_seeds
        ]
        curve, c_seeds = cls.curve_of(cells, rule, a_seeds)
        c = [
            syncs_at_loss(
                [(cells[n][s].syncs, cells[n][s].val) for n in curve], cells[tuned][s].val
            )
            for s in c_seeds
        ]
        c_ratio = [x.syncs / cells[tuned][s].syncs if x else math.nan for x, s in zip(c, c_seeds)]
        return cls(
            rule,
            tuned,
            frontier.choice_seeds.get(h_base_of(cells[rule]), []),
            a_seeds,
            [cells[rule][s].val - cells[tuned][s].val for s in a_seeds],
            b_seeds,
            b,
            [cells[rule][s].syncs for s in b_seeds],
            (min(frontier.syncs.values()), max(frontier.syncs.values())),
            curve,
            c_seeds,
            c,
            c_ratio,
        )

    @staticmethod
    def curve_of(
        cells: dict[str, dict[int, Result]], rule: str, seeds: list[int]
    ) -> tuple[list[str], list[int]]:
        """The rule's runs over h_base (``<rule>_hb<N>``), most syncs first, and the seeds they
        share with ``seeds``: the second point joins on the seeds it ran, a later one only if it ran
        on all of those (a point still running does not cut the seeds)."""
        others = sorted(
            (n for n in cells if n.removeprefix(rule + HB_SUFFIX).isdigit()),
            key=lambda n: h_base_of(cells[n]),
        )
        curve = [rule]
        for name in others:
            shared = [s for s in seeds if s in cells[name]]
            if shared and (len(curve) == 1 or shared == seeds):
                curve, seeds = curve + [name], shared
        return curve, seeds

    def a_value(self) -> str:
        return fmt(self.a, 3) if self.a_seeds else "not measured"

    def b_value(self) -> str:
        if not self.b_seeds:
            return "not measured"
        return "outside the grid" if any(math.isnan(x) for x in self.b) else fmt(self.b, 3)

    def c_value(self) -> str:
        if not self.c_seeds:
            return "not measured"
        if any(x is None for x in self.c):
            return "not reached"
        mean, se = mean_se(self.c_ratio)
        # below the loss already at the curve's fewest syncs: it needs fewer
        if any(x.bound for x in self.c):
            return f"at most {mean:.2f}x"
        return f"{mean:.2f}x" + ("" if math.isnan(se) else f" ± {se:.2f}")

    def a_text(self) -> str:
        if not self.a_seeds:
            return "not measured (no tuned DiLoCo at its h_base on its seeds)"
        # a choice made on fewer seeds than the pairing is named: a close call there may flip
        chosen = (
            ""
            if self.chosen_on == self.a_seeds
            else f", chosen on seeds {seed_list(self.chosen_on)}"
        )
        return f"{self.a_value()} ({self.tuned}{chosen}; seeds {seed_list(self.a_seeds)})"

    def b_text(self) -> str:
        if not self.b_seeds:
            return "not measured (the tuned grid and the rule share no seed)"
        outside = [s for s, x in zip(self.b_seeds, self.b) if math.isnan(x)]
        syncs = statistics.fmean(self.b_syncs)
        if outside:
            low, high = self.b_range
            return (
                f"outside the tuned grid's {low:.0f}-{high:.0f} syncs on seeds "
                f"{seed_list(outside)} ({syncs:.1f} syncs): not extrapolated"
            )
        return f"{self.b_value()} at {syncs:.1f} syncs (seeds {seed_list(self.b_seeds)})"

    def c_text(self, cells: dict[str, dict[int, Result]]) -> str:
        if not self.c_seeds:
            return "not measured (no tuned DiLoCo at its h_base on its seeds)"
        base = h_base_of(cells[self.rule])
        points = ", ".join(f"{h_base_of(cells[n]) / base:g}x" for n in self.curve)
        missed = [s for s, x in zip(self.c_seeds, self.c) if x is None]
        if missed:
            return (
                f"not reached on seeds {seed_list(missed)} (its curve: h_base {points}, seeds "
                f"{seed_list(self.c_seeds)})"
            )
        bounds = [s for s, x in zip(self.c_seeds, self.c) if x.bound]
        if bounds:
            return (
                f"{self.c_value()} (below at its fewest syncs on seeds "
                f"{seed_list(bounds)}; h_base {points})"
            )
        return f"{self.c_value()} (h_base {points}; seeds {seed_list(self.c_seeds)})"


def comparisons_report(
    cells: dict[str, dict[int, Result]], frontier: TunedFrontier, rules: Sequence[str]
) -> list[str]:
    rows = []
    for rule in rules:
        found = Comparison.of(cells, frontier, rule)
        rows.append(
            [rule, str(h_base_of(cells[rule])), found.a_text(), found.b_text(), found.c_text(cells)]
        )
    return [
        "### The comparators a reader assumes",
        "",
        "Each rule (a) minus the tuned DiLoCo at its own `h_base` (the best outer LR and momentum "
        "at that H, chosen on the tuning seeds); (b) minus the tuned frontier at its own sync "
        "count (the lower envelope of the best setting at each H, linear in log(syncs) between "
        "the measured horizons; no extrapolation); (c) the syncs at which its loss-against-syncs "
        "curve (its runs at 1x, 2x, 4x `h_base`, named `<rule>_hb<N>`) reaches the loss of (a)'s "
        "DiLoCo, as a ratio to that DiLoCo's syncs. Validation loss, paired per seed, mean ± "
        "standard error; negative is better in (a) and (b), below 1 is fewer syncs in (c).",
        "",
        replicate.markdown_table(
            [
                "rule",
                "h_base",
                "(a) minus tuned DiLoCo at h_base",
                "(b) minus tuned frontier at its syncs",
                "(c) syncs at equal loss / DiLoCo's",
            ],
            rows,
        ),  # fmt: skip
        "",
    ]


# the variants the plots single out: the paper's rule (the
# default) and the recommended descent setting
HIGHLIGHTED = {
    REFERENCE: ("black", "paper rule (default)"),
    "descent_k0.9_probe": ("crimson", "descent, gain 0.9, start probe (opt-in)"),
}


def plot(
    regime: Regime,
    cells: dict[str, dict[int, Result]],
    by_mu: dict[float, dict[int, str]],
    adaptive: Sequence[str],
    path: Path,
    frontier: TunedFrontier | None = None,
) -> None:
    """Each curve over the seeds all its horizons finished,
    each adaptive variant over its own seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 4.8))
    for mu, curve in sorted(by_mu.items()):
        most = max(len(cells[n]) for n in curve.values())
        seeds, names = curve_over(
            cells, curve, common_seeds(cells, [n for n in curve.values() if len(cells[n]) == most])
        )
        if not seeds:
            continue
        hs = sorted(names)
        xs = [statistics.fmean(cells[names[h]][s].syncs for s in seeds) for h in hs]
        stats = [mean_se([cells[names[h]][s].val for s in seeds]) for h in hs]
        ax.errorbar(
            xs, [m for m, _ in stats], yerr=[e for _, e in stats], marker="o", capsize=3,
            label=f"DiLoCo mu {mu:g} ({len(seeds)} seeds)",
        )  # fmt: skip
        if len(hs) > 3:
            for x, (m, _), h in zip(xs, stats, hs):
                ax.annotate(f"H{h}", (x, m), textcoords="offset points", xytext=(3, 4), fontsize=7)
    if frontier:
        seeds = common_seeds(cells, list(frontier.best.values()))
        envelope = frontier.envelope(cells, seeds)
        hs = sorted(envelope, key=frontier.syncs.__getitem__)
        ax.plot(
            [frontier.syncs[h] for h in hs],
            [statistics.fmean(cells[envelope[h]][s].val for s in seeds) for h in hs],
            color="black",
            linestyle="--",
            linewidth=1.5,
            label=f"tuned frontier: best outer LR and momentum per H ({len(seeds)} seeds)",
        )
    others = False
    for name in adaptive:
        runs = list(cells[name].values())
        m, e = mean_se([r.val for r in runs])
        x = statistics.fmean(r.syncs for r in runs)
        if name in HIGHLIGHTED:
            color, label = HIGHLIGHTED[name]
            ax.errorbar(
                [x], [m], yerr=[e], marker="*", markersize=16, markeredgecolor="black", color=color,
                linestyle="none", capsize=3, zorder=5, label=f"{label} ({len(runs)} seeds)",
            )  # fmt: skip
        else:  # the other variants of the campaign: grey, named in the report's tables
            ax.errorbar(
                [x],
                [m],
                yerr=[e],
                marker="*",
                markersize=8,
                color="0.6",
                linestyle="none",
                capsize=2,
                label=None if others else "other adaptive variants (frontier.md)",
            )
            others = True
    ax.set_xscale("log")
    ax.set_xlabel("synchronizations (log)")
    ax.set_ylabel("validation loss (mean ± s.e. over seeds)")
    ax.set_title(f"Fixed-horizon frontier, regime {regime.value}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(args: argparse.Namespace) -> Path:
    found = collect(args.out)
    if args.report_seeds:  # e.g. the seeds held out from a choice made on others
        keep = set(int_list(args.report_seeds))
        found = {
            regime: {
                name: {s: r for s, r in runs.items() if s in keep} for name, runs in cells.items()
            }
            for regime, cells in found.items()
        }
        found = {
            regime: {name: runs for name, runs in cells.items() if runs}
            for regime, cells in found.items()
        }
    lines = [
        "# Fixed-horizon frontier (generated by benchmarks/campaigns/frontier.py)",
        "",
        f"Runs under `{args.out}`; regenerate with `python benchmarks/campaigns/frontier.py --out "
        f"{args.out} --report-only`.",
        "",
    ]
    report_dir = Path(args.report_dir or args.out)
    for regime in Regime:
        if regime in found:
            lines += regime_report(regime, found[regime], args.base_mu, report_dir / "frontier")
    path = report_dir / "frontier.md"
    report_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------ main
def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/frontier", help="folder of the run folders")
    p.add_argument(
        "--regimes", default="iid,noniid", help="comma-separated, from iid, noniid (default both)"
    )
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (default 0-4)")
    p.add_argument(
        "--steps", type=int, default=1000, help="optimizer steps T (default 1000: H_base 10)"
    )
    p.add_argument("--workers", type=int, default=8, help="workers (default 8)")
    p.add_argument(
        "--h-base",
        type=int,
        help="the adaptive variants' H_base (default T/100, at least 2; smoke runs)",
    )
    p.add_argument("--h-list", default="10,20,5,15,30,13,40,7", help="DiLoCo horizons at --base-mu")
    p.add_argument(
        "--base-mu", type=float, default=0.7, help="AutoLoCo's base outer momentum (default 0.7)"
    )
    p.add_argument(
        "--mu-list",
        default="0.9,0.01,0.3,0.5",
        help="other momenta, each at every --mu-h-list horizon",
    )
    p.add_argument(
        "--mu-h-list", default="10,20", help="horizons of the momentum axis (default 10,20)"
    )
    p.add_argument(
        "--tuned-outer-lrs",
        default="",
        help="the tuned baseline: these outer LRs, each at every --tuned-momenta momentum "
        "and --tuned-h-list horizon",
    )
    p.add_argument("--tuned-momenta", default="0.5,0.7,0.9", help="momenta of the tuned baseline")
    p.add_argument("--tuned-h-list", default="5,10,20,40", help="horizons of the tuned baseline")
    p.add_argument(
        "--adaptive",
        action="append",
        default=[],
        metavar="NAME[:FIELD=VALUE,...]",
        help="AutoLoCo variant from the paper's H_base (repeatable; default: autoloco; "
        "method=diloco: a DiLoCo variant)",
    )
    p.add_argument("--batch-size", type=int, default=replicate.BATCH_SIZE)
    p.add_argument(
        "--lr",
        type=float,
        default=demo.PEAK_LR,
        help=f"inner AdamW peak LR (default {demo.PEAK_LR:g})",
    )
    p.add_argument("--hidden", type=int, default=replicate.HIDDEN)
    p.add_argument("--layers", type=int, default=replicate.LAYERS)
    p.add_argument("--heads", type=int, default=replicate.HEADS)
    p.add_argument("--vocab", type=int, default=replicate.VOCAB_SIZE)
    p.add_argument("--val-windows", type=int, default=1024)
    p.add_argument("--max-docs", type=int, help="use only the first N documents (smoke runs)")
    p.add_argument(
        "--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "autoloco")
    )
    p.add_argument("--report-only", action="store_true", help="do not train; only write the report")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check every run's settings and list the runs, done or to do; "
        "train nothing, write nothing",
    )
    p.add_argument(
        "--no-report", action="store_true", help="train only (another script reports these runs)"
    )
    p.add_argument("--report-dir", help="where frontier.md and the plots go (default --out)")
    p.add_argument(
        "--report-seeds",
        help="comma-separated: report these seeds only (default every finished seed)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--batched-workers",
        action="store_true",
        help="step the workers as one batched computation (same results within float rounding; "
        "default: the per-worker loop that made the committed runs)",
    )
    args = p.parse_args(argv)
    args.command = shlex.join(
        [
            "python",
            "benchmarks/campaigns/frontier.py",
            *(argv if argv is not None else sys.argv[1:]),
        ]
    )
    try:
        args.regimes = [Regime(r.strip()) for r in args.regimes.split(",") if r.strip()]
        args.seeds, h_list, mu_h = (
            int_list(args.seeds),
            int_list(args.h_list),
            int_list(args.mu_h_list),
        )
        mu_list = float_list(args.mu_list)
        tuned = tuned_grid(
            float_list(args.tuned_outer_lrs),
            float_list(args.tuned_momenta),
            int_list(args.tuned_h_list),
        )
    except ValueError as err:
        p.exit(
            2,
            "frontier: bad --regimes/--seeds/--h-list/--mu-list/--mu-h-list/--tuned-* value "
            f"({err}); e.g. --regimes iid --seeds 0,1\n",
        )
    h_base = args.h_base or replicate.schedule(args.steps)[0]
    # adaptive variants first: a campaign cut short still has
    # them next to the most important horizons
    args.points = parse_adaptive(args.adaptive or ["autoloco"], h_base) + grid(
        h_list, args.base_mu, mu_list, mu_h, tuned
    )
    return args


def dry_run(args: argparse.Namespace) -> None:
    """Build every run's config (a bad setting fails here, as
    it would before training) and list the runs."""
    configs = run_configs(args.points, args.steps)
    for seed in args.seeds:
        for regime in args.regimes:
            for point in args.points:
                folder = run_dir(args.out, regime, seed, point)
                state = "done" if (folder / SUMMARY).exists() else "to do"
                print(
                    f"{state:5}  {folder}  ({configs[point.name].method} H_base "
                    f"{point.h_base} {point.overrides})"
                )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        dry_run(args)
        return 0
    if not args.report_only:
        torch.set_num_threads(1)
        corpus = replicate.load_corpus(args.cache_dir, args.vocab, args.max_docs)
        run_all(args, args.points, corpus)
    if not args.no_report:
        print(f"report: {write_report(args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
