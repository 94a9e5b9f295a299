"""The interval engine: the stages of one synchronization, and the blocking schedule that runs them.

:class:`IntervalEngine` holds what every schedule shares (the local workers,
``theta_t`` and momentum, the policy, the interval being run, records and
totals) and offers the stages of a boundary (docs/algorithm.md#interval-statistics) as public
methods:

1. :meth:`~IntervalEngine.close_interval` and :meth:`~IntervalEngine.contributions`:
   each worker's pseudo-gradient and :class:`~autoloco_hf.sync.control.ControlMessage`;
   the communicator runs the control round (agreement) and the average;
2. :meth:`~IntervalEngine.aggregate`: ``D_t``, ``C_t`` and validity of the average;
3. :meth:`~IntervalEngine.outer_step` (and :meth:`~IntervalEngine.write_back`);
4. :meth:`~IntervalEngine.decide`: the policy learns from the interval;
5. :meth:`~IntervalEngine.record`: the record, the totals, the boundary listeners.

The engine delegates to small collaborators it owns: the layout of this rank's
part of the model (:mod:`~autoloco_hf.sync.engine.layout`), the aggregation
(:mod:`~autoloco_hf.sync.engine.aggregation`), the rule's measurements
(:mod:`~autoloco_hf.sync.engine.measurements`); the interval's state types live in
:mod:`~autoloco_hf.sync.engine.interval_state`. *When* the stages run is a
:class:`SyncSchedule` strategy: :class:`BlockingSchedule` here, the delayed and
eager ones in :mod:`autoloco_hf.sync.schedules.overlap`, streaming fragments in
:mod:`autoloco_hf.sync.schedules.streaming`. Build an engine with
:func:`autoloco_hf.sync.schedules.factory.make_engine`, which also picks the DDP baseline;
both engines implement :class:`autoloco_hf.sync.engine.contract.Engine`.

Example (two simulated workers on a toy regression)::

    >>> import torch
    >>> from autoloco_hf import AutoLoCoConfig
    >>> from autoloco_hf.sync.communicators import SimulatedCommunicator
    >>> from autoloco_hf.sync.schedules.factory import make_engine
    >>> from autoloco_hf.algorithm.schedule import FunctionSchedule
    >>> torch.manual_seed(0) and None
    >>> models = [torch.nn.Linear(4, 1) for _ in range(2)]
    >>> models[1].load_state_dict(models[0].state_dict())
    <All keys matched successfully>
    >>> opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    >>> config = AutoLoCoConfig(method="diloco", h_base=5)
    >>> schedule = FunctionSchedule(lambda s: 1e-2, 20)
    >>> engine = make_engine(config, models, schedule, SimulatedCommunicator(2), total_steps=20)
    >>> for step in range(20):
    ...     for i, (m, o) in enumerate(zip(models, opts)):
    ...         x = torch.randn(8, 4); loss = (m(x) - x.sum(1, keepdim=True)).pow(2).mean()
    ...         loss.backward(); o.step(); o.zero_grad()
    ...     _ = engine.after_optimizer_step(tokens=[8, 8], losses=[loss.item()] * 2)
    >>> engine.totals.syncs, torch.equal(models[0].weight, models[1].weight)
    (4, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

from autoloco_hf.algorithm.correction import OuterCorrection, correction_for
from autoloco_hf.algorithm.policies import NextInterval, PolicyFactory, make_policy
from autoloco_hf.config import AutoLoCoConfig, Overlap, Pacing
from autoloco_hf.state.checkpoint import check_config
from autoloco_hf.state.records import IntervalRecord, JsonlWriter, RunTotals
from autoloco_hf.sync.control import WorkerDisagreement
from autoloco_hf.sync.engine.aggregation import Aggregation, Collected
from autoloco_hf.sync.engine.contract import SyncSchedule, check_workers
from autoloco_hf.sync.engine.interval_state import (
    Aggregate,
    ClosedInterval,
    InFlight,
    IntervalCounters,
    OuterStep,
    warn_if_not_previewed,
)
from autoloco_hf.sync.engine.invalid_intervals import (
    TooManyInvalidIntervals,
    report_invalid,
    reset_nonfinite_state,
)
from autoloco_hf.sync.engine.layout import SyncLayout, build_outer_state
from autoloco_hf.sync.engine.measurements import DisplacementMeasurements
from autoloco_hf.sync.outer import OuterOptimizer, broadcast_initial_parameters
from autoloco_hf.sync.pacing import make_pacer

if TYPE_CHECKING:
    from autoloco_hf.algorithm.rules.decisions import RuleDecision
    from autoloco_hf.algorithm.schedule import LRSchedule
    from autoloco_hf.sync.communicators.base import AverageResult, Communicator
    from autoloco_hf.sync.engine.fragments import Fragment

__all__ = [
    "Aggregate",
    "BlockingSchedule",
    "BoundaryListener",
    "ClosedInterval",
    "Collected",
    "InFlight",
    "IntervalCounters",
    "IntervalEngine",
    "OuterStep",
    "OuterStepHook",
    "SyncSchedule",
    "TooManyInvalidIntervals",
    "WorkerDisagreement",
    "check_workers",
]

BoundaryListener = Callable[[IntervalRecord], None]
"""Called with every interval's record once the boundary is complete.

