"""The model-size ladder: the default rule against the tuned
DiLoCo, rung by rung, in regime A (IID).

Not a test. Reads the run folders that ``benchmarks/campaigns/frontier.py``
writes: the 197k rung from ``results/frontier`` (``--base``), the CPU rungs from
``OUT/<rung>/`` (``results/ladder/h128_l4`` ...) and the GPU rungs from their
committed folders. Writes one table by rung with the comparators every report uses
(``frontier.Comparison``) and, per rung, the planned runs that have not finished::

    python benchmarks/campaigns/ladder.py --out results/ladder

A rung with no finished run is reported as not measured. The CPU campaign that fills the ladder runs
``benchmarks/campaigns/frontier.py`` with the variants of :data:`CPU_PLAN`, seed by seed; runs that
are finished are skipped, and copies started together share the work through run locks::

    F="python benchmarks/campaigns/frontier.py --h-list '' --mu-list '' --no-report --quiet \
       --tuned-momenta 0.5 --seeds S"
    # regime A at 1.18M (2.56M: --out results/ladder/h192_l4 --hidden 192)
    $F --out results/ladder/h128_l4 --hidden 128 --layers 4 --regimes iid \
       --adaptive default:controller=descent --adaptive default_hb20:controller=descent,h_base=20 \
       --adaptive default_hb40:controller=descent,h_base=40 --adaptive autoloco \
       --tuned-outer-lrs 0.35,0.7,1.0 --tuned-h-list 10,20,5,40
    # regime B at 1.18M
    $F --out results/ladder/h128_l4 --hidden 128 --layers 4 --regimes noniid \
       --adaptive default:controller=descent --adaptive autoloco \
       --tuned-outer-lrs 0.35,0.7,1.0 --tuned-h-list 10,20,5,40

A held-out seed runs the default and, at each H, only the outer LR the tuning seeds chose; the
default's curve over ``h_base`` (for (c)) runs alone::

    # regime B at 1.18M: held-out seed 3 (LR 0.7 won at every H), then h_base 20 on seeds 0-2
    $F --out results/ladder/h128_l4 --hidden 128 --layers 4 --regimes noniid --seeds 3 \
       --adaptive default:controller=descent --tuned-outer-lrs 0.7 --tuned-h-list 10,20,5,40
    $F --out results/ladder/h128_l4 --hidden 128 --layers 4 --regimes noniid --seeds 0,1,2 \
       --adaptive default_hb20:controller=descent,h_base=20
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

# benchmarks/: its kinds import as packages
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from campaigns import (
    frontier,  # noqa: E402  (the runs, the tuned frontier and the comparators are frontier.py's)
    gpu_frontier,  # noqa: E402  (the GPU rungs' sizes and planned grid)
    replicate,  # noqa: E402
)

from autoloco_hf.toy.llama import tiny_llama  # noqa: E402

DEFAULT = "default"  # the default rule's name on the ladder's rungs
BASE_DEFAULT = "descent_k0.9_guard_mu0.5_hmax20"  # ... and in the 197k campaign (docs/results.md)
REPORT = "results/ladder.md"
SEEDS = (0, 1, 2)  # the tuning seeds of every rung
# the CPU rungs' runs per seed: the default at 1x, 2x, 4x
# h_base, the paper's rule, and the tuned grid
TUNED = frontier.tuned_grid([0.35, 0.7, 1.0], [0.5], [10, 20, 5, 40])
# the default at 2x, 4x h_base: (c)'s curve
CURVE = tuple(f"{DEFAULT}{frontier.HB_SUFFIX}{h}" for h in (20, 40))
CPU_PLAN = (
    DEFAULT,
    *CURVE,
    frontier.REFERENCE,
    *(frontier.fixed_name(mu, h, lr) for lr, mu, h in TUNED),
)

# The rule study: at 2.56M the default ends above the tuned frontier at its own syncs,
# because it starts at 2 h_base, descends slowly and never goes below h_base, while
# the frontier steepens with size (H 5 << H 10). Three candidates, each a
# configuration of the descent rule (no code change), were fixed with the criterion
# below before any of their runs (commit of 2026-12-06 20:05 UTC). Campaign, per rung:
#   frontier.py --out <rung folder> [--hidden/--layers of the rung] --seeds S \
#       --regimes iid --h-list '' --mu-list '' --adaptive NAME:FIELDS ... --no-report --quiet
RULE_CANDIDATES = {
    "cand_hmin5": "controller=descent,h_min=5",  # the default, free to shorten to h_base / 2
    # ... and twice as fast
    "cand_hmin5_k1.8": 'controller=descent,h_min=5,rule_options={"gain":1.8}',
    # starts at h_base, shortens to h_base / 2
    "cand_from_hbase": "controller=descent,h_max=10,h_min=5",
}
# run after the study's first results: not candidates
DIAGNOSTICS = ("diag_lr0.35", "diag_from_hbase_lr0.35")
# 2.56M seed 1 where it finished
RULE_STUDY_SEEDS = {"197k": (0, 1, 2, 3), "1.18M": (0, 1), "2.56M": (0, 1)}
RULE_CRITERION = (
    "A candidate is eligible if its mean (b), the candidate minus the tuned frontier at its own "
    "syncs, is at most 0 on every rung measured (the seeds of RULE_STUDY_SEEDS that finished it "
    "and the frontier). Among the eligible candidates and the default (if eligible), the lowest "
    "mean (b) on the largest rung wins; two within one standard error of each other there (0.02 "
    "on a single seed) are split by the fewer mean syncs at 197k. If none is eligible, the "
    "default stays and the report says so. The chosen one replaces the default only after its "
    "held-out seeds (197k: 8-9, 1.18M: 2, 2.56M: 2) keep (b) at most one standard error above 0."
)


@dataclass(frozen=True)
class Rung:
    """One model size: where its runs are, what its default
    is called there and what its campaign plans."""

    folder: Path
    hidden: int
    layers: int
    heads: int
    device: str
    default: str = DEFAULT
    plan: tuple[str, ...] = CPU_PLAN

    def planned_parameters(self) -> int:
        with torch.device("meta"):
            model = tiny_llama(
                replicate.VOCAB_SIZE,
                self.hidden,
                self.layers,
                self.heads,
                max_position_embeddings=64,
            )
        return sum(p.numel() for p in model.parameters())

    def run_name(self, planned: str) -> str:
        """The planned name as this rung's campaign calls it
        (the 197k campaign names its default otherwise)."""
        return (
            self.default + planned.removeprefix(DEFAULT) if planned.startswith(DEFAULT) else planned
        )


def rungs(out: Path, base: Path) -> list[Rung]:
    # the GPU campaign's tuned grid, and the default's 2x and
    # 4x h_base that (c) needs (not in that grid yet)
    gpu_plan = (*gpu_frontier.points(gpu_frontier.Grid.TUNED, 1000), *CURVE)
    gpu = {
        name: Rung(Path(folder), sizes.hidden, sizes.layers, sizes.heads, "GPU", plan=gpu_plan)
        for name, folder in (
            ("14m", "results/gpu_frontier_14m"),
            ("114m", "results/gpu_frontier_114m"),
        )
        for sizes in [gpu_frontier.MODELS[name]]
    }
    return [
        Rung(
            base, replicate.HIDDEN, replicate.LAYERS, replicate.HEADS, "CPU", default=BASE_DEFAULT
        ),
        Rung(out / "h128_l4", 128, 4, replicate.HEADS, "CPU"),
        Rung(out / "h192_l4", 192, 4, replicate.HEADS, "CPU"),
        gpu["14m"],
        gpu["114m"],
    ]


def parameters_text(count: int) -> str:
    """196928 -> 197k; 1179776 -> 1.18M."""
    return f"{count / 1e6:.2f}M" if count >= 1e6 else f"{count / 1e3:.0f}k"


def missing(rung: Rung, cells: dict[str, dict[int, frontier.Result]]) -> list[str]:
    """Per tuning seed, the planned runs not finished (all of them: the seed not started)."""
    lines = []
    for seed in SEEDS:
        left = [rung.run_name(n) for n in rung.plan if seed not in cells.get(rung.run_name(n), {})]
        if len(left) == len(rung.plan):
            lines.append(f"seed {seed}: not started ({len(left)} runs)")
        elif left:
            lines.append(
                f"seed {seed}: {len(left)} of {len(rung.plan)} runs not finished: {', '.join(left)}"
            )
    return lines


def rung_row(rung: Rung, cells: dict[str, dict[int, frontier.Result]]) -> list[str]:
    """Parameters, seeds and the comparators of one rung (not
    measured where its runs do not allow them)."""
    head = [frontier.seed_list(sorted(cells.get(rung.default, {}))) or "none"]
    complete = [s for s in SEEDS if all(s in cells.get(rung.run_name(n), {}) for n in rung.plan)]
    head.append(frontier.seed_list(complete) or "none")
    if rung.default not in cells:
        return (
            head
            + [f"not measured ({'not run' if not cells else 'the default has not finished'})"]
            + ["-"] * 3
        )
    tuned = frontier.TunedFrontier.of(cells)
    if tuned is None:
        return (
            head
            + ["not measured (no tuned grid yet: two outer LRs at two horizons or more)"]
            + ["-"] * 3
        )
    default = frontier.Comparison.of(cells, tuned, rung.default)
    paper = frontier.REFERENCE in cells and frontier.Comparison.of(cells, tuned, frontier.REFERENCE)
    return head + [
        default.a_text(),
        default.b_text(),
        default.c_text(cells),
        paper.b_text() if paper else "not measured",
    ]


def held_out_runs(
    cells: dict[str, dict[int, frontier.Result]], default: str
) -> dict[int, frontier.Result]:
    """The default's runs on its held-out seeds: those outside :data:`SEEDS`, on which no setting
    was chosen."""
    return {s: r for s, r in cells.get(default, {}).items() if s not in SEEDS}


def held_out(
    cells: dict[str, dict[int, frontier.Result]], default: str
) -> frontier.Comparison | None:
    """The default's comparators on its held-out seeds alone, against the tuned DiLoCo chosen on
    the tuning seeds; None when the rung has none."""
    held = held_out_runs(cells, default)
    tuned = frontier.TunedFrontier.of(cells) if held else None
    if tuned is None:
        return None
    found = frontier.Comparison.of({**cells, default: held}, tuned, default)
    return found if found.a_seeds or found.b_seeds else None


def held_out_row(
    label: str, cells: dict[str, dict[int, frontier.Result]], default: str
) -> list[str]:
    """:func:`held_out` as a row of the report; empty when the rung has no held-out seed."""
    found = held_out(cells, default)
    if found is None:
        return []
    held = held_out_runs(cells, default)
    syncs = statistics.fmean(r.syncs for r in held.values())
    return [
        label,
        frontier.seed_list(sorted(held)),
        f"{syncs:.1f}",
        f"{found.a_value()} (seeds {frontier.seed_list(found.a_seeds) or 'none'})",
        f"{found.b_value()} (seeds {frontier.seed_list(found.b_seeds) or 'none'})",
    ]


# The ladder's targets: this many rungs spanning at least this factor in parameters, each with the
# default and the paper's rule on this many seeds; the default's syncs at equal loss at most this
# fraction of the tuned DiLoCo's; a held-out rung has at least two held-out seeds.
TARGET_RUNGS = 3
TARGET_SPAN = 12.0
TARGET_SEEDS = 3
TARGET_SYNCS = 0.6
TARGET_HELD_OUT = 2


@dataclass(frozen=True)
class Measured:
    """One rung's runs of one regime, as the targets read them."""

    label: str  # "1.18M", or "B at 1.18M"
    parameters: int
    cells: dict[str, dict[int, frontier.Result]]
    default: str

    def comparison(self, rule: str) -> frontier.Comparison | None:
        """The rule's comparators, or None where the rule or the tuned grid has not run."""
        tuned = frontier.TunedFrontier.of(self.cells) if rule in self.cells else None
        return None if tuned is None else frontier.Comparison.of(self.cells, tuned, rule)


