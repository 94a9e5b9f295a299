"""Run folders: what one training run of one method leaves behind, written and read back.

:class:`RunWriter` writes a run folder (the demo and the C4 recipe use it):

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

:func:`find_runs` reads run folders back (``autoloco report`` and the benchmarks compare them).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoloco_hf.errors import AutoLoCoError
from autoloco_hf.state.records import TRAINER_SUMMARY_FILENAME, RunTotals, read_jsonl

SUMMARY, INTERVALS, STEPS = "summary.json", "intervals.jsonl", "steps.jsonl"
LAST_FRACTION = 0.02  # the paper reports train loss over the last 2% of steps (1k of 50k)
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
        # a resumed run keeps the steps up to its checkpoint and drops any logged after it
        kept = []
        if resume_step and os.path.exists(steps_path):
            kept = [row for row in read_jsonl(steps_path) if row["step"] <= resume_step]
        self._steps = open(steps_path, "w")
        self._steps.writelines(json.dumps(row) + "\n" for row in kept)
        self.losses: list[float] = [row["loss"] for row in kept]

    def log_step(
        self, step: int, loss: float, lr: float, totals: RunTotals, seconds: float
    ) -> None:
        """Record optimizer step ``step`` (1-based: the number of steps done) after it ran."""
        self.losses.append(loss)
        row = dict(
            step=step,
            loss=loss,
            lr=lr,
            syncs=totals.syncs,
            payload_bytes=totals.payload_bytes,
            seconds=seconds,
        )
        self._steps.write(json.dumps(row) + "\n")

    def finish(
        self, totals: RunTotals, config: dict[str, Any], wall_seconds: float, **extra: Any
    ) -> dict[str, Any]:
        """Write ``summary.json`` (totals, config, last-2%
        train loss, ``extra`` such as ``val_loss``)."""
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
    """Add ``extra`` (a recipe's test loss, its settings) to the
    summary AutoLoCoCallback wrote; return the whole summary.

    One set of run files per run: a Trainer recipe extends
    the callback's rather than writing its own beside them.
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
    """A run folder's summary: ``summary.json`` (RunWriter),
    else ``autoloco_summary.json`` (a Trainer's output_dir)."""
    for name in (SUMMARY, TRAINER_SUMMARY_FILENAME):
        if os.path.exists(os.path.join(path, name)):
            return os.path.join(path, name)
    return None


class RunFolderError(AutoLoCoError, ValueError):
    """A run folder that cannot be read: the message is one
    line naming the folder or file and the fix."""


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
    """Whether a summary field's JSON ``value`` is ``kind``
    (one of :data:`SUMMARY_FIELDS`' values)."""
    if kind == "a file name":
        return isinstance(value, str)
    if value is None:
        return kind == OPTIONAL_NUMBER
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_summary(summary_path: str, summary: Any) -> None:
    """A summary the report can read: a ``totals`` with
    numeric counts, and each field it reads of its type."""
    totals = summary.get("totals") if isinstance(summary, dict) else None
    if not isinstance(totals, dict) or not {"syncs", "payload_bytes"} <= set(totals):
        raise RunFolderError(
            f"{summary_path}: no 'totals' with 'syncs' and 'payload_bytes'; pass a folder written "
            "by the demo, a recipe or AutoLoCoCallback"
        )
    fields = {f"totals.{name}": (totals[name], NUMBER) for name in ("syncs", "payload_bytes")}
    fields.update(
        (name, (summary[name], kind)) for name, kind in SUMMARY_FIELDS.items() if name in summary
    )
    for name, (value, kind) in fields.items():
        if not _holds(value, kind):
            raise RunFolderError(
                f"{summary_path}: '{name}' is {json.dumps(value)}, not {kind}; fix or remove it, "
                "or pass a folder written by the demo, a recipe or AutoLoCoCallback"
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
    """The running ``syncs`` / ``payload_bytes`` of a thinned step log, from the interval records
    (each sync lands at its boundary)."""
    boundaries = sorted((r["start_step"] + r["h_step"], r["payload_bytes"]) for r in intervals)
    syncs = payload = 0
    for row in steps:
        while syncs < len(boundaries) and boundaries[syncs][0] <= row["step"]:
            payload += boundaries[syncs][1]
            syncs += 1
        row["syncs"], row["payload_bytes"] = syncs, payload


def find_runs(paths: Sequence[str]) -> list[Run]:
    """Run folders named directly, or the run folders one
    level inside the given folders (sorted)."""
    runs = []
    for path in paths:
        if not os.path.exists(path):
            raise RunFolderError(
                f"RUN_DIR {path} does not exist: pass a run folder or a folder of run folders"
            )
        if not os.path.isdir(path):
            raise RunFolderError(f"RUN_DIR {path} is a file: pass the run folder that holds it")
        if _summary_file(path):
            runs.append(load_run(path))
            continue
        inside = sorted(d for d in os.listdir(path) if _summary_file(os.path.join(path, d)))
        if not inside:
            raise RunFolderError(
                f"RUN_DIR {path}: no {SUMMARY} (or a Trainer's {TRAINER_SUMMARY_FILENAME}) here or "
                "in its sub-folders; is it a finished run?"
            )
        runs.extend(load_run(os.path.join(path, d)) for d in inside)
    return runs
