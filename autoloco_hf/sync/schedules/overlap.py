"""Overlapped schedules: the outer collective runs behind the
next inner steps (docs/algorithm.md#overlap).

At a boundary each worker starts the collective with
:meth:`~autoloco_hf.sync.communicators.Communicator.start_average` and trains on;
the average is applied when it is due:

* :class:`DelayedSchedule` (Streaming DiLoCo): ``overlap_steps`` inner steps later,
  mixed into the running replica, ``x <- alpha x + (1 - alpha) theta_{t+1}``; the
  running interval's length is decided at that moment, and an interval the policy
  would end before that step is stretched past it (recorded as ``stretched``).
* :class:`EagerSchedule` (eager updates): at the next boundary. Meanwhile each
  worker runs from an outer step that adds its own fresh pseudo-gradient (its
  share ``1/N``) to the outer state; the controller decides one interval late.

``theta`` and the momentum move only with complete averages, so they stay
identical on every worker, and a result is applied at the step the schedule says
it is due, so ``N`` simulated workers and ``N`` processes stay bit-identical. The
last boundary of the budget blocks, so the run ends on one model.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from autoloco_hf.config import Overlap
from autoloco_hf.sync.communicators.base import PendingAverage
from autoloco_hf.sync.control import ControlMessage
from autoloco_hf.sync.engine.interval_state import Aggregate, ClosedInterval, InFlight, OuterStep
from autoloco_hf.sync.outer import flatten_fp32
from autoloco_hf.wire.formats.base import true_divide

if TYPE_CHECKING:  # the engine calls the schedule; the schedule only reads it
    from autoloco_hf.state.records import IntervalRecord
    from autoloco_hf.sync.engine.engine import IntervalEngine

__all__ = ["DelayedSchedule", "EagerSchedule"]


class DelayedSchedule:
    """The average of interval ``t`` is merged ``overlap_steps`` steps into interval ``t + 1``.

    Extra memory: the in-flight mean (one FP32 model copy).
    """

    mode = Overlap.DELAYED

    def __init__(self) -> None:
        self.in_flight: InFlight | None = None

    def attach(self, engine: IntervalEngine) -> None:
        pass

    @torch.no_grad()
    def after_step(self, engine: IntervalEngine) -> IntervalRecord | None:
        record = self._start(engine) if engine.interval_ended() else None
        if self.in_flight is not None and engine.step >= self.in_flight.due_step:
            record = self._land(engine)
        return record

    def _start(self, engine: IntervalEngine) -> IntervalRecord | None:
        """Start the average of ``Delta_t^i = theta_t - x^i``;
        the next interval's length waits for it."""
        assert self.in_flight is None
        closed = engine.close_interval()
        deltas, messages = engine.contributions(closed.interval)
        due = min(engine.step + engine.config.overlap_steps, engine.total_steps)
        self.in_flight = InFlight(
            closed, due, engine.comm.start_average(deltas, messages, engine.shard_segment_sizes)
        )
        engine.pause_interval()
        return self._land(engine) if engine.step >= due else None

    def _land(self, engine: IntervalEngine) -> IntervalRecord:
        """Outer step on the arrived mean, merged into the running
        replicas; the running interval gets its length."""
        flight, self.in_flight = self.in_flight, None
        assert flight is not None
        closed = flight.closed
        started = time.perf_counter()
        aggregate = engine.aggregate(flight.pending.wait(), closed.lr_mass)
        outer = engine.outer_step(closed.interval, aggregate)
        boundary = closed.interval.start_step + closed.interval.h_step
        alpha = engine.config.overlap_mix
        theta = engine.theta()
        # the run ends on theta for everybody; an invalid interval restarts from theta as in
        # docs/algorithm.md#interval-assessment
        if boundary >= engine.total_steps or alpha == 0.0 or not aggregate.valid:
            engine.write_back(theta)
        else:
            for params in engine.worker_params:
                for p, chunk in zip(params, torch.split(theta, engine.outer.numels)):
                    p.lerp_(chunk.view_as(p).to(device=p.device, dtype=p.dtype), 1.0 - alpha)
        sync_seconds = time.perf_counter() - started
        decision, controller_seconds = engine.decide(closed, aggregate)
        # it must outlast the merge
        engine.plan_interval(boundary, min_steps=engine.step - boundary + 1)
        record = engine.record(
            closed, aggregate, outer, decision, closed.seconds, sync_seconds, controller_seconds
        )
        if engine.interval_ended():  # the budget's last interval ended before the merge
            return self._start(engine) or record
        return record

    def state_dict(self) -> dict[str, Any]:
        return {
            "mode": str(self.mode),
            "in_flight": self.in_flight.state_dict() if self.in_flight else None,
        }

    def load_state_dict(self, state: dict[str, Any] | None, engine: IntervalEngine) -> None:
        flight = state["in_flight"] if state else None
        self.in_flight = (
            InFlight.from_state(flight, PendingAverage.from_state(flight, engine.outer.device))
            if flight
            else None
        )


