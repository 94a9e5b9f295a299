"""The replicas of the local workers and how one optimizer step runs them.

Two strategies share one interface (:class:`Replicas`), and :class:`LocalWorkers`
holds one of them:

* :class:`LoopedReplicas`: one model, inner optimizer and LR scheduler per worker,
  stepped one after the other (``N`` forward/backward passes and ``N`` AdamW steps).
* :class:`ReplicaStack`: each parameter stacked across the replicas into one
  ``[N, ...]`` leaf tensor. One ``torch.vmap`` of ``torch.func.functional_call`` gives
  every replica's loss on its own batch, one backward every replica's gradient, and one
  AdamW over the stacked tensors steps them all. AdamW is elementwise, so that is ``N``
  AdamWs with the same learning rate, weight decay, eps and step count. Each replica's
  ``nn.Module`` keeps parameters that are views into the stacked tensors, so the engine
  reads and writes them in place. Results match the loop within float rounding, not bit
  for bit: batched kernels may reduce in another order
  (tests/sync/workers/test_batched_workers.py measures the difference).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.func import functional_call

from autoloco_hf.algorithm.token_mapper import count_non_padding_tokens
from autoloco_hf.config import Pacing

if TYPE_CHECKING:
    from autoloco_hf.config import AutoLoCoConfig

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


def causal_lm_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """The loss of a ``transformers`` model called on a batch with ``labels``."""
    return model(**batch).loss


def batch_tokens(batch: Any) -> int:
    """The non-padding tokens of one worker's batch (docs/algorithm.md#token-mapper)."""
    count = count_non_padding_tokens(batch)
    if count is None:
        raise ValueError(
            "cannot count the batch's tokens (docs/algorithm.md#token-mapper): give it an "
            "attention_mask, input_ids or inputs_embeds"
        )
    return int(count)


def constant_schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def forward_backward(model: torch.nn.Module, batch: Any, loss_fn: LossFn) -> float:
    """One model's loss on one batch; its gradients accumulate into ``model``."""
    model.train()
    loss = loss_fn(model, batch)
    loss.backward()
    return float(loss.detach())


class Replicas(Protocol):
    """The local workers' models, inner optimizers and LR schedulers, and one step of them all."""

    models: list[torch.nn.Module]
    optimizers: list[torch.optim.Optimizer]
    schedulers: list[Any]

    def forward_backward(
        self, batches: Sequence[Any], loss_fn: LossFn
    ) -> tuple[list[float], list[float]]:
        """Each replica's loss on its batch and its seconds; the gradients land in ``.grad``."""
        ...

    def expose_grads(self) -> None:
        """Give each replica's parameters their own ``.grad`` (for gradient averaging)."""
        ...

    def step(self, max_grad_norm: float | None) -> float:
        """Clip each replica's gradient, step the optimizers
        and schedules; returns the step's LR."""
        ...


class LoopedReplicas:
    """One deep copy of ``model`` per worker, each with its own optimizer and scheduler."""

    def __init__(
        self,
        model: torch.nn.Module,
        count: int,
        optimizer_factory: Callable[[Any], torch.optim.Optimizer],
        scheduler_factory: Callable[[torch.optim.Optimizer], Any],
    ) -> None:
        self.models = [copy.deepcopy(model) for _ in range(count)]
        self.optimizers = [optimizer_factory(m.parameters()) for m in self.models]
        self.schedulers = [scheduler_factory(o) for o in self.optimizers]

    def forward_backward(
        self, batches: Sequence[Any], loss_fn: LossFn
    ) -> tuple[list[float], list[float]]:
        losses, seconds = [], []
        for model, batch in zip(self.models, batches):
            started = time.perf_counter()
            losses.append(forward_backward(model, batch, loss_fn))
            seconds.append(time.perf_counter() - started)
        return losses, seconds

    def expose_grads(self) -> None:
        """Each replica already holds its own gradients."""

    def step(self, max_grad_norm: float | None) -> float:
        if max_grad_norm is not None:
            for model in self.models:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        lr = float(self.optimizers[0].param_groups[0]["lr"])
        for optimizer, scheduler in zip(self.optimizers, self.schedulers):
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        return lr


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
        # one of each, over the stack
        self.optimizers, self.schedulers = [self.optimizer], [self.scheduler]
        self._loss_fn: LossFn | None = None
        self._losses: Callable[..., torch.Tensor] | None = None

    @property
    def count(self) -> int:
        return len(self.models)

    def forward_backward(
        self, batches: Sequence[Any], loss_fn: LossFn
    ) -> tuple[list[float], list[float]]:
        """Each replica's loss on its batch (``batches[i]``)
        and its seconds; the gradients land in ``.grad``.

        A batched step has no per-replica time: each replica gets an equal share.
        """
        started = time.perf_counter()
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
        share = (time.perf_counter() - started) / self.count
        return losses.detach().tolist(), [share] * self.count

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
    """One batched step cannot give the workers unequal inner steps."""
    if config.pacing == Pacing.BUDGET:
        raise ValueError(
            "batched workers: pacing='budget' gives the workers unequal inner steps, which one "
            "batched step cannot take; use LocalWorkers with batched=False (the per-worker loop)"
        )
