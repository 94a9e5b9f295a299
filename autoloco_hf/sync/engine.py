"""The interval engine: the stages of one synchronization, and the blocking schedule that runs them in a row.

:class:`IntervalEngine` holds what every schedule shares (the local workers, ``theta_t``
and momentum, the policy, the interval being run, records and totals) and offers the
stages of a boundary (docs/algorithm.md §2) as public methods:

1. :meth:`~IntervalEngine.close_interval` and :meth:`~IntervalEngine.contributions`:
   each worker's pseudo-gradient and :class:`~autoloco_hf.sync.control.ControlMessage`;
   the communicator runs the control round (agreement) and the average;
2. :meth:`~IntervalEngine.aggregate`: ``D_t``, ``C_t`` and validity of the average;
3. :meth:`~IntervalEngine.outer_step` (and :meth:`~IntervalEngine.write_back`);
4. :meth:`~IntervalEngine.decide`: the policy learns from the interval;
5. :meth:`~IntervalEngine.record`: the record, the totals, the boundary listeners.

*When* these run is a :class:`SyncSchedule` strategy: :class:`BlockingSchedule` here,
the delayed and eager ones in :mod:`autoloco_hf.sync.overlap`, streaming fragments
in :mod:`autoloco_hf.sync.streaming`. Build an engine with
:func:`autoloco_hf.sync.factory.make_engine`, which also picks the DDP baseline.

Example (two simulated workers on a toy regression)::

    >>> import torch
    >>> from autoloco_hf import AutoLoCoConfig
    >>> from autoloco_hf.sync.communicators import SimulatedCommunicator
    >>> from autoloco_hf.sync.factory import make_engine
    >>> from autoloco_hf.algorithm.schedule import FunctionSchedule
    >>> torch.manual_seed(0) and None
    >>> models = [torch.nn.Linear(4, 1) for _ in range(2)]
    >>> models[1].load_state_dict(models[0].state_dict())
    <All keys matched successfully>
    >>> opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    >>> engine = make_engine(AutoLoCoConfig(method="diloco", h_base=5), models,
    ...                      FunctionSchedule(lambda s: 1e-2, 20), SimulatedCommunicator(2), total_steps=20)
    >>> for step in range(20):
    ...     for i, (m, o) in enumerate(zip(models, opts)):
    ...         x = torch.randn(8, 4); loss = (m(x) - x.sum(1, keepdim=True)).pow(2).mean()
    ...         loss.backward(); o.step(); o.zero_grad()
    ...     _ = engine.after_optimizer_step(tokens=[8, 8], losses=[loss.item()] * 2)
    >>> engine.totals.syncs, torch.equal(models[0].weight, models[1].weight)
    (4, True)
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch

from autoloco_hf.algorithm.correction import OuterCorrection, correction_for
from autoloco_hf.algorithm.policies import IntervalOutcome, NextInterval, PolicyFactory, make_policy
from autoloco_hf.algorithm.rules import Delivery, Measured
from autoloco_hf.algorithm.rules.decisions import RuleDecision
from autoloco_hf.algorithm.schedule import LRSchedule
from autoloco_hf.algorithm.stats import IntervalStatistics, drift_exponent, drift_growth, interval_statistics
from autoloco_hf.config import AutoLoCoConfig, Overlap, Pacing, WireDtype
from autoloco_hf.sync.accounting import payload_bytes
from autoloco_hf.sync.checkpoint import check_config
from autoloco_hf.sync.codec import ErrorFeedback, WireCodec
from autoloco_hf.sync.communicators import AverageResult, Communicator, PendingAverage, Traffic
from autoloco_hf.sync.control import ControlMessage, ControlRound, WorkerDisagreement, config_fingerprint
from autoloco_hf.sync.fragments import Fragment, on_local_tensors, split_fragments
from autoloco_hf.sync.outer import OuterOptimizer, broadcast_initial_parameters, flatten_fp32
from autoloco_hf.sync.pacing import make_pacer
from autoloco_hf.sync.records import IntervalRecord, JsonlWriter, RunTotals

__all__ = [
    "BlockingSchedule",
    "BoundaryListener",
    "InFlight",
    "IntervalEngine",
    "OuterStepHook",
    "SyncSchedule",
    "TooManyInvalidIntervals",
    "WorkerDisagreement",
]

logger = logging.getLogger("autoloco_hf")

BoundaryListener = Callable[[IntervalRecord], None]
"""Called with every interval's record once the boundary is complete (JSONL writer, loggers, state persistence)."""

OuterStepHook = Callable[[NextInterval, torch.Tensor, OuterOptimizer], None]
"""Called with the interval, its mean pseudo-gradient and the outer optimizer right before each outer step that
runs (streaming fragments: each fragment's, with its part of the mean); it may change the outer state, as the
ablations of ``benchmarks/switch_cost.py`` do to the momentum."""


