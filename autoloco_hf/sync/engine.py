"""The interval engine: local steps, one collective, the outer step, the next horizon.

One :class:`IntervalEngine` per process drives the process's local workers:
one model with :class:`~autoloco_hf.sync.communicators.ProcessGroupCommunicator` under
``torchrun`` / ``accelerate launch``, or ``N`` replicas with
:class:`~autoloco_hf.sync.communicators.SimulatedCommunicator`. The caller runs the inner
steps and calls :meth:`IntervalEngine.after_optimizer_step` once per true
optimizer step; at a boundary the engine (docs/algorithm.md §2) runs three stages, each
returning a small frozen result, and then builds the interval's record once:

1. aggregate (:class:`Aggregate`): each worker's pseudo-gradient
   ``theta_t - theta_t^i`` is averaged and its
   :class:`~autoloco_hf.sync.control.ControlMessage` (squared norm, tokens,
   losses, the interval it executed) summed in one synchronization; every
   worker must have executed the same interval; ``D_t`` and ``C_t`` follow;
2. outer step (:class:`OuterStep`): the outer correction ``rho_t, mu_t, eta_t``
   and the Nesterov step (skipped on a non-finite interval), ``theta_{t+1}``
   written back into every local worker;
3. advance the policy (:class:`PolicyAdvance`): the policy learns from the
   interval and chooses the next one.

Example (two simulated workers on a toy regression)::

    >>> import torch
    >>> from autoloco_hf import AutoLoCoConfig
    >>> from autoloco_hf.sync.communicators import SimulatedCommunicator
    >>> from autoloco_hf.algorithm.schedule import FunctionSchedule
    >>> torch.manual_seed(0) and None
    >>> models = [torch.nn.Linear(4, 1) for _ in range(2)]
    >>> models[1].load_state_dict(models[0].state_dict())
    <All keys matched successfully>
    >>> opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    >>> engine = IntervalEngine(AutoLoCoConfig(method="diloco", h_base=5), models,
    ...                         FunctionSchedule(lambda s: 1e-2, 20), SimulatedCommunicator(2), total_steps=20)
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
from dataclasses import asdict, dataclass
from typing import Any

import torch

from autoloco_hf.algorithm.controller import Assessment, ControllerDecision, Decision, Phase
from autoloco_hf.algorithm.correction import OuterCorrection, interval_ratio, outer_correction
from autoloco_hf.algorithm.policies import IntervalOutcome, NextInterval, make_policy
from autoloco_hf.algorithm.schedule import LRSchedule
from autoloco_hf.algorithm.stats import IntervalStatistics, interval_statistics
from autoloco_hf.config import AutoLoCoConfig, Overlap, WireDtype
from autoloco_hf.sync.accounting import payload_bytes, wire_bytes_sent
from autoloco_hf.sync.codec import ErrorFeedback, WireCodec, roundtrip_as_sent
from autoloco_hf.sync.communicators import AverageResult, Communicator, Traffic
from autoloco_hf.sync.control import ControlMessage, ControlRound, WorkerDisagreement, config_fingerprint
from autoloco_hf.sync.outer import OuterOptimizer, flatten_fp32
from autoloco_hf.sync.records import IntervalRecord, JsonlWriter, RunTotals

__all__ = ["IntervalEngine", "TooManyInvalidIntervals", "WorkerDisagreement"]

logger = logging.getLogger("autoloco_hf")


class TooManyInvalidIntervals(RuntimeError):
    """``config.max_consecutive_invalid`` intervals in a row had a non-finite loss or pseudo-gradient (docs/algorithm.md §5.2)."""


@dataclass(frozen=True)
class Aggregate:
    """What the one collective of a boundary produced, and whether the outer step may use it (docs/algorithm.md §2, 5.2)."""

    mean: torch.Tensor  # mean pseudo-gradient (FP32, identical on all workers)
    control: ControlRound
    stats: IntervalStatistics
    mean_loss: float
    all_finite: bool  # no worker reported a non-finite pseudo-gradient or loss
    valid: bool  # all finite, and so are the statistics and the mean: the outer step runs
    traffic: Traffic


@dataclass(frozen=True)
class OuterStep:
    """The outer correction used and whether ``theta`` moved (docs/algorithm.md §4)."""

    correction: OuterCorrection
    applied: bool


@dataclass(frozen=True)
class PolicyAdvance:
    """The policy's decision on the closed interval and the interval that follows it (docs/algorithm.md §5, 6)."""

    decision: ControllerDecision | None
    next_interval: NextInterval | None
    interval_seconds: float  # wall time of the closed interval, sync and decision included
    controller_seconds: float


