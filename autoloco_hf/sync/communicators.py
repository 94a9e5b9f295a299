"""Communicators: one collective per synchronization, real or simulated (docs/algorithm.md §2, 7, 8.4).

Both implementations average the workers' flat FP32 pseudo-gradients and sum
a small float64 vector of per-worker scalars (squared norms, token counts,
loss sums, a non-finite flag, the executed horizon for the agreement check).

* :class:`ProcessGroupCommunicator` uses ``torch.distributed`` (gloo on CPU,
  NCCL on GPU): FP32 as a flat, bucketed all-reduce; every lossy wire with the
  paper's owner-reduce aggregation (each worker owns a part of the buffer,
  decodes and averages the contributions in FP32, encodes the mean once and
  sends it to everybody) over ``all_to_all_single``.
* :class:`SimulatedCommunicator` does the same arithmetic, in the same order,
  for ``N`` replicas held in one process, so ``N`` simulated workers reproduce
  ``N`` processes bit for bit (FP32 exactly for ``N = 2``, where the all-reduce
  sum has a single order; the lossy wires for any ``N``).

Wire bytes count what one worker sends to the others: for the FP32 all-reduce
the ring algorithm's ``2 (N-1)/N`` times the buffer, for owner-reduce the exact
sizes of the ``all_to_all`` splits leaving the worker.
"""

from __future__ import annotations

import datetime
import re
import socket
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from autoloco_hf.config import AutoLoCoConfig, CodecKernel, WireDtype
from autoloco_hf.sync.accounting import wire_bytes_sent
from autoloco_hf.sync.codec import (
    WireCodec,
    balanced_parts,
    gathered_mean,
    mean_in_worker_order,
    owner_reduce_mean,
)
from autoloco_hf.sync.formats.base import true_divide


def _now(tensor: torch.Tensor) -> float:
    """Wall clock after the current stream has finished its queued work (CUDA kernels run asynchronously).

    Only the current stream: an overlapped sync runs on a side stream of its own and
    must not wait for the training kernels queued meanwhile.
    """
    if tensor.is_cuda:
        torch.cuda.current_stream(tensor.device).synchronize()
    return time.perf_counter()


def collective_device(backend: str, device: torch.device) -> torch.device:
    """Where a collective of a group with ``backend`` (``dist.get_backend``) runs on a tensor held on ``device``.

    An NCCL-only group (what ``accelerate launch`` and the recipes start on GPUs) carries GPU tensors only, so
    a tensor in host memory (the outer state with ``outer_on_cpu=True``, the control messages) travels
    through the current GPU and comes back; gloo (alone or in ``"cpu:gloo,cuda:nccl"``) carries it as it is.
    """
    if device.type == "cpu" and "gloo" not in backend.lower() and "mpi" not in backend.lower():
        return torch.device("cuda")  # the current GPU (``torch.cuda.set_device``), as NCCL uses it
    return device


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


class PeerLostError(RuntimeError):
    """A collective did not complete: a peer died, was partitioned away, or did not answer within the timeout.

    ``silent_ranks`` are the global ranks that may not have answered (exact with
    two workers; with more, the backend does not say which peer was missing, so
    all the others are listed). The message is one line.
    """

    def __init__(self, message: str, silent_ranks: Sequence[int]) -> None:
        super().__init__(message)
        self.silent_ranks = list(silent_ranks)

    def at(self, where: str, advice: str = "") -> PeerLostError:
        """The same error, prefixed with where the run was (step, interval) and followed by what to do."""
        return PeerLostError(f"{where}: {self}" + (f"; {advice}" if advice else ""), self.silent_ranks)


_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*")  # gloo's "[/path/pair.cc:78] " prefix