class TooManyInvalidIntervals(RuntimeError):
    """``config.max_consecutive_invalid`` intervals in a row had a non-finite loss or pseudo-gradient (docs/algorithm.md §5.2)."""


@dataclass(frozen=True)
class ClosedInterval:
    """An interval whose last step has run; its counters are read, its average may still be pending."""

    interval: NextInterval
    lr_mass: float  # measured
    seconds: float  # wall time of its steps


@dataclass
class InFlight:
    """A closed interval whose average was started and has not been applied yet."""

    closed: ClosedInterval
    due_step: int  # delayed: the step its result is merged; eager: its boundary (applied at the next one)
    pending: PendingAverage

    def state_dict(self) -> dict[str, Any]:
        """The collective is waited for and stored as its result (docs/algorithm.md §11.3)."""
        return {
            "interval": asdict(self.closed.interval),
            "lr_mass": self.closed.lr_mass,
            "due_step": self.due_step,
            "interval_seconds": self.closed.seconds,
            **pending_state(self.pending),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> InFlight:
        closed = ClosedInterval(
            NextInterval(**state["interval"]), float(state["lr_mass"]), float(state["interval_seconds"])
        )
        return cls(closed, int(state["due_step"]), pending_from_state(state, device))


def pending_state(pending: PendingAverage) -> dict[str, Any]:
    """An average in flight, waited for and stored as its result (a checkpoint cannot hold a collective)."""
    result = pending.wait()
    return {
        "mean": result.mean.detach().clone(),
        "scalar_sums": result.scalar_sums.clone(),
        "scalar_rows": result.scalar_rows.clone(),
        "traffic": asdict(result.traffic),
    }


def pending_from_state(state: dict[str, Any], device: torch.device) -> PendingAverage:
    result = AverageResult(
        state["mean"].to(device), state["scalar_sums"], Traffic(**state["traffic"]), state["scalar_rows"]
    )
    return PendingAverage.completed(result)


@dataclass(frozen=True)
class Collected:
    """One completed collective's control round and squared mean norm, over every rank of every worker.

    The whole model's at a boundary, or one fragment's (docs/algorithm.md §12):
    squared norms and counts add up over fragments.
    """

    control: ControlRound
    mean_sq_norm: float
    mean_nonfinite: bool
    traffic: Traffic

    def state_dict(self) -> dict[str, Any]:
        return {
            "totals": self.control.totals.pack(),
            "rows": torch.stack([w.pack() for w in self.control.workers]),
            "mean_sq_norm": self.mean_sq_norm,
            "mean_nonfinite": self.mean_nonfinite,
            "traffic": asdict(self.traffic),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Collected:
        workers = tuple(ControlMessage.unpack(row) for row in state["rows"])
        control = ControlRound(ControlMessage.unpack(state["totals"]), workers)
        return cls(control, float(state["mean_sq_norm"]), bool(state["mean_nonfinite"]), Traffic(**state["traffic"]))


def _summed(parts: Sequence[Collected]) -> Collected:
    """The fragments' collected sums added in fragment order; the agreed fields of the last (it closed the interval)."""
    if len(parts) == 1:
        return parts[0]
    last = parts[-1]
    agreed = {name: getattr(last.control.totals, name) for name in ControlMessage.agreed_fields()}

    def add(messages: Sequence[ControlMessage]) -> ControlMessage:
        total = messages[0].pack()
        for message in messages[1:]:
            total = total + message.pack()
        return dataclasses.replace(ControlMessage.unpack(total), **agreed)

    workers = tuple(add(column) for column in zip(*(p.control.workers for p in parts)))
    traffic = Traffic(**{k: sum(getattr(p.traffic, k) for p in parts) for k in asdict(last.traffic)})
    return Collected(
        ControlRound(add([p.control.totals for p in parts]), workers),
        sum((p.mean_sq_norm for p in parts[1:]), parts[0].mean_sq_norm),
        any(p.mean_nonfinite for p in parts),
        traffic,
    )


@dataclass(frozen=True)
class Aggregate:
    """What the collectives of a boundary produced, and whether the outer step may use it (docs/algorithm.md §2, 5.2)."""

    mean: torch.Tensor | None  # FP32, identical on all workers; None for an interval of fragments (applied one by one)
    control: ControlRound
    stats: IntervalStatistics
    mean_loss: float
    all_finite: bool  # no worker reported a non-finite pseudo-gradient or loss
    valid: bool  # all finite, and so are the statistics and the mean: the outer step runs
    traffic: Traffic
    anchor_drift_energy: float = math.nan  # D at the rule's boundary displacement request (docs/algorithm.md §5.7)
    anchor_lr_mass: float = math.nan

    def outcome(self, closed: ClosedInterval) -> IntervalOutcome:
        """What the policy learns; a non-finite worker hides the statistics, whatever the sums say."""
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
        """``p`` of ``D ~ Lambda^p`` from the anchor to the interval's end (LR mass ``lr_mass``), when measured."""
        exponent = drift_exponent(
            *drift_growth(self.stats.drift_energy, lr_mass, self.anchor_drift_energy, self.anchor_lr_mass)
        )
        return None if math.isnan(exponent) else exponent


@dataclass(frozen=True)
class OuterStep:
    correction: OuterCorrection
    applied: bool


@dataclass
class IntervalCounters:
    """What the local workers did since the interval started (summed into their control messages)."""

    tokens: list[int]
    loss_sum: list[float]
    loss_count: int = 0
    lr_mass: float = 0.0
    anchor_sq_norms: list[float] | None = None  # each local worker's ||theta_t - theta^i||^2 at the boundary request
    anchor_lr_mass: float = 0.0
    # step -> (each local worker's ||theta_t - theta^i||^2, LR mass) of the shared requests measured so far
    shared: dict[int, tuple[list[float], float]] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)  # each local worker's inner steps (budget pacing: unequal)
    worker_lr_mass: list[float] = field(default_factory=list)  # each local worker's summed inner learning rates
    busy_seconds: list[float] = field(default_factory=list)  # each local worker's time on its steps (or virtual)
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def zero(cls, workers: int) -> IntervalCounters:
        return cls([0] * workers, [0.0] * workers, steps=[0] * workers, worker_lr_mass=[0.0] * workers,
                   busy_seconds=[0.0] * workers)  # fmt: skip

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
        workers, count, lr_mass = len(state["tokens"]), int(state["loss_count"]), float(state["lr_mass"])
        return cls(
            list(state["tokens"]), list(state["loss_sum"]), count, lr_mass,
            None if anchor is None else [float(v) for v in anchor], float(state.get("anchor_lr_mass", 0.0)),
            {int(step): ([float(v) for v in norms], float(lr)) for step, (norms, lr) in shared.items()},
            # a checkpoint from before unequal speeds: every worker took the interval's steps so far
            steps=[int(n) for n in state.get("steps", [count] * workers)],
            worker_lr_mass=[float(m) for m in state.get("worker_lr_mass", [lr_mass] * workers)],
            busy_seconds=[float(t) for t in state.get("busy_seconds", [0.0] * workers)],
        )  # fmt: skip


class SyncSchedule(Protocol):
    """When the stages of a boundary run, and what the workers train from until the average is applied.

    A schedule calls the engine's public stages only, and keeps its own state
    (what is in flight, per-worker start points) in :meth:`state_dict`. A new
    schedule is one more class with these members and one more branch in
    ``make_engine``, as the streaming fragments' (:mod:`autoloco_hf.sync.streaming`).
    """

    mode: Overlap

    @property
    def in_flight(self) -> InFlight | None: ...

    def attach(self, engine: IntervalEngine) -> None:
        """Prepare per-worker buffers; called once, after ``theta_0`` is in every worker."""

    def after_step(self, engine: IntervalEngine) -> IntervalRecord | None:
        """Called after every counted step; returns the record of an interval applied at this step."""

    def state_dict(self) -> dict[str, Any] | None: ...

    def load_state_dict(self, state: dict[str, Any] | None, engine: IntervalEngine) -> None: ...


class BlockingSchedule:
    """Every stage at the boundary, in a row: the workers wait for ``theta_{t+1}`` (docs/algorithm.md §2)."""

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
        # agreement is checked as soon as the control messages arrive, before the payload (docs/algorithm.md §5.3)
        result = engine.comm.average(deltas, messages, engine.shard_segment_sizes, check=engine.check_agreement)
        aggregate = engine.aggregate(result, closed.lr_mass)
        outer = engine.outer_step(closed.interval, aggregate)
        engine.write_back()
        sync_seconds = time.perf_counter() - started
        decision, controller_seconds = engine.decide(closed, aggregate)
        engine.start_interval()
        seconds = closed.seconds + time.perf_counter() - started
        return engine.record(closed, aggregate, outer, decision, seconds, sync_seconds, controller_seconds)

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: dict[str, Any] | None, engine: IntervalEngine) -> None:
        pass