The JSONL writer, loggers and state persistence listen here.
"""

OuterStepHook = Callable[[NextInterval, torch.Tensor, OuterOptimizer], None]
"""Called with the interval, its mean pseudo-gradient and the outer optimizer before an outer step.

Streaming fragments: each fragment's, with its part of the mean. It may change
the outer state, as the ablations of ``benchmarks/campaigns/switch_cost.py`` do to the
momentum.
"""


class BlockingSchedule:
    """Every stage at the boundary, in a row: the workers wait for ``theta_{t+1}``
    (docs/algorithm.md#interval-statistics)."""

    mode = Overlap.NONE
    in_flight = None

    def attach(self, engine: IntervalEngine) -> None:
        pass

    @torch.no_grad()
    def after_step(self, engine: IntervalEngine) -> IntervalRecord | None:
        if not engine.interval_ended():
            return None
        closed = engine.close_interval()
        started = time.perf_counter()
        deltas, messages = engine.contributions(closed.interval)
        # agreement is checked as soon as the control messages
        # arrive, before the payload (docs/algorithm.md#phases)
        sizes, check = engine.shard_segment_sizes, engine.check_agreement
        result = engine.comm.average(deltas, messages, sizes, check=check)
        aggregate = engine.aggregate(result, closed.lr_mass)
        outer = engine.outer_step(closed.interval, aggregate)
        engine.write_back()
        sync_seconds = time.perf_counter() - started
        decision, controller_seconds = engine.decide(closed, aggregate)
        engine.start_interval()
        seconds = closed.seconds + time.perf_counter() - started
        times = (seconds, sync_seconds, controller_seconds)
        return engine.record(closed, aggregate, outer, decision, *times)

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: dict[str, Any] | None, engine: IntervalEngine) -> None:
        pass


def check_interval_config(config: AutoLoCoConfig, sync: SyncSchedule) -> None:
    """An interval engine runs an interval method under the schedule of its ``overlap``."""
    if not config.is_interval_method:
        raise ValueError(
            f"method={config.method!r} has no intervals: "
            "build its engine with make_engine(config, ...)"
        )  # fmt: skip
    if sync.mode != config.overlap:
        raise ValueError(
            f"config.overlap={str(config.overlap)!r} but the schedule is "
            f"{str(sync.mode)!r}: use make_engine"
        )  # fmt: skip


