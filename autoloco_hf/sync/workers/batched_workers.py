"""Simulated workers stepped as one batched computation, for the campaigns on one device.

:class:`~autoloco_hf.sync.workers.local_workers.LocalWorkers` steps its ``N`` replicas one after
the other: ``N`` forward/backward passes and ``N`` AdamW steps per optimizer step, each a
Python round trip (on a GPU, a string of small kernel launches). Here each parameter is
stacked across the replicas into one ``[R, ...]`` leaf tensor. One ``torch.vmap`` of
``torch.func.functional_call`` gives every replica's loss on its own batch, one backward
every replica's gradient, and one inner optimizer over the stacked tensors steps them
all. AdamW is elementwise, so one AdamW over ``[R, ...]`` tensors is ``R`` AdamWs with
the same learning rate, weight decay, eps and step count (bias correction).

Each replica's ``nn.Module`` keeps parameters that are views into the stacked tensors,
so the sync engine reads and writes them in place as it does ``LocalWorkers``'. Results
match the per-worker loop within float rounding, not bit for bit: batched kernels may
reduce in another order (tests/sync/workers/test_batched_workers.py measures the difference).

:class:`BatchedWorkers` is ``LocalWorkers`` with that step (one run).
:class:`BatchedRuns` steps several runs that share the initial model, the batches, the
inner schedule and the budget, each with its own config and engine, as one stack of
``runs x N`` replicas: a grid of outer settings in one computation.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.func import functional_call

from autoloco_hf.algorithm.schedule import SchedulerPreview
from autoloco_hf.config import AutoLoCoConfig, Pacing
from autoloco_hf.sync.communicators import Communicator, SimulatedCommunicator
from autoloco_hf.sync.schedules.factory import make_engine
from autoloco_hf.sync.workers.local_workers import (
    LocalWorkers,
    LossFn,
    batch_tokens,
    causal_lm_loss,
    constant_schedule,
)

if TYPE_CHECKING:
    from autoloco_hf.state.records import IntervalRecord

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: max_norm / (norm + eps)


class _LossOf(torch.nn.Module):
    """``loss_fn(model, batch)`` as a module, so ``functional_call`` can swap its parameters."""

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: Any) -> torch.Tensor:
        return self.loss_fn(self.model, batch)


class ReplicaStack:
    """``count`` copies of ``model`` whose parameters live stacked in ``[count, ...]`` leaf tensors.

    ``models[i]``'s parameters are views of row ``i``: in-place writes on either side are
    seen by the other. The inner optimizer and its scheduler are built once, over the
    stacked tensors.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        count: int,
        optimizer_factory: Callable[[Any], torch.optim.Optimizer],
        scheduler_factory: Callable[[torch.optim.Optimizer], Any],
    ) -> None:
        self.models = [copy.deepcopy(model) for _ in range(count)]
        named = [dict(m.named_parameters()) for m in self.models]  # tied weights appear once
        self.params: dict[str, torch.Tensor] = {}
        for name in named[0]:
            self.params[name] = torch.stack([n[name].detach() for n in named]).requires_grad_(True)
        for name, stacked in self.params.items():
            for row, replica in enumerate(named):
                replica[name].data = stacked.data[row]
        self.optimizer = optimizer_factory(list(self.params.values()))
        self.scheduler = scheduler_factory(self.optimizer)
        self._loss_fn: LossFn | None = None
        self._losses: Callable[..., torch.Tensor] | None = None

    @property
    def count(self) -> int:
        return len(self.models)

    def forward_backward(self, batches: Sequence[Any], loss_fn: LossFn) -> list[float]:
        """Each replica's loss on its batch (``batches[i]``); the gradients land in ``.grad``."""
        if len(batches) != self.count:
            raise ValueError(f"got {len(batches)} batches for {self.count} replicas")
        if loss_fn is not self._loss_fn:  # one vmapped function per loss: build it once
            self._loss_fn = loss_fn
            module = _LossOf(self.models[0], loss_fn)

            def loss(params: dict[str, torch.Tensor], batch: Any) -> torch.Tensor:
                renamed = {f"model.{name}": value for name, value in params.items()}
                return functional_call(module, renamed, (batch,))

            self._losses = torch.vmap(loss)
        self.models[0].train()
        stacked = {key: torch.stack([b[key] for b in batches]) for key in batches[0]}
        losses = self._losses(self.params, stacked)
        losses.sum().backward()  # loss i depends on row i only: each row gets its own gradient
        return losses.detach().tolist()

    def clip_grad_norms(self, max_norm: float) -> None:
        """``clip_grad_norm_`` of each replica on its own gradient (over all its parameters)."""
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        per_tensor = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads], 1)
        coef = (max_norm / (torch.linalg.vector_norm(per_tensor, dim=1) + CLIP_EPS)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))

    def expose_grads(self) -> None:
        """Give each replica's parameters ``.grad`` views of the stacked gradients (for DDP)."""
        for name, stacked in self.params.items():
            for row, model in enumerate(self.models):
                model.get_parameter(name).grad = stacked.grad[row]

    def step(self, max_grad_norm: float | None) -> float:
        """Clip (per replica), step the optimizer and the schedule; returns the step's LR."""
        if max_grad_norm is not None:
            self.clip_grad_norms(max_grad_norm)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return lr


