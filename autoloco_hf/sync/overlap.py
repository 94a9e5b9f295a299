"""Overlapped synchronization: the outer collective runs behind the next inner steps (docs/algorithm.md §11).

:class:`OverlappedEngine` is what :class:`~autoloco_hf.sync.engine.IntervalEngine`
builds when ``config.overlap`` is ``delayed`` or ``eager``. At a boundary each
worker starts the collective with
:meth:`~autoloco_hf.sync.communicators.Communicator.start_average` and trains on
from its local replica; the average is applied when it is due:

* ``delayed`` (Streaming DiLoCo): ``overlap_steps`` inner steps later, then the
  outer result is mixed into the running replica,
  ``x <- alpha x + (1 - alpha) theta_{t+1}``; the length of the interval that
  is running is decided at that moment from the statistics that just arrived.
* ``eager`` (eager updates): at the next boundary. Meanwhile each worker runs
  from an outer step that adds its own fresh pseudo-gradient (its share
  ``1/N`` of the average) to the outer state, which holds every earlier
  average: its fresh contribution takes the place of the one still in flight.
  The controller decides one interval late (the horizon of interval ``t+2``
  from the statistics of interval ``t``).

The outer parameters and momentum move only with complete averages, so they are
identical on every worker. Both the simulation and real process groups apply a
result at the step the engine says it is due, so ``N`` simulated workers and
``N`` processes stay bit-identical. The last boundary of the budget blocks, so
the run ends on one model.

Example (two simulated workers, eager overlap)::

    >>> import torch
    >>> from autoloco_hf import AutoLoCoConfig
    >>> from autoloco_hf.sync.communicators import SimulatedCommunicator
    >>> from autoloco_hf.sync.engine import IntervalEngine
    >>> from autoloco_hf.algorithm.schedule import FunctionSchedule
    >>> models = [torch.nn.Linear(4, 1) for _ in range(2)]
    >>> engine = IntervalEngine(AutoLoCoConfig(method="diloco", h_base=5, overlap="eager"), models,
    ...                         FunctionSchedule(lambda s: 1e-2, 20), SimulatedCommunicator(2), total_steps=20)
    >>> type(engine).__name__
    'OverlappedEngine'
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from autoloco_hf.algorithm.policies import NextInterval
from autoloco_hf.config import Overlap
from autoloco_hf.sync.communicators import AverageResult, PendingAverage, Traffic
from autoloco_hf.sync.control import ControlMessage
from autoloco_hf.sync.engine import Aggregate, IntervalEngine, OuterStep, PolicyAdvance
from autoloco_hf.sync.outer import flatten_fp32
from autoloco_hf.sync.records import IntervalRecord

__all__ = ["OverlappedEngine", "InFlight"]


@dataclass
class InFlight:
    """The collective of a closed interval that has not been applied yet."""

    interval: NextInterval  # the interval whose pseudo-gradient is in flight
    lr_mass: float  # its measured LR mass
    due_step: int  # delayed: the step its result is merged; eager: its boundary (applied at the next one)
    pending: PendingAverage
    interval_seconds: float  # wall time of the interval itself, for its record


class OverlappedEngine(IntervalEngine):
    """:class:`IntervalEngine` whose outer collective overlaps the following inner steps (docs/algorithm.md §11).

    Takes the same arguments; built by ``IntervalEngine(config, ...)`` when
    ``config.overlap`` is not ``none``. Extra memory: the in-flight mean (one
    FP32 model copy); ``eager`` also keeps each local worker's start point (one
    FP32 copy per local worker).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_flight: InFlight | None = None
        self._eager = self.config.overlap == Overlap.EAGER
        device = self.outer.device
        # eager: y_t^i, where worker i started the running interval (its pseudo-gradient is measured from there)
        # (this rank's shard of it with a sharded outer state, docs/algorithm.md §8.3)
        self._starts = [flatten_fp32(p, device, self.outer.shard) for p in self.worker_params] if self._eager else []

    @property
    def in_flight(self) -> InFlight | None:
        """The collective started at the last boundary and not applied yet (``None`` when there is none)."""
        return self._in_flight

    def after_optimizer_step(
        self, tokens: Sequence[int], losses: Sequence[float], lr: float | None = None
    ) -> IntervalRecord | None:
        record = super().after_optimizer_step(tokens, losses, lr)  # a boundary calls _synchronize
        flight = self._in_flight
        if not self._eager and flight is not None and self.step >= flight.due_step:
            record = self._land_delayed()
        return record

    # ------------------------------------------------------------- boundary
    @torch.no_grad()
    def _synchronize(self) -> IntervalRecord | None:
        return self._boundary_eager() if self._eager else self._boundary_delayed()

    def _boundary_delayed(self) -> IntervalRecord | None:
        """Start the collective of ``Delta_t^i = theta_t - x^i``; the interval that follows gets its length when it lands."""
        interval, lr_mass = self._interval, self._lr_mass
        assert interval is not None and self._in_flight is None
        self._check_lr_mass(interval, lr_mass)
        deltas, messages = self._contributions(interval)
        due = min(self.step + self.config.overlap_steps, self.total_steps)
        self._in_flight = InFlight(
            interval,
            lr_mass,
            due,
            self.comm.start_average(deltas, messages, self.shard_segment_sizes),
            time.perf_counter() - self._interval_started,
        )
        self._reset_interval_counters()
        self._interval = None  # decided when the statistics land, before this interval can end
        return self._land_delayed() if self.step >= due else None

    @torch.no_grad()
    def _land_delayed(self) -> IntervalRecord:
        """Outer step on the arrived mean, merge into the running replicas, length of the running interval."""
        flight = self._in_flight
        assert flight is not None
        self._in_flight = None
        started = time.perf_counter()
        aggregate = self._read_aggregate(flight.pending.wait(), flight.lr_mass)
        outer = self._apply_outer(flight.interval, aggregate)
        boundary = flight.interval.start_step + flight.interval.h_step
        final = boundary >= self.total_steps  # the run ends on theta for everybody
        alpha = self.config.overlap_mix
        theta = self.comm.gather_shards(self.outer.params.detach(), sum(self.segment_sizes))  # sharded: the worker's
        for params in self.worker_params:
            if final or alpha == 0.0 or not aggregate.valid:  # an invalid interval restarts from theta as in §5.2
                self.outer.write_back(params, theta)
            else:
                for p, chunk in zip(params, torch.split(theta, self.outer.numels)):
                    p.lerp_(chunk.view_as(p).to(device=p.device, dtype=p.dtype), 1.0 - alpha)
        sync_seconds = time.perf_counter() - started
        advance = self._advance(flight, aggregate, next_start=None, plan_at=boundary)
        record = self._emit(flight, aggregate, outer, advance, sync_seconds)
        running = self._interval
        if running is not None and self.step >= running.start_step + running.h_step:
            return self._boundary_delayed() or record  # the budget's last interval ended before the merge
        return record

    def _boundary_eager(self) -> IntervalRecord | None:
        """Apply the average of interval ``t-1``, start that of ``t``, start ``t+1`` from the eager estimate."""
        interval, lr_mass = self._interval, self._lr_mass
        assert interval is not None
        self._check_lr_mass(interval, lr_mass)
        interval_seconds = time.perf_counter() - self._interval_started
        deltas, messages = self._contributions(interval, starts=self._starts)
        record: IntervalRecord | None = None
        flight, self._in_flight = self._in_flight, None
        if flight is not None:
            started = time.perf_counter()
            aggregate = self._read_aggregate(flight.pending.wait(), flight.lr_mass)
            outer = self._apply_outer(flight.interval, aggregate)
            sync_seconds = time.perf_counter() - started
            advance = self._advance(flight, aggregate, next_start=self.step, plan_at=None)
            record = self._emit(flight, aggregate, outer, advance, sync_seconds)

        if self.step >= self.total_steps:  # the last boundary blocks: the run ends on theta for everybody
            started = time.perf_counter()
            last = InFlight(
                interval,
                lr_mass,
                self.step,
                PendingAverage.completed(self.comm.average(deltas, messages, self.shard_segment_sizes)),
                interval_seconds,
            )
            aggregate = self._read_aggregate(last.pending.wait(), lr_mass)
            outer = self._outer_step(interval, aggregate)
            sync_seconds = time.perf_counter() - started
            advance = self._advance(last, aggregate, next_start=self.step, plan_at=None)
            return self._emit(last, aggregate, outer, advance, sync_seconds)

        pending = self.comm.start_average(deltas, messages, self.shard_segment_sizes)
        self._in_flight = InFlight(interval, lr_mass, self.step, pending, interval_seconds)
        finite = [ControlMessage.unpack(m).nonfinite == 0 for m in messages]
        self._eager_restart(interval, deltas, finite)
        if flight is None:  # nothing was decided at this boundary: the next interval keeps the current horizon
            self._start_interval()
        return record

    def _eager_restart(self, interval: NextInterval, deltas: list[torch.Tensor], finite: list[bool]) -> None:
        """``x^i <- y_{t+1}^i = step(theta_t, m_t, Delta_t^i / N)``, taken on copies of the outer state (§11.2).

        ``theta_t`` holds every average up to interval ``t - 1``; the worker adds
        its own fresh contribution now and the others' when their average lands.
        """
        n = self.num_workers
        correction = self._correction(interval)
        for i, (params, delta) in enumerate(zip(self.worker_params, deltas)):
            estimate = delta / n
            if self.config.uses_nesterov_outer:
                start = self.outer.lookahead(
                    estimate, correction.outer_lr, correction.momentum, correction.grad_divisor
                )
            else:
                start = self.outer.params.detach() - estimate
            self.outer.write_back(params, self.comm.gather_shards(start, sum(self.segment_sizes)))
            self._starts[i] = start
        if not all(finite):  # a worker that produced NaN restarts from a finite point with a finite optimizer
            self._sanitize_optimizers()

    # -------------------------------------------------------------- helpers
    def _advance(
        self, flight: InFlight, aggregate: Aggregate, next_start: int | None, plan_at: int | None
    ) -> PolicyAdvance:
        """Feed the landed interval to the policy and plan the next one.

        Delayed: the interval that started at the landed interval's boundary
        (``plan_at``) is planned now, its counters keep running. Eager: the
        decision sets the interval starting now (``next_start``), one interval
        after the one that just ended.
        """
        assert self.policy is not None
        started = time.perf_counter()
        decision = self.policy.complete(self._outcome(flight.interval, flight.lr_mass, aggregate), next_start)
        if plan_at is not None:
            self._interval = self.policy.next_interval(plan_at) if plan_at < self.total_steps else None
        else:
            self._start_interval()
        return PolicyAdvance(decision, self._interval, flight.interval_seconds, time.perf_counter() - started)

    def _emit(
        self, flight: InFlight, aggregate: Aggregate, outer: OuterStep, advance: PolicyAdvance, sync_seconds: float
    ) -> IntervalRecord:
        record = self._record(flight.interval, flight.lr_mass, aggregate, outer, advance, sync_seconds)
        self._account(record, aggregate.traffic, sync_seconds, advance.controller_seconds)
        return record

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The base state plus the in-flight collective, waited for and stored as its result (docs/algorithm.md §11.4)."""
        state = super().state_dict()
        flight = self._in_flight
        saved_flight = None
        if flight is not None:
            result = flight.pending.wait()
            saved_flight = {
                "interval": asdict(flight.interval),
                "lr_mass": flight.lr_mass,
                "due_step": flight.due_step,
                "interval_seconds": flight.interval_seconds,
                "mean": result.mean.detach().clone(),
                "scalar_sums": result.scalar_sums.clone(),
                "scalar_rows": result.scalar_rows.clone(),
                "traffic": asdict(result.traffic),
            }
        state["overlap"] = {
            "mode": str(self.config.overlap),
            "in_flight": saved_flight,
            "starts": [s.clone() for s in self._starts],
        }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("overlap")
        if saved is None or saved["mode"] != str(self.config.overlap):
            raise ValueError(
                f"checkpoint was written with overlap={saved['mode'] if saved else 'none'!r} but this run has "
                f"overlap={str(self.config.overlap)!r}: resume with the same AutoLoCoConfig"
            )
        super().load_state_dict(state)
        flight = saved["in_flight"]
        self._in_flight = None
        if flight is not None:
            result = AverageResult(
                flight["mean"].to(self.outer.device),
                flight["scalar_sums"],
                Traffic(**flight["traffic"]),
                flight["scalar_rows"],
            )
            self._in_flight = InFlight(
                NextInterval(**flight["interval"]),
                float(flight["lr_mass"]),
                int(flight["due_step"]),
                PendingAverage.completed(result),
                float(flight["interval_seconds"]),
            )
        self._starts = [s.to(self.outer.device) for s in saved["starts"]]
