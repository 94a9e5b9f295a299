"""One worker per process over ``torch.distributed`` (gloo on CPU, NCCL on GPU).

FP32 travels as a flat, bucketed all-reduce; every lossy wire uses the paper's
owner-reduce aggregation (each worker owns a part of the buffer, decodes and
averages the contributions in FP32, encodes the mean once and sends it to
everybody) over ``all_to_all_single``. Its persistent buffers live here too:
they exist only for this communicator's collectives.
"""

from __future__ import annotations

import datetime
import socket
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

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
    collective_device,
    gathered_bytes_sent,
    peer_lost,
    sum_in_worker_order,
    worker_label,
)
from autoloco_hf.wire.accounting import wire_bytes_sent
from autoloco_hf.wire.formats.base import true_divide

if TYPE_CHECKING:
    from autoloco_hf.wire.codec import WireCodec

__all__ = ["ProcessGroupCommunicator"]


class ProcessGroupCommunicator(Communicator):
    """One worker per process over a ``torch.distributed`` process group.

    Args:
        group: the process group across workers (default: the world). With
            worker groups (docs/algorithm.md#worker-groups) it holds the ranks of equal local rank.
        wire_dtype: a wire format name (docs/algorithm.md#wire-codecs); ``topk_fraction`` sparsifies
            it (docs/algorithm.md#low-bit-wires).
        timeout_s: bound on every collective (``AutoLoCoConfig.sync_timeout_s``).
            Without ``group``, a new group over the world is created with this
            timeout (collective: every rank must build its communicator), so
            the bound does not depend on the launcher's default group timeout
            (``TrainingArguments.ddp_timeout``, 30 minutes by default). With a
            ``group``, that group must have been created with this timeout.
            A collective that fails or times out raises :class:`PeerLostError`.
        worker_rank: the global rank that names this process's worker in messages and records
            (a worker of several ranks: its first one); default this process's rank. Every
            worker's, with its host, is gathered once here (collective), so no sync carries text.
    """

    def __init__(
        self,
        group=None,
        timeout_s: float | None = None,
        worker_rank: int | None = None,
        **kwargs,
    ) -> None:
        import torch.distributed as dist

        super().__init__(**kwargs)
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialized: launch with torchrun / accelerate launch, "
                "or use SimulatedCommunicator for workers inside one process"
            )
        self.dist = dist
        if group is None and timeout_s is not None:
            ranks = list(range(dist.get_world_size()))
            group = dist.new_group(ranks, timeout=datetime.timedelta(seconds=timeout_s))
        self.group = group
        self.timeout_s = timeout_s
        self.num_workers = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.local_workers = 1
        # reused by the FP32 all-reduce and the lossy wires' owner-reduce, one per layout
        # (fragments: F of them)
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._owners: dict[tuple, _OwnerReduceBuffers] = {}
        # runs an overlapped owner-reduce of a lossy wire
        self._background: ThreadPoolExecutor | None = None
        # an overlapped all-gather's buffers, one per layout
        self._gathers: dict[tuple, _GatherBuffers] = {}
        # the aggregations started, by name: evidence for tests and benchmarks of which path ran
        self.aggregations: Counter[str] = Counter()
        identities: list[Any] = [None] * self.num_workers
        with self._guarded("the start-up exchange of ranks and host names"):
            me = dist.get_rank() if worker_rank is None else worker_rank
            dist.all_gather_object(identities, (me, socket.gethostname()), group=group)
        self._labels = [worker_label(w, rank, host) for w, (rank, host) in enumerate(identities)]

    def worker_labels(self) -> list[str]:
        return list(self._labels)

    def _carrier(self, device: torch.device) -> torch.device:
        return collective_device(str(self.dist.get_backend(self.group)), device)

    def global_worker(self, local: int) -> int:
        return self.rank

    def global_rank(self, worker: int) -> int:
        """The global rank of ``worker`` (its rank in this communicator's group)."""
        return self.dist.get_global_rank(self.group, worker) if self.group is not None else worker

    @contextmanager
    def _guarded(self, operation: str) -> Iterator[None]:
        """Turn a failed or timed-out collective into one :class:`PeerLostError` line that names the
        peers."""
        try:
            yield
        # gloo raises RuntimeError, NCCL DistBackendError (a RuntimeError)
        except RuntimeError as err:
            others = [self.global_rank(w) for w in range(self.num_workers) if w != self.rank]
            me = self.global_rank(self.rank)
            raise peer_lost(err, operation, me, others, self.timeout_s) from err

    def average(self, flats, scalars, segment_sizes, wire_dtype=None, check=None) -> AverageResult:
        if len(flats) != 1:
            raise ValueError("a process-group worker contributes exactly one buffer")
        flat = flats[0]
        wire = wire_dtype or self.wire_dtype
        traffic = Traffic()
        codec = self.codec(segment_sizes, wire)
        carrier = self._carrier(flat.device)
        with self._guarded("the synchronization's control messages"):
            gathered, _ = self._gather_scalars(scalars, carrier, async_op=False)
        sums, rows = _control_sums(gathered)
        # every worker holds the same rows: all raise alike, before the payload
        if gathered and check is not None:
            check(sums, rows)
        # a streaming fragment outside this rank's shard (and its group's): no payload
        if flat.numel() == 0:
            return AverageResult(flat.detach().clone(), sums, traffic, rows)
        staged = flat.to(carrier)
        with self._guarded("the synchronization's pseudo-gradient exchange"):
            if wire == WireDtype.FP32:
                mean = self._all_reduce_mean(staged, traffic)
            else:
                mean = self._owner_reduce_mean(staged, codec, traffic)
        traffic.wire_bytes = wire_bytes_sent(codec, self.num_workers, self.rank)
        return AverageResult(mean.to(flat.device), sums, traffic, rows)

    def sum_over_workers(self, rows: Sequence[torch.Tensor]) -> torch.Tensor:
        with self._guarded("a horizon rule's shared measurement"):
            gathered, _ = self._gather_scalars(rows, self._carrier(rows[0].device), async_op=False)
        return _control_sums(gathered)[0]

    def _all_reduce_mean(self, flat: torch.Tensor, traffic: Traffic) -> torch.Tensor:
        start = _now(flat)
        # one persistent buffer: a fresh allocation per sync costs as much as the all-reduce
        # itself on CPU
        key = (flat.shape, flat.device)
        if key not in self._buffers:
            self._buffers[key] = torch.empty_like(flat)
        total = self._buffers[key].copy_(flat)
        for work in self._start_all_reduce(total):
            work.wait()
        true_divide(total, self.num_workers, out=total)
        traffic.collective_seconds = _now(flat) - start
        return total

    def _owner_reduce_mean(
        self,
        flat: torch.Tensor,
        codec: WireCodec,
        traffic: Traffic,
    ) -> torch.Tensor:
        n, rank = self.num_workers, self.rank
        bufs = self._owner_buffers(codec, flat.device)
        my_start, my_end = bufs.parts[rank]
        my_numel = my_end - my_start

        tick = _now(flat)
        # my contribution to each owner, in place
        for (s, e), wire in zip(bufs.parts, bufs.by_part):
            codec.encode(flat[s:e], s, out=wire)
        traffic.encode_seconds += _now(flat) - tick

        self._exchange(
            bufs.by_part_flat, bufs.by_worker_flat, bufs.part_splits, bufs.worker_splits, traffic,
        )  # fmt: skip

        # decode + mean in worker order 0..N-1, as mean_in_worker_order does
        # (docs/algorithm.md#wire-codecs, #simulation)
        tick = _now(flat)
        total = codec.decode(bufs.by_worker[0], my_start, my_numel, out=bufs.total)
        for wire in bufs.by_worker[1:]:
            total += codec.decode(wire, my_start, my_numel, out=bufs.scratch)
        true_divide(total, n, out=total)
        traffic.decode_seconds += _now(flat) - tick

        tick = _now(flat)  # the owner's mean, encoded once, sent to every worker (itself included)
        codec.encode(total, my_start, out=bufs.by_worker[0])
        for wire in bufs.by_worker[1:]:
            for dst, src in zip(wire, bufs.by_worker[0]):
                dst.copy_(src)
        traffic.encode_seconds += _now(flat) - tick

        self._exchange(
            bufs.by_worker_flat, bufs.by_part_flat, bufs.worker_splits, bufs.part_splits, traffic,
        )  # fmt: skip

        tick = _now(flat)
        for (s, e), wire in zip(bufs.parts, bufs.by_part):
            codec.decode(wire, s, e - s, out=bufs.mean[s:e])
        traffic.decode_seconds += _now(flat) - tick
        return bufs.mean

    def _owner_buffers(self, codec: WireCodec, device: torch.device) -> _OwnerReduceBuffers:
        """Persistent wire buffers of the owner-reduce (fresh ones per sync cost more than the codec
        on CPU)."""
        key = (
            codec.segment_sizes,
            codec.wire_dtype,
            codec.block_size,
            codec.topk_fraction,
            self.num_workers,
            device,
        )
        if key not in self._owners:
            self._owners[key] = _OwnerReduceBuffers(key, codec, self.num_workers, self.rank, device)
        return self._owners[key]

    def _exchange(
        self,
        send: list[torch.Tensor],
        recv: list[torch.Tensor],
        send_splits: list[list[int]],
        recv_splits: list[list[int]],
        traffic: Traffic,
    ) -> None:
        """One ``all_to_all_single`` per wire tensor kind over contiguous buffers: split ``j`` goes
        to / comes from worker ``j``."""
        tick = _now(send[0])
        for out, inp, out_splits, in_splits in zip(recv, send, recv_splits, send_splits):
            self.dist.all_to_all_single(
                out,
                inp,
                output_split_sizes=out_splits,
                input_split_sizes=in_splits,
                group=self.group,
            )
        traffic.collective_seconds += _now(send[0]) - tick

    def broadcast_(self, tensor: torch.Tensor) -> None:
        staged = tensor.to(self._carrier(tensor.device))
        with self._guarded("the start-up broadcast of rank 0's parameters"):
            self.dist.broadcast(staged, src=self.global_rank(0), group=self.group)
        if staged is not tensor:
            tensor.copy_(staged)

    def start_average(self, flats, scalars, segment_sizes, wire_dtype=None) -> PendingAverage:
        """Start the average; the caller trains on until :meth:`PendingAverage.wait`
        (docs/algorithm.md#overlap).

        FP32: the control all-gather and the bucketed all-reduce run as
        ``async_op=True`` work handles. A lossy wire with ``overlap_aggregation="all_gather"``
        (the default): this worker's buffer is encoded here and all-gathered by
        ``async_op=True`` work handles; the decode and the sum wait for the merge
        (:meth:`_start_all_gather`). With ``"owner_reduce"``: the owner-reduce needs its two
        exchanges with a decode in between, so the whole blocking :meth:`average`
        runs on one background thread (the collectives and codec kernels release the
        GIL; on CUDA on a side stream of its own). Either way the inputs are copied or
        encoded first, so they may be reused once this returns, and every collective
        stays bounded by the group's ``sync_timeout_s``.
        """
        wire = WireDtype(wire_dtype or self.wire_dtype)
        if len(flats) != 1:
            raise ValueError("a process-group worker contributes exactly one buffer")
        if wire != WireDtype.FP32 and self.overlap_aggregation == OWNER_REDUCE:
            self.aggregations[OWNER_REDUCE] += 1
            return self._start_in_background(flats[0], scalars, segment_sizes, wire)
        if wire != WireDtype.FP32:
            self.aggregations[ALL_GATHER] += 1
            return self._start_all_gather(flats[0], scalars, self.codec(segment_sizes, wire))
        self.aggregations["all_reduce"] += 1
        flat = flats[0]
        sent = wire_bytes_sent(self.codec(segment_sizes, wire), self.num_workers, self.rank)
        traffic = Traffic(wire_bytes=sent)
        start = time.perf_counter()
        carrier = self._carrier(flat.device)
        gathered, gather_work = self._gather_scalars(scalars, carrier, async_op=True)
        # not the blocking path's reused buffer: it may run meanwhile
        total = flat.detach().to(carrier, copy=True)
        works = [w for w in (gather_work,) if w is not None]
        works += self._start_all_reduce(total) if total.numel() else []

        def finish() -> AverageResult:
            # bounded by the group's sync_timeout_s
            with self._guarded("the overlapped synchronization"):
                for work in works:
                    work.wait()
            true_divide(total, self.num_workers, out=total)
            # issue to completion, compute overlapped included
            traffic.collective_seconds = _now(total) - start
            sums, rows = _control_sums(gathered)
            return AverageResult(total.to(flat.device), sums, traffic, rows)

        return PendingAverage(finish)

    def _start_all_gather(
        self,
        flat: torch.Tensor,
        scalars: Sequence[torch.Tensor],
        codec: WireCodec,
    ) -> PendingAverage:
        """Encode this worker's buffer, start the all-gathers; the merge decodes all ``N`` in worker
        order.

        The buffer is encoded by the owner parts
        (:func:`~autoloco_hf.wire.codec.roundtrip_as_sent`'s layout), so error feedback keeps what
        this worker sent. At the merge every worker decodes the same ``N`` buffers and adds them in
        worker order, as :func:`~autoloco_hf.wire.codec.gathered_mean` does: bit-identical on every
        worker and in the simulation.
        """
        traffic = Traffic(wire_bytes=gathered_bytes_sent(codec, self.num_workers))
        start = time.perf_counter()
        carrier = self._carrier(flat.device)
        gathered, gather_work = self._gather_scalars(scalars, carrier, async_op=True)
        works = [w for w in (gather_work,) if w is not None]
        if flat.numel() == 0:  # a streaming fragment outside this rank's shard: no payload
            mean = flat.detach().clone()
        else:
            bufs = self._gather_buffers(codec, carrier)
            staged = flat.detach().to(carrier)
            tick = _now(staged)
            for (s, e), wire in zip(bufs.parts, bufs.sent):
                codec.encode(staged[s:e], s, out=wire)
            traffic.encode_seconds = _now(staged) - tick
            works += [
                self.dist.all_gather_single(received, sent, group=self.group, async_op=True)
                for received, sent in zip(bufs.received_flat, bufs.sent_flat)
            ]

        def finish() -> AverageResult:
            # bounded by the group's sync_timeout_s
            with self._guarded("the overlapped synchronization"):
                for work in works:
                    work.wait()
            # issue to completion, overlap included
            traffic.collective_seconds = time.perf_counter() - start
            sums, rows = _control_sums(gathered)
            if flat.numel() == 0:
                return AverageResult(mean, sums, traffic, rows)
            tick = _now(bufs.total)
            # worker 0's into the total, then add in worker order
            for worker, wires in enumerate(bufs.received):
                decoded = bufs.scratch if worker else bufs.total
                for (s, e), wire in zip(bufs.parts, wires):
                    codec.decode(wire, s, e - s, out=decoded[s:e])
                if worker:
                    bufs.total += decoded
            true_divide(bufs.total, self.num_workers, out=bufs.total)
            traffic.decode_seconds = _now(bufs.total) - tick
            return AverageResult(bufs.total.to(flat.device), sums, traffic, rows)

        return PendingAverage(finish)

    def _gather_buffers(self, codec: WireCodec, device: torch.device) -> _GatherBuffers:
        """Persistent buffers of the all-gather (one average of a layout is in flight at a time)."""
        key = (
            codec.segment_sizes,
            codec.wire_dtype,
            codec.block_size,
            codec.topk_fraction,
            self.num_workers,
            device,
        )
        if key not in self._gathers:
            self._gathers[key] = _GatherBuffers(codec, self.num_workers, device)
        return self._gathers[key]

    def _gather_scalars(
        self,
        scalars: Sequence[torch.Tensor],
        device: torch.device,
        async_op: bool,
    ) -> tuple[list[torch.Tensor], Any]:
        """One tiny float64 all-gather of the control messages (summed in worker order like the
        simulation, docs/algorithm.md#simulation)."""
        if not scalars:
            return [], None
        local = scalars[0].to(device=device, dtype=torch.float64).reshape(-1).clone()
        gathered = [torch.empty_like(local) for _ in range(self.num_workers)]
        return gathered, self.dist.all_gather(gathered, local, group=self.group, async_op=async_op)

    def _start_all_reduce(self, total: torch.Tensor) -> list[Any]:
        """The FP32 sum into ``total`` in place, one all-reduce per bucket, all in flight at
        once."""
        return [
            self.dist.all_reduce(bucket, group=self.group, async_op=True)
            for bucket in torch.split(total, self.bucket_elements)
        ]

    def _start_in_background(
        self,
        flat: torch.Tensor,
        scalars: Sequence[torch.Tensor],
        segment_sizes: Sequence[int],
        wire: WireDtype,
    ) -> PendingAverage:
        """Run the blocking owner-reduce of copies of the inputs on this communicator's sync thread.

        One thread, so overlapped averages run one at a time, in order, and the
        persistent owner-reduce buffers are never shared; nothing else uses this
        communicator's group meanwhile (the engine waits for an average before it
        starts the next one).
        """
        flat = flat.detach().clone()
        scalars = [s.detach().clone() for s in scalars]
        side = torch.cuda.Stream(flat.device) if flat.is_cuda else None
        if side is not None:  # the copies above are queued on the caller's stream
            side.wait_stream(torch.cuda.current_stream(flat.device))
        if self._background is None:
            self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autoloco-sync")

        def run() -> AverageResult:
            with torch.cuda.stream(side) if side is not None else nullcontext():
                return self.average([flat], scalars, segment_sizes, wire)

        future = self._background.submit(run)

        def finish() -> AverageResult:
            # re-raises the thread's PeerLostError / WorkerDisagreement here
            result = future.result()
            if side is not None:
                torch.cuda.current_stream(flat.device).wait_stream(side)
            return result

        return PendingAverage(finish)