class IntervalEngine:
    """Runs AutoLoCo / DiLoCo / QSR / Linear intervals for the local workers of this process.

    Args:
        config: the run's :class:`AutoLoCoConfig` (an interval method).
        models: the local workers' models (1 per process, or ``N`` simulated
            replicas); worker 0's parameters become every worker's ``theta_0``.
        schedule: the inner LR schedule, for LR-mass previews.
        communicator: averages across all workers.
        total_steps: the training budget in optimizer steps.
        sync: the :class:`SyncSchedule` matching ``config.overlap``.
        warmup_steps: inner-LR warm-up; defaults to ``config.warmup_steps`` or 0.
        optimizers: the inner optimizers; non-finite state is reset after an invalid interval.
        records_path: JSONL file for per-interval records (write it on one rank).
        on_record: called with every :class:`IntervalRecord`.
        policy_factory: builds the interval policy (default
            :func:`~autoloco_hf.algorithm.policies.make_policy`, the one of ``config.method``).

    ``listeners`` (:data:`BoundaryListener`) and ``before_outer_step``
    (:data:`OuterStepHook`) take more callbacks.
    """

    averages_gradients = False

    def __init__(
        self,
        config: AutoLoCoConfig,
        models: Sequence[torch.nn.Module],
        schedule: LRSchedule,
        communicator: Communicator,
        total_steps: int,
        *,
        sync: SyncSchedule,
        warmup_steps: int | None = None,
        optimizers: Sequence[torch.optim.Optimizer] = (),
        records_path: str | None = None,
        on_record: BoundaryListener | None = None,
        policy_factory: PolicyFactory = make_policy,
    ) -> None:
        check_workers(config, models, communicator, total_steps)
        check_interval_config(config, sync)
        self.config = config
        self.sync = sync
        self.worker_params = [list(m.parameters()) for m in models]
        self.segment_sizes = [p.numel() for p in self.worker_params[0]]
        self.schedule = schedule
        self.comm = communicator
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps if warmup_steps is not None else (config.warmup_steps or 0)
        self.optimizers = list(optimizers)
        self.totals = RunTotals()
        self.records: list[IntervalRecord] = []
        self.writer = JsonlWriter(records_path) if records_path else None
        listeners = (self.writer and self.writer.write, on_record)
        self.listeners: list[BoundaryListener] = [f for f in listeners if f]
        self.before_outer_step: list[OuterStepHook] = []
        broadcast_initial_parameters(communicator, self.worker_params)
        # this rank's part of the flat model, and its names kept for the schedules and callers
        layout = self.layout = SyncLayout.of(config, communicator, self.segment_sizes)
        self.shard, self.shard_segment_sizes = layout.shard, layout.shard_segment_sizes
        self.fragments, self.fragment_pieces = layout.fragments, layout.fragment_pieces
        self.fragment_segment_sizes = layout.fragment_segment_sizes
        self.fragment_payload_bytes = layout.fragment_payload_bytes
        self.payload_bytes = layout.payload_bytes  # of one interval, per worker
        self.outer, self.error_feedback = build_outer_state(config, layout, self.worker_params)
        self.policy = policy_factory(config, schedule, total_steps, self.warmup_steps)
        self.pacer = make_pacer(config, communicator)
        self.aggregation = Aggregation(
            config, communicator, self.pacer, layout, self.outer, self.worker_params,
            self.error_feedback,
        )  # fmt: skip
        self.measurements = DisplacementMeasurements(
            self.policy, communicator, self.outer, self.worker_params
        )  # fmt: skip
        self.step = 0
        self._lr_mass_warned = False
        self.start_interval()
        sync.attach(self)

    @property
    def num_workers(self) -> int:
        return self.comm.num_workers

    @property
    def current_interval(self) -> NextInterval | None:
        """The interval being executed (``None`` after the budget, or while a merge decides it)."""
        return self._interval

    @property
    def in_flight(self) -> InFlight | None:
        return self.sync.in_flight

    def after_optimizer_step(
        self,
        tokens: Sequence[int],
        losses: Sequence[float],
        lr: float | None = None,
        steps: Sequence[int] | None = None,
        seconds: Sequence[float] | None = None,
    ) -> IntervalRecord | None:
        """See :meth:`autoloco_hf.sync.engine.contract.Engine.after_optimizer_step`;
        the schedule syncs."""
        if self.step >= self.total_steps:
            budget = self.total_steps
            raise RuntimeError(f"step {self.step} is past the training budget of {budget} steps")
        counters = self.counters
        lr = lr if lr is not None else self.schedule.lr_at(self.step)
        counters.count_step(tokens, losses, lr, steps, seconds)
        self.step += 1
        self.totals.steps = self.step
        # what the policy's rule asked for at this step (docs/algorithm.md#rule-plugins)
        if self._interval is not None:
            elapsed = self.step - self._interval.start_step
            self._interval = self.measurements.serve(self._interval, counters, elapsed)
        return self.sync.after_step(self)

    # ------------------------------------------------------ the interval in flight
    def steps_due(self) -> list[int]:
        """Inner steps each local worker takes at the next step of the run
        (docs/algorithm.md#pacing-mechanism).

        The position in the interval is the counters' step count: it also runs while an
        overlapped average is in flight and the interval's length is not decided yet
        (docs/algorithm.md#pacing-with-overlap).
        """
        return self.pacer.steps_due(self.counters.loss_count)

    def interval_ended(self) -> bool:
        interval = self._interval
        return interval is not None and self.step >= interval.start_step + interval.h_step

    def start_interval(self, min_steps: int = 1) -> None:
        """Fresh counters, and the policy's next interval from this step (at least
        ``min_steps``)."""
        self.counters = IntervalCounters.zero(self.comm.local_workers)
        self.plan_interval(self.step, min_steps)

    def plan_interval(self, start_step: int, min_steps: int = 1) -> None:
        """Set the running interval's length now (a delayed merge decides it once it started)."""
        planned = start_step < self.total_steps
        self._interval = self.policy.next_interval(start_step, min_steps) if planned else None

    def pause_interval(self) -> None:
        """Fresh counters for an interval whose length is not decided yet."""
        self.counters = IntervalCounters.zero(self.comm.local_workers)
        self._interval = None

    def close_interval(self) -> ClosedInterval:
        interval, counters = self._interval, self.counters
        assert interval is not None
        # the previews are wrong: say it once (docs/algorithm.md#interval-statistics)
        if not self._lr_mass_warned:
            self._lr_mass_warned = warn_if_not_previewed(interval, counters.lr_mass)
        seconds = time.perf_counter() - counters.started
        return ClosedInterval(interval, counters.lr_mass, seconds)

    # -------------------------------------------------------------- the stages
    def contributions(
        self,
        interval: NextInterval,
        starts: Sequence[torch.Tensor] | None = None,
        fragment: Fragment | None = None,
        counted: bool = True,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each local worker's pseudo-gradient and packed control message.

        The pseudo-gradient is taken from ``theta_t``, or from the worker's own start point
        ``starts[i]``. ``fragment``: that fragment's part only; ``counted=False``: its message
        carries no tokens or losses (the interval's last fragment carries them,
        docs/algorithm.md#fragments-and-the-rule).
        """
        return self.aggregation.contributions(
            interval, self.counters, self.step, len(self.records), starts, fragment, counted
        )

    def check_agreement(self, sums: torch.Tensor, rows: torch.Tensor) -> None:
        """Every worker closed the same interval at the same step with the same config, and
        counted its tokens and steps consistently
        (docs/algorithm.md#pacing-bad-input), else stop here."""
        self.aggregation.check_agreement(sums, rows)

    def collect(self, result: AverageResult) -> Collected:
        """The control round of one collective (agreement checked) and ``||mean||^2``, all ranks."""
        return self.aggregation.collect(result)

    def aggregate(self, result: AverageResult, lr_mass: float) -> Aggregate:
        """The control round, ``D_t``, ``C_t`` and validity of one collective
        (docs/algorithm.md#interval-statistics, #interval-assessment)."""
        return self.combine([self.collect(result)], lr_mass, result.mean)

    def combine(
        self, parts: Sequence[Collected], lr_mass: float, mean: torch.Tensor | None
    ) -> Aggregate:  # fmt: skip
        """``D_t``, ``C_t`` and validity from the collectives of one interval (one per fragment)."""
        return self.aggregation.combine(parts, lr_mass, mean)

    def outer_step(
        self, interval: NextInterval, aggregate: Aggregate, fragment: Fragment | None = None
    ) -> OuterStep:  # fmt: skip
        """``theta_{t+1}`` and the momentum (of ``fragment``) from the mean; no move when invalid.

        A fragment is stepped with its interval's correction
        (docs/algorithm.md#fragments-and-the-rule); an invalid average
        (docs/algorithm.md#interval-assessment) resets non-finite inner-optimizer state instead.
        """
        correction = self.correction(interval)
        if aggregate.valid:
            assert aggregate.mean is not None
            index = fragment.index if fragment is not None else 0
            for hook in self.before_outer_step:
                hook(interval, aggregate.mean, self.outer)
            if self.config.uses_nesterov_outer:
                self.outer.step(
                    aggregate.mean, correction.outer_lr, correction.momentum,
                    correction.grad_divisor, index,
                )  # fmt: skip
            else:
                self.outer.average_step(aggregate.mean, index)
        else:
            self.sanitize_optimizers()
        return OuterStep(correction, aggregate.valid)

    def theta(self) -> torch.Tensor:
        """The whole worker's ``theta_t`` (this rank's shards gathered when sharded)."""
        return self.comm.gather_shards(self.outer.params.detach(), sum(self.segment_sizes))

    def write_back(
        self, theta: torch.Tensor | None = None, fragment: Fragment | None = None
    ) -> None:  # fmt: skip
        """Every local worker restarts from ``theta`` (default ``theta_t``), or its ``fragment``."""
        theta = self.theta() if theta is None else theta
        for params in self.worker_params:
            if fragment is None:
                self.outer.write_back(params, theta)
            else:
                start, end = fragment.span
                part = params[fragment.first : fragment.last]
                self.outer.write_back(part, theta[start:end], fragment.first)

    def decide(
        self, closed: ClosedInterval, aggregate: Aggregate, next_start: int | None = None
    ) -> tuple[RuleDecision | None, float]:
        """The policy's decision on ``closed`` and its time (``next_start``: set, when lagged)."""
        started = time.perf_counter()
        decision = self.policy.complete(aggregate.outcome(closed), next_start)
        return decision, time.perf_counter() - started

    def record(
        self,
        closed: ClosedInterval,
        aggregate: Aggregate,
        outer: OuterStep,
        decision: RuleDecision | None,
        seconds: float,
        sync_seconds: float,
        controller_seconds: float,
        applied: bool | None = None,
    ) -> IntervalRecord:
        """Build the record, add it to the totals, tell the listeners; stop on too many invalid.

        ``applied``: whether every outer step of the interval ran (fragments: one per fragment),
        default ``outer``'s. The pacer learns every worker's speed from the control messages
        here, before the next step (docs/algorithm.md#pacing-mechanism).
        """
        workers = self.aggregation.whole_workers(aggregate.control.workers)
        labels = self.comm.worker_labels()
        inner_steps = [w.inner_steps for w in workers]
        pace = self.pacer.observe(inner_steps, [w.busy_seconds for w in workers], labels)
        record = IntervalRecord.build(
            index=len(self.records),
            interval=closed.interval,
            lr_mass=closed.lr_mass,
            stats=aggregate.stats,
            mean_loss=aggregate.mean_loss,
            tokens=aggregate.control.totals.tokens,
            correction=outer.correction,
            applied=outer.applied if applied is None else applied,
            decision=decision,
            following=self._interval,
            seconds=seconds,
            sync_seconds=sync_seconds,
            controller_seconds=controller_seconds,
            payload_bytes=self.payload_bytes,
            traffic=aggregate.traffic,
            anchor_normalized_drift=aggregate.anchor_normalized_drift,
            drift_exponent=aggregate.drift_exponent(closed.lr_mass),
            probe_exponent=closed.interval.probe_exponent,
            workers=workers,
            pace=pace,
            timed=self.config.pacing == Pacing.BUDGET or self.config.worker_speeds is not None,
            labels=labels,
        )
        self.totals.add(record)
        self.records.append(record)
        for listener in self.listeners:
            listener(record)
        if not aggregate.valid:
            limit = self.config.max_consecutive_invalid
            report_invalid(
                self.records, closed.interval, aggregate.control, labels,
                self.step, limit,
            )  # fmt: skip
        return record

    # ------------------------------------------------------------- helpers
    def correction(self, interval: NextInterval) -> OuterCorrection:
        """From the previewed LR masses, so that every worker computes it alike
        (docs/algorithm.md#outer-correction)."""
        return correction_for(self.config, interval.lr_mass, interval.lr_mass_base)

    def sanitize_optimizers(self) -> None:
        """Zero non-finite inner-optimizer state so a worker that produced NaN can go on."""
        reset_nonfinite_state(self.optimizers)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Outer state, policy, the interval in flight and accounting (docs/algorithm.md#state).

        The workers' own parameters and inner optimizer states belong to the caller's checkpoint.
        """
        return {
            "config": self.config.to_dict(),
            "step": self.step,
            "outer": self.outer.state_dict(),
            "policy": self.policy.state_dict(),
            "current_interval": asdict(self._interval) if self._interval else None,
            "interval": self.counters.state_dict(),
            "error_feedback": [f.state_dict() for f in self.error_feedback],
            "totals": self.totals.as_dict(),
            "records": [r.__dict__.copy() for r in self.records],
            "overlap": self.sync.state_dict(),
            "pacer": self.pacer.state_dict(),
        }

    def boundary_state(self) -> dict[str, Any]:
        """What every worker holds alike right after a boundary
        (docs/algorithm.md#boundary-snapshots).

        Any number of workers can go on from it: ``theta_t``, the outer momentum, the
        policy (controller, token mapper), the planned next interval, totals and records;
        no per-worker state. The tensors are the live ones: copy them before the next step.
        """
        return {
            "step": self.step,
            "workers": self.num_workers,
            "outer": self.outer.state_dict(),
            "policy": self.policy.state_dict(),
            "current_interval": asdict(self._interval) if self._interval else None,
            "totals": self.totals.as_dict(),
            "records": [r.__dict__.copy() for r in self.records],
        }

    def resume_at_boundary(self, state: dict[str, Any]) -> None:
        """Go on from a :meth:`boundary_state` with this engine's number of workers
        (docs/algorithm.md#boundary-snapshots).

        Every local worker restarts from ``theta_t``. With another number of
        workers the policy rescales its token mapper and recalibrates its
        controller, and the next interval is planned again.
        """
        if self.step or self.records:
            raise RuntimeError(
                f"resume_at_boundary needs a new engine, this one is at step {self.step}"
            )  # fmt: skip
        self._load_shared_state(state)
        saved_workers = int(state["workers"])
        if saved_workers == self.num_workers and state["current_interval"] is not None:
            self.counters = IntervalCounters.zero(self.comm.local_workers)
            self._interval = NextInterval(**state["current_interval"])
        else:
            if saved_workers != self.num_workers:
                self.policy.rescale_workers(saved_workers, self.num_workers)
            self.start_interval()
        self.write_back()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_config("the engine state", state["config"], self.config)
        for feedback, saved_feedback in zip(self.error_feedback, state["error_feedback"]):
            feedback.load_state_dict(saved_feedback)
        self._load_shared_state(state)
        saved_interval = state["current_interval"]
        self._interval = NextInterval(**saved_interval) if saved_interval else None
        self.counters = IntervalCounters.from_state(state["interval"])
        self.pacer.load_state_dict(state.get("pacer", {}))
        self.sync.load_state_dict(state["overlap"], self)

    def _load_shared_state(self, state: dict[str, Any]) -> None:
        """What a checkpoint and a boundary state both hold: outer state, policy, step, records."""
        self.outer.load_state_dict(state["outer"])
        self.policy.load_state_dict(state["policy"])
        self.step = int(state["step"])
        self.totals = RunTotals(**state["totals"])
        self.records = [IntervalRecord(**r) for r in state["records"]]
        if self.writer is not None:
            self.writer.restore(self.records)
