"""Run folders and ``autoloco report``: tables and plots that compare finished runs.

A *run folder* is what one training run of one method leaves behind, written
by :class:`RunWriter` (the demo and the C4 recipe use it):

* ``intervals.jsonl``: one :class:`~autoloco_hf.state.records.IntervalRecord` per sync;
* ``steps.jsonl``: per optimizer step, the mean training loss over workers,
  the inner LR, and the cumulative syncs, payload bytes and wall time
  (what the loss-vs-step and loss-vs-bytes plots need);
* ``summary.json``: the run's totals (:class:`~autoloco_hf.state.records.RunTotals`),
  its configuration and its final losses.

A Trainer's ``output_dir`` with :class:`~autoloco_hf.AutoLoCoCallback` is a
run folder too: the callback writes ``autoloco_summary.json``,
``autoloco_steps.jsonl`` (at the Trainer's ``logging_steps``) and
``autoloco_intervals.jsonl``.

``autoloco report DIR [DIR ...]`` accepts run folders or folders of run
folders (a demo's output), and writes the paper's Table 1 (method, syncs,
payload, train loss over the last 2% of steps, validation loss) and Table 2
(steps, time and bytes to reach loss thresholds) with the plots, to the
terminal and to ``report.md``. A run that timed its workers (budget pacing or
a virtual clock, docs/algorithm.md §13) adds each worker's tokens, steps,
speed and straggler intervals, and its tokens in every interval (the
terminal shows the first and last few intervals, ``report.md`` all of them).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoloco_hf.config import Method
from autoloco_hf.errors import AutoLoCoError
from autoloco_hf.state.records import TRAINER_SUMMARY_FILENAME, RunTotals, read_jsonl, worker_shares

SUMMARY, INTERVALS, STEPS = "summary.json", "intervals.jsonl", "steps.jsonl"
LAST_FRACTION = 0.02  # the paper reports train loss over the last 2% of steps (1k of 50k)
CONSOLE_INTERVALS = 10  # intervals of a run's per-worker tokens printed to the terminal (report.md holds all)
PLOTS = {
    "loss_vs_step.png": "Training loss vs step",
    "loss_vs_bytes.png": "Training loss vs bytes communicated",
    "horizon.png": "Horizon trajectory",
    "outer_mu_eta.png": "Outer momentum mu_t and outer learning rate eta_t",
    "drift_coherence.png": "Drift energy D_t and coherence C_t",
}
NUMBER, OPTIONAL_NUMBER = "a number", "a number or null"
# The summary fields the report reads besides ``totals``, and what each must hold.
SUMMARY_FIELDS = {
    "train_loss_last": OPTIONAL_NUMBER,
    "val_loss": OPTIONAL_NUMBER,
    "cpu_seconds": OPTIONAL_NUMBER,
    "wall_seconds": NUMBER,
    "intervals_file": "a file name",
    "steps_file": "a file name",
}


class RunWriter:
    """Writes one run folder: ``steps.jsonl`` as training goes, ``summary.json`` at the end.

    Pass :attr:`intervals_path` as the engine's ``records_path`` so the
    interval records land in the same folder. ``resume_step`` keeps the
    ``steps.jsonl`` rows of a resumed run up to its checkpoint.
    """

    def __init__(self, run_dir: str, name: str, resume_step: int = 0) -> None:
        self.run_dir = run_dir
        self.name = name
        os.makedirs(run_dir, exist_ok=True)
        self.intervals_path = os.path.join(run_dir, INTERVALS)
        steps_path = os.path.join(run_dir, STEPS)
        kept = []  # a resumed run keeps the steps up to its checkpoint and drops any logged after it
        if resume_step and os.path.exists(steps_path):
            kept = [row for row in read_jsonl(steps_path) if row["step"] <= resume_step]
        self._steps = open(steps_path, "w")
        self._steps.writelines(json.dumps(row) + "\n" for row in kept)
        self.losses: list[float] = [row["loss"] for row in kept]

    def log_step(self, step: int, loss: float, lr: float, totals: RunTotals, seconds: float) -> None:
        """Record optimizer step ``step`` (1-based: the number of steps done) after it ran."""
        self.losses.append(loss)
        row = dict(step=step, loss=loss, lr=lr, syncs=totals.syncs, payload_bytes=totals.payload_bytes, seconds=seconds)
        self._steps.write(json.dumps(row) + "\n")

    def finish(self, totals: RunTotals, config: dict[str, Any], wall_seconds: float, **extra: Any) -> dict[str, Any]:
        """Write ``summary.json`` (totals, config, last-2% train loss, ``extra`` such as ``val_loss``)."""
        self._steps.close()
        summary = dict(
            name=self.name,
            method=config.get("method"),
            steps=totals.steps,
            train_loss_last=last_fraction_mean(self.losses),
            wall_seconds=wall_seconds,
            totals=totals.as_dict(),
            config=config,
            **extra,
        )
        with open(os.path.join(self.run_dir, SUMMARY), "w") as f:
            json.dump(summary, f, indent=2, allow_nan=True)
        return summary


def extend_trainer_summary(output_dir: str, **extra: Any) -> dict[str, Any]:
    """Add ``extra`` (a recipe's test loss, its settings) to the summary AutoLoCoCallback wrote; return the whole summary.

    One set of run files per run: a Trainer recipe extends the callback's rather than writing its own beside them.
    """
    path = os.path.join(output_dir, TRAINER_SUMMARY_FILENAME)
    with open(path) as f:
        summary = json.load(f)
    summary.update(extra)
    with open(path, "w") as f:
        json.dump(summary, f, indent=2, default=str, allow_nan=True)
    return summary


def last_fraction_mean(losses: Sequence[float], fraction: float = LAST_FRACTION) -> float:
    """Mean of the last ``fraction`` of ``losses`` (at least one value)."""
    if not losses:
        return math.nan
    k = max(1, math.ceil(fraction * len(losses)))
    return sum(losses[-k:]) / k


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average (shorter at the start) used for curves and thresholds."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


@dataclass
class Run:
    """A finished run folder, read back."""

    path: str
    summary: dict[str, Any]
    intervals: list[dict[str, Any]]
    steps: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return str(self.summary.get("name") or os.path.basename(os.path.normpath(self.path)))

    @property
    def smoothed_loss(self) -> list[float]:
        window = max(1, math.ceil(LAST_FRACTION * len(self.steps)))
        return moving_average([s["loss"] for s in self.steps], window)


def _summary_file(path: str) -> str | None:
    """A run folder's summary: ``summary.json`` (RunWriter), else ``autoloco_summary.json`` (a Trainer's output_dir)."""
    for name in (SUMMARY, TRAINER_SUMMARY_FILENAME):
        if os.path.exists(os.path.join(path, name)):
            return os.path.join(path, name)
    return None


class RunFolderError(AutoLoCoError, ValueError):
    """A run folder that cannot be read: the message is one line naming the folder or file and the fix."""


def _existing_log(path: str) -> str | None:
    """A JSONL log, or its gzipped copy (committed benchmark runs keep their logs compressed)."""
    return next((p for p in (path, path + ".gz") if os.path.exists(p)), None)


def _read_json(path: str, lines: bool) -> Any:
    try:
        with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
            return [json.loads(line) for line in f if line.strip()] if lines else json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        reason = err.msg if isinstance(err, json.JSONDecodeError) else err.reason
        kind = "JSON Lines (one JSON object a line)" if lines else "JSON"
        raise RunFolderError(
            f"{path}: not valid {kind} ({reason}); was the run interrupted while writing it?"
        ) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:  # cut short, or not gzip at all
        raise RunFolderError(
            f"{path}: not a complete gzip file ({err}); was the run interrupted while writing it? "
            "Delete it to report the run without it, or re-run"
        ) from None


def _holds(value: Any, kind: str) -> bool:
    """Whether a summary field's JSON ``value`` is ``kind`` (one of :data:`SUMMARY_FIELDS`' values)."""
    if kind == "a file name":
        return isinstance(value, str)
    if value is None:
        return kind == OPTIONAL_NUMBER
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_summary(summary_path: str, summary: Any) -> None:
    """A summary the report can read: a ``totals`` with numeric counts, and each field it reads of its type."""
    totals = summary.get("totals") if isinstance(summary, dict) else None
    if not isinstance(totals, dict) or not {"syncs", "payload_bytes"} <= set(totals):
        raise RunFolderError(
            f"{summary_path}: no 'totals' with 'syncs' and 'payload_bytes'; pass a folder written by the demo, "
            "a recipe or AutoLoCoCallback"
        )
    fields = {f"totals.{name}": (totals[name], NUMBER) for name in ("syncs", "payload_bytes")}
    fields.update((name, (summary[name], kind)) for name, kind in SUMMARY_FIELDS.items() if name in summary)
    for name, (value, kind) in fields.items():
        if not _holds(value, kind):
            raise RunFolderError(
                f"{summary_path}: '{name}' is {json.dumps(value)}, not {kind}; fix or remove it, or pass a folder "
                "written by the demo, a recipe or AutoLoCoCallback"
            )


def load_run(path: str) -> Run:
    summary_path = _summary_file(path)
    summary = _read_json(summary_path, lines=False)
    _check_summary(summary_path, summary)
    # a Trainer run names its own files; its train loss over the last 2% comes from the logged steps
    intervals_path = _existing_log(os.path.join(path, summary.get("intervals_file", INTERVALS)))
    steps_path = _existing_log(os.path.join(path, summary.get("steps_file", STEPS)))
    intervals = _read_json(intervals_path, lines=True) if intervals_path else []
    steps = _read_json(steps_path, lines=True) if steps_path else []
    if steps and "payload_bytes" not in steps[0] and intervals:
        _add_sync_totals(steps, intervals)
    summary.setdefault("train_loss_last", last_fraction_mean([s["loss"] for s in steps]))
    return Run(path, summary, intervals, steps)


def _add_sync_totals(steps: list[dict[str, Any]], intervals: list[dict[str, Any]]) -> None:
    """The running ``syncs`` / ``payload_bytes`` of a thinned step log, from the interval records (each sync lands at its boundary)."""
    boundaries = sorted((r["start_step"] + r["h_step"], r["payload_bytes"]) for r in intervals)
    syncs = payload = 0
    for row in steps:
        while syncs < len(boundaries) and boundaries[syncs][0] <= row["step"]:
            payload += boundaries[syncs][1]
            syncs += 1
        row["syncs"], row["payload_bytes"] = syncs, payload


def find_runs(paths: Sequence[str]) -> list[Run]:
    """Run folders named directly, or the run folders one level inside the given folders (sorted)."""
    runs = []
    for path in paths:
        if not os.path.exists(path):
            raise RunFolderError(f"RUN_DIR {path} does not exist: pass a run folder or a folder of run folders")
        if not os.path.isdir(path):
            raise RunFolderError(f"RUN_DIR {path} is a file: pass the run folder that holds it")
        if _summary_file(path):
            runs.append(load_run(path))
            continue
        inside = sorted(d for d in os.listdir(path) if _summary_file(os.path.join(path, d)))
        if not inside:
            raise RunFolderError(
                f"RUN_DIR {path}: no {SUMMARY} (or a Trainer's {TRAINER_SUMMARY_FILENAME}) here or in "
                "its sub-folders; is it a finished run?"
            )
        runs.extend(load_run(os.path.join(path, d)) for d in inside)
    return runs


# ------------------------------------------------------------------ tables
def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.1f}"


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table; ``align`` holds each column's separator (``---``, ``---:``), default ``---``."""
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align or ["---"] * len(headers)) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def table1(runs: Sequence[Run]) -> str:
    """The paper's Table 1 (one row per run, with its method): syncs, payload, train loss over the last 2% of steps, val loss (+ wall time)."""
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
    """Each run's final smoothed loss (rounded up to 0.01), highest first: how soon does every other run get there?"""
    levels = sorted({math.ceil(r.smoothed_loss[-1] * 100) / 100 for r in runs if r.steps}, reverse=True)
    if len(levels) > count:  # keep the extremes and evenly spaced levels between them
        levels = [levels[round(i * (len(levels) - 1) / (count - 1))] for i in range(count)]
    return levels