def refuse_unequal_steps(config: AutoLoCoConfig) -> None:
    if config.pacing == Pacing.BUDGET:
        raise ValueError(
            "batched workers: pacing='budget' gives the workers unequal inner steps, which one "
            "batched step cannot take; use LocalWorkers (the per-worker loop) for it"
        )


class BatchedWorkers(LocalWorkers):
    """:class:`LocalWorkers` with its ``N`` replicas stepped as one batched computation (one run).

    Same arguments and results as ``LocalWorkers`` (within float rounding), for the lockstep
    :meth:`train_step` only: ``pacing='budget'`` is refused. ``optimizers`` and
    ``schedulers`` hold one element each, the optimizer over the stacked parameters.
    """

    def __init__(
        self,
        config: AutoLoCoConfig,
        model: torch.nn.Module,
        communicator: Communicator,
        **kwargs: Any,
    ) -> None:
        refuse_unequal_steps(config)
        super().__init__(config, model, communicator, **kwargs)

    def _replicas(
        self,
        model: torch.nn.Module,
        count: int,
        optimizer_factory: Callable[[Any], torch.optim.Optimizer],
        scheduler_factory: Callable[[torch.optim.Optimizer], Any],
    ) -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer], list[Any]]:
        self.stack = ReplicaStack(model, count, optimizer_factory, scheduler_factory)
        return self.stack.models, [self.stack.optimizer], [self.stack.scheduler]

    def train_step(self, batches: Sequence[Any]) -> IntervalRecord | None:
        """One optimizer step of every local worker on its batch; returns a record at a sync."""
        if len(batches) != len(self.models):
            raise ValueError(f"got {len(batches)} batches for {len(self.models)} local workers")
        started = time.perf_counter()
        losses = self.stack.forward_backward(batches, self.loss_fn)
        tokens = [batch_tokens(b) for b in batches]
        # a batch has no per-worker time: each worker gets an equal share
        measured = [(time.perf_counter() - started) / len(batches)] * len(batches)
        seconds = self._seconds([1] * len(self.models), measured)
        if self.engine.averages_gradients:
            self.stack.expose_grads()
            self.engine.average_gradients()
        self.last_losses = losses
        lr = self.stack.step(self.max_grad_norm)
        return self.engine.after_optimizer_step(tokens, losses, lr=lr, seconds=seconds)

    def train_paced(self, next_batch: Callable[[int], Any]) -> IntervalRecord | None:
        refuse_unequal_steps(self.config)  # a config changed after construction is refused here
        raise ValueError("batched workers: train_paced needs pacing='budget', which they refuse")


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
        started = time.perf_counter()
        losses = self.stack.forward_backward(list(batches) * len(self.engines), self.loss_fn)
        tokens = [batch_tokens(b) for b in batches]
        seconds = [(time.perf_counter() - started) / self.stack.count] * self.workers
        lr = self.stack.step(self.max_grad_norm)
        w = self.workers
        self.last_losses = [losses[r * w : (r + 1) * w] for r in range(len(self.engines))]
        return [
            engine.after_optimizer_step(tokens, run_losses, lr=lr, seconds=seconds)
            for engine, run_losses in zip(self.engines, self.last_losses)
        ]
