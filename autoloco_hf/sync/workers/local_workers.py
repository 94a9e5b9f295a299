"""A plain PyTorch training loop for the workers of one process (docs/algorithm.md#simulation).

:class:`LocalWorkers` owns the process's worker replicas, each with its own
inner optimizer and LR scheduler, and the engine
(:func:`~autoloco_hf.sync.schedules.factory.make_engine`) that synchronizes them. With
:class:`SimulatedCommunicator` it holds ``N`` replicas (the paper's simulation on one device); with
:class:`ProcessGroupCommunicator` it holds the one worker of this process. Both run the same code,
so the two modes give the same parameters.

Example::

    >>> import torch
    >>> from autoloco_hf import AutoLoCoConfig
    >>> from autoloco_hf.sync.communicators import SimulatedCommunicator
    >>> workers = LocalWorkers(
    ...     AutoLoCoConfig(method="diloco", h_base=4),
    ...     torch.nn.Linear(3, 1),
    ...     SimulatedCommunicator(2),
    ...     optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    ...     total_steps=8,
    ...     loss_fn=lambda model, batch: (model(batch["x"]) - batch["y"]).pow(2).mean())
    >>> for step in range(8):
    ...     batch = {"x": torch.ones(2, 3), "y": torch.zeros(2, 1),
    ...              "attention_mask": torch.ones(2, 3)}
    ...     _ = workers.train_step([batch, batch])
    >>> workers.engine.totals.syncs
    2
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from autoloco_hf.algorithm.policies import PolicyFactory, make_policy
from autoloco_hf.algorithm.schedule import SchedulerPreview
from autoloco_hf.sync.pacing import VirtualClock
from autoloco_hf.sync.schedules.factory import make_engine
from autoloco_hf.sync.snapshot import BoundarySnapshot, Snapshot
from autoloco_hf.sync.workers.replicas import (
    LoopedReplicas,
    LossFn,
    Replicas,
    ReplicaStack,
    batch_tokens,
    causal_lm_loss,
    constant_schedule,
    forward_backward,
    refuse_unequal_steps,
)

if TYPE_CHECKING:
    from autoloco_hf.config import AutoLoCoConfig
    from autoloco_hf.state.records import IntervalRecord
    from autoloco_hf.sync.communicators.base import Communicator


class LocalWorkers:
    """Replicas of ``model`` (one per local worker) trained
    with their own optimizers and synchronized by the engine.

    Args:
        config: the run's :class:`AutoLoCoConfig`.
        model: the initial model; each local worker trains a deep copy.
        communicator: ``SimulatedCommunicator(N)`` or ``ProcessGroupCommunicator()``.
        optimizer_factory: builds a worker's inner optimizer from its parameters.
        scheduler_factory: builds a worker's LR scheduler (default constant).
        total_steps: training budget in optimizer steps.
        loss_fn: ``loss_fn(model, batch) -> loss`` (default: ``model(**batch).loss``).
        max_grad_norm: clip each worker's gradient norm before
            its optimizer step (``None``: no clipping).
        warmup_steps, records_path, on_record, policy_factory: passed to
            :func:`~autoloco_hf.sync.schedules.factory.make_engine`.
        snapshot_dir: write a :class:`~autoloco_hf.sync.snapshot.BoundarySnapshot` there at every
            boundary (pass it on one process only); :meth:`close` waits for the last one.
        batched: step the replicas as one batched computation
            (:class:`~autoloco_hf.sync.workers.replicas.ReplicaStack`: one stacked optimizer and
            scheduler, results equal within float rounding) instead of one after the other;
            ``pacing='budget'`` is refused with it.

    After :meth:`train_step`, ``last_losses`` holds each local worker's loss of that step (its mean
    over the step's inner steps with :meth:`train_paced`). With ``config.worker_speeds`` every
    worker is timed on a :class:`~autoloco_hf.sync.pacing.VirtualClock`, else by the wall clock.
    """

    def __init__(
        self,
        config: AutoLoCoConfig,
        model: torch.nn.Module,
        communicator: Communicator,
        optimizer_factory: Callable[[Any], torch.optim.Optimizer],
        total_steps: int,
        scheduler_factory: Callable[[torch.optim.Optimizer], Any] = constant_schedule,
        loss_fn: LossFn = causal_lm_loss,
        max_grad_norm: float | None = None,
        warmup_steps: int | None = None,
        records_path: str | None = None,
        on_record: Callable[[IntervalRecord], None] | None = None,
        snapshot_dir: str | None = None,
        policy_factory: PolicyFactory = make_policy,
        batched: bool = False,
    ) -> None:
        self.config = config
        if batched:
            refuse_unequal_steps(config)
        kind = ReplicaStack if batched else LoopedReplicas
        self.replicas: Replicas = kind(
            model, communicator.local_workers, optimizer_factory, scheduler_factory
        )
        self.models, self.optimizers, self.schedulers = (
            self.replicas.models,
            self.replicas.optimizers,
            self.replicas.schedulers,
        )
        self.loss_fn = loss_fn
        self.max_grad_norm = max_grad_norm
        self.last_losses: list[float] = []
        self.engine = make_engine(
            config,
            self.models,
            SchedulerPreview(self.schedulers[0], total_steps),
            communicator,
            total_steps,
            warmup_steps=warmup_steps,
            optimizers=self.optimizers,
            records_path=records_path,
            on_record=on_record,
            policy_factory=policy_factory,
        )
        self.clock = VirtualClock.of(config, communicator)
        self.snapshot: BoundarySnapshot | None = None
        if snapshot_dir is not None:
            self.snapshot = BoundarySnapshot(
                snapshot_dir, self.engine, extra_state=self._shared_schedule_state
            )
            self.engine.listeners.append(self.snapshot)

    def _shared_schedule_state(self) -> dict[str, Any]:
        """Every worker's LR scheduler is at the same step: one copy is shared state."""
        return {"scheduler": self.schedulers[0].state_dict()}

    @property
    def step(self) -> int:
        return self.engine.step

    def _seconds(self, steps: Sequence[int], measured: Sequence[float]) -> list[float]:
        """Each worker's time on its steps: the virtual clock's
        when speeds are simulated, else ``measured``."""
        return self.clock.seconds(self.step, steps) if self.clock is not None else list(measured)

    def train_step(self, batches: Sequence[Any]) -> IntervalRecord | None:
        """One optimizer step of every local worker on its batch; returns a record at a sync."""
        if len(batches) != len(self.models):
            raise ValueError(f"got {len(batches)} batches for {len(self.models)} local workers")
        losses, measured = self.replicas.forward_backward(batches, self.loss_fn)
        tokens = [batch_tokens(b) for b in batches]
        seconds = self._seconds([1] * len(self.models), measured)
        if self.engine.averages_gradients:
            self.replicas.expose_grads()
            self.engine.average_gradients()
        self.last_losses = losses
        lr = self.replicas.step(self.max_grad_norm)
        return self.engine.after_optimizer_step(tokens, losses, lr=lr, seconds=seconds)

    def train_paced(self, next_batch: Callable[[int], Any]) -> IntervalRecord | None:
        """One step of the run with ``pacing="budget"``: each local worker takes the inner steps its
        share of the interval gives it now (0, 1 or more, :meth:`IntervalEngine.steps_due`), on
        batches drawn from ``next_batch(worker)``, at the run's current learning rate
        (docs/algorithm.md#pacing-mechanism); returns a record at a sync.
        """
        if isinstance(self.replicas, ReplicaStack):
            refuse_unequal_steps(self.config)  # a config changed after construction is refused here
            raise ValueError(
                "batched workers: train_paced needs pacing='budget'; use batched=False"
            )
        due = self.engine.steps_due()
        lr = float(self.optimizers[0].param_groups[0]["lr"])
        losses, tokens, measured = (
            [0.0] * len(self.models),
            [0] * len(self.models),
            [0.0] * len(self.models),
        )
        last = []
        for i, (model, optimizer) in enumerate(zip(self.models, self.optimizers)):
            started = time.perf_counter()
            for _ in range(due[i]):
                batch = next_batch(i)
                loss, count = forward_backward(model, batch, self.loss_fn), batch_tokens(batch)
                if self.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses[i] += loss
                tokens[i] += count
            measured[i] = time.perf_counter() - started
            last.append(losses[i] / due[i] if due[i] else float("nan"))
        self.last_losses = last
        # the schedule follows the run's steps, whoever took the inner ones
        for scheduler in self.schedulers:
            scheduler.step()
        seconds = self._seconds(due, measured)
        return self.engine.after_optimizer_step(tokens, losses, lr=lr, steps=due, seconds=seconds)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume mid-interval:
        replicas, inner optimizers, schedulers, engine."""
        return {
            "models": [m.state_dict() for m in self.models],
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "engine": self.engine.state_dict(),
        }

    def resume_from_snapshot(
        self, snapshot: Snapshot, optimizer_states: Sequence[dict[str, Any]] | None = None
    ) -> None:
        """Go on from a boundary snapshot, with this object's number of workers
        (docs/algorithm.md#boundary-snapshots).

        Every worker restarts from ``theta_t`` at the snapshot's step (its data
        position) with its LR scheduler there. Its inner optimizer starts fresh
        (zero AdamW moments) unless ``optimizer_states`` gives each worker's
        state at that boundary (same number of workers), which makes the resume
        bit-exact with the run that wrote the snapshot.
        """
        if optimizer_states is not None and len(optimizer_states) != len(self.optimizers):
            raise ValueError(
                f"{len(optimizer_states)} optimizer states for {len(self.optimizers)} local "
                "workers: carry the inner state only when resuming with the same workers, else "
                "pass none (fresh moments)"
            )
        self.engine.resume_at_boundary(snapshot.engine_state)
        for optimizer, scheduler, optimizer_state in zip(
            self.optimizers, self.schedulers, optimizer_states or [None] * len(self.optimizers)
        ):
            scheduler.load_state_dict(snapshot.state["scheduler"])
            if optimizer_state is not None:
                optimizer.load_state_dict(optimizer_state)
            else:  # the scheduler's state does not set the optimizer's learning rate
                for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
                    group["lr"] = lr

    def close(self) -> None:
        """Wait for the last boundary snapshot (raising its write error, if any)."""
        if self.snapshot is not None:
            self.snapshot.close()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for model, s in zip(self.models, state["models"]):
            model.load_state_dict(s)
        for optimizer, s in zip(self.optimizers, state["optimizers"]):
            optimizer.load_state_dict(s)
        for scheduler, s in zip(self.schedulers, state["schedulers"]):
            scheduler.load_state_dict(s)
        self.engine.load_state_dict(state["engine"])