def reach(run: Run, threshold: float) -> dict[str, float] | None:
    """Step, seconds and payload bytes at which the smoothed training loss first reaches ``threshold``."""
    for row, loss in zip(run.steps, run.smoothed_loss):
        if loss <= threshold:
            return dict(
                step=row["step"], seconds=row.get("seconds", math.nan), payload_bytes=row["payload_bytes"]
            )  # thinned logs: no timings
    return None


def table2(runs: Sequence[Run], thresholds: Sequence[float]) -> str:
    """The paper's Table 2: steps, time and bytes until the smoothed training loss reaches each threshold."""
    rows = []
    for run in runs:
        row = [run.name]
        for threshold in thresholds:
            hit = reach(run, threshold)
            row.append(
                "not reached"
                if hit is None
                else f"{hit['step']:,} / {_fmt(hit['seconds'], 0)} s / {_mib(hit['payload_bytes'])} MiB"
            )
        rows.append(row)
    return markdown_table(["run"] + [f"loss <= {t:g}: step / time / payload" for t in thresholds], rows)


# ----------------------------------------------------------------- workers
def timed(run: Run) -> bool:
    """Whether the run recorded each worker's seconds (budget pacing or a virtual clock): its workers get a section."""
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
    """Each worker's sums over ``intervals``, by label (a worker keeps its label when the membership changes)."""
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
    """One row per worker: its tokens and share of the cluster's, inner steps, speed, straggler and idle intervals."""
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
    headers = ["worker", "tokens", "share of tokens", "inner steps", "steps/s", "straggler intervals", "idle intervals"]
    return markdown_table(headers, rows)