def describe_backend_error(err: BaseException) -> str:
    """The backend's first sentence without its C++ source location (one line for the user)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return _SOURCE_PREFIX.sub("", text).split(". ")[0]


def peer_lost(
    err: BaseException, operation: str, rank: int, others: Sequence[int], timeout_s: float | None
) -> PeerLostError:
    """The one-line :class:`PeerLostError` for a collective of ``rank`` with ``others`` that failed with ``err``."""
    who = f"rank {others[0]}" if len(others) == 1 else f"one of ranks {list(others)} (the backend does not say which)"
    detail = describe_backend_error(err)
    if any(word in detail.lower() for word in ("closed", "reset")):
        what = "closed its connection (its process ended)"
    else:
        what = "did not answer" + (f" within sync_timeout_s={timeout_s:g}" if timeout_s is not None else "")
    return PeerLostError(f"{operation} on rank {rank}: {who} {what} ({detail})", others)


# How an overlapped average of a lossy wire aggregates (docs/algorithm.md §11). ALL_GATHER, the default:
# every worker's encoded buffer reaches every worker through asynchronous all-gathers started by the
# training thread, decoded and summed in worker order at the merge, with no Python work between the
# exchanges. OWNER_REDUCE: the blocking average's owner-reduce (two exchanges with a decode and an encode
# between them) on a background thread; it rounds the mean once more, so its bits differ.
ALL_GATHER = "all_gather"
OWNER_REDUCE = "owner_reduce"
OVERLAP_AGGREGATIONS = (ALL_GATHER, OWNER_REDUCE)


def gathered_bytes_sent(codec: WireCodec, num_workers: int) -> int:
    """Bytes one worker sends in the all-gather of the encoded buffers: ``N - 1`` whole buffers (a ring).

    Every worker's buffer has the same size (the owner parts' layout), and each receives the
    ``N - 1`` others' as many bytes. Owner-reduce sends about ``2 (N-1)/N`` buffers instead: the same
    for two workers, fewer for more (:func:`~autoloco_hf.sync.accounting.wire_bytes_sent`).
    """
    whole = sum(codec.wire_bytes(s, e - s) for s, e in codec.partition(num_workers))
    return (num_workers - 1) * whole


# check(sums, rows) run on the gathered scalars before the payload is exchanged (see Communicator.average)
ScalarCheck = Callable[[torch.Tensor, torch.Tensor], None]


class PendingAverage:
    """An average in flight (overlapped synchronization, docs/algorithm.md §11).

    :meth:`wait` blocks until the collective has completed and returns its
    :class:`AverageResult`; later calls return the same result, so a checkpoint
    may wait for it before the training loop does.
    """

    def __init__(self, finish: Callable[[], AverageResult]) -> None:
        self._finish: Callable[[], AverageResult] | None = finish
        self._result: AverageResult | None = None

    @classmethod
    def completed(cls, result: AverageResult) -> PendingAverage:
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
    the simulation and N processes bit-identical (docs/algorithm.md §8.4).
    """
    total = values[0].to(torch.float64, copy=True)
    for v in values[1:]:
        total += v.to(torch.float64)
    return total


def worker_label(worker: int, rank: int, host: str) -> str:
    """How logs, errors and records name a worker: its index, global rank and host, so an operator can find it."""
    return f"worker {worker} (rank {rank}, host {host})"


