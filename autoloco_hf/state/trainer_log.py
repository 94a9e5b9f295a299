"""The run files ``autoloco report`` reads from a Trainer run, written by the main process.

``autoloco_steps.jsonl``: one row per logged step (loss, LR, syncs, bytes);
``autoloco_summary.json``: the run's totals and config at the end. The
per-interval records (``autoloco_intervals.jsonl``) are the engine's.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from autoloco_hf.config import AutoLoCoConfig
from autoloco_hf.state.records import TRAINER_STEPS_FILENAME, TRAINER_SUMMARY_FILENAME, RunTotals


class TrainerRunLog:
    """Steps and summary files in ``output_dir``; nothing is written unless ``is_main_process``."""

    def __init__(self, output_dir: str, is_main_process: bool) -> None:
        self.output_dir, self.is_main_process = output_dir, is_main_process
        self.steps_path = os.path.join(output_dir, TRAINER_STEPS_FILENAME)
        self.started = time.perf_counter()

    def start(self, global_step: int) -> None:
        """Start the clock; keep the rows up to the step a resumed run restarts from."""
        self.started = time.perf_counter()
        if not self.is_main_process or not os.path.exists(self.steps_path):
            return
        with open(self.steps_path) as f:
            kept = [line for line in f if line.strip() and json.loads(line)["step"] <= global_step]
        with open(self.steps_path, "w") as f:
            f.writelines(kept)

    def log_step(self, step: int, logs: dict[str, Any], totals: RunTotals) -> None:
        if not self.is_main_process:
            return
        row = dict(
            step=step,
            loss=float(logs["loss"]),
            lr=float(logs.get("learning_rate", 0.0)),
            syncs=totals.syncs,
            payload_bytes=totals.payload_bytes,
            seconds=time.perf_counter() - self.started,
        )
        with open(self.steps_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def finish(
        self,
        name: str,
        config: AutoLoCoConfig,
        steps: int,
        planned: int,
        totals: RunTotals,
        intervals_file: str,
    ) -> None:
        if not self.is_main_process:
            return
        summary = dict(
            name=name,
            method=str(config.method),
            steps=steps,
            planned_steps=planned,
            wall_seconds=time.perf_counter() - self.started,
            totals=totals.as_dict(),
            config=config.to_dict(),
            intervals_file=intervals_file,
            steps_file=TRAINER_STEPS_FILENAME,
        )
        with open(os.path.join(self.output_dir, TRAINER_SUMMARY_FILENAME), "w") as f:
            json.dump(summary, f, indent=2, default=str)