def interval_tokens_table(run: Run, limit: int | None = None) -> str:
    """Each worker's tokens in every interval (``limit``: the first and last ``limit // 2`` intervals only)."""
    labels = [w.label for w in worker_totals(run.intervals)]
    rows = []
    for index, record in enumerate(run.intervals):
        tokens = {share.label: share.tokens for share in worker_shares(record)}
        start, h = record["start_step"], record["h_step"]
        cells = [f"{tokens[label]:,}" if label in tokens else "-" for label in labels]
        rows.append([str(index), f"{start + 1}-{start + h}", *cells, f"{sum(tokens.values()):,}"])
    if limit is not None and len(rows) > limit:
        kept = limit // 2
        skipped = [f"... {len(rows) - 2 * kept} intervals more in report.md", "", *[""] * len(labels), ""]
        rows = rows[:kept] + [skipped] + rows[-kept:]
    return markdown_table(["interval", "steps", *labels, "all workers"], rows)


def workers_section(runs: Sequence[Run], limit: int | None = None) -> str:
    """Per-worker tables of the runs that timed their workers; empty when none did (lockstep runs)."""
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
        "Speed is inner steps per second of a worker's own time on them (virtual seconds on a simulated clock). "
        "A straggler interval: the worker was below `straggler_fraction` of the median speed for "
        "`straggler_intervals` syncs in a row; an idle one: it took no step (docs/algorithm.md §13.3).\n\n"
        + "\n".join(parts)
    )