class Communicator(ABC):
    """Averages flat buffers across all workers; ``local_workers`` of them live in this process."""

    num_workers: int
    local_workers: int

    def __init__(
        self,
        wire_dtype: str = WireDtype.FP32,
        block_size: int = 4096,
        bucket_size_mb: float = 64.0,
        topk_fraction: float | None = None,
        codec_kernel: CodecKernel = CodecKernel.EAGER,
        overlap_aggregation: str = ALL_GATHER,
    ) -> None:
        # the codec checks the names, block size and fraction once here: bad input fails at construction
        WireCodec(wire_dtype, [], block_size, topk_fraction, codec_kernel)
        if overlap_aggregation not in OVERLAP_AGGREGATIONS:
            raise ValueError(
                f"overlap_aggregation={overlap_aggregation!r} is not an aggregation: "
                f"use {ALL_GATHER!r} (the default) or {OWNER_REDUCE!r}"
            )
        self.overlap_aggregation = overlap_aggregation
        self.wire_dtype = WireDtype(wire_dtype)
        self.block_size = block_size
        self.topk_fraction = topk_fraction
        self.codec_kernel = CodecKernel(codec_kernel)
        self.bucket_elements = max(1, int(bucket_size_mb * 2**20 / 4))
        # one per layout and wire: the whole model, or each streaming fragment in turn (docs/algorithm.md §12)
        self._codecs: dict[tuple, WireCodec] = {}

    def codec(self, segment_sizes: Sequence[int], wire_dtype: str | None = None) -> WireCodec:
        """The wire codec for a flat buffer made of ``segment_sizes`` tensors (built once per layout and wire).

        ``topk_fraction`` sparsifies this communicator's own wire only, not an override (gradients in FP32).
        """
        wire = WireDtype(wire_dtype or self.wire_dtype)
        key = (tuple(segment_sizes), wire)
        if key not in self._codecs:
            topk = self.topk_fraction if wire == self.wire_dtype else None
            kernel = self.codec_kernel if wire == self.wire_dtype else CodecKernel.EAGER
            self._codecs[key] = WireCodec(wire, segment_sizes, self.block_size, topk, kernel)
        return self._codecs[key]

    def start_average(
        self,
        flats: Sequence[torch.Tensor],
        scalars: Sequence[torch.Tensor],
        segment_sizes: Sequence[int],
        wire_dtype: str | None = None,
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
        wire_dtype: str | None = None,
        check: ScalarCheck | None = None,
    ) -> AverageResult:
        """Mean of all workers' ``flats`` and sum of their ``scalars`` (one entry per local worker).

        ``check(sums, rows)`` runs on every worker once the scalars have arrived
        and before the model-sized payload is sent; whatever it raises stops
        the synchronization there, on every worker alike.
        """

    def worker_labels(self) -> list[str]:
        """How messages name the workers, in worker order (:func:`worker_label`).

        Here every worker lives in this process, on this host; simulated worker ``i`` stands for rank ``i``
        of the same run on ``N`` processes, which labels it alike.
        """
        host = socket.gethostname()
        return [worker_label(i, i, host) for i in range(self.num_workers)]

    def global_worker(self, local: int) -> int:
        """The index among all workers of this process's local worker ``local``."""
        return local

    def sum_over_workers(self, rows: Sequence[torch.Tensor]) -> torch.Tensor:
        """Float64 sums of a few scalars (one row per local worker) over every worker, in worker order.

        A collective of its own, between synchronizations: a horizon rule's shared measurement (docs/algorithm.md §5.7).
        """
        return sum_in_worker_order([r.to(torch.float64).reshape(-1) for r in rows])

    @abstractmethod
    def broadcast_(self, tensor: torch.Tensor) -> None:
        """Make ``tensor`` identical on all workers (worker 0's value)."""

    # A worker whose ranks each own a shard of the flat model (HierarchicalCommunicator)
    # overrides these; for a worker that syncs the whole model they are identities.
    shards_per_worker: int = 1

    def shard_range(self, numel: int) -> tuple[int, int]:
        """``[start, end)`` of the flat model whose outer state and sync this rank owns."""
        return 0, numel

    def sum_over_shards(self, partial: torch.Tensor) -> torch.Tensor:
        """Float64 sums over this shard's ranks (squared norms, tokens, counts) -> sums over every rank of every worker."""
        return partial

    def max_over_shards(self, partial: torch.Tensor) -> torch.Tensor:
        """Float64 maxima over this worker's ranks (the slowest rank's seconds, docs/algorithm.md §13.7)."""
        return partial

    def gather_shards(self, shard: torch.Tensor, numel: int) -> torch.Tensor:
        """The whole flat model from this worker's shards (``shard`` covers :meth:`shard_range`)."""
        return shard

    def worker_tensor_sizes(self, local_sizes: Sequence[int]) -> list[int]:
        """Each parameter tensor's elements in the whole worker model (this rank's tensors may be shards of them)."""
        return list(local_sizes)