def verdict(met: bool, measured: bool = True) -> str:
    return "not measured" if not measured else "met" if met else "**missed**"


def seeds_text(seeds: Sequence[int]) -> str:
    """[3] -> seed 3; [3, 8, 9] -> seeds 3,8,9."""
    return f"seed{'s' if len(seeds) > 1 else ''} {frontier.seed_list(list(seeds))}"


def b_mean_text(found: frontier.Comparison) -> str:
    return found.b_value() + ("" if len(found.b_seeds) > 1 else f" ({seeds_text(found.b_seeds)})")


def target_rows(ladder: Sequence[Measured], regime_b: Measured, gpu: Measured) -> list[list[str]]:
    """The ladder's targets, each with what was measured and whether it was met. ``ladder``: the
    CPU rungs of regime A, smallest first; ``regime_b``: regime B at a larger rung; ``gpu``: the
    GPU campaign's first rung."""
    found = {m.label: m.comparison(m.default) for m in [*ladder, regime_b]}
    paper = {m.label: m.comparison(frontier.REFERENCE) for m in [*ladder, regime_b]}

    def seeds_of(label: str) -> str:
        d, p = found[label], paper[label]
        return (
            f"{label}: the default on {seeds_text(d.b_seeds) if d else 'no seed'}, "
            f"the paper's rule on {seeds_text(p.b_seeds) if p else 'no seed'}"
        )

    def enough(label: str) -> bool:
        d, p = found[label], paper[label]
        return bool(d and p and min(len(d.b_seeds), len(p.b_seeds)) >= TARGET_SEEDS)

    full = [m for m in ladder if enough(m.label)]
    span = max(m.parameters for m in full) / min(m.parameters for m in full) if full else 0.0
    rows = [
        [
            f"A ladder: {TARGET_RUNGS} rungs or more spanning {TARGET_SPAN:g}x or more in "
            f"parameters, the default and the paper's rule on {TARGET_SEEDS} seeds or more against "
            "the tuned frontier",
            "; ".join(seeds_of(m.label) for m in ladder) + f"; span {span:.1f}x",
            verdict(len(full) >= TARGET_RUNGS and span >= TARGET_SPAN),
        ],
        [
            f"Regime B at a larger rung, {TARGET_SEEDS} seeds or more",
            seeds_of(regime_b.label),
            verdict(enough(regime_b.label)),
        ],
    ]
    measured_b = [m for m in [*ladder, regime_b] if found[m.label] and found[m.label].b_seeds]
    rows.append([
        "The default on or below the tuned frontier at its own syncs, (b) <= 0 (mean over seeds), "
        "on every rung in A and at B's larger rung",
        "; ".join(f"{m.label} {b_mean_text(found[m.label])}" for m in measured_b),
        verdict(all(frontier.mean_se(found[m.label].b)[0] <= 0 for m in measured_b)),
    ])  # fmt: skip
    held_rows, held_met = [], True
    for m in [*ladder, regime_b]:
        held = held_out(m.cells, m.default)
        if held is None or not held.b_seeds:
            held_rows.append(f"{m.label}: none")
            held_met = False
            continue
        mean, se = frontier.mean_se(held.b)
        # one held-out seed has no spread of its own: the rung's, over all its seeds
        bound = se if len(held.b_seeds) > 1 else frontier.mean_se(found[m.label].b)[1]
        few = len(held.b_seeds) < TARGET_HELD_OUT
        held_met &= not few and mean <= bound
        held_rows.append(
            f"{m.label}: {mean:+.3f} on {seeds_text(held.b_seeds)} (one standard error: "
            f"{bound:.3f}{f'; fewer than {TARGET_HELD_OUT} seeds' if few else ''})"
        )
    rows.append([
        f"Held-out seeds of the default ({TARGET_HELD_OUT} or more per rung): (b) at most one "
        "standard error above 0, on every rung in A and at B's larger rung",
        "; ".join(held_rows),
        verdict(held_met),
    ])  # fmt: skip
    c_rows, c_met = [], True
    for m in [*ladder, regime_b]:
        d = found[m.label]
        if d is None or not d.c_seeds:
            c_rows.append(f"{m.label}: not measured")
            c_met = False
            continue
        c_rows.append(f"{m.label}: {d.c_value()}")
        c_met &= all(x is not None for x in d.c) and frontier.mean_se(d.c_ratio)[0] <= TARGET_SYNCS
    rows.append([
        f"The default's syncs at equal loss (c) at most {TARGET_SYNCS:g}x the tuned DiLoCo's at "
        "`h_base`, on every rung in A and at B's larger rung",
        "; ".join(c_rows),
        verdict(c_met),
    ])  # fmt: skip
    gpu_found = gpu.comparison(gpu.default)
    gpu_seeds = gpu_found.b_seeds if gpu_found else []
    rows.append([
        f"The GPU rung {gpu.label}: the tuned grid and the default on {TARGET_SEEDS} seeds "
        "(the campaign in one device call of 10 minutes or less)",
        f"the default against the tuned frontier on {seeds_text(gpu_seeds)}"
        if gpu_found
        else "not run: no tuned grid at this rung",
        verdict(len(gpu_seeds) >= TARGET_SEEDS, gpu_found is not None),
    ])  # fmt: skip
    return rows


