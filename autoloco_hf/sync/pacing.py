"""When each worker's interval ends, and how much its
pseudo-gradient weighs (docs/algorithm.md#pacing).

A :class:`Pacer` is the engine's strategy for workers of unequal speed:

* :class:`LockstepPacer` (``pacing = "lockstep"``, the default): every worker takes
  one step per step of the run, so the interval ends after ``H`` steps of each and
  the slowest worker sets the pace; the average weighs the workers equally.
* :class:`BudgetPacer` (``pacing = "budget"``): the interval's ``N * H`` inner steps
  are split among the workers in proportion to the speeds measured over the
  previous interval (agreed at its sync, from every worker's control message), so
  they all end together; the average weighs each worker by the steps it took.

The run's step counter stays the cluster's: one step of the run is ``N`` inner
steps of the cluster, whoever takes them, so ``total_steps``, the LR schedule and
the horizon rule read the same budget as in lockstep (:func:`set_schedule_step`
puts a rank's ``LambdaLR`` at the run's step). :class:`VirtualClock` times
simulated workers of given speeds, so both pacings run and are compared on 2 CPU cores.

Example (one worker at half speed: after the first interval it takes a third of the steps)::

    >>> pacer = BudgetPacer(
    ...     num_workers=2, local=[0, 1], straggler_fraction=0.5, straggler_intervals=3
    ... )
    >>> pacer.steps_due(elapsed=0)
    [1, 1]
    >>> pacer.observe(steps=[4, 4], seconds=[4.0, 8.0], labels=["worker 0", "worker 1"]).stragglers
    []
    >>> [sum(pacer.steps_due(k)[w] for k in range(6)) for w in (0, 1)]
    [8, 4]
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autoloco_hf.config import AutoLoCoConfig, Pacing
from autoloco_hf.errors import AutoLoCoError

logger = logging.getLogger("autoloco_hf")

# a measured speed becomes an integer share of this, relative to the fastest worker
SHARE_RESOLUTION = 1_000_000
# a worker's tokens per step may differ from the others' median by this factor
TOKENS_PER_STEP_SPREAD = 4.0


class InconsistentCounts(AutoLoCoError, RuntimeError):
    """A worker's token count disagrees with its step count: its weight would be wrong
    (docs/algorithm.md#pacing-bad-input)."""


@dataclass(frozen=True)
class PaceReport:
    """What one sync's speeds showed: who is too slow, who took no step."""

    # below the fraction of the median for enough intervals
    stragglers: list[str] = field(default_factory=list)
    idle: list[str] = field(default_factory=list)  # no step at all: contributed nothing


@dataclass(frozen=True)
class Weights:
    """Per local worker, the factor on its pseudo-gradient and on its squared norm
    (docs/algorithm.md#pacing-weights)."""

    delta: list[float]
    sq_norm: list[float]


class Pacer(Protocol):
    """How many inner steps each local worker takes at each
    step of the run, and the weights of their work."""

    def steps_due(self, elapsed: int) -> list[int]:
        """Inner steps of each local worker at the interval's step ``elapsed`` (0-based)."""

    def weights(
        self, steps: Sequence[int], lr_masses: Sequence[float], lr_mass: float, comm: Any
    ) -> Weights | None:
        """The factors of the weighted average; ``None`` when
        every worker took the same steps (equal weights)."""

    def check_counts(self, workers: Sequence[Any], labels: Sequence[str]) -> None:
        """Refuse, before the payload, a worker whose tokens disagree with its steps."""

    def observe(
        self, steps: Sequence[float], seconds: Sequence[float], labels: Sequence[str]
    ) -> PaceReport | None:
        """Learn every worker's speed from the sync's control
        messages (the same numbers on every worker)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class LockstepPacer:
    """Every worker one step per step of the run, equal weights:
    the algorithm before unequal speeds, bit for bit."""

    def __init__(self, local_workers: int) -> None:
        self._due = [1] * local_workers

    def steps_due(self, elapsed: int) -> list[int]:
        return list(self._due)

    def weights(self, steps, lr_masses, lr_mass, comm) -> None:
        return None

    def check_counts(self, workers, labels) -> None:
        pass

    def observe(self, steps, seconds, labels) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class BudgetPacer:
    """The interval's ``N * H`` inner steps split by measured speed; weights by steps
    (docs/algorithm.md#pacing-mechanism to #stragglers).

    Args:
        num_workers: ``N``.
        local: the global index of each worker of this process.
        straggler_fraction, straggler_intervals: a worker below ``fraction`` of the median speed for
            ``intervals`` syncs in a row is reported.
    """

    def __init__(
        self,
        num_workers: int,
        local: Sequence[int],
        straggler_fraction: float,
        straggler_intervals: int,
    ) -> None:
        self.num_workers = num_workers
        self.local = list(local)
        self.straggler_fraction = straggler_fraction
        self.straggler_intervals = straggler_intervals
        # unmeasured: equal (the first interval runs in lockstep)
        self.shares = [SHARE_RESOLUTION] * num_workers
        self.slow_streak = [0] * num_workers

    def cumulative(self, worker: int, elapsed: int) -> int:
        """Inner steps of ``worker`` in the interval's first ``elapsed`` steps:
        ``floor(elapsed N q_w / sum q)``.

        Exact integer arithmetic, so equal shares give exactly one step per step of the run.
        """
        return elapsed * self.num_workers * self.shares[worker] // sum(self.shares)

    def steps_due(self, elapsed: int) -> list[int]:
        return [self.cumulative(w, elapsed + 1) - self.cumulative(w, elapsed) for w in self.local]

    def split(self, h_step: int) -> list[int]:
        """Every worker's inner steps in an interval of
        ``h_step`` steps of the run, at the current shares."""
        return [self.cumulative(w, h_step) for w in range(self.num_workers)]

    def adopt(self, speeds: Sequence[float]) -> None:
        """Shares from speeds (``nan``: not measured, the worker keeps its share)."""
        measured = [s for s in speeds if not math.isnan(s)]
        if measured:
            fastest = max(measured)
            self.shares = [
                q if math.isnan(s) else max(1, round(SHARE_RESOLUTION * s / fastest))
                for q, s in zip(self.shares, speeds)
            ]

    def weights(
        self, steps: Sequence[int], lr_masses: Sequence[float], lr_mass: float, comm: Any
    ) -> Weights | None:
        """``w_i = n_i / S``, and the LR-mass rescale ``r = Lambda / sum_i w_i Lambda_i``
        (docs/algorithm.md#pacing-weights).

        One small collective sums ``n_i``, ``n_i Lambda_i`` and ``n_i^2`` over the workers; equal
        steps (``S^2 = N sum n_i^2``, exact in float64) leave the average as it was.
        """
        # here: the split itself is pure, and `autoloco plan --speeds` previews it without torch
        import torch

        rows = [
            torch.tensor([n, n * m, n * n], dtype=torch.float64) for n, m in zip(steps, lr_masses)
        ]
        # a worker of R ranks syncing shards counts its row
        # once per rank (the ranks take the same steps)
        total, weighted_mass, squares = (
            comm.sum_over_workers(rows) / comm.shards_per_worker
        ).tolist()
        if total == 0 or total * total == self.num_workers * squares:
            return None
        rescale = lr_mass * total / weighted_mass if weighted_mass > 0 else 1.0
        factors = [self.num_workers * n / total for n in steps]
        return Weights([f * rescale for f in factors], [f * rescale * rescale for f in factors])

    def check_counts(self, workers: Sequence[Any], labels: Sequence[str]) -> None:
        """No tokens without steps, at least one token per
        step, tokens per step near the others' median."""
        refused = []
        counted = [w for w in workers if w.inner_steps > 0 and w.tokens >= w.inner_steps]
        # the median in log space: with two workers, their
        # geometric mean, so both are named when they differ
        typical = (
            math.exp(statistics.median(math.log(w.tokens / w.inner_steps) for w in counted))
            if counted
            else 0
        )
        for worker, label in zip(workers, labels):
            if (worker.inner_steps == 0) != (
                worker.tokens == 0
            ) or worker.tokens < worker.inner_steps:
                refused.append(f"{label}: {worker.tokens:g} tokens in {worker.inner_steps:g} steps")
            elif worker.inner_steps and not (
                typical / TOKENS_PER_STEP_SPREAD
                <= worker.tokens / worker.inner_steps
                <= typical * TOKENS_PER_STEP_SPREAD
            ):
                refused.append(
                    f"{label}: {worker.tokens:g} tokens in {worker.inner_steps:g} steps, the "
                    f"workers' median {typical:.4g} per step"
                )
        if refused:
            raise InconsistentCounts(
                f"token and step counts disagree at a synchronization: {'; '.join(refused)}. Each "
                "worker's pseudo-gradient weighs by its steps, so the average was not computed: "
                "every worker must count the tokens of the batches it trained on "
                "(docs/algorithm.md#pacing-bad-input)"
            )

    def observe(
        self, steps: Sequence[float], seconds: Sequence[float], labels: Sequence[str]
    ) -> PaceReport:
        """New shares from the measured speeds ``n_i / t_i``;
        a worker with no step keeps its last share."""
        speeds = [n / t if n > 0 and t > 0 else math.nan for n, t in zip(steps, seconds)]
        measured = [s for s in speeds if not math.isnan(s)]
        idle = [label for label, n in zip(labels, steps) if n == 0]
        self.adopt(speeds)
        if measured:
            median = statistics.median(measured)
            for i, s in enumerate(speeds):
                slow = math.isnan(s) or s < self.straggler_fraction * median
                self.slow_streak[i] = self.slow_streak[i] + 1 if slow else 0
        stragglers = [
            label
            for label, streak in zip(labels, self.slow_streak)
            if streak >= self.straggler_intervals
        ]
        for label, streak in zip(labels, self.slow_streak):
            if streak == self.straggler_intervals:
                logger.warning(
                    "AutoLoCo: %s ran below %g of the median speed for %d intervals in a row (a "
                    "straggler: it takes fewer steps and weighs less; check its machine)",
                    label,
                    self.straggler_fraction,
                    streak,
                )
        if idle:
            logger.warning(
                "AutoLoCo: %s took no step in the interval and contributed nothing to the average",
                ", ".join(idle),
            )
        return PaceReport(stragglers, idle)

    def state_dict(self) -> dict[str, Any]:
        return {"shares": list(self.shares), "slow_streak": list(self.slow_streak)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # another number of workers: measured afresh
        if state and len(state["shares"]) == self.num_workers:
            self.shares = [int(q) for q in state["shares"]]
            self.slow_streak = [int(s) for s in state["slow_streak"]]


def make_pacer(config: AutoLoCoConfig, comm: Any) -> Pacer:
    """The pacer of ``config.pacing`` for the local workers of ``comm``."""
    if config.pacing == Pacing.LOCKSTEP:
        return LockstepPacer(comm.local_workers)
    local = [comm.global_worker(i) for i in range(comm.local_workers)]
    return BudgetPacer(
        comm.num_workers, local, config.straggler_fraction, config.straggler_intervals
    )


def set_schedule_step(scheduler: Any, step: int) -> None:
    """Put a ``LambdaLR`` at ``step``: the next optimizer
    step uses that step's learning rate (as the engine's)."""
    groups = scheduler.optimizer.param_groups
    for group, base, factor in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(step)
    scheduler.last_epoch = step
    scheduler._last_lr = [group["lr"] for group in groups]


class VirtualClock:
    """Seconds each simulated worker spends on a step, from ``worker_speeds`` and ``speed_changes``
    (docs/algorithm.md#virtual-clock).

    A worker at speed ``v`` takes ``1 / v`` virtual seconds per inner step; a change
    ``[step, worker, speed]`` applies from that step of the run on.
    """

    def __init__(self, speeds: Sequence[float], changes: Sequence[Sequence[Any]] = ()) -> None:
        self.base = list(speeds)
        self.changes = sorted((int(s), int(w), float(v)) for s, w, v in changes)

    @classmethod
    def of(cls, config: AutoLoCoConfig, comm: Any) -> VirtualClock | None:
        """The clock of this process's workers (``None``
        without ``worker_speeds``: real seconds are measured).

        ``worker_speeds`` and ``speed_changes`` name all the workers: a process keeps its own.
        """
        if config.worker_speeds is None:
            return None
        if len(config.worker_speeds) != comm.num_workers:
            raise ValueError(
                f"AutoLoCoConfig.worker_speeds has {len(config.worker_speeds)} speeds for "
                f"{comm.num_workers} workers: give one speed per worker"
            )
        local = {comm.global_worker(i): i for i in range(comm.local_workers)}
        changes = [
            (step, local[worker], speed)
            for step, worker, speed in config.speed_changes or ()
            if worker in local
        ]
        return cls([config.worker_speeds[g] for g in local], changes)

    def speeds_at(self, step: int) -> list[float]:
        speeds = list(self.base)
        for at, worker, speed in self.changes:
            if at <= step:
                speeds[worker] = speed
        return speeds

    def seconds(self, step: int, steps: Sequence[int]) -> list[float]:
        """Virtual seconds of ``steps[i]`` inner steps of
        each worker at step ``step`` of the run."""
        return [n / v for n, v in zip(steps, self.speeds_at(step))]
