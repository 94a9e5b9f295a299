"""Several simulated runs stepped as one batched computation, for the campaigns on one device.

:class:`BatchedRuns` steps several runs that share the initial model, the batches, the
inner schedule and the budget, each with its own config and engine, as one
:class:`~autoloco_hf.sync.workers.replicas.ReplicaStack` of ``runs x N`` replicas: a grid of
outer settings in one computation. (One run's workers stepped so:
``LocalWorkers(..., batched=True)``.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from autoloco_hf.algorithm.schedule import SchedulerPreview
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.schedules.factory import make_engine
from autoloco_hf.sync.workers.replicas import (
    LossFn,
    ReplicaStack,
    batch_tokens,
    causal_lm_loss,
    constant_schedule,
    refuse_unequal_steps,
)

if TYPE_CHECKING:
    from autoloco_hf.config import AutoLoCoConfig
    from autoloco_hf.state.records import IntervalRecord


class BatchedRuns:
    """Several runs of ``workers`` simulated workers, stepped as one stack of replicas.

    The runs share the initial ``model``, the batches of every step, the inner optimizer's
    settings, its schedule and the budget; each has its own config and engine (its outer
    settings and horizon rule). Run ``r``'s workers are ``stack.models[r * workers : (r + 1)
    * workers]``. Gradient averaging (DDP) and ``pacing='budget'`` are refused. An invalid
    interval of one run zeroes the non-finite state of the shared inner optimizer: only
    non-finite entries change, as in the per-run loop.
    """

    def __init__(
        self,
        configs: Sequence[AutoLoCoConfig],
        model: torch.nn.Module,
        workers: int,
        optimizer_factory: Callable[[Any], torch.optim.Optimizer],
        total_steps: int,
        scheduler_factory: Callable[[torch.optim.Optimizer], Any] = constant_schedule,
        loss_fn: LossFn = causal_lm_loss,
        max_grad_norm: float | None = None,
        records_paths: Sequence[str | None] | None = None,
    ) -> None:
        for config in configs:
            refuse_unequal_steps(config)
            if not config.is_interval_method:
                method = f"method={config.method}"
                raise ValueError(f"batched runs: {method} averages gradients; use LocalWorkers")
        self.workers = workers
        self.loss_fn = loss_fn
        self.max_grad_norm = max_grad_norm
        count = len(configs) * workers
        self.stack = ReplicaStack(model, count, optimizer_factory, scheduler_factory)
        paths = records_paths or [None] * len(configs)
        self.engines = [
            make_engine(
                config,
                self.stack.models[r * workers : (r + 1) * workers],
                SchedulerPreview(self.stack.scheduler, total_steps),
                SimulatedCommunicator(workers),
                total_steps,
                optimizers=[self.stack.optimizer],
                records_path=path,
            )
            for r, (config, path) in enumerate(zip(configs, paths))
        ]
        self.last_losses: list[list[float]] = []

    def run_models(self) -> list[torch.nn.Module]:
        """Each run's first worker (after the budget's last sync, all its workers hold theta)."""
        return self.stack.models[:: self.workers]

    def train_step(self, batches: Sequence[Any]) -> list[IntervalRecord | None]:
        """One optimizer step of every worker of every run (worker ``i`` reads ``batches[i]``)."""
        if len(batches) != self.workers:
            raise ValueError(f"got {len(batches)} batches for {self.workers} workers per run")
        losses, shares = self.stack.forward_backward(
            list(batches) * len(self.engines), self.loss_fn
        )
        tokens = [batch_tokens(b) for b in batches]
        seconds = shares[: self.workers]
        lr = self.stack.step(self.max_grad_norm)
        w = self.workers
        self.last_losses = [losses[r * w : (r + 1) * w] for r in range(len(self.engines))]
        return [
            engine.after_optimizer_step(tokens, run_losses, lr=lr, seconds=seconds)
            for engine, run_losses in zip(self.engines, self.last_losses)
        ]