# the other regimes: (label, the rung (an index into rungs()), the runs' folder (None: the rung's
# own), their regime); at the smallest rung (docs/results.md) the default has its 197k name
OTHER_REGIMES = (
    ("B (non-IID)", 0, None, frontier.Regime.NONIID),
    ("B (non-IID)", 1, None, frontier.Regime.NONIID),
    ("C (B at 4x the inner LR)", 0, "results/regime_search/lr8e-3", frontier.Regime.NONIID),
    ("D (A: 4 workers at 8x the batch)", 0, "results/frontier_d", frontier.Regime.IID),
)


def regime_b_rung(ladder: Sequence[Rung], measured: Sequence[Measured]) -> Measured:
    """Regime B at the larger rung of :data:`OTHER_REGIMES`, as the targets read it."""
    index, folder = next(
        (i, f) for _, i, f, kind in OTHER_REGIMES if kind == frontier.Regime.NONIID and i > 0
    )
    path = Path(folder) if folder else ladder[index].folder
    cells = frontier.collect(str(path)).get(frontier.Regime.NONIID, {}) if path.is_dir() else {}
    rung = measured[index]
    return Measured(f"B at {rung.label}", rung.parameters, cells, rung.default)


README_HEADERS = [
    "regime",
    "parameters",
    "rule",
    "seeds of (a)",
    "syncs",
    "minus tuned DiLoCo at `h_base` (a)",
    "minus tuned frontier at its syncs (b)",
    "syncs at equal loss (c)",
]


