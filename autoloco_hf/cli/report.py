"""``autoloco report``: tables and plots that compare finished runs.

``autoloco report DIR [DIR ...]`` accepts run folders (:mod:`autoloco_hf.state.run_folder`)
or folders of run folders (a demo's output), and writes the paper's Table 1 (method, syncs,
payload, train loss over the last 2% of steps, validation loss) and Table 2
(steps, time and bytes to reach loss thresholds) with the plots, to the
terminal and to ``report.md``. A run that timed its workers (budget pacing or
a virtual clock, docs/algorithm.md#pacing) adds each worker's tokens, steps,
speed and straggler intervals, and its tokens in every interval (the
terminal shows the first and last few intervals, ``report.md`` all of them).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoloco_hf.config import Method
from autoloco_hf.state.records import worker_shares
from autoloco_hf.state.run_folder import Run, RunFolderError, find_runs
from autoloco_hf.state.run_plots import PLOTS, write_plots
from autoloco_hf.usage import markdown_table, new_file_path, usage_error

# intervals of a run's per-worker tokens printed to the terminal (report.md holds all)
CONSOLE_INTERVALS = 10


# ------------------------------------------------------------------ tables
def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.1f}"


def _fmt(value: float | None, digits: int = 4) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.{digits}f}"
    )


def table1(runs: Sequence[Run]) -> str:
    """The paper's Table 1 (one row per run, with its method): syncs, payload, train loss over the
    last 2% of steps, val loss (+ wall time)."""
    baseline = next((r for r in runs if r.summary.get("method") == Method.DILOCO), None)
    rows = []
    for run in runs:
        totals = run.summary["totals"]
        syncs, payload = totals["syncs"], totals["payload_bytes"]
        vs = "-"
        if baseline is not None and run.summary.get("method") != Method.DDP:
            vs = f"{100 * (payload / baseline.summary['totals']['payload_bytes'] - 1):+.1f}%"
        rows.append(
            [
                run.name,
                str(run.summary.get("method") or "-"),
                f"{syncs:,}",
                _mib(payload),
                vs,
                _fmt(run.summary.get("train_loss_last")),
                _fmt(run.summary.get("val_loss")),
                f"{run.summary.get('wall_seconds', math.nan):.0f}",
                _fmt(run.summary.get("cpu_seconds"), 0),
            ]
        )
    vs_name = f"payload vs {baseline.name}" if baseline else "payload vs diloco"
    # CPU time next to wall time: on a shared machine only the CPU time compares methods fairly
    headers = [
        "run",
        "method",
        "syncs",
        "payload (MiB/worker)",
        vs_name,
        "train loss (last 2%)",
        "val loss",
        "wall (s)",
        "CPU (s)",
    ]
    return markdown_table(headers, rows)


def default_thresholds(runs: Sequence[Run], count: int = 4) -> list[float]:
    """Each run's final smoothed loss (rounded up to 0.01),
    highest first: how soon does every other run get there?"""
    levels = sorted(
        {math.ceil(r.smoothed_loss[-1] * 100) / 100 for r in runs if r.steps}, reverse=True
    )
    if len(levels) > count:  # keep the extremes and evenly spaced levels between them
        levels = [levels[round(i * (len(levels) - 1) / (count - 1))] for i in range(count)]
    return levels


def reach(run: Run, threshold: float) -> dict[str, float] | None:
    """Step, seconds and payload bytes at which the smoothed
    training loss first reaches ``threshold``."""
    for row, loss in zip(run.steps, run.smoothed_loss):
        if loss <= threshold:
            return dict(
                step=row["step"],
                seconds=row.get("seconds", math.nan),
                payload_bytes=row["payload_bytes"],
            )  # thinned logs: no timings
    return None


def table2(runs: Sequence[Run], thresholds: Sequence[float]) -> str:
    """The paper's Table 2: steps, time and bytes until the
    smoothed training loss reaches each threshold."""
    rows = []
    for run in runs:
        row = [run.name]
        for threshold in thresholds:
            hit = reach(run, threshold)
            row.append(
                "not reached"
                if hit is None
                else f"{hit['step']:,} / {_fmt(hit['seconds'], 0)} s / "
                f"{_mib(hit['payload_bytes'])} MiB"
            )
        rows.append(row)
    return markdown_table(
        ["run"] + [f"loss <= {t:g}: step / time / payload" for t in thresholds], rows
    )


# ----------------------------------------------------------------- workers
def timed(run: Run) -> bool:
    """Whether the run recorded each worker's seconds (budget
    pacing or a virtual clock): its workers get a section."""
    return any(r.get("worker_seconds") for r in run.intervals)


@dataclass
class WorkerTotals:
    """One worker's work summed over a run's intervals."""

    label: str
    tokens: int = 0
    steps: int = 0
    timed_steps: int = 0  # the steps of the intervals whose seconds were recorded
    seconds: float = 0.0
    straggler_intervals: int = 0
    idle_intervals: int = 0

    @property
    def speed(self) -> float:
        """Inner steps per second of its own time on them (virtual on a simulated clock)."""
        return self.timed_steps / self.seconds if self.seconds > 0 else math.nan


def worker_totals(intervals: Sequence[dict[str, Any]]) -> list[WorkerTotals]:
    """Each worker's sums over ``intervals``, by label (a
    worker keeps its label when the membership changes)."""
    totals: dict[str, WorkerTotals] = {}
    for record in intervals:
        for share in worker_shares(record):
            worker = totals.setdefault(share.label, WorkerTotals(share.label))
            worker.tokens += share.tokens
            worker.steps += share.steps
            if share.seconds is not None:
                worker.timed_steps += share.steps
                worker.seconds += share.seconds
            worker.straggler_intervals += share.straggler
            worker.idle_intervals += share.idle
    return list(totals.values())


def workers_table(run: Run) -> str:
    """One row per worker: its tokens and share of the cluster's,
    inner steps, speed, straggler and idle intervals."""
    totals = worker_totals(run.intervals)
    cluster = sum(w.tokens for w in totals)
    rows = [
        [
            w.label,
            f"{w.tokens:,}",
            f"{100 * w.tokens / cluster:.1f}%" if cluster else "-",
            f"{w.steps:,}",
            _fmt(w.speed, 3),
            str(w.straggler_intervals),
            str(w.idle_intervals),
        ]
        for w in totals
    ]
    headers = [
        "worker",
        "tokens",
        "share of tokens",
        "inner steps",
        "steps/s",
        "straggler intervals",
        "idle intervals",
    ]
    return markdown_table(headers, rows)


def interval_tokens_table(run: Run, limit: int | None = None) -> str:
    """Each worker's tokens in every interval (``limit``: the
    first and last ``limit // 2`` intervals only)."""
    labels = [w.label for w in worker_totals(run.intervals)]
    rows = []
    for index, record in enumerate(run.intervals):
        tokens = {share.label: share.tokens for share in worker_shares(record)}
        start, h = record["start_step"], record["h_step"]
        cells = [f"{tokens[label]:,}" if label in tokens else "-" for label in labels]
        rows.append([str(index), f"{start + 1}-{start + h}", *cells, f"{sum(tokens.values()):,}"])
    if limit is not None and len(rows) > limit:
        kept = limit // 2
        skipped = [
            f"... {len(rows) - 2 * kept} intervals more in report.md",
            "",
            *[""] * len(labels),
            "",
        ]
        rows = rows[:kept] + [skipped] + rows[-kept:]
    return markdown_table(["interval", "steps", *labels, "all workers"], rows)