# ------------------------------------------------------------------- plots
def write_plots(runs: Sequence[Run], out_dir: str) -> list[str]:
    """The five comparison plots as PNGs in ``out_dir``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    from cycler import cycler

    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    # past the palette's 10 colors, lines change style rather than repeat a color
    with matplotlib.rc_context({"axes.prop_cycle": cycler(linestyle=["-", "--", ":"]) * cycler(color=colors)}):
        return _write_plots(runs, out_dir)


def _write_plots(runs: Sequence[Run], out_dir: str) -> list[str]:
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    interval_runs = [r for r in runs if r.intervals and r.summary.get("method") != Method.DDP]

    def save(fig, name: str) -> None:
        fig.suptitle(PLOTS[name])
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        ax.plot([s["step"] for s in run.steps], run.smoothed_loss, label=run.name, lw=1.2)
    ax.set(xlabel="step", ylabel="training loss (moving average, 2% of steps)")
    _zoom_on_tail(ax, runs)
    ax.legend()
    save(fig, "loss_vs_step.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        points = [
            (s["payload_bytes"] / 2**20, loss)
            for s, loss in zip(run.steps, run.smoothed_loss)
            if s["payload_bytes"] > 0
        ]
        if points:
            ax.plot(*zip(*points), label=run.name, lw=1.2)
    ax.set(
        xscale="log", xlabel="payload communicated per worker (MiB, log scale)", ylabel="training loss (moving average)"
    )
    _zoom_on_tail(ax, runs)
    if ax.lines:  # a one-worker run sends nothing: no curve, so no legend (matplotlib warns on an empty one)
        ax.legend()
    save(fig, "loss_vs_bytes.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    cut_any = False
    for run in interval_runs:
        xs, ys, cut = horizon_series(run.intervals)
        (line,) = ax.step(xs, ys, where="post", label=f"{run.name} ({len(run.intervals)} syncs)")
        for start, h in cut:  # drawn apart, not as a drop of H: the budget cut it, not the controller
            ax.plot([start, start + h], [h, h], ls=":", marker="x", color=line.get_color())
        cut_any = cut_any or bool(cut)
    if cut_any:
        ax.plot([], [], ls=":", marker="x", color="gray", label="cut short by the step budget (no decision)")
    ax.set(xlabel="step", ylabel="H_step (local steps per interval)")
    ax.legend()
    save(fig, "horizon.png")

    def two_panels(top: str, bottom: str, top_label: str, bottom_label: str, name: str, log_top: bool = False) -> None:
        fig, (ax_top, ax_bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
        for run in interval_runs:
            starts = [r["start_step"] for r in run.intervals]
            ax_top.plot(starts, [r[top] for r in run.intervals], marker=".", label=run.name)
            ax_bottom.plot(starts, [r[bottom] for r in run.intervals], marker=".", label=run.name)
        ax_top.set(yscale="log" if log_top else "linear", ylabel=top_label)
        ax_bottom.set(xlabel="interval start step", ylabel=bottom_label)
        ax_top.legend()
        save(fig, name)

    two_panels("mu", "eta", "outer momentum mu_t", "outer LR eta_t", "outer_mu_eta.png")
    two_panels(
        "drift_energy", "coherence", "drift energy D_t", "coherence C_t (0..N)", "drift_coherence.png", log_top=True
    )
    return list(PLOTS)


def truncated(intervals: Sequence[dict[str, Any]], index: int) -> bool:
    """Whether interval ``index`` was cut short by the step budget rather than chosen.

    The controller records it (assessment ``truncated``); a fixed-horizon
    policy does not, so its last interval counts when shorter than the one before.
    """
    record = intervals[index]
    if record.get("assessment") == "truncated":
        return True
    last = index == len(intervals) - 1
    return (
        last and index > 0 and record.get("assessment") == "fixed" and record["h_step"] < intervals[index - 1]["h_step"]
    )


def horizon_series(intervals: Sequence[dict[str, Any]]) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """The chosen horizons as a step curve (x, y, closed at the end of the last chosen interval) and the cut ones ((start, h))."""
    chosen = [r for i, r in enumerate(intervals) if not truncated(intervals, i)]
    cut = [(r["start_step"], r["h_step"]) for i, r in enumerate(intervals) if truncated(intervals, i)]
    xs = [r["start_step"] for r in chosen]
    ys = [r["h_step"] for r in chosen]
    if chosen:
        xs.append(chosen[-1]["start_step"] + chosen[-1]["h_step"])
        ys.append(chosen[-1]["h_step"])
    return xs, ys, cut


def _zoom_on_tail(ax: Any, runs: Sequence[Run]) -> str | None:
    """Clip the y axis above the early-training spike so the differences at the end stay visible, and say so on the plot.

    Returns the note drawn (None when nothing is clipped).
    """
    tails = [loss for r in runs for loss in r.smoothed_loss[len(r.smoothed_loss) // 10 :]]
    if not tails:
        return None
    low, high = min(tails), max(tails)
    pad = 0.05 * (high - low) or 0.05 * max(abs(high), 1.0)  # a flat tail still gets a visible band
    top = high + pad
    ax.set_ylim(low - pad, top)
    everything = [loss for r in runs for loss in r.smoothed_loss]
    above = [r for r in runs if any(loss > top for loss in r.smoothed_loss)]
    if not above:
        return None
    last_clipped = max(s["step"] for r in above for s, loss in zip(r.steps, r.smoothed_loss) if loss > top)
    note = f"y axis clipped at {top:.3g}: steps <= {last_clipped:,} reach up to {max(everything):.3g} (off the top)"
    ax.text(0.98, 0.98, note, transform=ax.transAxes, ha="right", va="top", fontsize=8, color="dimgray")
    return note


# ------------------------------------------------------------------ report
def render(runs: Sequence[Run], thresholds: Sequence[float], interval_rows: int | None = None) -> str:
    """Table 1 and Table 2 as Markdown, then the workers of timed runs (``interval_rows``: intervals shown per run)."""
    return (
        "### Table 1: communication and quality\n\n"
        + table1(runs)
        + "\n\nPayload is the logical payload per worker (full-model tensors at the wire dtype). "
        "Train loss is the mean over workers of the per-step loss, averaged over the last 2% of steps.\n\n"
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
    """Write ``report.md`` (the tables, the command, embedded plots) and the PNGs; return report.md's path."""
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
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: pass comma-separated numbers, e.g. 3.5,3.2")
    return levels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from autoloco_hf.cli import new_file_path

    parser.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run folders, or folders of run folders (a demo's --out)"
    )
    parser.add_argument(
        "--out",
        type=new_file_path,
        help="where report.md and the plots go (default: RUN_DIR/report for one RUN_DIR, else ./autoloco-report)",
    )
    parser.add_argument(
        "--thresholds",
        type=loss_levels,
        help="comma-separated loss levels for Table 2 (default: derived from the runs)",
    )
    parser.add_argument("--title", default="AutoLoCo run comparison", help="title of report.md")


def run(args: argparse.Namespace) -> int:
    import shlex

    from autoloco_hf.cli import usage_error

    try:
        runs = find_runs(args.run_dirs)
    except RunFolderError as err:
        usage_error(str(err), "autoloco report")
    thresholds = args.thresholds or default_thresholds(runs)
    out = args.out or (os.path.join(args.run_dirs[0], "report") if len(args.run_dirs) == 1 else "autoloco-report")
    levels = ["--thresholds", ",".join(f"{t:g}" for t in args.thresholds)] if args.thresholds else []
    command = shlex.join(["autoloco", "report", *args.run_dirs] + levels + ["--out", out])
    path = write_report(runs, out, args.title, command, thresholds)
    print(render(runs, thresholds, CONSOLE_INTERVALS))
    print(f"report: {path}")
    return 0