def readme_rows(
    regime: str, params: str, cells: dict[str, dict[int, frontier.Result]], default: str
) -> list[list[str]]:
    """The README's rows of one rung and regime: the default
    and the paper's rule, by the comparators (a)-(c)."""
    tuned = frontier.TunedFrontier.of(cells) if default in cells else None
    if tuned is None:
        why = (
            "not run"
            if not cells
            else "the default not finished"
            if default not in cells
            else "no tuned grid yet"
        )
        return [[regime, params, "the default", "-", "-", f"not measured: {why}", "-", "-"]]
    rows = []
    for label, name in (("the default", default), ("the paper's rule", frontier.REFERENCE)):
        if name in cells:
            found = frontier.Comparison.of(cells, tuned, name)
            syncs = statistics.fmean(cells[name][s].syncs for s in found.a_seeds)
            rows.append([
                regime, params, label, frontier.seed_list(found.a_seeds), f"{syncs:.0f}",
                found.a_value(), found.b_value(), found.c_value(),
            ])  # fmt: skip
    return rows


def regime_cells(
    out: Path, base: Path
) -> list[tuple[str, str, dict[str, dict[int, frontier.Result]], str]]:
    """``(regime, parameters, runs, the default's name)``: every rung in regime A, then the other
    regimes (:data:`OTHER_REGIMES`), in the README's order."""
    found: dict[Path, dict[frontier.Regime, dict[str, dict[int, frontier.Result]]]] = {}

    def cells_of(folder: Path, regime: frontier.Regime) -> dict[str, dict[int, frontier.Result]]:
        if folder not in found:
            found[folder] = frontier.collect(str(folder)) if folder.is_dir() else {}
        return found[folder].get(regime, {})

    ladder = rungs(out, base)
    params = [parameters_text(rung.planned_parameters()) for rung in ladder]
    return [
        ("A (IID)", params[k], cells_of(rung.folder, frontier.Regime.IID), rung.default)
        for k, rung in enumerate(ladder)
    ] + [
        (
            regime,
            params[index],
            cells_of(Path(folder) if folder else ladder[index].folder, kind),
            ladder[index].default,
        )
        for regime, index, folder, kind in OTHER_REGIMES
    ]


def readme_table(out: Path, base: Path) -> str:
    """The README's results table, by rung in regime A, then
    the other regimes (:data:`OTHER_REGIMES`)."""
    rows = [row for measured in regime_cells(out, base) for row in readme_rows(*measured)]
    return replicate.markdown_table(README_HEADERS, rows)


@dataclass(frozen=True)
class Doubling:
    """One rung and regime: what doubling the horizon costs the tuned DiLoCo, and the default's
    (a)."""

    regime: str
    parameters: str
    cost: list[float]  # per seed: the tuned DiLoCo at 2 h_base minus at h_base
    cost_seeds: list[int]
    a: list[float]  # per seed: the default's (a)
    a_seeds: list[int]

    @property
    def mean_cost(self) -> float:
        return statistics.fmean(self.cost)

    @property
    def mean_a(self) -> float:
        return statistics.fmean(self.a)


