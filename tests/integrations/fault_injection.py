"""Test-only faults for ``trainer_worker.py`` runs (spec key
``faults``), driven by files in the output folder.

* every rank writes ``progress_rank{r}.json`` (step, pid) after each step, so a
  test knows where a run is and which process to kill;
* ``pause``: ``{"step": S, "ranks": [...]}``: those ranks stop at the end of step
  ``S`` *before* AutoLoCo sees the step (so before a synchronization that step
  would close), write ``paused_rank{r}``, and wait until the test creates
  ``resume``. A rank pauses once per output folder (a restarted worker that
  replays step ``S`` does not pause again); ``pauses``: a list of such pauses,
  each with a ``tag`` (files ``paused_<tag>_rank{r}`` and ``resume_<tag>``);
* ``nan``: ``{"step": S, "rank": r}``: rank ``r`` writes a NaN into its first
  parameter at the end of step ``S`` (its next losses and its pseudo-gradient
  become non-finite);
* ``SyncSnapshots`` (after AutoLoCo in the callback list) keeps the parameters
  and the outer momentum right after every synchronization.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

PAUSE_LIMIT_S = 300.0


def write_json_atomic(path: Path, value: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


class FaultInjector(TrainerCallback):
    """Runs before AutoLoCoCallback in ``on_step_end``: progress files, pauses, NaN injection."""

    def __init__(self, faults: dict, rank: int, out_dir: str) -> None:
        self.faults = faults
        self.rank = rank
        self.out = Path(out_dir)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        write_json_atomic(
            self.out / f"progress_rank{self.rank}.json", {"step": step, "pid": os.getpid()}
        )
        nan = self.faults.get("nan")
        if nan and nan["rank"] == self.rank and nan["step"] == step:
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] = float("nan")
        single = self.faults.get("pause")
        for pause in ([{**single, "tag": ""}] if single else []) + self.faults.get("pauses", []):
            self._pause(pause, step)

    def _pause(self, pause: dict, step: int) -> None:
        tag = f"_{pause['tag']}" if pause["tag"] else ""
        marker, resume = self.out / f"paused{tag}_rank{self.rank}", self.out / f"resume{tag}"
        if self.rank in pause["ranks"] and pause["step"] == step and not marker.exists():
            marker.write_text(str(time.time()))
            deadline = time.monotonic() + PAUSE_LIMIT_S
            while not resume.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {self.rank}: the test never created {resume}")
                time.sleep(0.05)


class SyncSnapshots(TrainerCallback):
    """Runs after AutoLoCoCallback: the parameters and outer
    momentum right after each synchronization."""

    def __init__(self, autoloco) -> None:
        self.autoloco = autoloco
        self.snapshots: list[dict] = []
        self._syncs = 0

    def on_step_end(self, args, state, control, model=None, **kwargs):
        engine = self.autoloco.engine
        if engine.totals.syncs == self._syncs:
            return
        self._syncs = engine.totals.syncs
        momentum = engine.outer.momentum_buffer
        self.snapshots.append(
            {
                "step": state.global_step,
                "params": [p.detach().clone() for p in model.parameters()],
                "momentum": None if momentum is None else momentum.detach().clone(),
            }
        )


def fault_callbacks(spec: dict, rank: int, autoloco) -> tuple[list, list]:
    """Callbacks to put before and after AutoLoCoCallback for
    ``spec["faults"]`` (none without it)."""
    faults = spec.get("faults")
    if faults is None:
        return [], []
    return [FaultInjector(faults, rank, spec["output_dir"])], [SyncSnapshots(autoloco)]