def workers_section(runs: Sequence[Run], limit: int | None = None) -> str:
    """Per-worker tables of the runs that timed their
    workers; empty when none did (lockstep runs)."""
    parts = [
        f"#### {run.name}\n\n{workers_table(run)}\n\nTokens of each worker in each interval:\n\n"
        f"{interval_tokens_table(run, limit)}\n"
        for run in runs
        if timed(run)
    ]
    if not parts:
        return ""
    return (
        "\n### Workers: tokens, steps and speed\n\n"
        "Speed is inner steps per second of a worker's own time on them (virtual seconds on a "
        "simulated clock). A straggler interval: the worker was below `straggler_fraction` of the "
        "median speed for `straggler_intervals` syncs in a row; an idle one: it took no step "
        "(docs/algorithm.md#stragglers).\n\n" + "\n".join(parts)
    )


# ------------------------------------------------------------------ report
def render(
    runs: Sequence[Run], thresholds: Sequence[float], interval_rows: int | None = None
) -> str:
    """Table 1 and Table 2 as Markdown, then the workers of
    timed runs (``interval_rows``: intervals shown per run)."""
    return (
        "### Table 1: communication and quality\n\n"
        + table1(runs)
        + "\n\nPayload is the logical payload per worker (full-model tensors at the wire dtype). "
        "Train loss is the mean over workers of the per-step loss, averaged over the last 2% of "
        "steps.\n\n"
        "### Table 2: steps, time and payload to reach a training loss\n\n"
        + table2(runs, thresholds)
        + "\n\nThe loss is the training loss smoothed over a window of 2% of the steps.\n"
        + workers_section(runs, interval_rows)
    )


