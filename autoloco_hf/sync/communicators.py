"""Communicators: one collective per synchronization, real or simulated (spec 2, 7, 8.4).

Both implementations average the workers' flat FP32 pseudo-gradients and sum
a small float64 vector of per-worker scalars (squared norms, token counts,
loss sums, a non-finite flag, the executed horizon for the agreement check).

* :class:`ProcessGroupCommunicator` uses ``torch.distributed`` (gloo on CPU,
  NCCL on GPU): FP32 as a flat, bucketed all-reduce; BF16 and INT8 with the
  paper's owner-reduce aggregation (each worker owns a part of the buffer,
  decodes and averages the contributions in FP32, encodes the mean once and
  sends it to everybody) over ``all_to_all_single``.
* :class:`SimulatedCommunicator` does the same arithmetic, in the same order,
  for ``N`` replicas held in one process, so ``N`` simulated workers reproduce
  ``N`` processes bit for bit (FP32 exactly for ``N = 2``, where the all-reduce
  sum has a single order; BF16/INT8 for any ``N``).

Wire bytes count what one worker sends to the others: for the FP32 all-reduce
the ring algorithm's ``2 (N-1)/N`` times the buffer, for owner-reduce the exact
sizes of the ``all_to_all`` splits leaving the worker.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from autoloco_hf.config import AutoLoCoConfig, WireDtype
from autoloco_hf.sync.accounting import wire_bytes_sent
from autoloco_hf.sync.codec import (
    WireCodec,
    mean_in_worker_order,
    owner_reduce_mean,
    owner_reduce_part,
)


def _now(tensor: torch.Tensor) -> float:
    """Wall clock after the tensor's device has finished its queued work (CUDA kernels run asynchronously)."""
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
    return time.perf_counter()


@dataclass
class Traffic:
    """Cost of one synchronization for one worker."""

    wire_bytes: int = 0
    encode_seconds: float = 0.0
    collective_seconds: float = 0.0
    decode_seconds: float = 0.0


@dataclass
class AverageResult:
    mean: torch.Tensor  # decoded mean (FP32, identical on all workers); may be a buffer reused by the next call
    scalar_sums: torch.Tensor  # float64 sums over all workers, added in worker order
    traffic: Traffic
    # float64 (num_workers, len(scalars)): every worker's scalars in worker order, so that callers can
    # check that values which must agree (the executed interval) do agree; (0, 0) without scalars
    scalar_rows: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.float64))


class PendingAverage:
    """An average in flight (overlapped synchronization, docs/algorithm.md §11).

    :meth:`wait` blocks until the collective has completed and returns its
    :class:`AverageResult`; later calls return the same result, so a checkpoint
    may wait for it before the training loop does.
    """

    def __init__(self, finish: Callable[[], AverageResult]) -> None:
        self._finish: Optional[Callable[[], AverageResult]] = finish
        self._result: Optional[AverageResult] = None

    @classmethod
    def completed(cls, result: AverageResult) -> "PendingAverage":
        pending = cls(lambda: result)
        pending.wait()
        return pending

    def wait(self) -> AverageResult:
        if self._finish is not None:
            self._result, self._finish = self._finish(), None
        assert self._result is not None
        return self._result