def _control_sums(gathered: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The sums in worker order and every worker's row; empty without control messages."""
    if not gathered:
        return torch.zeros(0, dtype=torch.float64), torch.zeros(0, 0, dtype=torch.float64)
    return sum_in_worker_order(gathered).cpu(), torch.stack(gathered).cpu()


class _GatherBuffers:
    """Wire and FP32 buffers of one all-gather layout, allocated once and reused by every overlapped
    average.

    ``sent_flat``: this worker's encoded buffer, one contiguous tensor per wire tensor kind, its
    owner parts in order; ``sent``: per part, its views of them (what :meth:`WireCodec.encode`
    writes). ``received_flat``: the ``N`` workers' buffers, worker ``j``'s at ``j`` times a buffer's
    length; ``received[j]``: worker ``j``'s per-part views. ``total`` / ``scratch``: FP32
    accumulators of the whole buffer (``total`` holds the mean the merge returns, reused by the next
    average).
    """

    def __init__(self, codec: WireCodec, n: int, device: torch.device) -> None:
        self.parts = codec.partition(n)
        part_wires = [codec.empty_wire(s, e - s, "meta") for s, e in self.parts]
        sizes = [[wires[k].numel() for wires in part_wires] for k in range(len(part_wires[0]))]
        kinds = zip(sizes, part_wires[0])
        self.sent_flat = [torch.empty(sum(c), dtype=w.dtype, device=device) for c, w in kinds]
        self.received_flat = [
            torch.empty(n * sent.numel(), dtype=sent.dtype, device=device)
            for sent in self.sent_flat
        ]  # fmt: skip
        self.sent = self._per_part(self.sent_flat, sizes)
        self.received = [
            self._per_part(
                [
                    buf[j * sent.numel() : (j + 1) * sent.numel()]
                    for buf, sent in zip(self.received_flat, self.sent_flat)
                ],
                sizes,
            )
            for j in range(n)
        ]
        self.total = torch.empty(codec.numel, dtype=torch.float32, device=device)
        self.scratch = torch.empty(codec.numel, dtype=torch.float32, device=device)

    @staticmethod
    def _per_part(
        flat_by_kind: list[torch.Tensor],
        sizes: list[list[int]],
    ) -> list[list[torch.Tensor]]:
        """Per owner part, its views of the per-kind buffers (``sizes[kind][part]`` elements
        each)."""
        splits = (torch.split(buf, counts) for buf, counts in zip(flat_by_kind, sizes))
        return [list(ws) for ws in zip(*splits)]


class _OwnerReduceBuffers:
    """Wire and FP32 buffers of one owner-reduce layout, allocated once and reused by every sync.

    ``by_part``: the whole buffer's wire tensors, part ``j`` at its place (what a
    worker sends to the owners, and later receives from them): per kind one
    contiguous tensor, so ``all_to_all_single`` needs no concatenation.
    ``by_worker``: ``N`` copies of this rank's part (the contributions it receives as
    owner, then its encoded mean sent to everybody). ``total`` / ``scratch``: FP32
    accumulators of the owner's part; ``mean``: the decoded mean of the whole buffer.
    """

    def __init__(
        self,
        key: tuple,
        codec: WireCodec,
        n: int,
        rank: int,
        device: torch.device,
    ) -> None:
        self.key = key
        self.parts = codec.partition(n)
        my_start, my_end = self.parts[rank]
        my_numel = my_end - my_start
        part_wires = [codec.empty_wire(s, e - s, "meta") for s, e in self.parts]
        my_wire = part_wires[rank]
        self.by_part_flat = [
            torch.empty(sum(w[k].numel() for w in part_wires), dtype=w0.dtype, device=device)
            for k, w0 in enumerate(part_wires[0])
        ]
        self.by_worker_flat = [
            torch.empty(n * w.numel(), dtype=w.dtype, device=device) for w in my_wire
        ]  # fmt: skip
        by_part = (
            torch.split(buf, [w[k].numel() for w in part_wires])
            for k, buf in enumerate(self.by_part_flat)
        )  # fmt: skip
        self.by_part = [list(ws) for ws in zip(*by_part)]
        by_worker = (
            torch.split(buf, [w.numel()] * n) for buf, w in zip(self.by_worker_flat, my_wire)
        )  # fmt: skip
        self.by_worker = [list(ws) for ws in zip(*by_worker)]
        # per kind
        self.part_splits = [[w[k].numel() for w in part_wires] for k in range(len(my_wire))]
        self.worker_splits = [[w.numel()] * n for w in my_wire]
        self.total = torch.empty(my_numel, dtype=torch.float32, device=device)
        self.scratch = torch.empty(my_numel, dtype=torch.float32, device=device)
        self.mean = torch.empty(codec.numel, dtype=torch.float32, device=device)