def write_report(
    runs: Sequence[Run],
    out_dir: str,
    title: str,
    command: str,
    thresholds: Sequence[float] | None = None,
    notes: str = "",
) -> str:
    """Write ``report.md`` (the tables, the command, embedded
    plots) and the PNGs; return report.md's path."""
    thresholds = list(thresholds) if thresholds else default_thresholds(runs)
    plots = write_plots(runs, out_dir)
    lines = [f"# {title}", "", "Command:", "", "```", command, "```", ""]
    if notes:
        lines += [notes, ""]
    lines += [render(runs, thresholds), "## Plots", ""]
    lines += [f"### {PLOTS[name]}\n\n![{PLOTS[name]}]({name})\n" for name in plots]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def loss_levels(text: str) -> list[float]:
    """An ``argparse`` type: comma-separated finite loss levels (``3.5,3.2``)."""
    try:
        levels = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        levels = []
    if not levels or not all(math.isfinite(v) for v in levels):
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: pass comma-separated numbers, e.g. 3.5,3.2"
        )
    return levels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders, or folders of run folders (a demo's --out)",
    )
    parser.add_argument(
        "--out",
        type=new_file_path,
        help="where report.md and the plots go (default: RUN_DIR/report for one "
        "RUN_DIR, else ./autoloco-report)",
    )
    parser.add_argument(
        "--thresholds",
        type=loss_levels,
        help="comma-separated loss levels for Table 2 (default: derived from the runs)",
    )
    parser.add_argument("--title", default="AutoLoCo run comparison", help="title of report.md")


def run(args: argparse.Namespace) -> int:
    import shlex

    try:
        runs = find_runs(args.run_dirs)
    except RunFolderError as err:
        usage_error(str(err), "autoloco report")
    thresholds = args.thresholds or default_thresholds(runs)
    out = args.out or (
        os.path.join(args.run_dirs[0], "report") if len(args.run_dirs) == 1 else "autoloco-report"
    )
    levels = (
        ["--thresholds", ",".join(f"{t:g}" for t in args.thresholds)] if args.thresholds else []
    )
    command = shlex.join(["autoloco", "report", *args.run_dirs] + levels + ["--out", out])
    path = write_report(runs, out, args.title, command, thresholds)
    print(render(runs, thresholds, CONSOLE_INTERVALS))
    print(f"report: {path}")
    return 0