def doubling(
    regime: str, parameters: str, cells: dict[str, dict[int, frontier.Result]], default: str
) -> Doubling | None:
    """None where the default, the tuned grid or its horizon at 2 ``h_base`` has not run."""
    tuned = frontier.TunedFrontier.of(cells) if default in cells else None
    if tuned is None:
        return None
    h_base = frontier.h_base_of(cells[default])
    short, long = tuned.best.get(h_base), tuned.best.get(2 * h_base)
    if short is None or long is None:
        return None
    seeds = frontier.common_seeds(cells, [short, long])
    cost = [cells[long][s].val - cells[short][s].val for s in seeds]
    found = frontier.Comparison.of(cells, tuned, default)
    if not seeds or not found.a_seeds:
        return None
    return Doubling(regime, parameters, cost, seeds, found.a, found.a_seeds)


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    k = 0
    while k < len(order):
        tie = k
        while tie + 1 < len(order) and values[order[tie + 1]] == values[order[k]]:
            tie += 1
        for j in range(k, tie + 1):
            out[order[j]] = (k + tie) / 2 + 1
        k = tie + 1
    return out


def doubling_verdict(found: Sequence[Doubling]) -> str:
    """The rank correlation of the doubling cost with the default's (a), in one sentence."""
    if len(found) < 3:
        return "Not decided: fewer than 3 rungs and regimes measured."
    cost, a = ranks([d.mean_cost for d in found]), ranks([d.mean_a for d in found])
    return (
        "Spearman's rank correlation of the doubling cost with the default's (a): "
        f"{statistics.correlation(cost, a):+.2f} over {len(found)} rungs and regimes (rows above, "
        "by cost), a trend, not a test."
    )


# the line above the table in each doc
TABLE_MARKER = "<!-- generated: python benchmarks/campaigns/ladder.py --readme"
TABLE_DOCS = ("README.md", "docs/results.md")


def table_span(lines: Sequence[str]) -> tuple[int, int]:
    """The lines of a document's generated table: those after the marker that start with ``|``."""
    start = next(i for i, line in enumerate(lines) if line.startswith(TABLE_MARKER)) + 1
    return start, next(
        (i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines)
    )


def update_docs(table: str) -> None:
    """Writes the generated table into README.md and docs/results.md, in place of the one there."""
    for doc in map(Path, TABLE_DOCS):
        lines = doc.read_text().split("\n")
        start, end = table_span(lines)
        doc.write_text("\n".join(lines[:start] + table.split("\n") + lines[end:]))
        print(f"updated: {doc}")


@dataclass(frozen=True)
class StudyCell:
    """One rule on one rung of the rule study: (b) over the
    study's seeds, and the rule's mean syncs there."""

    rung: str
    rule: str
    seeds: list[int]
    b_mean: float
    b_se: float  # NaN on one seed
    syncs: float


def study_cells(
    rung: Rung, label: str, cells: dict[str, dict[int, frontier.Result]]
) -> list[StudyCell]:
    """(b) of the default, each candidate and each diagnostic
    on the study's seeds of one rung (frontier: all seeds)."""
    tuned = frontier.TunedFrontier.of(cells)
    if tuned is None:
        return []
    seeds = set(RULE_STUDY_SEEDS[label])
    found = []
    for rule in (rung.default, *RULE_CANDIDATES, *DIAGNOSTICS):
        if rule not in cells:
            continue
        own = {**cells, rule: {s: r for s, r in cells[rule].items() if s in seeds}}
        comparison = frontier.Comparison.of(own, tuned, rule)
        if comparison.b_seeds:
            mean, se = frontier.mean_se(comparison.b)
            name = DEFAULT if rule == rung.default else rule
            found.append(
                StudyCell(
                    label, name, comparison.b_seeds, mean, se, statistics.fmean(comparison.b_syncs)
                )
            )
    return found


def study_verdict(found: Sequence[StudyCell], default: str, rung_order: Sequence[str]) -> str:
    """RULE_CRITERION applied to the study's cells: the winning rule and why, in one sentence."""
    rules = [default, *RULE_CANDIDATES]
    by_rule = {r: {c.rung: c for c in found if c.rule == r} for r in rules}
    measured = [r for r in rung_order if any(c.rung == r for c in found)]
    if not measured:
        return "Not decided: no rule of the study has finished on any rung."
    largest, smallest = measured[-1], measured[0]
    missing = [r for r in RULE_CANDIDATES if set(by_rule[r]) != set(measured)]
    if missing:
        return (
            f"Not decided: {', '.join(missing)} not finished on every rung measured "
            f"({', '.join(measured)})."
        )
    eligible = [
        r
        for r in rules
        if set(by_rule[r]) == set(measured) and all(c.b_mean <= 0 for c in by_rule[r].values())
    ]
    if not eligible:
        return "No rule is eligible (mean (b) above 0 on some rung): the default stays."
    best = min(eligible, key=lambda r: by_rule[r][largest].b_mean)
    top = by_rule[best][largest]
    margin = 0.02 if math.isnan(top.b_se) else top.b_se
    close = [r for r in eligible if by_rule[r][largest].b_mean - top.b_mean <= margin]
    winner = min(close, key=lambda r: by_rule[r][smallest].syncs)
    why = (
        f"the lowest mean (b) at {largest}"
        if winner == best
        else f"within {margin:.3f} of the lowest (b) at {largest} with fewer syncs at {smallest}"
    )
    return f"Eligible: {', '.join(eligible)}. Chosen: {winner} ({why})."