class IntervalEngine:
    """Runs AutoLoCo / DiLoCo / QSR / Linear intervals (and DDP gradient averaging) for local workers.

    Args:
        config: the run's :class:`AutoLoCoConfig`.
        models: the local workers' models (1 per process, or ``N`` simulated
            replicas). Their parameters at construction become ``theta_0``
            (worker 0's, broadcast to the others).
        schedule: the inner LR schedule (``SchedulerPreview`` of the live
            scheduler, or a ``FunctionSchedule``) for LR-mass previews.
        communicator: averages across all workers.
        total_steps: the training budget in optimizer steps.
        warmup_steps: inner-LR warm-up; defaults to ``config.warmup_steps`` or 0.
        optimizers: the inner optimizers; non-finite state entries are reset
            after an invalid interval so that training can go on.
        records_path: JSONL file for per-interval records (write it on one rank).
        on_record: called with every :class:`IntervalRecord` (e.g. for logging).
    """

    def __new__(cls, config: AutoLoCoConfig, *args: Any, **kwargs: Any) -> IntervalEngine:
        """``config.overlap`` other than ``none`` builds the overlapped engine (docs/algorithm.md §11)."""
        if cls is IntervalEngine and config.overlap != Overlap.NONE:
            from autoloco_hf.sync.overlap import OverlappedEngine

            cls = OverlappedEngine
        return super().__new__(cls)

    def __init__(
        self,
        config: AutoLoCoConfig,
        models: Sequence[torch.nn.Module],
        schedule: LRSchedule,
        communicator: Communicator,
        total_steps: int,
        warmup_steps: int | None = None,
        optimizers: Sequence[torch.optim.Optimizer] = (),
        records_path: str | None = None,
        on_record: Callable[[IntervalRecord], None] | None = None,
    ) -> None:
        if len(models) != communicator.local_workers:
            raise ValueError(
                f"{len(models)} local models but the communicator expects {communicator.local_workers}: "
                "pass one model per process, or N replicas to SimulatedCommunicator(N)"
            )
        if (communicator.wire_dtype, communicator.block_size) != (config.wire_dtype, config.int8_block_size):
            raise ValueError(
                f"the communicator sends {communicator.wire_dtype} (block {communicator.block_size}) but "
                f"config.wire_dtype={config.wire_dtype!r} (int8_block_size={config.int8_block_size}): build it with "
                "wire_dtype=config.wire_dtype, block_size=config.int8_block_size"
            )
        if total_steps <= 0:
            raise ValueError(f"total_steps={total_steps}: the training budget must be positive")
        self.config = config
        self.worker_params = [[p for p in m.parameters()] for m in models]
        self.segment_sizes = [p.numel() for p in self.worker_params[0]]
        self.schedule = schedule
        self.comm = communicator
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps if warmup_steps is not None else (config.warmup_steps or 0)
        self.optimizers = list(optimizers)
        self.records_path = records_path
        self.on_record = on_record
        self.totals = RunTotals()
        self.records: list[IntervalRecord] = []
        self._writer: JsonlWriter | None = JsonlWriter(records_path) if records_path else None
        numel = sum(self.segment_sizes)
        self._payload_bytes = payload_bytes(1, numel, communicator.wire_dtype, communicator.block_size)
        self._fingerprint = config_fingerprint(config)

        self._broadcast_initial_parameters()
        # the range of the flat model whose outer state and sync this process owns (all of it unless
        # the worker's ranks each own a shard: HierarchicalCommunicator, docs/algorithm.md §8.3)
        self.shard = communicator.shard_range(numel)
        start, end = self.shard
        self.shard_segment_sizes = [
            n for _, n in WireCodec(WireDtype.FP32, self.segment_sizes).pieces(start, end - start)
        ]
        self.outer = OuterOptimizer(
            self.worker_params[0],
            lr=config.outer_lr,
            momentum=config.outer_momentum,
            device="cpu" if config.outer_on_cpu else None,
            shard=None if self.shard == (0, numel) else self.shard,
        )
        self.policy = (
            make_policy(config, schedule, total_steps, self.warmup_steps) if config.is_interval_method else None
        )
        # optional residual carried to the next interval, one FP32 model copy per local worker (docs/algorithm.md §7 extension)
        self.error_feedback = (
            [ErrorFeedback(self.outer.numel, self.outer.device) for _ in models] if config.error_feedback else []
        )
        self.step = 0
        self._lr_mass_warned = False
        self._start_interval()

    # ---------------------------------------------------------------- public
    @property
    def num_workers(self) -> int:
        return self.comm.num_workers

    @property
    def averages_gradients(self) -> bool:
        """DDP baseline (``config.is_interval_method`` is False): no intervals; gradients are averaged every step."""
        return self.policy is None

    @property
    def current_interval(self) -> NextInterval | None:
        """The interval being executed (``None`` for DDP or after the budget)."""
        return self._interval

    def after_optimizer_step(
        self, tokens: Sequence[int], losses: Sequence[float], lr: float | None = None
    ) -> IntervalRecord | None:
        """Account one true optimizer step of every local worker; synchronize at a boundary.

        Args:
            tokens: non-padding input tokens each local worker consumed in this step.
            losses: each local worker's training loss of this step.
            lr: the inner learning rate actually used (default: the schedule's value).

        Returns the interval's record when this step closed an interval.
        """
        if self.step >= self.total_steps:
            raise RuntimeError(f"step {self.step} is past the training budget of {self.total_steps} steps")
        self._lr_mass += lr if lr is not None else self.schedule.lr_at(self.step)
        for i, (t, loss) in enumerate(zip(tokens, losses)):
            self._tokens[i] += int(t)
            self._loss_sum[i] += float(loss)
        self._loss_count += 1
        self.step += 1
        self.totals.steps = self.step
        if self._interval is None or self.step < self._interval.start_step + self._interval.h_step:
            return None
        return self._synchronize()

    @torch.no_grad()
    def average_gradients(self) -> None:
        """DDP baseline: replace every local worker's gradients by the all-worker mean (once per step)."""
        grads = [
            torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params])
            for params in self.worker_params
        ]
        start = time.perf_counter()
        result = self.comm.average(grads, [], self.segment_sizes, wire_dtype=WireDtype.FP32)
        for params in self.worker_params:
            for p, chunk in zip(params, torch.split(result.mean, self.segment_sizes)):
                if p.grad is None:
                    p.grad = torch.empty_like(p)
                p.grad.copy_(chunk.view_as(p))
        self.account_gradient_sync(result.traffic, time.perf_counter() - start)

    def account_gradient_sync(self, traffic: Traffic | None = None, seconds: float = 0.0) -> None:
        """Count one per-step FP32 gradient all-reduce of the DDP baseline, ours or torch DDP's (ring bytes)."""
        self.totals.syncs += 1
        self.totals.payload_tensors += 1
        self.totals.payload_bytes += payload_bytes(1, sum(self.segment_sizes), WireDtype.FP32)
        if traffic is None:
            codec = self.comm.codec(self.segment_sizes, WireDtype.FP32)
            traffic = Traffic(wire_bytes=wire_bytes_sent(codec, self.num_workers))
        self._add_traffic(traffic, seconds)

    # ------------------------------------------------------------- internals
    def _broadcast_initial_parameters(self) -> None:
        """All workers start from worker 0's parameters (docs/algorithm.md §2: one theta_0)."""
        flat = flatten_fp32(self.worker_params[0])
        self.comm.broadcast_(flat)
        with torch.no_grad():
            for params in self.worker_params:
                for p, chunk in zip(params, torch.split(flat, self.segment_sizes)):
                    p.copy_(chunk.view_as(p))

    def _start_interval(self) -> None:
        self._reset_interval_counters()
        self._interval = self.policy.next_interval(self.step) if self.policy and self.step < self.total_steps else None

    def _reset_interval_counters(self) -> None:
        workers = self.comm.local_workers
        self._tokens = [0] * workers
        self._loss_sum = [0.0] * workers
        self._loss_count = 0
        self._lr_mass = 0.0
        self._interval_started = time.perf_counter()

    @torch.no_grad()
    def _synchronize(self) -> IntervalRecord:
        """Close the interval: aggregate, outer step, advance the policy, then record it once."""
        interval, lr_mass = self._interval, self._lr_mass
        assert interval is not None
        started = time.perf_counter()
        aggregate = self._aggregate(interval, lr_mass)
        self._check_lr_mass(interval, lr_mass)
        outer = self._outer_step(interval, aggregate)
        sync_seconds = time.perf_counter() - started
        advance = self._advance_policy(interval, lr_mass, aggregate)
        record = self._record(interval, lr_mass, aggregate, outer, advance, sync_seconds)
        self._account(record, aggregate.traffic, sync_seconds, advance.controller_seconds)
        if not aggregate.valid:
            self._report_invalid(interval, aggregate.control)
        return record

    def _aggregate(self, interval: NextInterval, lr_mass: float) -> Aggregate:
        """Each worker's pseudo-gradient and control message in one collective; ``D_t``, ``C_t`` from it (docs/algorithm.md §2)."""
        deltas, messages = self._contributions(interval)
        # agreement is checked as soon as the control messages arrive, before the payload (docs/algorithm.md §5.3)
        result = self.comm.average(deltas, messages, self.shard_segment_sizes, check=self._check_agreement)
        return self._read_aggregate(result, lr_mass)

    def _contributions(
        self, interval: NextInterval, starts: Sequence[torch.Tensor] | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each local worker's pseudo-gradient (from ``theta_t``, or from its own start point ``starts[i]``) and packed control message."""
        deltas, messages = [], []
        for i, params in enumerate(self.worker_params):
            if starts is None:
                delta = self.outer.pseudo_gradient(params)
            else:  # eager overlap: the local progress of the interval (docs/algorithm.md §11.3)
                delta = starts[i] - flatten_fp32(params, self.outer.device, self.outer.shard)
            sq_norm = float(torch.linalg.vector_norm(delta, dtype=torch.float64)) ** 2
            finite = math.isfinite(sq_norm) and math.isfinite(self._loss_sum[i])
            if not finite:  # keep the codec and the collective well defined; the flag skips the step
                delta.zero_()
            elif self.error_feedback:  # D_t above uses the local pseudo-gradient before encoding (docs/algorithm.md §2)
                delta = self._compensate(i, delta)
            deltas.append(delta)
            messages.append(self._control_message(interval, i, sq_norm, finite).pack())
        return deltas, messages

    def _read_aggregate(self, result: AverageResult, lr_mass: float) -> Aggregate:
        """The control round (agreement checked), ``D_t``, ``C_t`` and validity of one completed collective (docs/algorithm.md §2, 5.2)."""
        control = ControlRound.from_rows(result.scalar_sums, result.scalar_rows)
        control.check_agreement(self.comm.worker_labels())  # the overlapped path's check; blocking checked it already
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
        control = dataclasses.replace(control, totals=totals)
        mean_sq_norm, mean_nonfinite = summed[-2:].tolist()
        stats = interval_statistics(
            totals.sq_norm,
            mean_sq_norm,
            self.num_workers,
            lr_mass,
            self.config.eps,
        )
        mean_loss = totals.loss_sum / max(totals.loss_count, 1.0)
        all_finite = totals.nonfinite == 0
        valid = all_finite and stats.finite and math.isfinite(mean_loss) and mean_nonfinite == 0
        return Aggregate(result.mean, control, stats, mean_loss, all_finite, valid, result.traffic)

    def _control_message(self, interval: NextInterval, worker: int, sq_norm: float, finite: bool) -> ControlMessage:
        return ControlMessage(
            sq_norm=sq_norm if finite else 0.0,
            tokens=float(self._tokens[worker]),
            loss_sum=self._loss_sum[worker] if finite else 0.0,
            loss_count=float(self._loss_count),
            nonfinite=0.0 if finite else 1.0,
            step=float(self.step),
            interval_index=float(len(self.records)),
            start_step=float(interval.start_step),
            h_step=float(interval.h_step),
            h_tok=float(interval.h_tok),
            config_fingerprint=self._fingerprint,
        )

    def _check_agreement(self, sums: torch.Tensor, rows: torch.Tensor) -> None:
        """Every worker closed the same interval at the same step with the same config, else stop here."""
        ControlRound.from_rows(sums, rows).check_agreement(self.comm.worker_labels())

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
            f"interval {len(self.records) - 1} (steps {interval.start_step + 1}-{self.step}): non-finite loss "
            f"or pseudo-gradient on {', '.join(culprits)}"
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

    def _outer_step(self, interval: NextInterval, aggregate: Aggregate) -> OuterStep:
        """``theta_{t+1}`` from the mean pseudo-gradient, written back into every local worker (docs/algorithm.md §4, 5.2)."""
        outer = self._apply_outer(interval, aggregate)
        theta = self.comm.gather_shards(self.outer.params.detach(), sum(self.segment_sizes))
        for params in self.worker_params:
            self.outer.write_back(params, theta)
        return outer

    def _apply_outer(self, interval: NextInterval, aggregate: Aggregate) -> OuterStep:
        """``theta_{t+1}`` and the momentum from the mean pseudo-gradient, or no move on an invalid interval."""
        correction = self._correction(interval)
        if aggregate.valid:
            if self.config.uses_nesterov_outer:
                self.outer.step(aggregate.mean, correction.outer_lr, correction.momentum, correction.grad_divisor)
            else:
                self.outer.average_step(aggregate.mean)
        else:  # docs/algorithm.md §5.2 "invalid": theta_t and the momentum stay as they were
            self.totals.skipped_outer_steps += 1
            self._sanitize_optimizers()
        return OuterStep(correction, aggregate.valid)

    def _advance_policy(self, interval: NextInterval, lr_mass: float, aggregate: Aggregate) -> PolicyAdvance:
        """Tell the policy what the interval did and start the next one (docs/algorithm.md §3, 5)."""
        assert self.policy is not None
        started = time.perf_counter()
        decision = self.policy.complete(self._outcome(interval, lr_mass, aggregate))
        interval_seconds = time.perf_counter() - self._interval_started
        self._start_interval()
        return PolicyAdvance(decision, self._interval, interval_seconds, time.perf_counter() - started)

    def _outcome(self, interval: NextInterval, lr_mass: float, aggregate: Aggregate) -> IntervalOutcome:
        finite = aggregate.all_finite
        return IntervalOutcome(
            interval=interval,
            global_tokens=int(round(aggregate.control.totals.tokens)),
            drift_energy=aggregate.stats.drift_energy if finite else math.nan,
            coherence=aggregate.stats.coherence if finite else math.nan,
            lr_mass=lr_mass,
            mean_loss=aggregate.mean_loss if finite else math.nan,
            pseudo_grad_finite=aggregate.valid,
        )

    def _compensate(self, worker: int, delta: torch.Tensor) -> torch.Tensor:
        feedback = self.error_feedback[worker]
        compensated = feedback.compensate(delta)
        codec = self.comm.codec(self.shard_segment_sizes)
        feedback.update(roundtrip_as_sent(codec, compensated, self.num_workers), compensated)
        return compensated

    def _check_lr_mass(self, interval: NextInterval, measured: float) -> None:
        """docs/algorithm.md §2: preview and measurement of an interval's LR mass must agree, else the previews are wrong."""
        if not self._lr_mass_warned and not math.isclose(measured, interval.lr_mass, rel_tol=1e-6, abs_tol=1e-12):
            self._lr_mass_warned = True
            warnings.warn(
                f"interval at step {interval.start_step}: the learning rates actually used sum to {measured:.6g} but "
                f"the schedule preview gave {interval.lr_mass:.6g}; the outer correction and candidate selection rely "
                "on the preview: pass the live scheduler (SchedulerPreview) that drives the inner optimizer",
                RuntimeWarning,
                stacklevel=2,
            )

    def _correction(self, interval: NextInterval) -> OuterCorrection:
        cfg = self.config
        if cfg.outer_correction_enabled:
            return outer_correction(
                interval.lr_mass,
                interval.lr_mass_base,
                cfg.outer_momentum,
                cfg.outer_lr,
                mu_min=cfg.mu_min,
                mu_max=cfg.mu_max,
                kappa_max=cfg.kappa_max,
                eps=cfg.eps,
                adjust_momentum=cfg.adjust_momentum,
                scale_outer_lr=cfg.scale_outer_lr,
                normalize_pseudo_grad=cfg.normalize_pseudo_grad,
            )
        rho = interval_ratio(interval.lr_mass, interval.lr_mass_base, cfg.eps)
        if cfg.uses_nesterov_outer:  # DiLoCo: fixed outer settings
            return OuterCorrection(rho, cfg.outer_momentum, cfg.outer_lr, 1.0, None)
        return OuterCorrection(rho, 0.0, 1.0, 1.0, None)  # direct model averaging

    def _sanitize_optimizers(self) -> None:
        """Zero non-finite inner-optimizer state so a worker that produced NaN can go on."""
        for optimizer in self.optimizers:
            for state in optimizer.state.values():
                for value in state.values():
                    if torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
                        torch.nan_to_num_(value, nan=0.0, posinf=0.0, neginf=0.0)

    def _record(
        self,
        interval: NextInterval,
        lr_mass: float,
        aggregate: Aggregate,
        outer: OuterStep,
        advance: PolicyAdvance,
        sync_seconds: float,
    ) -> IntervalRecord:
        stats, correction = aggregate.stats, outer.correction
        decision, following = advance.decision, advance.next_interval
        traffic = aggregate.traffic
        return IntervalRecord(
            index=len(self.records),
            start_step=interval.start_step,
            h_tok=interval.h_tok,
            h_step=interval.h_step,
            h_ref=interval.h_ref,
            lr_mass=lr_mass,
            lr_mass_preview=interval.lr_mass,
            lr_mass_base=interval.lr_mass_base,
            rho=correction.rho,
            mu=correction.momentum,
            eta=correction.outer_lr,
            drift_energy=stats.drift_energy,
            coherence=stats.coherence,
            normalized_drift=stats.normalized_drift,
            disagreement=stats.disagreement,
            mean_loss=aggregate.mean_loss,
            tokens=int(round(aggregate.control.totals.tokens)),
            outer_step_applied=outer.applied,
            assessment=decision.assessment if decision else Assessment.FIXED,
            decision=decision.decision if decision else Decision.FIXED,
            phase=decision.phase if decision else Phase.FIXED,
            next_h_tok=following.h_tok if following else None,
            next_h_step=following.h_step if following else None,
            z_drift=decision.z_drift if decision else None,
            z_coherence=decision.z_coherence if decision else None,
            seconds=advance.interval_seconds,
            sync_seconds=sync_seconds,
            controller_seconds=advance.controller_seconds,
            payload_bytes=self._payload_bytes,
            wire_bytes=traffic.wire_bytes,
            encode_seconds=traffic.encode_seconds,
            collective_seconds=traffic.collective_seconds,
            decode_seconds=traffic.decode_seconds,
        )

    def _account(
        self, record: IntervalRecord, traffic: Traffic, sync_seconds: float, controller_seconds: float
    ) -> None:
        totals = self.totals
        totals.tokens += record.tokens
        totals.syncs += 1
        totals.payload_tensors += 1
        totals.payload_bytes += record.payload_bytes
        totals.controller_seconds += controller_seconds
        self._add_traffic(traffic, sync_seconds)
        self.records.append(record)
        if self._writer is not None:
            self._writer.write(record)
        if self.on_record is not None:
            self.on_record(record)

    def _add_traffic(self, traffic: Traffic, seconds: float) -> None:
        totals = self.totals
        totals.wire_bytes += traffic.wire_bytes
        totals.sync_seconds += seconds
        totals.encode_seconds += traffic.encode_seconds
        totals.collective_seconds += traffic.collective_seconds
        totals.decode_seconds += traffic.decode_seconds

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Outer parameters, momentum, policy (controller, token mapper, rejected bound) and accounting (docs/algorithm.md §8.2).

        The workers' own parameters and inner optimizer states belong to the
        caller's checkpoint (the Trainer saves them).
        """
        return {
            "config": self.config.to_dict(),
            "step": self.step,
            "outer": self.outer.state_dict(),
            "policy": self.policy.state_dict() if self.policy else None,
            "current_interval": asdict(self._interval) if self._interval else None,
            "interval": {
                "tokens": list(self._tokens),
                "loss_sum": list(self._loss_sum),
                "loss_count": self._loss_count,
                "lr_mass": self._lr_mass,
            },
            "error_feedback": [f.state_dict() for f in self.error_feedback],
            "totals": self.totals.as_dict(),
            "records": [r.__dict__.copy() for r in self.records],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["config"]
        for key in ("method", "h_base", "q_h", "h_min", "h_max", "wire_dtype"):
            if saved.get(key) != getattr(self.config, key):
                raise ValueError(
                    f"checkpoint was written with {key}={saved.get(key)!r} but this run has "
                    f"{key}={getattr(self.config, key)!r}: resume with the same AutoLoCoConfig"
                )
        if state.get("overlap") is not None and self.config.overlap == Overlap.NONE:
            raise ValueError(
                f"checkpoint was written with overlap={state['overlap']['mode']!r} but this run has overlap='none': "
                "resume with the same AutoLoCoConfig"
            )
        self.outer.load_state_dict(state["outer"])
        if self.policy is not None:
            self.policy.load_state_dict(state["policy"])
        self.step = int(state["step"])
        for feedback, saved_feedback in zip(self.error_feedback, state["error_feedback"]):
            feedback.load_state_dict(saved_feedback)
        self.totals = RunTotals(**state["totals"])
        self.records = [IntervalRecord(**r) for r in state["records"]]
        if self._writer is not None:
            self._writer.restore(self.records)
        self._start_interval()
        saved_interval = state["current_interval"]
        self._interval = NextInterval(**saved_interval) if saved_interval else None  # the interval in flight
        interval = state["interval"]
        self._tokens = list(interval["tokens"])
        self._loss_sum = list(interval["loss_sum"])
        self._loss_count = int(interval["loss_count"])
        self._lr_mass = float(interval["lr_mass"])
