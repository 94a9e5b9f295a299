"""The small state types of one interval, shared by the engine and its schedules.

They are plain values (closed interval, average in flight, collected sums,
aggregate, counters) with their own ``state_dict``, kept apart from the engine
so a schedule can hold and checkpoint them without reaching into the engine.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from autoloco_hf.algorithm.policies import IntervalOutcome, NextInterval
from autoloco_hf.algorithm.stats import IntervalStatistics, drift_exponent, drift_growth

if TYPE_CHECKING:
    from autoloco_hf.algorithm.correction import OuterCorrection
    from autoloco_hf.sync.communicators.base import PendingAverage, Traffic
    from autoloco_hf.sync.control import ControlRound

__all__ = [
    "Aggregate",
    "ClosedInterval",
    "InFlight",
    "IntervalCounters",
    "OuterStep",
    "warn_if_not_previewed",
]


@dataclass(frozen=True)
class ClosedInterval:
    """An interval whose last step has run; its counters are read, its average may still be
    pending."""

    interval: NextInterval
    lr_mass: float  # measured
    seconds: float  # wall time of its steps


@dataclass
class InFlight:
    """A closed interval whose average was started and has not been applied yet."""

    closed: ClosedInterval
    # delayed: the step its result is merged; eager: its boundary (applied at the next one)
    due_step: int
    pending: PendingAverage

    def state_dict(self) -> dict[str, Any]:
        """The collective is waited for and stored as its result
        (docs/algorithm.md#overlap-checkpoints)."""
        return {
            "interval": asdict(self.closed.interval),
            "lr_mass": self.closed.lr_mass,
            "due_step": self.due_step,
            "interval_seconds": self.closed.seconds,
            **self.pending.state_dict(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], pending: PendingAverage) -> InFlight:
        """The interval :meth:`state_dict` stored, with its average restored by the caller
        (``PendingAverage.from_state``)."""
        interval = NextInterval(**state["interval"])
        closed = ClosedInterval(interval, float(state["lr_mass"]), float(state["interval_seconds"]))
        return cls(closed, int(state["due_step"]), pending)


@dataclass(frozen=True)
class Aggregate:
    """What the collectives of a boundary produced, and whether the outer step may use it
    (docs/algorithm.md#interval-statistics, #interval-assessment)."""

    # FP32, identical on all workers; None for an interval of fragments (applied one by one)
    mean: torch.Tensor | None
    control: ControlRound
    stats: IntervalStatistics
    mean_loss: float
    all_finite: bool  # no worker reported a non-finite pseudo-gradient or loss
    valid: bool  # all finite, and so are the statistics and the mean: the outer step runs
    traffic: Traffic
    # D at the rule's boundary displacement request (docs/algorithm.md#rule-plugins)
    anchor_drift_energy: float = math.nan
    anchor_lr_mass: float = math.nan

    def outcome(self, closed: ClosedInterval) -> IntervalOutcome:
        """What the policy learns; a non-finite worker hides the statistics, whatever the sums
        say."""
        finite = self.all_finite
        return IntervalOutcome(
            interval=closed.interval,
            global_tokens=int(round(self.control.totals.tokens)),
            drift_energy=self.stats.drift_energy if finite else math.nan,
            coherence=self.stats.coherence if finite else math.nan,
            lr_mass=closed.lr_mass,
            mean_loss=self.mean_loss if finite else math.nan,
            pseudo_grad_finite=self.valid,
            anchor_drift_energy=self.anchor_drift_energy if finite else math.nan,
            anchor_lr_mass=self.anchor_lr_mass,
        )

    @property
    def anchor_normalized_drift(self) -> float | None:
        """``d`` at the rule's boundary displacement request, when it asked for one."""
        if not self.anchor_lr_mass > 0 or not self.anchor_drift_energy > 0:
            return None
        return self.anchor_drift_energy / (self.anchor_lr_mass * self.anchor_lr_mass)

    def drift_exponent(self, lr_mass: float) -> float | None:
        """``p`` of ``D ~ Lambda^p`` from the anchor to the interval's end, when measured.

        ``lr_mass``: the LR mass of the whole interval.
        """
        anchor = (self.anchor_drift_energy, self.anchor_lr_mass)
        exponent = drift_exponent(*drift_growth(self.stats.drift_energy, lr_mass, *anchor))
        return None if math.isnan(exponent) else exponent


@dataclass(frozen=True)
class OuterStep:
    correction: OuterCorrection
    applied: bool


@dataclass
class IntervalCounters:
    """What the local workers did since the interval started (summed into their control
    messages)."""

    tokens: list[int]
    loss_sum: list[float]
    loss_count: int = 0
    lr_mass: float = 0.0
    # each local worker's ||theta_t - theta^i||^2 at the boundary request
    anchor_sq_norms: list[float] | None = None
    anchor_lr_mass: float = 0.0
    # step -> (each local worker's ||theta_t - theta^i||^2, LR mass) of the shared requests
    # measured so far
    shared: dict[int, tuple[list[float], float]] = field(default_factory=dict)
    # each local worker's inner steps (budget pacing: unequal)
    steps: list[int] = field(default_factory=list)
    # each local worker's summed inner learning rates
    worker_lr_mass: list[float] = field(default_factory=list)
    # each local worker's time on its steps (or virtual)
    busy_seconds: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def zero(cls, workers: int) -> IntervalCounters:
        return cls(
            [0] * workers, [0.0] * workers, steps=[0] * workers,
            worker_lr_mass=[0.0] * workers, busy_seconds=[0.0] * workers,
        )  # fmt: skip

    def count_step(
        self,
        tokens: Sequence[int],
        losses: Sequence[float],
        lr: float,
        steps: Sequence[int] | None,
        seconds: Sequence[float] | None,
    ) -> None:
        """Add one step of the run (arguments as ``Engine.after_optimizer_step``'s)."""
        self.lr_mass += lr
        steps = steps if steps is not None else [1] * len(tokens)
        for i, (t, loss, n) in enumerate(zip(tokens, losses, steps)):
            self.tokens[i] += int(t)
            self.loss_sum[i] += float(loss)
            self.steps[i] += int(n)
            self.worker_lr_mass[i] += lr * n
            self.busy_seconds[i] += float(seconds[i]) if seconds is not None else 0.0
        self.loss_count += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "tokens": list(self.tokens),
            "loss_sum": list(self.loss_sum),
            "loss_count": self.loss_count,
            "lr_mass": self.lr_mass,
            "anchor_sq_norms": None if self.anchor_sq_norms is None else list(self.anchor_sq_norms),
            "anchor_lr_mass": self.anchor_lr_mass,
            "shared": {step: (list(norms), lr) for step, (norms, lr) in self.shared.items()},
            "steps": list(self.steps),
            "worker_lr_mass": list(self.worker_lr_mass),
            "busy_seconds": list(self.busy_seconds),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> IntervalCounters:
        anchor, shared = state.get("anchor_sq_norms"), state.get("shared", {})
        workers, count = len(state["tokens"]), int(state["loss_count"])
        lr_mass = float(state["lr_mass"])
        return cls(
            list(state["tokens"]), list(state["loss_sum"]), count, lr_mass,
            None if anchor is None else [float(v) for v in anchor],
            float(state.get("anchor_lr_mass", 0.0)),
            {int(s): ([float(v) for v in norms], float(lr)) for s, (norms, lr) in shared.items()},
            # a checkpoint from before unequal speeds: every worker took the interval's steps so far
            steps=[int(n) for n in state.get("steps", [count] * workers)],
            worker_lr_mass=[float(m) for m in state.get("worker_lr_mass", [lr_mass] * workers)],
            busy_seconds=[float(t) for t in state.get("busy_seconds", [0.0] * workers)],
        )  # fmt: skip


def warn_if_not_previewed(interval: NextInterval, measured: float) -> bool:
    """Warn when the LR mass actually used differs from the previewed one; whether it did.

    The outer correction and candidate selection rely on the preview
    (docs/algorithm.md#interval-statistics); the caller warns once per run. Called from
    ``IntervalEngine.close_interval`` inside a schedule's ``after_step``:
    ``stacklevel`` counts those frames.
    """
    previewed = interval.lr_mass
    if math.isclose(measured, previewed, rel_tol=1e-6, abs_tol=1e-12):
        return False
    warnings.warn(
        f"interval at step {interval.start_step}: the learning rates actually used sum to "
        f"{measured:.6g} but the schedule preview gave {previewed:.6g}; the outer "
        "correction and candidate selection rely on the preview: pass the live scheduler "
        "(SchedulerPreview) that drives the inner optimizer",
        RuntimeWarning,
        stacklevel=4,
    )
    return True