def same_settings_excess(
    cells: dict[str, dict[int, frontier.Result]], rule: str, seed: int
) -> float:
    """The rule minus the fixed DiLoCo at the rule's own outer LR and
    momentum, interpolated in log(syncs) at the rule's syncs (NaN outside that
    curve's range): what the horizon costs, the outer settings held equal."""
    run = cells[rule][seed]
    lr, mu = run.config["outer_lr"], run.outer_momentum
    curve = [
        (cells[n][seed].syncs, cells[n][seed].val)
        for h in sorted({h for _, _, h in TUNED})
        if seed in cells.get(n := frontier.fixed_name(mu, h, lr), {})
    ]
    return run.val - frontier.log_interpolate(curve, run.syncs)


def diagnostic_rows(
    label: str, cells: dict[str, dict[int, frontier.Result]], default: str
) -> list[list[str]]:
    """Per run of the study's rules and the diagnostics: its
    outer LR, syncs and the excess over its own fixed curve."""
    rows = []
    for rule in (default, *RULE_CANDIDATES, *DIAGNOSTICS):
        for seed, run in sorted(cells.get(rule, {}).items()):
            excess = same_settings_excess(cells, rule, seed)
            rows.append(
                [
                    label,
                    DEFAULT if rule == default else rule,
                    str(seed),
                    f"{run.config['outer_lr']:g}",
                    f"{run.syncs:.0f}",
                    f"{run.val:.3f}",
                    "outside its curve" if math.isnan(excess) else f"{excess:+.3f}",
                ]
            )
    return rows


TRAJECTORY_INTERVALS = 20  # the early part of a run, where the rule's horizon differs from h_base
COHERENCE_INTERVALS = 3  # the start, where the rule's long first intervals cost on the larger rungs


def horizon_rows(rung: Rung, label: str) -> list[list[str]]:
    """Per seed of the rung's default: its horizons over the
    first intervals, read from its interval records."""
    rows = []
    for records in sorted(rung.folder.glob(f"iid/seed*/{rung.default}/intervals.jsonl.gz")):
        with gzip.open(records, "rt") as f:
            intervals = [json.loads(line) for line in f]
        horizons = [r["h_step"] for r in intervals]
        # a severe assessment of the descent rule is its drift guard halving the horizon
        guarded = [str(i + 1) for i, r in enumerate(intervals) if r.get("assessment") == "severe"]
        early = horizons[:TRAJECTORY_INTERVALS]
        first_at_base = next((i + 1 for i, h in enumerate(horizons) if h <= 10), None)
        rows.append(
            [
                label,
                records.parent.parent.name.removeprefix("seed"),
                " ".join(map(str, horizons[:14])),
                f"{sum(early) / len(early):.1f}",
                str(first_at_base) if first_at_base else "never",
                str(min(horizons[:-1])),
                ", ".join(guarded) or "never",
                " ".join(f"{r['coherence']:.2f}" for r in intervals[:COHERENCE_INTERVALS]),
            ]
        )
    return rows


CALIBRATION_INTERVALS = 2  # the descent rule's calibration: its first intervals after warm-up


@dataclass(frozen=True)
class StartSignal:
    """One run of the default: how much its workers agreed at the start, and what its start cost.

    ``correlation`` is the mean pairwise correlation of the workers' pseudo-gradients that the
    coherence implies, ``(C - 1) / (N - 1)`` (``C = 1 + (N - 1) rho`` for N updates of equal norm):
    unlike ``C`` it does not grow with the number of workers, so one threshold could serve any N.
    """

    label: str
    regime: str
    seed: int
    coherence: float  # geometric mean of C_t over the calibration intervals
    correlation: float
    a: float  # the run minus the tuned DiLoCo at h_base on the same seed: (a) of one seed


def start_signals(rung: Rung, label: str) -> list[StartSignal]:
    """Per regime and seed of the rung's default: the calibration's coherence against its (a)."""
    found = []
    regimes = frontier.collect(str(rung.folder)) if rung.folder.is_dir() else {}
    for regime, cells in regimes.items():
        tuned = frontier.TunedFrontier.of(cells) if rung.default in cells else None
        if tuned is None:
            continue
        comparison = frontier.Comparison.of(cells, tuned, rung.default)
        for seed, a in zip(comparison.a_seeds, comparison.a):
            run = rung.folder / regime.value / f"seed{seed}" / rung.default
            with gzip.open(run / frontier.INTERVALS_GZ, "rt") as f:
                early = [json.loads(f.readline()) for _ in range(CALIBRATION_INTERVALS)]
            workers = json.loads((run / frontier.SUMMARY).read_text())["workers"]
            coherence = math.exp(statistics.fmean(math.log(r["coherence"]) for r in early))
            correlation = (coherence - 1.0) / (workers - 1)
            found.append(StartSignal(label, regime.value, seed, coherence, correlation, a))
    return found


def start_signal_verdict(found: Sequence[StartSignal]) -> str:
    """Whether a threshold on the calibration's correlation separates the runs whose start paid
    ((a) < 0) from those whose start cost ((a) > 0), in one sentence."""
    paid = [s for s in found if s.a < 0]
    cost = [s for s in found if s.a > 0]
    if not paid or not cost:
        return "Not decided: the runs measured have not both paid and cost."
    low = min(paid, key=lambda s: s.correlation)
    high = max(cost, key=lambda s: s.correlation)

    def where(s: StartSignal) -> str:
        return f"{s.label}, regime {s.regime}, seed {s.seed}: (a) {s.a:+.3f}"

    if high.correlation < low.correlation:
        return (
            f"A threshold between {high.correlation:.3f} and {low.correlation:.3f} separates "
            f"them: the start cost at {high.correlation:.3f} at most ({where(high)}) and paid at "
            f"{low.correlation:.3f} at least ({where(low)})."
        )
    return (
        "No threshold separates them: the start paid at a correlation as low as "
        f"{low.correlation:.3f} ({where(low)}) and cost at one as high as "
        f"{high.correlation:.3f} ({where(high)}). A rule that cut the start to `h_base` below a "
        "fixed correlation would lose the runs where the start pays to save those where it costs."
    )