class EagerSchedule:
    """The average of interval ``t`` is applied at the end of
    ``t + 1``; meanwhile each worker starts from its own estimate.

    Extra memory: the in-flight mean and each local worker's start point (one FP32 copy each).
    """

    mode = Overlap.EAGER

    def __init__(self) -> None:
        self.in_flight: InFlight | None = None
        self.starts: list[torch.Tensor] = []

    def attach(self, engine: IntervalEngine) -> None:
        # y_t^i, where worker i started the running interval (this rank's shard of it,
        # docs/algorithm.md#worker-groups)
        self.starts = [
            flatten_fp32(p, engine.outer.device, engine.outer.shard) for p in engine.worker_params
        ]

    @torch.no_grad()
    def after_step(self, engine: IntervalEngine) -> IntervalRecord | None:
        """Apply the average of interval ``t-1``, start that
        of ``t``, start ``t+1`` from the eager estimate."""
        if not engine.interval_ended():
            return None
        closed = engine.close_interval()
        deltas, messages = engine.contributions(closed.interval, starts=self.starts)
        record: IntervalRecord | None = None
        flight, self.in_flight = self.in_flight, None
        if flight is not None:
            started = time.perf_counter()
            aggregate = engine.aggregate(flight.pending.wait(), flight.closed.lr_mass)
            outer = engine.outer_step(flight.closed.interval, aggregate)
            record = self._finish(
                engine, flight.closed, aggregate, outer, time.perf_counter() - started
            )

        # the last boundary blocks: the run ends on theta for everybody
        if engine.step >= engine.total_steps:
            started = time.perf_counter()
            result = engine.comm.average(deltas, messages, engine.shard_segment_sizes)
            aggregate = engine.aggregate(result, closed.lr_mass)
            outer = engine.outer_step(closed.interval, aggregate)
            engine.write_back()
            return self._finish(engine, closed, aggregate, outer, time.perf_counter() - started)

        pending = engine.comm.start_average(deltas, messages, engine.shard_segment_sizes)
        self.in_flight = InFlight(closed, engine.step, pending)
        self._restart(
            engine, closed, deltas, [ControlMessage.unpack(m).nonfinite == 0 for m in messages]
        )
        # nothing was decided at this boundary: the next interval keeps the current horizon
        if flight is None:
            engine.start_interval()
        return record

    @staticmethod
    def _finish(
        engine: IntervalEngine,
        closed: ClosedInterval,
        aggregate: Aggregate,
        outer: OuterStep,
        sync_seconds: float,
    ) -> IntervalRecord:
        """The decision (one interval late: it sets the interval starting now) and the record."""
        decision, controller_seconds = engine.decide(closed, aggregate, next_start=engine.step)
        engine.start_interval()
        return engine.record(
            closed, aggregate, outer, decision, closed.seconds, sync_seconds, controller_seconds
        )

    def _restart(
        self,
        engine: IntervalEngine,
        closed: ClosedInterval,
        deltas: list[torch.Tensor],
        finite: list[bool],
    ) -> None:
        """``x^i <- y_{t+1}^i = step(theta_t, m_t, Delta_t^i / N)`` on copies of the outer state
        (docs/algorithm.md#eager-update).

        ``theta_t`` holds every average up to interval ``t - 1``; the worker adds
        its own fresh contribution now and the others' when their average lands.
        """
        n = engine.num_workers
        correction = engine.correction(closed.interval)
        outer = engine.outer
        for i, (params, delta) in enumerate(zip(engine.worker_params, deltas)):
            estimate = true_divide(delta, n)
            if engine.config.uses_nesterov_outer:
                start = outer.lookahead(
                    estimate, correction.outer_lr, correction.momentum, correction.grad_divisor
                )
            else:
                start = outer.params.detach() - estimate
            outer.write_back(params, engine.comm.gather_shards(start, sum(engine.segment_sizes)))
            self.starts[i] = start
        # a worker that produced NaN restarts from a finite point with a finite optimizer
        if not all(finite):
            engine.sanitize_optimizers()

    def state_dict(self) -> dict[str, Any]:
        return {
            "mode": str(self.mode),
            "in_flight": self.in_flight.state_dict() if self.in_flight else None,
            "starts": [s.clone() for s in self.starts],
        }

    def load_state_dict(self, state: dict[str, Any] | None, engine: IntervalEngine) -> None:
        flight = state["in_flight"] if state else None
        self.in_flight = (
            InFlight.from_state(flight, PendingAverage.from_state(flight, engine.outer.device))
            if flight
            else None
        )
        if state:
            self.starts = [s.to(engine.outer.device) for s in state["starts"]]