def sum_in_worker_order(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """Float64 ``v0 + v1 + ... + v_{N-1}`` in this fixed order on both paths.

    An all-reduce picks its own addition order (gloo's differs from the simulation's
    for N >= 3), so the scalar sums would differ in the last bit of the squared norms
    and loss sums; gathering the N tiny vectors and adding them in worker order keeps
    the simulation and N processes bit-identical (spec 8.4).
    """
    total = values[0].to(torch.float64, copy=True)
    for v in values[1:]:
        total += v.to(torch.float64)
    return total


class Communicator(ABC):
    """Averages flat buffers across all workers; ``local_workers`` of them live in this process."""

    num_workers: int
    local_workers: int

    def __init__(self, wire_dtype: str = WireDtype.FP32, block_size: int = 4096, bucket_size_mb: float = 64.0) -> None:
        self.wire_dtype = WireDtype(wire_dtype)
        self.block_size = block_size
        self.bucket_elements = max(1, int(bucket_size_mb * 2**20 / 4))
        self._codec: Optional[WireCodec] = None

    def codec(self, segment_sizes: Sequence[int], wire_dtype: Optional[str] = None) -> WireCodec:
        """The wire codec for a flat buffer made of ``segment_sizes`` tensors (built once per layout and wire)."""
        wire = wire_dtype or self.wire_dtype
        if self._codec is None or self._codec.segment_sizes != tuple(segment_sizes) or self._codec.wire_dtype != wire:
            self._codec = WireCodec(wire, segment_sizes, self.block_size)
        return self._codec

    def start_average(
        self,
        flats: Sequence[torch.Tensor],
        scalars: Sequence[torch.Tensor],
        segment_sizes: Sequence[int],
        wire_dtype: Optional[str] = None,
    ) -> PendingAverage:
        """Start :meth:`average` without waiting for it; the inputs may be reused once this returns.

        This default computes the average at once: the simulation applies it at
        the step the engine says it is due, which models an asynchronous
        collective's timing exactly (docs/algorithm.md §11).
        """
        return PendingAverage.completed(self.average(flats, scalars, segment_sizes, wire_dtype))

    @abstractmethod
    def average(
        self,
        flats: Sequence[torch.Tensor],
        scalars: Sequence[torch.Tensor],
        segment_sizes: Sequence[int],
        wire_dtype: Optional[str] = None,
    ) -> AverageResult:
        """Mean of all workers' ``flats`` and sum of their ``scalars`` (one entry per local worker)."""

    @abstractmethod
    def broadcast_(self, tensor: torch.Tensor) -> None:
        """Make ``tensor`` identical on all workers (worker 0's value)."""


class SimulatedCommunicator(Communicator):
    """``N`` workers inside one process (the paper's simulation, spec 8.4)."""

    def __init__(self, num_workers: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_workers = num_workers
        self.local_workers = num_workers

    def average(self, flats, scalars, segment_sizes, wire_dtype=None) -> AverageResult:
        if len(flats) != self.num_workers:
            raise ValueError(f"expected {self.num_workers} contributions, got {len(flats)}")
        wire = wire_dtype or self.wire_dtype
        traffic = Traffic()
        start = _now(flats[0])
        codec = self.codec(segment_sizes, wire)
        mean = mean_in_worker_order(flats) if wire == WireDtype.FP32 else owner_reduce_mean(codec, flats)
        traffic.wire_bytes = wire_bytes_sent(codec, self.num_workers, worker=0)
        traffic.collective_seconds = _now(flats[0]) - start
        if not scalars:
            return AverageResult(mean, torch.zeros(0, dtype=torch.float64), traffic)
        rows = torch.stack([s.to(torch.float64).reshape(-1) for s in scalars])
        return AverageResult(mean, sum_in_worker_order(scalars), traffic, rows)

    def broadcast_(self, tensor: torch.Tensor) -> None:
        pass  # replicas in one process are built from one initialization


class ProcessGroupCommunicator(Communicator):
    """One worker per process over a ``torch.distributed`` process group.

    Args:
        group: the process group across workers (default: the world). With
            worker groups (spec 8.3) it holds the ranks of equal local rank.
        wire_dtype: ``fp32``, ``bf16`` or ``int8`` (spec 7).
    """

    def __init__(self, group=None, **kwargs) -> None:
        import torch.distributed as dist

        super().__init__(**kwargs)
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialized: launch with torchrun / accelerate launch, "
                "or use SimulatedCommunicator for workers inside one process"
            )
        self.dist = dist
        self.group = group
        self.num_workers = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.local_workers = 1
        self._buffer: Optional[torch.Tensor] = None  # reused by the FP32 all-reduce

    def average(self, flats, scalars, segment_sizes, wire_dtype=None) -> AverageResult:
        if len(flats) != 1:
            raise ValueError("a process-group worker contributes exactly one buffer")
        flat = flats[0]
        wire = wire_dtype or self.wire_dtype
        traffic = Traffic()
        sums = torch.zeros(0, dtype=torch.float64)
        rows = torch.zeros(0, 0, dtype=torch.float64)
        if scalars:  # one tiny float64 all-gather, summed in worker order like the simulation (spec 2, 8.4)
            local = scalars[0].to(device=flat.device, dtype=torch.float64).reshape(-1).contiguous()
            gathered = [torch.empty_like(local) for _ in range(self.num_workers)]
            self.dist.all_gather(gathered, local, group=self.group)
            sums = sum_in_worker_order(gathered).cpu()
            rows = torch.stack(gathered).cpu()
        codec = self.codec(segment_sizes, wire)
        if wire == WireDtype.FP32:
            mean = self._all_reduce_mean(flat, traffic)
        else:
            mean = self._owner_reduce_mean(flat, codec, traffic)
        traffic.wire_bytes = wire_bytes_sent(codec, self.num_workers, self.rank)
        return AverageResult(mean, sums, traffic, rows)

    def _all_reduce_mean(self, flat: torch.Tensor, traffic: Traffic) -> torch.Tensor:
        start = _now(flat)
        # one persistent buffer: a fresh allocation per sync costs as much as the all-reduce itself on CPU
        if self._buffer is None or self._buffer.shape != flat.shape or self._buffer.device != flat.device:
            self._buffer = torch.empty_like(flat)
        total = self._buffer.copy_(flat)
        works = [
            self.dist.all_reduce(bucket, group=self.group, async_op=True)
            for bucket in torch.split(total, self.bucket_elements)
        ]
        for work in works:
            work.wait()
        total /= self.num_workers
        traffic.collective_seconds = _now(flat) - start
        return total

    def _owner_reduce_mean(self, flat: torch.Tensor, codec: WireCodec, traffic: Traffic) -> torch.Tensor:
        n, rank = self.num_workers, self.rank
        parts = codec.partition(n)
        my_start, my_end = parts[rank]

        tick = _now(flat)
        outgoing = [codec.encode(flat[s:e], s) for s, e in parts]  # my contribution to each owner
        traffic.encode_seconds += _now(flat) - tick

        incoming = [codec.empty_wire(my_start, my_end - my_start, flat.device) for _ in range(n)]
        self._exchange(outgoing, incoming, traffic)

        tick = _now(flat)
        decoded = [codec.decode(wire, my_start, my_end - my_start) for wire in incoming]
        traffic.decode_seconds += _now(flat) - tick

        tick = _now(flat)
        my_mean_wire = owner_reduce_part(codec, decoded, my_start)  # FP32 mean, encoded once
        traffic.encode_seconds += _now(flat) - tick

        gathered = [codec.empty_wire(s, e - s, flat.device) for s, e in parts]
        self._exchange([my_mean_wire] * n, gathered, traffic)

        tick = _now(flat)
        mean = torch.empty_like(flat)
        for (s, e), wire in zip(parts, gathered):
            mean[s:e] = codec.decode(wire, s, e - s)
        traffic.decode_seconds += _now(flat) - tick
        return mean

    def _exchange(
        self, outgoing: list[list[torch.Tensor]], incoming: list[list[torch.Tensor]], traffic: Traffic
    ) -> None:
        """``all_to_all_single`` per wire tensor kind: ``outgoing[j]`` goes to worker ``j``, ``incoming[j]`` comes from it."""
        tick = _now(outgoing[0][0])
        for kind in range(len(outgoing[0])):
            send = torch.cat([wire[kind].reshape(-1) for wire in outgoing])
            recv = torch.empty(sum(w[kind].numel() for w in incoming), dtype=send.dtype, device=send.device)
            self.dist.all_to_all_single(
                recv,
                send,
                output_split_sizes=[w[kind].numel() for w in incoming],
                input_split_sizes=[w[kind].numel() for w in outgoing],
                group=self.group,
            )
            for target, chunk in zip(incoming, torch.split(recv, [w[kind].numel() for w in incoming])):
                target[kind].copy_(chunk.view_as(target[kind]))
        traffic.collective_seconds += _now(outgoing[0][0]) - tick

    def broadcast_(self, tensor: torch.Tensor) -> None:
        self.dist.broadcast(tensor, src=self.dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group)

    def start_average(self, flats, scalars, segment_sizes, wire_dtype=None) -> PendingAverage:
        """FP32: the control all-gather and the bucketed all-reduce run as ``async_op=True`` work handles.

        The flat buffer is copied into a buffer of its own, so the caller may go
        on training while the collective runs. BF16/INT8 owner-reduce needs its
        two exchanges with a decode in between: it completes here (not overlapped).
        """
        wire = WireDtype(wire_dtype or self.wire_dtype)
        if wire != WireDtype.FP32:
            return super().start_average(flats, scalars, segment_sizes, wire)
        if len(flats) != 1:
            raise ValueError("a process-group worker contributes exactly one buffer")
        flat = flats[0]
        traffic = Traffic(wire_bytes=wire_bytes_sent(self.codec(segment_sizes, wire), self.num_workers, self.rank))
        start = time.perf_counter()
        gathered: list[torch.Tensor] = []
        works = []
        if scalars:
            local = scalars[0].to(device=flat.device, dtype=torch.float64).reshape(-1).clone()
            gathered = [torch.empty_like(local) for _ in range(self.num_workers)]
            works.append(self.dist.all_gather(gathered, local, group=self.group, async_op=True))
        total = flat.detach().clone()  # not the blocking path's reused buffer: it may run meanwhile
        works += [
            self.dist.all_reduce(bucket, group=self.group, async_op=True)
            for bucket in torch.split(total, self.bucket_elements)
        ]

        def finish() -> AverageResult:
            for work in works:
                work.wait()
            total.div_(self.num_workers)
            traffic.collective_seconds = _now(total) - start  # issue to completion, compute overlapped included
            if not gathered:
                return AverageResult(total, torch.zeros(0, dtype=torch.float64), traffic)
            return AverageResult(total, sum_in_worker_order(gathered).cpu(), traffic, torch.stack(gathered).cpu())

        return PendingAverage(finish)


def make_communicator(
    config: AutoLoCoConfig, distributed: bool, simulated_workers: int = 1, group: Any = None
) -> Communicator:
    """The communicator of a run of ``config``, with its wire dtype, INT8 block size and bucket size.

    ``distributed``: one worker per process over ``torch.distributed`` (``group``,
    default the world); else ``simulated_workers`` workers inside this process.
    """
    kwargs = dict(wire_dtype=config.wire_dtype, block_size=config.int8_block_size, bucket_size_mb=config.bucket_size_mb)
    if distributed:
        return ProcessGroupCommunicator(group=group, **kwargs)
    return SimulatedCommunicator(simulated_workers, **kwargs)