class SimulatedCommunicator(Communicator):
    """``N`` workers inside one process (the paper's simulation, docs/algorithm.md §8.4)."""

    def __init__(self, num_workers: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_workers = num_workers
        self.local_workers = num_workers

    def average(self, flats, scalars, segment_sizes, wire_dtype=None, check=None) -> AverageResult:
        return self._average(flats, scalars, segment_sizes, wire_dtype, check, OWNER_REDUCE)

    def start_average(self, flats, scalars, segment_sizes, wire_dtype=None) -> PendingAverage:
        """At once, with the aggregation of an overlapped average (``overlap_aggregation``) as N processes run it."""
        result = self._average(flats, scalars, segment_sizes, wire_dtype, None, self.overlap_aggregation)
        return PendingAverage.completed(result)

    def _average(self, flats, scalars, segment_sizes, wire_dtype, check, aggregation: str) -> AverageResult:
        if len(flats) != self.num_workers:
            raise ValueError(f"expected {self.num_workers} contributions, got {len(flats)}")
        if scalars and check is not None:
            check(sum_in_worker_order(scalars), torch.stack([s.to(torch.float64).reshape(-1) for s in scalars]))
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


class ProcessGroupCommunicator(Communicator):
    """One worker per process over a ``torch.distributed`` process group.

    Args:
        group: the process group across workers (default: the world). With
            worker groups (docs/algorithm.md §8.3) it holds the ranks of equal local rank.
        wire_dtype: a wire format name (docs/algorithm.md §7); ``topk_fraction`` sparsifies it (§7.1).
        timeout_s: bound on every collective (``AutoLoCoConfig.sync_timeout_s``).
            Without ``group``, a new group over the world is created with this
            timeout (collective: every rank must build its communicator), so
            the bound does not depend on the launcher's default group timeout
            (``TrainingArguments.ddp_timeout``, 30 minutes by default). With a
            ``group``, that group must have been created with this timeout.
            A collective that fails or times out raises :class:`PeerLostError`.
        worker_rank: the global rank that names this process's worker in messages and records (a worker of
            several ranks: its first one); default this process's rank. Every worker's, with its host, is
            gathered once here (collective), so no sync carries text.
    """

    def __init__(self, group=None, timeout_s: float | None = None, worker_rank: int | None = None, **kwargs) -> None:
        import torch.distributed as dist

        super().__init__(**kwargs)
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialized: launch with torchrun / accelerate launch, "
                "or use SimulatedCommunicator for workers inside one process"
            )
        self.dist = dist
        if group is None and timeout_s is not None:
            group = dist.new_group(list(range(dist.get_world_size())), timeout=datetime.timedelta(seconds=timeout_s))
        self.group = group
        self.timeout_s = timeout_s
        self.num_workers = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.local_workers = 1
        # reused by the FP32 all-reduce and the lossy wires' owner-reduce, one per layout (fragments: F of them)
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._owners: dict[tuple, _OwnerReduceBuffers] = {}
        self._background: ThreadPoolExecutor | None = None  # runs an overlapped owner-reduce of a lossy wire
        self._gathers: dict[tuple, _GatherBuffers] = {}  # an overlapped all-gather's buffers, one per layout
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
        """Turn a failed or timed-out collective into one :class:`PeerLostError` line that names the peers."""
        try:
            yield
        except RuntimeError as err:  # gloo raises RuntimeError, NCCL DistBackendError (a RuntimeError)
            others = [self.global_rank(w) for w in range(self.num_workers) if w != self.rank]
            raise peer_lost(err, operation, self.global_rank(self.rank), others, self.timeout_s) from err

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
        if gathered and check is not None:  # every worker holds the same rows: all raise alike, before the payload
            check(sums, rows)
        if flat.numel() == 0:  # a streaming fragment outside this rank's shard (and its group's): no payload
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
        # one persistent buffer: a fresh allocation per sync costs as much as the all-reduce itself on CPU
        key = (flat.shape, flat.device)
        if key not in self._buffers:
            self._buffers[key] = torch.empty_like(flat)
        total = self._buffers[key].copy_(flat)
        for work in self._start_all_reduce(total):
            work.wait()
        true_divide(total, self.num_workers, out=total)
        traffic.collective_seconds = _now(flat) - start
        return total

    def _owner_reduce_mean(self, flat: torch.Tensor, codec: WireCodec, traffic: Traffic) -> torch.Tensor:
        n, rank = self.num_workers, self.rank
        bufs = self._owner_buffers(codec, flat.device)
        my_start, my_end = bufs.parts[rank]
        my_numel = my_end - my_start

        tick = _now(flat)
        for (s, e), wire in zip(bufs.parts, bufs.by_part):  # my contribution to each owner, in place
            codec.encode(flat[s:e], s, out=wire)
        traffic.encode_seconds += _now(flat) - tick

        self._exchange(bufs.by_part_flat, bufs.by_worker_flat, bufs.part_splits, bufs.worker_splits, traffic)

        tick = _now(
            flat
        )  # decode + mean in worker order 0..N-1, as mean_in_worker_order does (docs/algorithm.md §7, 8.4)
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

        self._exchange(bufs.by_worker_flat, bufs.by_part_flat, bufs.worker_splits, bufs.part_splits, traffic)

        tick = _now(flat)
        for (s, e), wire in zip(bufs.parts, bufs.by_part):
            codec.decode(wire, s, e - s, out=bufs.mean[s:e])
        traffic.decode_seconds += _now(flat) - tick
        return bufs.mean

    def _owner_buffers(self, codec: WireCodec, device: torch.device) -> _OwnerReduceBuffers:
        """Persistent wire buffers of the owner-reduce (fresh ones per sync cost more than the codec on CPU)."""
        key = (codec.segment_sizes, codec.wire_dtype, codec.block_size, codec.topk_fraction, self.num_workers, device)
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
        """One ``all_to_all_single`` per wire tensor kind over contiguous buffers: split ``j`` goes to / comes from worker ``j``."""
        tick = _now(send[0])
        for out, inp, out_splits, in_splits in zip(recv, send, recv_splits, send_splits):
            self.dist.all_to_all_single(
                out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits, group=self.group
            )
        traffic.collective_seconds += _now(send[0]) - tick

    def broadcast_(self, tensor: torch.Tensor) -> None:
        staged = tensor.to(self._carrier(tensor.device))
        with self._guarded("the start-up broadcast of rank 0's parameters"):
            self.dist.broadcast(staged, src=self.global_rank(0), group=self.group)
        if staged is not tensor:
            tensor.copy_(staged)

    def start_average(self, flats, scalars, segment_sizes, wire_dtype=None) -> PendingAverage:
        """Start the average; the caller trains on until :meth:`PendingAverage.wait` (docs/algorithm.md §11).

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
        traffic = Traffic(wire_bytes=wire_bytes_sent(self.codec(segment_sizes, wire), self.num_workers, self.rank))
        start = time.perf_counter()
        carrier = self._carrier(flat.device)
        gathered, gather_work = self._gather_scalars(scalars, carrier, async_op=True)
        total = flat.detach().to(carrier, copy=True)  # not the blocking path's reused buffer: it may run meanwhile
        works = [w for w in (gather_work,) if w is not None] + (self._start_all_reduce(total) if total.numel() else [])

        def finish() -> AverageResult:
            with self._guarded("the overlapped synchronization"):  # bounded by the group's sync_timeout_s
                for work in works:
                    work.wait()
            true_divide(total, self.num_workers, out=total)
            traffic.collective_seconds = _now(total) - start  # issue to completion, compute overlapped included
            sums, rows = _control_sums(gathered)
            return AverageResult(total.to(flat.device), sums, traffic, rows)

        return PendingAverage(finish)

    def _start_all_gather(
        self, flat: torch.Tensor, scalars: Sequence[torch.Tensor], codec: WireCodec
    ) -> PendingAverage:
        """Encode this worker's buffer, start the all-gathers; the merge decodes all ``N`` in worker order.

        The buffer is encoded by the owner parts (:func:`~autoloco_hf.sync.codec.roundtrip_as_sent`'s
        layout), so error feedback keeps what this worker sent. At the merge every worker decodes the
        same ``N`` buffers and adds them in worker order, as :func:`~autoloco_hf.sync.codec.gathered_mean`
        does: bit-identical on every worker and in the simulation.
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
            with self._guarded("the overlapped synchronization"):  # bounded by the group's sync_timeout_s
                for work in works:
                    work.wait()
            traffic.collective_seconds = time.perf_counter() - start  # issue to completion, overlap included
            sums, rows = _control_sums(gathered)
            if flat.numel() == 0:
                return AverageResult(mean, sums, traffic, rows)
            tick = _now(bufs.total)
            for worker, wires in enumerate(bufs.received):  # worker 0's into the total, then add in worker order
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
        key = (codec.segment_sizes, codec.wire_dtype, codec.block_size, codec.topk_fraction, self.num_workers, device)
        if key not in self._gathers:
            self._gathers[key] = _GatherBuffers(codec, self.num_workers, device)
        return self._gathers[key]

    def _gather_scalars(
        self, scalars: Sequence[torch.Tensor], device: torch.device, async_op: bool
    ) -> tuple[list[torch.Tensor], Any]:
        """One tiny float64 all-gather of the control messages (summed in worker order like the simulation, §8.4)."""
        if not scalars:
            return [], None
        local = scalars[0].to(device=device, dtype=torch.float64).reshape(-1).clone()
        gathered = [torch.empty_like(local) for _ in range(self.num_workers)]
        return gathered, self.dist.all_gather(gathered, local, group=self.group, async_op=async_op)

    def _start_all_reduce(self, total: torch.Tensor) -> list[Any]:
        """The FP32 sum into ``total`` in place, one all-reduce per bucket, all in flight at once."""
        return [
            self.dist.all_reduce(bucket, group=self.group, async_op=True)
            for bucket in torch.split(total, self.bucket_elements)
        ]

    def _start_in_background(
        self, flat: torch.Tensor, scalars: Sequence[torch.Tensor], segment_sizes: Sequence[int], wire: WireDtype
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
            result = future.result()  # re-raises the thread's PeerLostError / WorkerDisagreement here
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
    """Wire and FP32 buffers of one all-gather layout, allocated once and reused by every overlapped average.

    ``sent_flat``: this worker's encoded buffer, one contiguous tensor per wire tensor kind, its owner
    parts in order; ``sent``: per part, its views of them (what :meth:`WireCodec.encode` writes).
    ``received_flat``: the ``N`` workers' buffers, worker ``j``'s at ``j`` times a buffer's length;
    ``received[j]``: worker ``j``'s per-part views. ``total`` / ``scratch``: FP32 accumulators of the
    whole buffer (``total`` holds the mean the merge returns, reused by the next average).
    """

    def __init__(self, codec: WireCodec, n: int, device: torch.device) -> None:
        self.parts = codec.partition(n)
        part_wires = [codec.empty_wire(s, e - s, "meta") for s, e in self.parts]
        sizes = [[wires[k].numel() for wires in part_wires] for k in range(len(part_wires[0]))]
        self.sent_flat = [
            torch.empty(sum(counts), dtype=w.dtype, device=device) for counts, w in zip(sizes, part_wires[0])
        ]
        self.received_flat = [torch.empty(n * sent.numel(), dtype=sent.dtype, device=device) for sent in self.sent_flat]
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
    def _per_part(flat_by_kind: list[torch.Tensor], sizes: list[list[int]]) -> list[list[torch.Tensor]]:
        """Per owner part, its views of the per-kind buffers (``sizes[kind][part]`` elements each)."""
        return [list(ws) for ws in zip(*(torch.split(buf, counts) for buf, counts in zip(flat_by_kind, sizes)))]


class _OwnerReduceBuffers:
    """Wire and FP32 buffers of one owner-reduce layout, allocated once and reused by every sync.

    ``by_part``: the whole buffer's wire tensors, part ``j`` at its place (what a
    worker sends to the owners, and later receives from them): per kind one
    contiguous tensor, so ``all_to_all_single`` needs no concatenation.
    ``by_worker``: ``N`` copies of this rank's part (the contributions it receives as
    owner, then its encoded mean sent to everybody). ``total`` / ``scratch``: FP32
    accumulators of the owner's part; ``mean``: the decoded mean of the whole buffer.
    """

    def __init__(self, key: tuple, codec: WireCodec, n: int, rank: int, device: torch.device) -> None:
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
        self.by_worker_flat = [torch.empty(n * w.numel(), dtype=w.dtype, device=device) for w in my_wire]
        self.by_part = [
            list(ws)
            for ws in zip(
                *(torch.split(buf, [w[k].numel() for w in part_wires]) for k, buf in enumerate(self.by_part_flat))
            )
        ]
        self.by_worker = [
            list(ws) for ws in zip(*(torch.split(buf, [w.numel()] * n) for buf, w in zip(self.by_worker_flat, my_wire)))
        ]
        self.part_splits = [[w[k].numel() for w in part_wires] for k in range(len(my_wire))]  # per kind
        self.worker_splits = [[w.numel()] * n for w in my_wire]
        self.total = torch.empty(my_numel, dtype=torch.float32, device=device)
        self.scratch = torch.empty(my_numel, dtype=torch.float32, device=device)
        self.mean = torch.empty(codec.numel, dtype=torch.float32, device=device)


class HierarchicalCommunicator(Communicator):
    """A worker of ``R`` ranks syncing shard by shard (docs/algorithm.md §8.3): each byte crosses the slow link once.

    Rank ``r`` of a worker owns shard ``r`` of the flat model (``R`` contiguous,
    balanced parts). At a sync it averages only that shard with rank ``r`` of every
    other worker through ``outer`` (a :class:`ProcessGroupCommunicator` over the
    outer group: any wire, the INT8 owner-reduce included), keeps the outer
    parameters and momentum of that shard only, and the worker all-gathers the
    updated shards over ``inner_group`` (its fast, intra-node link).

    The shard's pseudo-gradient is taken locally: the ranks of a DDP worker hold
    identical parameters (gradients are averaged inside the worker every step),
    so the reduce-scatter inside the worker would return each rank's own slice;
    skipping it saves the intra-node traffic.

    The engine only sees :meth:`shard_range`, :meth:`sum_over_shards` and
    :meth:`gather_shards` (identities on the base class). A worker sharded by FSDP2
    plugs in with the same three: its shard is its local ``DTensor.to_local()``
    pieces (the engine's "model" is then the local shards, ``shard_range`` all of
    them), ``sum_over_shards`` is this class's, and ``gather_shards`` is the
    identity (the outer step writes straight into the local shards).
    Controller statistics stay exact: squared norms are summed over the shards
    inside the worker (:meth:`sum_over_shards`, in rank order, so every rank of
    the worker gets bit-identical values and the same horizon); so are tokens and
    losses, which therefore count every rank of every worker.
    """

    def __init__(self, outer: Communicator, inner_group: Any, ranks_per_worker: int, rank_in_worker: int) -> None:
        import torch.distributed as dist

        super().__init__(wire_dtype=outer.wire_dtype, block_size=outer.block_size, topk_fraction=outer.topk_fraction)
        if dist.get_world_size(inner_group) != ranks_per_worker:
            raise ValueError(
                f"the inner group has {dist.get_world_size(inner_group)} ranks but ranks_per_worker={ranks_per_worker}"
            )
        self.dist = dist
        self.outer = outer
        self.inner_group = inner_group
        self.ranks_per_worker = self.shards_per_worker = ranks_per_worker
        self.rank_in_worker = rank_in_worker
        self.num_workers = outer.num_workers
        self.local_workers = 1
        self.bucket_elements = outer.bucket_elements
        self._gather: torch.Tensor | None = None  # persistent all-gather buffers (padded shards)
        self._send: torch.Tensor | None = None
        self._full: torch.Tensor | None = None

    def codec(self, segment_sizes: Sequence[int], wire_dtype: str | None = None) -> WireCodec:
        return self.outer.codec(segment_sizes, wire_dtype)

    def average(self, flats, scalars, segment_sizes, wire_dtype=None, check=None) -> AverageResult:
        """The outer collective on this rank's shard (``flats`` and ``segment_sizes`` describe the shard)."""
        return self.outer.average(flats, scalars, segment_sizes, wire_dtype, check=check)

    def start_average(self, flats, scalars, segment_sizes, wire_dtype=None) -> PendingAverage:
        """The overlapped outer collective on this rank's shard; the worker's gather waits for it to land."""
        return self.outer.start_average(flats, scalars, segment_sizes, wire_dtype)

    def worker_labels(self) -> list[str]:
        return self.outer.worker_labels()

    def sum_over_workers(self, rows: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.outer.sum_over_workers([self.sum_over_shards(rows[0])])

    def global_worker(self, local: int) -> int:
        return self.outer.global_worker(local)

    def broadcast_(self, tensor: torch.Tensor) -> None:
        self.outer.broadcast_(tensor)

    def shard_range(self, numel: int) -> tuple[int, int]:
        return balanced_parts(numel, self.ranks_per_worker)[self.rank_in_worker]

    def sum_over_shards(self, partial: torch.Tensor) -> torch.Tensor:
        return sum_in_worker_order(self._gather_in_worker(partial)).cpu()

    def max_over_shards(self, partial: torch.Tensor) -> torch.Tensor:
        return torch.stack(self._gather_in_worker(partial)).amax(dim=0).cpu().view_as(partial)

    def _gather_in_worker(self, partial: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``partial`` of this worker, in rank order (a few float64 values)."""
        device = collective_device(str(self.dist.get_backend(self.inner_group)), partial.device)
        local = partial.to(device=device, dtype=torch.float64).reshape(-1).contiguous()
        gathered = [torch.empty_like(local) for _ in range(self.ranks_per_worker)]
        self.dist.all_gather(gathered, local, group=self.inner_group)
        return gathered

    def gather_shards(self, shard: torch.Tensor, numel: int) -> torch.Tensor:
        """All-gather inside the worker; shards differ by at most one element, so they travel padded."""
        parts = balanced_parts(numel, self.ranks_per_worker)
        width = parts[0][1] - parts[0][0]
        if self._full is None or self._full.numel() != numel or self._full.device != shard.device:
            carrier = collective_device(str(self.dist.get_backend(self.inner_group)), shard.device)
            self._gather = torch.empty(width * self.ranks_per_worker, dtype=torch.float32, device=carrier)
            self._send = torch.zeros(width, dtype=torch.float32, device=carrier)
            self._full = torch.empty(numel, dtype=torch.float32, device=shard.device)
        self._send[: shard.numel()].copy_(shard)
        self.dist.all_gather_single(self._gather, self._send, group=self.inner_group)
        for r, (s, e) in enumerate(parts):
            self._full[s:e].copy_(self._gather[r * width : r * width + e - s])
        return self._full


class ShardedWorkerCommunicator(HierarchicalCommunicator):
    """A worker whose ``R`` ranks each hold one shard of its model already (FSDP2 ``fully_shard`` inside the worker).

    The engine's "model" is this rank's local shards (``DTensor.to_local()``), and
    rank ``r`` of every worker holds the same shard, so the whole local buffer is
    this rank's part of the outer sync (:meth:`shard_range`), the outer step
    writes straight into the local shards (:meth:`gather_shards` is the identity:
    nothing is gathered), and the squared norms, tokens and losses are summed
    over the worker's ranks as for :class:`HierarchicalCommunicator`. Each rank
    sends ``1/R`` of the model across workers and keeps the outer parameters and
    momentum of its shard only.
    """

    def shard_range(self, numel: int) -> tuple[int, int]:
        return 0, numel

    def gather_shards(self, shard: torch.Tensor, numel: int) -> torch.Tensor:
        return shard

    def worker_tensor_sizes(self, local_sizes: Sequence[int]) -> list[int]:
        """The local shards' sizes summed over the worker's ranks: every rank then cuts fragments at the same tensors."""
        backend = str(self.dist.get_backend(self.inner_group))
        sizes = torch.tensor(
            list(local_sizes), dtype=torch.int64, device=collective_device(backend, torch.device("cpu"))
        )
        self.dist.all_reduce(sizes, group=self.inner_group)
        return sizes.tolist()


def make_communicator(
    config: AutoLoCoConfig,
    distributed: bool,
    simulated_workers: int = 1,
    group: Any = None,
    inner_group: Any = None,
    rank_in_worker: int = 0,
    fsdp_worker: bool = False,
) -> Communicator:
    """The communicator of a run of ``config``, with its wire dtype, block size, top-k fraction and bucket size.

    ``distributed``: one worker per process over ``torch.distributed`` (``group``,
    default a new group over the world), every collective bounded by ``config.sync_timeout_s``; else
    ``simulated_workers`` workers inside this process.
    With worker groups (``config.ranks_per_worker > 1``, ``inner_group`` the
    worker's ranks) and ``config.hierarchical_sync``, each rank syncs its shard
    (:class:`HierarchicalCommunicator`). ``fsdp_worker``: the ranks hold FSDP2 shards of the
    worker's model, each syncs its own (:class:`ShardedWorkerCommunicator`, whatever ``hierarchical_sync``).
    """
    kwargs = dict(
        wire_dtype=config.wire_dtype,
        block_size=config.int8_block_size,
        bucket_size_mb=config.bucket_size_mb,
        topk_fraction=config.topk_fraction,
        codec_kernel=config.codec_kernel,
    )
    if distributed:
        import torch.distributed as dist

        # a worker of several ranks is named by its first one, whichever of its ranks this is
        first = dist.get_global_rank(inner_group, 0) if inner_group is not None else None
        comm = ProcessGroupCommunicator(group=group, timeout_s=config.sync_timeout_s, worker_rank=first, **kwargs)
        if config.ranks_per_worker > 1 and (config.hierarchical_sync or fsdp_worker):
            if inner_group is None:
                raise ValueError("ranks_per_worker > 1 with hierarchical_sync needs the worker's inner_group")
            sharded = ShardedWorkerCommunicator if fsdp_worker else HierarchicalCommunicator
            comm = sharded(comm, inner_group, config.ranks_per_worker, rank_in_worker)
        return comm
    return SimulatedCommunicator(simulated_workers, **kwargs)