def check_workers(
    config: AutoLoCoConfig, models: Sequence[torch.nn.Module], communicator: Communicator, total_steps: int
) -> None:
    """Refuse a communicator that does not match the models or the config, and an empty budget."""
    if len(models) != communicator.local_workers:
        raise ValueError(
            f"{len(models)} local models but the communicator expects {communicator.local_workers}: "
            "pass one model per process, or N replicas to SimulatedCommunicator(N)"
        )
    sent = (communicator.wire_dtype, communicator.block_size, communicator.topk_fraction)
    if sent != (config.wire_dtype, config.int8_block_size, config.topk_fraction):
        raise ValueError(
            f"the communicator sends {communicator.wire_dtype} (block {communicator.block_size}, top-k "
            f"{communicator.topk_fraction}) but config.wire_dtype={config.wire_dtype!r} (int8_block_size="
            f"{config.int8_block_size}, topk_fraction={config.topk_fraction}): build it with make_communicator(config, ...)"
        )
    if total_steps <= 0:
        raise ValueError(f"total_steps={total_steps}: the training budget must be positive")


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
        policy_factory: builds the interval policy (default :func:`~autoloco_hf.algorithm.policies.make_policy`,
            the one of ``config.method``).

    ``listeners`` (:data:`BoundaryListener`) and ``before_outer_step`` (:data:`OuterStepHook`) take more callbacks.
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
        if not config.is_interval_method:
            raise ValueError(
                f"method={config.method!r} has no intervals: build its engine with make_engine(config, ...)"
            )
        if sync.mode != config.overlap:
            raise ValueError(
                f"config.overlap={str(config.overlap)!r} but the schedule is {str(sync.mode)!r}: use make_engine"
            )
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
        self.listeners: list[BoundaryListener] = [f for f in (self.writer and self.writer.write, on_record) if f]
        self.before_outer_step: list[OuterStepHook] = []
        numel = sum(self.segment_sizes)
        self._fingerprint = config_fingerprint(config)
        broadcast_initial_parameters(communicator, self.worker_params)
        self._build_outer_state(numel)
        self.policy = policy_factory(config, schedule, total_steps, self.warmup_steps)
        self.pacer = make_pacer(config, communicator)
        self.step = 0
        self._lr_mass_warned = False
        self.start_interval()
        sync.attach(self)

    def _build_outer_state(self, numel: int) -> None:
        """``theta_0``, the momentum and the error-feedback residuals of the range this rank owns.

        All of the flat model, unless the worker's ranks each own a shard
        (``HierarchicalCommunicator``, docs/algorithm.md §8.3).
        """
        config = self.config
        self.shard = self.comm.shard_range(numel)
        start, end = self.shard
        self.shard_segment_sizes = [
            n for _, n in WireCodec(WireDtype.FP32, self.segment_sizes).pieces(start, end - start)
        ]
        # streaming fragments (docs/algorithm.md §12); one piece, the whole model, when fragments=1
        # cut at whole tensors of the worker's model: an FSDP2 rank's tensors are its local shards of them
        tensor_sizes = self.comm.worker_tensor_sizes(self.segment_sizes) if config.fragments > 1 else self.segment_sizes
        self.fragments = on_local_tensors(split_fragments(tensor_sizes, config.fragments), self.segment_sizes)
        # this rank's part of each fragment, in flat-model coordinates: all of it, or where it meets the
        # rank's shard (possibly nothing: then only the control message travels, docs/algorithm.md §12.1)
        self.fragment_pieces = [
            (min(max(s, start), end), max(min(e, end), start)) for s, e in (f.span for f in self.fragments)
        ]
        self.fragment_segment_sizes = [
            [n for _, n in WireCodec(WireDtype.FP32, self.segment_sizes).pieces(lo, hi - lo)]
            for lo, hi in self.fragment_pieces
        ]
        self.fragment_payload_bytes = [
            payload_bytes(1, f.numel, self.comm.wire_dtype, self.comm.block_size, self.comm.topk_fraction)
            for f in self.fragments
        ]
        self.payload_bytes = sum(self.fragment_payload_bytes)  # of one interval, per worker
        self.outer = OuterOptimizer(
            self.worker_params[0],
            lr=config.outer_lr,
            momentum=config.outer_momentum,
            device="cpu" if config.outer_on_cpu else None,
            shard=None if self.shard == (0, numel) else self.shard,
            spans=[(lo - start, hi - start) for lo, hi in self.fragment_pieces] if config.fragments > 1 else None,
        )
        # one FP32 residual per local worker (each fragment owns its part), carried to the next sync (§7.2)
        self.error_feedback = (
            [ErrorFeedback(self.outer.numel, self.outer.device) for _ in self.worker_params]
            if config.error_feedback
            else []
        )

    @property
    def num_workers(self) -> int:
        return self.comm.num_workers

    @property
    def current_interval(self) -> NextInterval | None:
        """The interval being executed (``None`` after the budget, or while a delayed merge decides it)."""
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
        """Account one step of the run: every local worker's tokens, summed losses and the inner LR.

        ``steps``: each local worker's inner steps in it (default one each; budget pacing:
        :meth:`steps_due`); ``seconds``: the time each spent on them (real or virtual), from which
        its speed is measured. Returns the record of an interval whose average was applied at this step.
        """
        if self.step >= self.total_steps:
            raise RuntimeError(f"step {self.step} is past the training budget of {self.total_steps} steps")
        counters = self.counters
        lr = lr if lr is not None else self.schedule.lr_at(self.step)
        counters.lr_mass += lr
        steps = steps if steps is not None else [1] * len(tokens)
        for i, (t, loss, n) in enumerate(zip(tokens, losses, steps)):
            counters.tokens[i] += int(t)
            counters.loss_sum[i] += float(loss)
            counters.steps[i] += int(n)
            counters.worker_lr_mass[i] += lr * n
            counters.busy_seconds[i] += float(seconds[i]) if seconds is not None else 0.0
        counters.loss_count += 1
        self.step += 1
        self.totals.steps = self.step
        self._serve_measurements()
        return self.sync.after_step(self)

    def _displacement_sq_norms(self) -> list[float]:
        """Each local worker's ``||theta_t - theta^i||^2`` (of this rank's shard)."""
        return [
            float(torch.linalg.vector_norm(self.outer.pseudo_gradient(params), dtype=torch.float64)) ** 2
            for params in self.worker_params
        ]

    def _serve_measurements(self) -> None:
        """Measure what the policy's rule asked for at this step of the interval (docs/algorithm.md §5.7).

        A ``BOUNDARY`` request stays local: its displacements travel with the interval's control message (the
        first one only). ``SHARED`` requests are summed over the workers in one all-reduce at the last one's
        step, so every worker hands the rule the same numbers and all of them change the interval, or none.
        """
        interval, counters = self._interval, self.counters
        if interval is None:
            return
        requests = self.policy.measurements(interval)
        elapsed = self.step - interval.start_step
        due = [r for r in requests if r.step == elapsed]
        if not due:
            return
        norms = self._displacement_sq_norms()
        for request in due:
            if request.delivery == Delivery.BOUNDARY and counters.anchor_sq_norms is None:
                counters.anchor_sq_norms, counters.anchor_lr_mass = norms, counters.lr_mass
            elif request.delivery == Delivery.SHARED:
                counters.shared[request.step] = (norms, counters.lr_mass)
        steps = sorted({r.step for r in requests if r.delivery == Delivery.SHARED})
        if not steps or elapsed != steps[-1] or any(step not in counters.shared for step in steps):
            return
        rows = [
            torch.tensor([counters.shared[step][0][worker] for step in steps], dtype=torch.float64)
            for worker in range(len(norms))
        ]
        sums = self.comm.sum_over_workers(rows).tolist()
        results = tuple(Measured(step, total, counters.shared[step][1]) for step, total in zip(steps, sums))
        self._interval = self.policy.on_measurement(interval, results)

    # ------------------------------------------------------ the interval in flight
    def steps_due(self) -> list[int]:
        """Inner steps each local worker takes at the next step of the run (docs/algorithm.md §13.1).

        The position in the interval is the counters' step count: it also runs while an overlapped average
        is in flight and the interval's length is not decided yet (§13.7).
        """
        return self.pacer.steps_due(self.counters.loss_count)

    def interval_ended(self) -> bool:
        interval = self._interval
        return interval is not None and self.step >= interval.start_step + interval.h_step

    def start_interval(self, min_steps: int = 1) -> None:
        """Fresh counters, and the policy's next interval from this step (at least ``min_steps`` long)."""
        self.counters = IntervalCounters.zero(self.comm.local_workers)
        self.plan_interval(self.step, min_steps)

    def plan_interval(self, start_step: int, min_steps: int = 1) -> None:
        """Set the running interval's length now (a delayed merge decides it after the interval started)."""
        self._interval = self.policy.next_interval(start_step, min_steps) if start_step < self.total_steps else None

    def pause_interval(self) -> None:
        """Fresh counters for an interval whose length is not decided yet."""
        self.counters = IntervalCounters.zero(self.comm.local_workers)
        self._interval = None

    def close_interval(self) -> ClosedInterval:
        interval, counters = self._interval, self.counters
        assert interval is not None
        self._check_lr_mass(interval, counters.lr_mass)
        return ClosedInterval(interval, counters.lr_mass, time.perf_counter() - counters.started)

    # -------------------------------------------------------------- the stages
    def contributions(
        self,
        interval: NextInterval,
        starts: Sequence[torch.Tensor] | None = None,
        fragment: Fragment | None = None,
        counted: bool = True,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each local worker's pseudo-gradient (from ``theta_t``, or from its own start point ``starts[i]``) and packed control message.

        ``fragment``: that fragment's part only; ``counted=False``: its message
        carries no tokens or losses (the interval's last fragment carries them, §12.2).
        """
        deltas, messages = [], []
        counters = self.counters
        weights = self.pacer.weights(counters.steps, counters.worker_lr_mass, counters.lr_mass, self.comm)
        for i, params in enumerate(self.worker_params):
            if fragment is not None:
                delta = self.outer.pseudo_gradient(params, self.fragment_pieces[fragment.index])
            elif starts is None:
                delta = self.outer.pseudo_gradient(params)
            else:  # eager overlap: the local progress of the interval (docs/algorithm.md §11.2)
                delta = starts[i] - flatten_fp32(params, self.outer.device, self.outer.shard)
            sq_norm = float(torch.linalg.vector_norm(delta, dtype=torch.float64)) ** 2
            finite = math.isfinite(sq_norm) and math.isfinite(self.counters.loss_sum[i])
            if not finite:  # keep the codec and the collective well defined; the flag skips the step
                delta.zero_()
            elif weights is not None:  # the communicator's plain mean becomes the weighted one (§13.2)
                delta.mul_(weights.delta[i])
                sq_norm *= weights.sq_norm[i]
            # D_t uses the local pseudo-gradient before encoding (docs/algorithm.md §2)
            if finite and self.error_feedback:
                delta = self._compensate(i, delta, fragment)
            deltas.append(delta)
            messages.append(self._control_message(interval, i, sq_norm, finite, counted).pack())
        return deltas, messages

    def check_agreement(self, sums: torch.Tensor, rows: torch.Tensor) -> None:
        """Every worker closed the same interval at the same step with the same config, and counted its tokens
        and steps consistently (budget pacing, docs/algorithm.md §13.4), else stop here."""
        control = ControlRound.from_rows(sums, rows)
        labels = self.comm.worker_labels()
        control.check_agreement(labels)
        self.pacer.check_counts(control.workers, labels)

    def collect(self, result: AverageResult) -> Collected:
        """The control round of one completed collective (agreement checked) and its ``||mean||^2``, over all ranks."""
        control = ControlRound.from_rows(result.scalar_sums, result.scalar_rows)
        control.check_agreement(self.comm.worker_labels())
        # this shard's sums (and its part of ||mean||^2) -> every rank's of every worker, so that all ranks
        # see the whole model's D_t, C_t and the same tokens and losses (identity when unsharded)
        mean_part = [
            float(torch.linalg.vector_norm(result.mean, dtype=torch.float64)) ** 2,
            float(not bool(torch.isfinite(result.mean).all())),
        ]
        summed = self.comm.sum_over_shards(
            torch.cat([control.totals.pack(), torch.tensor(mean_part, dtype=torch.float64)])
        )
        agreed = {name: getattr(control.totals, name) for name in ControlMessage.agreed_fields()}
        totals = dataclasses.replace(ControlMessage.unpack(summed[:-2]), **agreed)
        mean_sq_norm, mean_nonfinite = summed[-2:].tolist()
        return Collected(dataclasses.replace(control, totals=totals), mean_sq_norm, mean_nonfinite != 0, result.traffic)

    def aggregate(self, result: AverageResult, lr_mass: float) -> Aggregate:
        """The control round (agreement checked), ``D_t``, ``C_t`` and validity of one completed collective (docs/algorithm.md §2, 5.2)."""
        return self.combine([self.collect(result)], lr_mass, result.mean)

    def combine(self, parts: Sequence[Collected], lr_mass: float, mean: torch.Tensor | None) -> Aggregate:
        """``D_t``, ``C_t`` and validity from the collectives of one interval (one, or one per fragment, §12.2)."""
        part = _summed(parts)
        totals = part.control.totals
        stats = interval_statistics(totals.sq_norm, part.mean_sq_norm, self.num_workers, lr_mass, self.config.eps)
        mean_loss = totals.loss_sum / max(totals.loss_count, 1.0)
        all_finite = totals.nonfinite == 0
        valid = all_finite and stats.finite and math.isfinite(mean_loss) and not part.mean_nonfinite
        return Aggregate(
            mean, part.control, stats, mean_loss, all_finite, valid, part.traffic,
            totals.anchor_sq_norm / self.num_workers, totals.anchor_lr_mass,
        )  # fmt: skip

    def outer_step(self, interval: NextInterval, aggregate: Aggregate, fragment: Fragment | None = None) -> OuterStep:
        """``theta_{t+1}`` and the momentum (of ``fragment``) from the mean pseudo-gradient; no move when invalid (§5.2).

        A fragment is stepped with its interval's correction (docs/algorithm.md §12.2).
        """
        correction = self.correction(interval)
        if aggregate.valid:
            assert aggregate.mean is not None
            index = fragment.index if fragment is not None else 0
            for hook in self.before_outer_step:
                hook(interval, aggregate.mean, self.outer)
            if self.config.uses_nesterov_outer:
                self.outer.step(
                    aggregate.mean, correction.outer_lr, correction.momentum, correction.grad_divisor, index
                )
            else:
                self.outer.average_step(aggregate.mean, index)
        else:
            self.sanitize_optimizers()
        return OuterStep(correction, aggregate.valid)

    def theta(self) -> torch.Tensor:
        """The whole worker's ``theta_t`` (this rank's shards gathered when the outer state is sharded)."""
        return self.comm.gather_shards(self.outer.params.detach(), sum(self.segment_sizes))

    def write_back(self, theta: torch.Tensor | None = None, fragment: Fragment | None = None) -> None:
        """Every local worker restarts from ``theta`` (default ``theta_t``), or ``fragment``'s part of it."""
        theta = self.theta() if theta is None else theta
        for params in self.worker_params:
            if fragment is None:
                self.outer.write_back(params, theta)
            else:
                start, end = fragment.span
                self.outer.write_back(params[fragment.first : fragment.last], theta[start:end], fragment.first)

    def decide(
        self, closed: ClosedInterval, aggregate: Aggregate, next_start: int | None = None
    ) -> tuple[RuleDecision | None, float]:
        """The policy's decision on the closed interval (``next_start``: the interval it sets, when lagged) and its time."""
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
        """Build the interval's record, add it to the totals, tell the listeners; stop on too many invalid ones.

        ``applied``: whether every outer step of the interval ran (fragments: one per fragment), default ``outer``'s.
        The pacer learns every worker's speed from the control messages here, before the next step (§13.1).
        """
        workers, labels = self._whole_workers(aggregate.control.workers), self.comm.worker_labels()
        pace = self.pacer.observe([w.inner_steps for w in workers], [w.busy_seconds for w in workers], labels)
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
            self._report_invalid(closed.interval, aggregate.control)
        return record

    # ------------------------------------------------------------- helpers
    def _whole_workers(self, workers: Sequence[ControlMessage]) -> list[ControlMessage]:
        """Every worker's message as the whole worker's, the same on every rank (§13.7).

        A worker of several ranks that each sync a shard sees only its own rank's row of every other worker.
        Its ranks take the same steps; its tokens are the sum over its ranks and its seconds the slowest
        rank's, so all ranks (and all workers) record the same counts and adopt the same shares: a node is
        as fast as its slowest rank. One all-gather of a few numbers inside the worker.
        """
        if self.comm.shards_per_worker == 1:
            return list(workers)
        tokens = self.comm.sum_over_shards(torch.tensor([w.tokens for w in workers], dtype=torch.float64))
        seconds = self.comm.max_over_shards(torch.tensor([w.busy_seconds for w in workers], dtype=torch.float64))
        return [
            dataclasses.replace(w, tokens=t, busy_seconds=b)
            for w, t, b in zip(workers, tokens.tolist(), seconds.tolist())
        ]

    def correction(self, interval: NextInterval) -> OuterCorrection:
        """From the previewed LR masses, so that every worker computes it alike (docs/algorithm.md §4)."""
        return correction_for(self.config, interval.lr_mass, interval.lr_mass_base)

    def sanitize_optimizers(self) -> None:
        """Zero non-finite inner-optimizer state so a worker that produced NaN can go on."""
        for optimizer in self.optimizers:
            for state in optimizer.state.values():
                for value in state.values():
                    if torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
                        torch.nan_to_num_(value, nan=0.0, posinf=0.0, neginf=0.0)

    def _control_message(
        self, interval: NextInterval, worker: int, sq_norm: float, finite: bool, counted: bool = True
    ) -> ControlMessage:
        counters = self.counters
        anchor = counters.anchor_sq_norms[worker] if counters.anchor_sq_norms is not None and counted else 0.0
        return ControlMessage(
            sq_norm=sq_norm if finite else 0.0,
            tokens=float(counters.tokens[worker]) if counted else 0.0,
            loss_sum=counters.loss_sum[worker] if finite and counted else 0.0,
            loss_count=float(counters.steps[worker]) if counted else 0.0,
            nonfinite=0.0 if finite else 1.0,
            anchor_sq_norm=anchor if finite and math.isfinite(anchor) else 0.0,
            anchor_lr_mass=counters.anchor_lr_mass if counted else 0.0,
            step=float(self.step),
            interval_index=float(len(self.records)),
            start_step=float(interval.start_step),
            h_step=float(interval.h_step),
            h_tok=float(interval.h_tok),
            config_fingerprint=self._fingerprint,
            inner_steps=float(counters.steps[worker]) if counted else 0.0,
            busy_seconds=counters.busy_seconds[worker] if counted else 0.0,
        )

    def _compensate(self, worker: int, delta: torch.Tensor, fragment: Fragment | None) -> torch.Tensor:
        """``delta`` plus the worker's residual (of ``fragment``'s part), which keeps what the wire drops (§7.2)."""
        if fragment is None:
            segments, offset = self.shard_segment_sizes, 0
        else:
            segments, offset = (
                self.fragment_segment_sizes[fragment.index],
                self.fragment_pieces[fragment.index][0] - self.shard[0],
            )
        codec = self.comm.codec(segments)
        return self.error_feedback[worker].apply(codec, delta, self.num_workers, offset)

    def _check_lr_mass(self, interval: NextInterval, measured: float) -> None:
        """Preview and measurement of an interval's LR mass must agree, else the previews are wrong (docs/algorithm.md §2)."""
        if not self._lr_mass_warned and not math.isclose(measured, interval.lr_mass, rel_tol=1e-6, abs_tol=1e-12):
            self._lr_mass_warned = True
            warnings.warn(
                f"interval at step {interval.start_step}: the learning rates actually used sum to {measured:.6g} but "
                f"the schedule preview gave {interval.lr_mass:.6g}; the outer correction and candidate selection rely "
                "on the preview: pass the live scheduler (SchedulerPreview) that drives the inner optimizer",
                RuntimeWarning,
                stacklevel=4,
            )

    def _report_invalid(self, interval: NextInterval, control: ControlRound) -> None:
        """Log who produced the non-finite values; stop after ``max_consecutive_invalid`` such intervals in a row."""
        labels = self.comm.worker_labels()
        culprits = [label for label, w in zip(labels, control.workers) if w.nonfinite] or ["the mean (every worker)"]
        streak = 0
        for record in reversed(self.records):  # this interval's record is the last one
            if record.outer_step_applied:
                break
            streak += 1
        good_step = self.records[-streak].start_step  # theta is still the one synchronized there
        where = (
            f"interval {len(self.records) - 1} (steps {interval.start_step + 1}-"
            f"{interval.start_step + interval.h_step}): non-finite loss or pseudo-gradient on {', '.join(culprits)}"
        )
        limit = self.config.max_consecutive_invalid
        if streak >= limit:
            raise TooManyInvalidIntervals(
                f"AutoLoCo stopped at step {self.step}: {where}, {streak} such intervals in a row "
                f"(max_consecutive_invalid={limit}); the outer parameters are still those synchronized at step "
                f"{good_step}: lower the learning rate or check the data of steps {good_step + 1}-{self.step}, then "
                "resume from the last checkpoint (docs/reliability.md)"
            )
        logger.warning(
            "AutoLoCo: %s; outer step skipped, every worker restarts from the parameters synchronized at "
            "step %d (%d of max_consecutive_invalid=%d in a row)",
            where,
            good_step,
            streak,
            limit,
        )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Outer state, policy, the interval in flight and accounting (docs/algorithm.md §8.2).

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
        """What every worker holds alike right after a boundary: any number of workers can go on from it (docs/algorithm.md §8.5).

        ``theta_t``, the outer momentum, the policy (controller, token mapper),
        the planned next interval, totals and records; no per-worker state. The
        tensors are the live ones: copy them before the next step.
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
        """Go on from a :meth:`boundary_state` with this engine's number of workers (docs/algorithm.md §8.5).

        Every local worker restarts from ``theta_t``. With another number of
        workers the policy rescales its token mapper and recalibrates its
        controller, and the next interval is planned again.
        """
        if self.step or self.records:
            raise RuntimeError(f"resume_at_boundary needs a new engine, this one is at step {self.step}")
        self.outer.load_state_dict(state["outer"])
        self.policy.load_state_dict(state["policy"])
        self.step = int(state["step"])
        self.totals = RunTotals(**state["totals"])
        self.records = [IntervalRecord(**r) for r in state["records"]]
        if self.writer is not None:
            self.writer.restore(self.records)
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
        self.outer.load_state_dict(state["outer"])
        self.policy.load_state_dict(state["policy"])
        self.step = int(state["step"])
        for feedback, saved_feedback in zip(self.error_feedback, state["error_feedback"]):
            feedback.load_state_dict(saved_feedback)
        self.totals = RunTotals(**state["totals"])
        self.records = [IntervalRecord(**r) for r in state["records"]]
        if self.writer is not None:
            self.writer.restore(self.records)
        saved_interval = state["current_interval"]
        self._interval = NextInterval(**saved_interval) if saved_interval else None
        self.counters = IntervalCounters.from_state(state["interval"])
        self.pacer.load_state_dict(state.get("pacer", {}))
        self.sync.load_state_dict(state["overlap"], self)
