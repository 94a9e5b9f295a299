"""FP32 outer parameters and the Nesterov outer step (docs/algorithm.md#outer-correction).

The synchronized parameters ``theta_t`` live in one flat FP32 buffer (optionally
in host memory), whatever the dtype of the worker model. The outer step is
``torch.optim.SGD(nesterov=True)`` on that buffer with ``lr`` and ``momentum``
set on its param group for each step, which makes it bit-exact with DiLoCo's
reference implementation (docs/algorithm.md#outer-correction, last paragraphs). QSR and Linear
Interval average models directly (docs/algorithm.md#baselines).

Example::

    >>> import torch
    >>> model = torch.nn.Linear(2, 1)
    >>> outer = OuterOptimizer(list(model.parameters()), lr=0.7, momentum=0.9)
    >>> with torch.no_grad():
    ...     _ = model.weight.add_(1.0)
    >>> delta = outer.pseudo_gradient(list(model.parameters()))
    >>> outer.step(delta, lr=0.7, momentum=0.9)
    >>> outer.write_back(list(model.parameters()))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def flatten_fp32(
    params: Sequence[torch.Tensor],
    device: torch.device | None = None,
    shard: tuple[int, int] | None = None,
) -> torch.Tensor:
    """One flat FP32 copy of ``params`` (on ``device``, default the params' device).

    ``shard = (start, end)`` copies only that range of the flat concatenation,
    reading just the tensors that overlap it.
    """
    device = device or params[0].device
    if shard is None:
        return torch.cat(
            [p.detach().reshape(-1).to(device=device, dtype=torch.float32) for p in params]
        )
    start, end = shard
    pieces, offset = [], 0
    for p in params:
        lo, hi = max(start, offset), min(end, offset + p.numel())
        if hi > lo:
            pieces.append(
                p.detach()
                .reshape(-1)[lo - offset : hi - offset]
                .to(device=device, dtype=torch.float32)
            )
        offset += p.numel()
    if not pieces:
        return torch.zeros(0, dtype=torch.float32, device=device)
    return torch.cat(pieces)


def broadcast_initial_parameters(
    communicator: Any, worker_params: Sequence[Sequence[torch.Tensor]]
) -> None:
    """Every local worker starts from worker 0's parameters
    (docs/algorithm.md#interval-statistics: one ``theta_0``)."""
    flat = flatten_fp32(worker_params[0])
    communicator.broadcast_(flat)
    sizes = [p.numel() for p in worker_params[0]]
    with torch.no_grad():
        for params in worker_params:
            for p, chunk in zip(params, torch.split(flat, sizes)):
                p.copy_(chunk.view_as(p))


class OuterOptimizer:
    """Holds ``theta_t`` and the outer momentum; computes pseudo-gradients and applies outer steps.

    Args:
        params: the worker model's parameters (their current values become ``theta_0``).
        lr, momentum: initial outer learning rate and momentum (overridden per step).
        device: where the FP32 outer state lives (``"cpu"`` to offload).
        shard: ``(start, end)`` of the flat model this rank owns (worker groups
            with the hierarchical sync, docs/algorithm.md#worker-groups): the outer parameters,
            momentum and pseudo-gradients cover only that range.
        spans: the ``(start, end)`` ranges of the streaming fragments (docs/algorithm.md#fragments)
            in this optimizer's buffer (the shard's, when sharded), each stepped on its own with its
            own momentum; ``None``: one piece.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        lr: float = 0.7,
        momentum: float = 0.9,
        device: torch.device | str | None = None,
        shard: tuple[int, int] | None = None,
        spans: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else params[0].device
        self.numels = [p.numel() for p in params]
        self.shard = shard
        self.params = flatten_fp32(params, self.device, shard).requires_grad_(True)
        # one leaf view of theta per fragment, each in its own
        # param group: SGD keeps one momentum per fragment
        self._pieces = (
            [self.params]
            if spans is None
            else [self.params.detach()[s:e].requires_grad_() for s, e in spans]
        )
        self.optimizer = torch.optim.SGD(
            [{"params": [p]} for p in self._pieces], lr=lr, momentum=momentum, nesterov=True
        )

    @property
    def numel(self) -> int:
        return self.params.numel()

    @property
    def momentum_buffer(self) -> torch.Tensor | None:
        """The outer momentum (fragments: theirs in order, zeros
        for one not stepped yet; ``None`` before any step)."""
        buffers = [self.optimizer.state.get(p, {}).get("momentum_buffer") for p in self._pieces]
        if len(buffers) == 1 or all(b is None for b in buffers):
            return buffers[0]
        return torch.cat(
            [torch.zeros_like(p) if b is None else b for p, b in zip(self._pieces, buffers)]
        )

    @torch.no_grad()
    def pseudo_gradient(
        self, local_params: Sequence[torch.Tensor], span: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """``Delta^i = theta_t - theta_t^i`` as a flat FP32 tensor
        (docs/algorithm.md#interval-statistics), or its ``span``.

        ``span``: a range of the flat model (inside the shard, when sharded).
        """
        if span is None:
            return self.params.detach() - flatten_fp32(local_params, self.device, self.shard)
        start, end = span
        offset = self.shard[0] if self.shard is not None else 0
        return self.params.detach()[start - offset : end - offset] - flatten_fp32(
            local_params, self.device, span
        )

    @torch.no_grad()
    def step(
        self,
        mean_pseudo_grad: torch.Tensor,
        lr: float,
        momentum: float,
        grad_divisor: float | None = None,
        fragment: int = 0,
    ) -> None:
        """Nesterov outer step on the averaged pseudo-gradient (docs/algorithm.md#outer-correction)
        of the whole or of ``fragment``.

        ``grad_divisor`` (``rho_t + eps``) applies pseudo-gradient normalization.
        The momentum buffer is not rescaled when ``momentum`` changes.
        """
        grad = mean_pseudo_grad.to(self.device, torch.float32)
        if grad_divisor is not None:
            grad = grad / grad_divisor
        piece = self._pieces[fragment]
        group = self.optimizer.param_groups[fragment]
        group["lr"], group["momentum"] = lr, momentum
        piece.grad = grad
        self.optimizer.step()  # the other fragments have no gradient: SGD leaves them alone
        piece.grad = None

    @torch.no_grad()
    def lookahead(
        self,
        mean_pseudo_grad: torch.Tensor,
        lr: float,
        momentum: float,
        grad_divisor: float | None = None,
    ) -> torch.Tensor:
        """What :meth:`step` would make of ``theta`` on this
        pseudo-gradient, with ``theta`` and the momentum untouched.

        The eager overlap starts each worker's next interval from such a step on
        its own estimate of the mean (docs/algorithm.md#overlap-checkpoints); running the same
        SGD code on copies keeps it bit-exact with the step taken later.
        """
        shadow = OuterOptimizer(
            [self.params.detach()], lr=lr, momentum=momentum, device=self.device
        )
        if self.momentum_buffer is not None:
            shadow.optimizer.state[shadow.params]["momentum_buffer"] = self.momentum_buffer.clone()
        shadow.step(mean_pseudo_grad, lr, momentum, grad_divisor)
        return shadow.params.detach()

    @torch.no_grad()
    def average_step(self, mean_pseudo_grad: torch.Tensor, fragment: int = 0) -> None:
        """Direct model averaging (QSR, Linear Interval):
        ``theta <- theta - mean Delta`` (of ``fragment``)."""
        self._pieces[fragment].sub_(mean_pseudo_grad.to(self.device, torch.float32))

    @torch.no_grad()
    def write_back(
        self, params: Sequence[torch.Tensor], full: torch.Tensor | None = None, first: int = 0
    ) -> None:
        """Copy ``theta_{t+1}`` into a worker model (cast to its dtype and device).

        A sharded optimizer needs ``full``, the flat model gathered from all shards.
        ``first``: ``params`` and ``full`` start at that parameter (a fragment's).
        """
        if full is None:
            if self.shard is not None:
                raise ValueError(
                    "a sharded OuterOptimizer writes back the gathered model: pass full="
                )
            full = self.params.detach()
        for p, chunk in zip(params, torch.split(full, self.numels[first : first + len(params)])):
            p.copy_(chunk.view_as(p))

    def state_dict(self) -> dict[str, Any]:
        return {"params": self.params.detach().clone(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["params"].shape != self.params.shape:
            raise ValueError(
                f"the checkpoint holds outer parameters of shape {tuple(state['params'].shape)} "
                f"but this rank owns {tuple(self.params.shape)}: resume with the same "
                "ranks_per_worker and hierarchical_sync"
            )
        with torch.no_grad():
            self.params.copy_(state["params"])
        self.optimizer.load_state_dict(state["optimizer"])
        for piece in self._pieces:  # SGD.load_state_dict casts state to the param's device
            buffer = self.optimizer.state.get(piece, {}).get("momentum_buffer")
            if buffer is not None:
                self.optimizer.state[piece]["momentum_buffer"] = buffer.to(
                    self.device, torch.float32
                )
