"""The displacement measurements a horizon rule asks for inside an interval (docs/algorithm.md
docs/algorithm.md#rule-plugins).

Kept out of the engine because only rules that look inside the interval use
them, and because the shared ones are a collective of their own between syncs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from autoloco_hf.algorithm.rules import Delivery, Measured

if TYPE_CHECKING:
    from autoloco_hf.algorithm.policies import IntervalPolicy, NextInterval
    from autoloco_hf.sync.communicators.base import Communicator
    from autoloco_hf.sync.engine.interval_state import IntervalCounters
    from autoloco_hf.sync.outer import OuterOptimizer

__all__ = ["DisplacementMeasurements"]


class DisplacementMeasurements:
    """Measures ``||theta_t - theta^i||^2`` at the steps the policy's rule requested.

    A ``BOUNDARY`` request stays local: its displacements travel with the
    interval's control message (the first one only). ``SHARED`` requests are
    summed over the workers in one all-reduce at the last one's step, so every
    worker hands the rule the same numbers and all of them change the interval,
    or none.
    """

    def __init__(
        self,
        policy: IntervalPolicy,
        comm: Communicator,
        outer: OuterOptimizer,
        worker_params: Sequence[Sequence[torch.Tensor]],
    ) -> None:
        self.policy = policy
        self.comm = comm
        self.outer = outer
        self.worker_params = worker_params

    def serve(
        self, interval: NextInterval, counters: IntervalCounters, elapsed: int
    ) -> NextInterval:  # fmt: skip
        """Record the measurements due ``elapsed`` steps into ``interval``; the interval to run."""
        requests = self.policy.measurements(interval)
        due = [r for r in requests if r.step == elapsed]
        if not due:
            return interval
        norms = self.displacement_sq_norms()
        for request in due:
            if request.delivery == Delivery.BOUNDARY and counters.anchor_sq_norms is None:
                counters.anchor_sq_norms, counters.anchor_lr_mass = norms, counters.lr_mass
            elif request.delivery == Delivery.SHARED:
                counters.shared[request.step] = (norms, counters.lr_mass)
        steps = sorted({r.step for r in requests if r.delivery == Delivery.SHARED})
        if not steps or elapsed != steps[-1] or any(step not in counters.shared for step in steps):
            return interval
        rows = [
            torch.tensor([counters.shared[step][0][worker] for step in steps], dtype=torch.float64)
            for worker in range(len(norms))
        ]
        sums = self.comm.sum_over_workers(rows).tolist()
        shared = counters.shared
        results = tuple(Measured(step, total, shared[step][1]) for step, total in zip(steps, sums))
        return self.policy.on_measurement(interval, results)

    def displacement_sq_norms(self) -> list[float]:
        """Each local worker's ``||theta_t - theta^i||^2`` (of this rank's shard)."""
        return [_sq_norm(self.outer.pseudo_gradient(params)) for params in self.worker_params]


def _sq_norm(delta: torch.Tensor) -> float:
    """``||delta||^2``, taken in float64 as the control messages are."""
    return float(torch.linalg.vector_norm(delta, dtype=torch.float64)) ** 2
