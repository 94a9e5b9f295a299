"""The DDP baseline: no intervals and no outer state; every step's gradients are averaged
(docs/algorithm.md#baselines)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from autoloco_hf.config import AutoLoCoConfig, WireDtype
from autoloco_hf.state.checkpoint import check_config
from autoloco_hf.state.records import IntervalRecord, RunTotals
from autoloco_hf.sync.communicators.base import Communicator, Traffic
from autoloco_hf.sync.engine.contract import check_workers
from autoloco_hf.sync.outer import broadcast_initial_parameters
from autoloco_hf.wire.accounting import payload_bytes, wire_bytes_sent

__all__ = ["GradientAveragingEngine"]


class GradientAveragingEngine:
    """Counts the steps and the per-step FP32 gradient all-reduce of the DDP baseline.

    It has the read side of :class:`~autoloco_hf.sync.engine.engine.IntervalEngine` (``step``,
    ``totals``, ``records``, ``current_interval``, ``state_dict``), so callers need no branch
    beyond :attr:`averages_gradients`.
    """

    averages_gradients = True
    current_interval = None
    in_flight = None
    outer = None

    def __init__(
        self,
        config: AutoLoCoConfig,
        models: Sequence[torch.nn.Module],
        communicator: Communicator,
        total_steps: int,
    ) -> None:
        check_workers(config, models, communicator, total_steps)
        self.config = config
        self.comm = communicator
        self.total_steps = total_steps
        self.worker_params = [list(m.parameters()) for m in models]
        self.segment_sizes = [p.numel() for p in self.worker_params[0]]
        self.totals = RunTotals()
        self.records: list[IntervalRecord] = []
        self.step = 0
        broadcast_initial_parameters(communicator, self.worker_params)

    @property
    def num_workers(self) -> int:
        return self.comm.num_workers

    def after_optimizer_step(
        self,
        tokens: Sequence[int],
        losses: Sequence[float],
        lr: float | None = None,
        steps: Sequence[int] | None = None,
        seconds: Sequence[float] | None = None,
    ) -> IntervalRecord | None:
        """Count the step (every worker takes one: gradients
        are averaged at each); no interval to account."""
        if self.step >= self.total_steps:
            raise RuntimeError(
                f"step {self.step} is past the training budget of {self.total_steps} steps"
            )
        self.step += 1
        self.totals.steps = self.step
        return None

    @torch.no_grad()
    def average_gradients(self) -> None:
        """Replace every local worker's gradients by the all-worker mean (once per step)."""
        grads = [
            torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                    for p in params
                ]
            )
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
        """Count one per-step FP32 gradient all-reduce, ours or torch DDP's (ring bytes)."""
        if traffic is None:
            codec = self.comm.codec(self.segment_sizes, WireDtype.FP32)
            traffic = Traffic(wire_bytes=wire_bytes_sent(codec, self.comm.num_workers))
        self.totals.add_sync(
            payload_bytes(1, sum(self.segment_sizes), WireDtype.FP32), traffic, seconds
        )

    def state_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "step": self.step, "totals": self.totals.as_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_config("the engine state", state["config"], self.config)
        self.step = int(state["step"])
        self.totals = RunTotals(**state["totals"])
