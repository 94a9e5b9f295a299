"""``N`` workers in one process: the same arithmetic, in the same order, as ``N`` processes.

Kept apart from the process-group communicator so the simulation can be read
on its own: it is the reference every distributed path must match bit for bit
(FP32 exactly for ``N = 2``, where the all-reduce sum has a single order; the
lossy wires for any ``N``).
"""

from __future__ import annotations

import torch

from autoloco_hf.config import WireDtype
from autoloco_hf.sync.communicators.base import (
    ALL_GATHER,
    OWNER_REDUCE,
    AverageResult,
    Communicator,
    PendingAverage,
    Traffic,
    _now,
    gathered_bytes_sent,
    sum_in_worker_order,
)
from autoloco_hf.wire.accounting import wire_bytes_sent
from autoloco_hf.wire.codec import gathered_mean, mean_in_worker_order, owner_reduce_mean

__all__ = ["SimulatedCommunicator"]


class SimulatedCommunicator(Communicator):
    """``N`` workers inside one process (the paper's simulation, docs/algorithm.md#simulation)."""

    def __init__(self, num_workers: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_workers = num_workers
        self.local_workers = num_workers

    def average(self, flats, scalars, segment_sizes, wire_dtype=None, check=None) -> AverageResult:
        return self._average(flats, scalars, segment_sizes, wire_dtype, check, OWNER_REDUCE)

    def start_average(self, flats, scalars, segment_sizes, wire_dtype=None) -> PendingAverage:
        """At once, with the aggregation of an overlapped average (``overlap_aggregation``) as N
        processes run it."""
        aggregation = self.overlap_aggregation
        result = self._average(flats, scalars, segment_sizes, wire_dtype, None, aggregation)
        return PendingAverage.completed(result)

    def _average(
        self,
        flats,
        scalars,
        segment_sizes,
        wire_dtype,
        check,
        aggregation: str,
    ) -> AverageResult:
        if len(flats) != self.num_workers:
            raise ValueError(f"expected {self.num_workers} contributions, got {len(flats)}")
        if scalars and check is not None:
            check(
                sum_in_worker_order(scalars),
                torch.stack([s.to(torch.float64).reshape(-1) for s in scalars]),
            )
        wire = wire_dtype or self.wire_dtype
        traffic = Traffic()
        start = _now(flats[0])
        codec = self.codec(segment_sizes, wire)
        if wire == WireDtype.FP32:
            mean = mean_in_worker_order(flats)
            traffic.wire_bytes = wire_bytes_sent(codec, self.num_workers, worker=0)
        elif aggregation == ALL_GATHER:
            mean = gathered_mean(codec, flats)
            traffic.wire_bytes = gathered_bytes_sent(codec, self.num_workers)
        else:
            mean = owner_reduce_mean(codec, flats)
            traffic.wire_bytes = wire_bytes_sent(codec, self.num_workers, worker=0)
        traffic.collective_seconds = _now(flats[0]) - start
        if not scalars:
            return AverageResult(mean, torch.zeros(0, dtype=torch.float64), traffic)
        rows = torch.stack([s.to(torch.float64).reshape(-1) for s in scalars])
        return AverageResult(mean, sum_in_worker_order(scalars), traffic, rows)

    def broadcast_(self, tensor: torch.Tensor) -> None:
        pass  # replicas in one process are built from one initialization