def write_report(args: argparse.Namespace) -> Path:
    rows, missing_lines, horizons, study, diagnostics, held_out_rows = [], [], [], [], [], []
    signals: list[StartSignal] = []
    cpu_rungs: list[Measured] = []
    gpu_rungs: list[Measured] = []
    ladder = rungs(Path(args.out), Path(args.base))
    for rung in ladder:
        cells = (
            frontier.collect(str(rung.folder)).get(frontier.Regime.IID, {})
            if rung.folder.is_dir()
            else {}
        )
        # builds the model on the meta device: once per rung
        count = rung.planned_parameters()
        params = parameters_text(count)
        measured = Measured(params, count, cells, rung.default)
        (cpu_rungs if rung.device == "CPU" else gpu_rungs).append(measured)
        label = f"{params} (`{rung.folder}`)"
        if params in RULE_STUDY_SEEDS:
            study += study_cells(rung, params, cells)
            diagnostics += diagnostic_rows(params, cells, rung.default)
        rows.append(
            [
                label,
                f"hidden {rung.hidden}, {rung.layers} layers",
                rung.device,
                *rung_row(rung, cells),
            ]
        )
        if row := held_out_row(params, cells, rung.default):
            held_out_rows.append(row)
        horizons += horizon_rows(rung, params)
        if rung.device == "CPU":
            signals += start_signals(rung, params)
        if rung.folder.parent == Path(args.out) and cells:
            # the rung's own report: its tuned baseline, which setting won at each H and by how much
            frontier.write_report(frontier.parse_args(["--out", str(rung.folder), "--report-only"]))
        left = missing(rung, cells)
        missing_lines += [f"* {label}: " + ("nothing" if not left else "; ".join(left))]
    regime_b = regime_b_rung(ladder, cpu_rungs)
    doublings = [d for m in regime_cells(Path(args.out), Path(args.base)) if (d := doubling(*m))]
    if row := held_out_row(regime_b.label, regime_b.cells, regime_b.default):
        held_out_rows.append(row)
    lines = [
        "# The size ladder, regime A (generated by benchmarks/campaigns/ladder.py)",
        "",
        f"Regenerate with `python benchmarks/campaigns/ladder.py --out {args.out} --base "
        f"{args.base}`; it also writes each CPU rung's own report (`frontier.md` in its folder: "
        "every fixed setting's mean loss, the setting chosen at each H, on which seeds, and the "
        "runner-up's margin). Regime A (IID), 8 workers, T = 1,000, the default rule at "
        f"`h_base` 10 (named `{BASE_DEFAULT}` in the 197k campaign, `{DEFAULT}` elsewhere). "
        "The comparators, "
        "as in every generated report (`benchmarks/campaigns/frontier.py`, `Comparison`): (a) the "
        "default minus the tuned DiLoCo at `h_base` (the best outer LR and momentum at H 10, "
        "chosen on the tuning seeds); (b) the default minus the tuned frontier at its own sync "
        "count (the lower envelope of the best setting at each H, linear in log(syncs) between "
        "the measured horizons, never extrapolated); (c) the syncs at which the default's "
        "loss-against-syncs curve (`h_base` 10, 20, 40) reaches the loss of (a)'s DiLoCo, as a "
        "ratio to that DiLoCo's syncs ('at most' where the default is already below it at its "
        "fewest syncs measured). Validation loss, paired per seed, mean ± standard error. The "
        "tuned grid: outer LR 0.35, 0.7 and 1.0 at momentum 0.5, H 5, 10, 20, 40 on the CPU rungs "
        "(the 197k campaign also has momenta 0.7 and 0.9); the GPU campaign's grid is "
        "`benchmarks/campaigns/gpu_frontier.py --grid tuned`.",
        "",
        replicate.markdown_table(
            [
                "parameters (runs)",
                "model",
                "device",
                "seeds: default",
                "seeds: every planned run",
                "(a) minus tuned DiLoCo at h_base",
                "(b) minus tuned frontier at its syncs",
                "(c) syncs at equal loss / DiLoCo's",
                "paper's rule: (b)",
            ],
            rows,
        ),
        "",
        "The default on its held-out seeds alone: seeds outside the tuning seeds "
        f"{frontier.seed_list(list(SEEDS))}, on which no setting was chosen, against the tuned "
        "DiLoCo chosen on the tuning seeds and run on these seeds too (the table above pools them "
        "with the tuning seeds).",
        "",
        replicate.markdown_table(
            [
                "parameters",
                "held-out seeds of the default",
                "syncs",
                "(a) minus tuned DiLoCo at h_base",
                "(b) minus tuned frontier at its syncs",
            ],
            held_out_rows,
        ),
        "",
        "## The ladder's targets, as measured",
        "",
        "Each target of the ladder's campaign, what the committed runs give and whether it is met "
        f"(held-out seeds: those outside {frontier.seed_list(list(SEEDS))}; one standard error is "
        "the held-out seeds' own where there are two or more, else the rung's over all its seeds).",
        "",
        replicate.markdown_table(
            ["target", "measured", "verdict"],
            target_rows(cpu_rungs, regime_b, gpu_rungs[0]),
        ),
        "",
        f"Not finished, per tuning seed ({frontier.seed_list(list(SEEDS))}) of each "
        "rung's planned campaign:",
        "",
        *missing_lines,
        "",
        "The default's horizon by rung (`h_step` of its interval records, `h_base` "
        "10): it starts at 2 `h_base`",
        "and descends to `h_base`, more slowly on the larger rungs; it never goes "
        "below `h_base` before the",
        "run's last, cut interval. Where the fixed frontier is steep (a shorter "
        "H buys much loss), those",
        "early long intervals are what the rule pays. The last column: the intervals whose "
        "drift its guard judged blown up (a severe assessment), after which it halved the horizon. "
        "Then the coherence of the first intervals (docs/algorithm.md#interval-statistics: "
        "near 1 when the workers' updates are unrelated, up to the number of workers when they "
        "agree).",
        "",
        replicate.markdown_table(
            [
                "parameters",
                "seed",
                "H of the first 14 intervals",
                f"mean H, first {TRAJECTORY_INTERVALS} intervals",
                "first interval at H <= 10",
                "shortest H before the last interval",
                "drift guard fired after interval",
                f"coherence C_t, intervals 1-{COHERENCE_INTERVALS}",
            ],
            horizons,
        ),
        "",
        "Would the workers' agreement at the start tell where the long start costs? Per run of "
        "the default (every regime and seed of the CPU rungs with a tuned DiLoCo): the geometric "
        f"mean coherence of its first {CALIBRATION_INTERVALS} intervals (its calibration, at 2 "
        "`h_base`), the mean pairwise correlation of the workers' pseudo-gradients it implies "
        "(`(C - 1) / (N - 1)`, independent of the number of workers N), and its (a) on that seed "
        "(negative: the rule, long start included, beat the tuned DiLoCo at `h_base`).",
        "",
        replicate.markdown_table(
            ["parameters", "regime", "seed", "coherence, calibration", "correlation", "(a)"],
            [
                [
                    s.label,
                    s.regime,
                    str(s.seed),
                    f"{s.coherence:.2f}",
                    f"{s.correlation:.3f}",
                    f"{s.a:+.3f}",
                ]
                for s in sorted(signals, key=lambda s: s.correlation)
            ],
        ),
        "",
        start_signal_verdict(signals),
        "",
        "What the long start risks: the tuned DiLoCo at 2 `h_base` minus the tuned DiLoCo at "
        "`h_base` (paired over the seeds both ran: what doubling the horizon costs a fixed "
        "schedule), against the default's (a), per rung and regime (the README's rows). The "
        "default starts at 2 `h_base`, so a start that costs the fixed schedule much is a start "
        "it pays for.",
        "",
        replicate.markdown_table(
            [
                "regime",
                "parameters",
                "doubling h_base costs the tuned DiLoCo",
                "seeds",
                "the default's (a)",
                "seeds of (a)",
            ],
            [
                [
                    d.regime,
                    d.parameters,
                    frontier.fmt(d.cost, 3),
                    frontier.seed_list(d.cost_seeds),
                    frontier.fmt(d.a, 3),
                    frontier.seed_list(d.a_seeds),
                ]
                for d in sorted(doublings, key=lambda d: d.mean_cost)
            ],
        ),
        "",
        doubling_verdict(doublings),
        "",
        "## The rule study",
        "",
        "Candidates fixed before their runs (`RULE_CANDIDATES` in "
        "benchmarks/campaigns/ladder.py), each a configuration of the descent rule: "
        + "; ".join(f"`{name}`: `{fields}`" for name, fields in RULE_CANDIDATES.items())
        + ". The criterion, as written before the runs: "
        + RULE_CRITERION,
        "",
        replicate.markdown_table(
            ["parameters", "rule", "seeds", "syncs", "(b) minus tuned frontier at its syncs"],
            [
                [
                    c.rung,
                    c.rule,
                    frontier.seed_list(c.seeds),
                    f"{c.syncs:.1f}",
                    f"{c.b_mean:+.3f}" + ("" if math.isnan(c.b_se) else f" ± {c.b_se:.3f}"),
                ]
                for c in study
            ],
        ),  # fmt: skip
        "",
        study_verdict(study, DEFAULT, list(RULE_STUDY_SEEDS)),
        "",
        "Where the cost lies: each run against the fixed DiLoCo at its own outer LR and momentum "
        "(the same outer settings, only the horizon differs), interpolated in log(syncs) at its "
        f"syncs. The diagnostics ({', '.join(f'`{d}`' for d in DIAGNOSTICS)}: the default and "
        "`cand_from_hbase` at outer LR 0.35, the best fixed outer LR at H 5 and 10 on the 2.56M "
        "rung) were added after the study's first results, to explain them; "
        "they are not candidates.",
        "",
        replicate.markdown_table(
            [
                "parameters",
                "rule",
                "seed",
                "outer LR",
                "syncs",
                "val loss",
                "minus fixed DiLoCo, same outer settings",
            ],
            diagnostics,
        ),
        "",
    ]
    path = Path(args.report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", default="results/ladder", help="the CPU rungs' folders (default results/ladder)"
    )
    p.add_argument(
        "--base", default="results/frontier", help="the 197k rung (default results/frontier)"
    )
    p.add_argument("--report", default=REPORT, help=f"where the report goes (default {REPORT})")
    p.add_argument(
        "--readme",
        action="store_true",
        help="write the results table into README.md and docs/results.md instead",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.readme:
        update_docs(readme_table(Path(args.out), Path(args.base)))
    else:
        print(f"report: {write_report(args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
