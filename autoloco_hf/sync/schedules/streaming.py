"""The streaming schedule: fragment ``f`` of every interval synchronized at its own step
(docs/algorithm.md#fragments).

With ``fragments = F`` the flat model is split into ``F`` pieces
(:func:`~autoloco_hf.sync.engine.fragments.split_fragments`). Inside an interval of
``H`` steps starting at ``s``, fragment ``f`` is synchronized at step
``s + ceil((f + 1) H / F)`` (in the budget's last interval: every fragment at its
end), so the last one closes the interval at its boundary. At its step a
fragment runs the engine's stages on its range of the flat model: pseudo-
gradients, the collective, the outer step of its own slice of ``theta`` and the
momentum, with the interval's correction; the result is written into the
replicas at once (``overlap = "none"``) or merged ``overlap_steps`` steps later
(``"delayed"``, ``x <- alpha x + (1 - alpha) theta``). The interval's ``D_t`` and
``C_t`` are the sums of its fragments' parts, and the policy decides the next
interval once the last fragment has landed, as with one piece. One fragment is in
flight at a time: the config keeps every interval at least
``F (overlap_steps + 1)`` steps long, and shorter mapped ones are stretched.
With worker groups (hierarchical sync) each rank syncs where the fragment meets
its shard (``IntervalEngine.fragment_pieces``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from autoloco_hf.algorithm.policies import NextInterval
from autoloco_hf.config import Overlap
from autoloco_hf.sync.communicators.base import PendingAverage
from autoloco_hf.sync.engine.aggregation import Collected
from autoloco_hf.sync.engine.fragments import Fragment, fragment_event_offset
from autoloco_hf.sync.engine.interval_state import ClosedInterval, OuterStep

if TYPE_CHECKING:  # the engine calls the schedule; the schedule only reads it
    from autoloco_hf.state.records import IntervalRecord
    from autoloco_hf.sync.engine.engine import IntervalEngine

__all__ = ["FragmentFlight", "FragmentSchedule"]


@dataclass
class FragmentFlight:
    """One fragment's average, started at ``step`` and used at ``due_step``."""

    fragment: int
    step: int
    due_step: int
    pending: PendingAverage
    started: float = field(default_factory=time.perf_counter)  # wall clock, not saved

    def state_dict(self) -> dict[str, Any]:
        return {
            "fragment": self.fragment,
            "step": self.step,
            "due_step": self.due_step,
            **self.pending.state_dict(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> FragmentFlight:
        pending = PendingAverage.from_state(state, device)
        return cls(int(state["fragment"]), int(state["step"]), int(state["due_step"]), pending)


class FragmentSchedule:
    """``F`` staggered fragment syncs per interval, blocking or with a delayed merge.

    Extra memory with ``delayed``: one fragment's mean in flight.
    """

    def __init__(self, mode: Overlap) -> None:
        if mode == Overlap.EAGER:
            raise ValueError(
                "overlap='eager' has no fragment schedule: use overlap='none' or 'delayed'"
            )
        self.mode = Overlap(mode)
        self.in_flight: FragmentFlight | None = None
        self.next_fragment = 0  # of the running interval
        # closed by its last fragment, which has not landed yet
        self.closed: ClosedInterval | None = None
        self.parts: list[Collected] = []  # the landed fragments of the interval being synchronized
        self.applied: list[bool] = []
        self.sync_seconds = 0.0
        self.fragments: tuple[Fragment, ...] = ()
        self.delay = 0

    def attach(self, engine: IntervalEngine) -> None:
        self.fragments = engine.fragments
        self.delay = engine.config.fragment_delay

    @property
    def min_steps(self) -> int:
        """Every fragment's sync and merge fit in an interval this long: ``F (tau + 1)`` steps."""
        return len(self.fragments) * (self.delay + 1)

    @torch.no_grad()
    def after_step(self, engine: IntervalEngine) -> IntervalRecord | None:
        record = None
        if self.in_flight is not None and engine.step >= self.in_flight.due_step:
            record = self._land(engine)
        while (fragment := self._due(engine)) is not None:
            record = self._start(engine, fragment) or record
        return record

    def _due(self, engine: IntervalEngine) -> Fragment | None:
        """The running interval's next fragment, if its step has come."""
        interval = engine.current_interval
        if interval is None or self.in_flight is not None:
            return None
        last_round = interval.start_step + interval.h_step >= engine.total_steps
        offset = fragment_event_offset(
            self.next_fragment, len(self.fragments), interval.h_step, last_round
        )
        return (
            self.fragments[self.next_fragment]
            if engine.step >= interval.start_step + offset
            else None
        )

    def _start(self, engine: IntervalEngine, fragment: Fragment) -> IntervalRecord | None:
        """The fragment's pseudo-gradients and control messages
        into the collective; the last one closes the interval."""
        last = fragment.index == len(self.fragments) - 1
        interval = engine.current_interval
        assert interval is not None
        if last:
            self.closed = engine.close_interval()
        started = time.perf_counter()
        deltas, messages = engine.contributions(interval, fragment=fragment, counted=last)
        segments = engine.fragment_segment_sizes[fragment.index]
        if self.mode == Overlap.NONE:
            result = engine.comm.average(deltas, messages, segments, check=engine.check_agreement)
            pending, due = PendingAverage.completed(result), engine.step
        else:
            pending = engine.comm.start_average(deltas, messages, segments)
            due = min(engine.step + self.delay, engine.total_steps)
        self.in_flight = FragmentFlight(fragment.index, engine.step, due, pending, started)
        # the training loop waits for this part too
        self.sync_seconds += time.perf_counter() - started
        self.next_fragment = 0 if last else fragment.index + 1
        if last:  # the next interval's length is decided when this fragment lands
            engine.pause_interval()
        return self._land(engine) if engine.step >= due else None

    def _land(self, engine: IntervalEngine) -> IntervalRecord | None:
        """Outer step of the fragment's slice, written or merged
        into the replicas; the interval's record after its last."""
        flight, self.in_flight = self.in_flight, None
        assert flight is not None
        fragment = self.fragments[flight.fragment]
        last = fragment.index == len(self.fragments) - 1
        started = time.perf_counter()
        result = flight.pending.wait()
        part = engine.collect(result)
        interval, lr_mass = self._interval_of(engine, last)
        outer = engine.outer_step(interval, engine.combine([part], lr_mass, result.mean), fragment)
        self._merge(engine, fragment, flight.step, outer)
        self.parts.append(part)
        self.applied.append(outer.applied)
        self.sync_seconds += time.perf_counter() - started
        if not last:
            return None
        return self._finish(engine, outer, flight)

    def _interval_of(self, engine: IntervalEngine, last: bool) -> tuple[NextInterval, float]:
        if last:
            assert self.closed is not None
            return self.closed.interval, self.closed.lr_mass
        assert engine.current_interval is not None
        return engine.current_interval, engine.counters.lr_mass

    def _merge(
        self, engine: IntervalEngine, fragment: Fragment, step: int, outer: OuterStep
    ) -> None:
        """The fragment's ``theta`` into every replica: copied
        (blocking, last interval, ``alpha = 0``) or mixed.

        After an invalid average every replica restarts from all of ``theta``: the
        non-finite values have reached the other fragments through the inner steps.
        """
        alpha = engine.config.overlap_mix
        theta = engine.theta()
        if not outer.applied:
            engine.write_back(theta)
            return
        if self.mode == Overlap.NONE or step >= engine.total_steps or alpha == 0.0:
            engine.write_back(theta, fragment)
            return
        start, end = fragment.span
        sizes = engine.outer.numels[fragment.first : fragment.last]
        for params in engine.worker_params:
            for p, chunk in zip(
                params[fragment.first : fragment.last], torch.split(theta[start:end], sizes)
            ):
                p.lerp_(chunk.view_as(p).to(device=p.device, dtype=p.dtype), 1.0 - alpha)

    def _finish(
        self, engine: IntervalEngine, outer: OuterStep, flight: FragmentFlight
    ) -> IntervalRecord:
        """The interval's statistics from its fragments' sums,
        the decision, the next interval and the record."""
        closed, self.closed = self.closed, None
        assert closed is not None
        aggregate = engine.combine(self.parts, closed.lr_mass, None)
        applied = all(self.applied)
        sync_seconds, self.parts, self.applied, self.sync_seconds = self.sync_seconds, [], [], 0.0
        decision, controller_seconds = engine.decide(closed, aggregate)
        boundary = closed.interval.start_step + closed.interval.h_step
        # an interval the budget cuts short syncs every fragment
        # at its end: it needs no room for their offsets
        min_steps = min(self.min_steps, engine.total_steps - boundary + 1)
        if self.mode == Overlap.NONE:
            engine.start_interval(min_steps)
            seconds = closed.seconds + time.perf_counter() - flight.started
        else:  # the running interval, started at the boundary, gets its length now
            engine.plan_interval(boundary, min_steps)
            seconds = closed.seconds
        return engine.record(
            closed,
            aggregate,
            outer,
            decision,
            seconds,
            sync_seconds,
            controller_seconds,
            applied=applied,
        )

    def state_dict(self) -> dict[str, Any]:
        closed = self.closed
        return {
            "mode": str(self.mode),
            "fragments": len(self.fragments),
            "next_fragment": self.next_fragment,
            "in_flight": self.in_flight.state_dict() if self.in_flight else None,
            "closed": (
                {
                    "interval": asdict(closed.interval),
                    "lr_mass": closed.lr_mass,
                    "seconds": closed.seconds,
                }
                if closed
                else None
            ),
            "parts": [p.state_dict() for p in self.parts],
            "applied": list(self.applied),
            "sync_seconds": self.sync_seconds,
        }

    def load_state_dict(self, state: dict[str, Any] | None, engine: IntervalEngine) -> None:
        if state is None or state.get("fragments") != len(self.fragments):
            raise ValueError(
                f"the engine state holds no schedule of {len(self.fragments)} fragments: resume "
                "with the AutoLoCoConfig.fragments it was written with"
            )
        flight, closed = state["in_flight"], state["closed"]
        self.in_flight = FragmentFlight.from_state(flight, engine.outer.device) if flight else None
        self.next_fragment = int(state["next_fragment"])
        self.closed = (
            ClosedInterval(
                NextInterval(**closed["interval"]),
                float(closed["lr_mass"]),
                float(closed["seconds"]),
            )
            if closed
            else None
        )
        self.parts = [Collected.from_state(p) for p in state["parts"]]
        self.applied = [bool(a) for a in state["applied"]]
        self.sync_seconds = float(state["sync_seconds"])
