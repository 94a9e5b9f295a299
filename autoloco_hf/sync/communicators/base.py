"""What every communicator shares: the contract, the result types and the helpers.

A synchronization averages the workers' flat FP32 pseudo-gradients and sums a
small float64 vector of per-worker scalars (squared norms, token counts, loss
sums, a non-finite flag, the executed horizon for the agreement check). The
implementations live next to this module, one per file; the engine sees only
:class:`Communicator`.

Wire bytes count what one worker sends to the others: for the FP32 all-reduce
the ring algorithm's ``2 (N-1)/N`` times the buffer, for owner-reduce the exact
sizes of the ``all_to_all`` splits leaving the worker.
"""

from __future__ import annotations

import re
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from autoloco_hf.config import CodecKernel, WireDtype
from autoloco_hf.errors import AutoLoCoError
from autoloco_hf.wire.codec import WireCodec


def _now(tensor: torch.Tensor) -> float:
    """Wall clock after the current stream has finished its queued work (CUDA kernels run
    asynchronously).

    Only the current stream: an overlapped sync runs on a side stream of its own and
    must not wait for the training kernels queued meanwhile.
    """
    if tensor.is_cuda:
        torch.cuda.current_stream(tensor.device).synchronize()
    return time.perf_counter()


def collective_device(backend: str, device: torch.device) -> torch.device:
    """Where a collective of a group with ``backend`` (``dist.get_backend``) runs on a tensor held
    on ``device``.

    An NCCL-only group (what ``accelerate launch`` and the recipes start on GPUs) carries GPU
    tensors only, so a tensor in host memory (the outer state with ``outer_on_cpu=True``, the
    control messages) travels through the current GPU and comes back; gloo (alone or in
    ``"cpu:gloo,cuda:nccl"``) carries it as it is.
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


def _no_rows() -> torch.Tensor:
    return torch.zeros(0, 0, dtype=torch.float64)


@dataclass
class AverageResult:
    # decoded mean (FP32, identical on all workers); may be a buffer reused by the next call
    mean: torch.Tensor
    scalar_sums: torch.Tensor  # float64 sums over all workers, added in worker order
    traffic: Traffic
    # float64 (num_workers, len(scalars)): every worker's scalars in worker order, so that
    # callers can check that values which must agree (the executed interval) do agree; (0, 0)
    # without scalars
    scalar_rows: torch.Tensor = field(default_factory=lambda: _no_rows())


class PeerLostError(AutoLoCoError, RuntimeError):
    """A collective did not complete: a peer died, was partitioned away, or did not answer within
    the timeout.

    ``silent_ranks`` are the global ranks that may not have answered (exact with
    two workers; with more, the backend does not say which peer was missing, so
    all the others are listed). The message is one line.
    """

    def __init__(self, message: str, silent_ranks: Sequence[int]) -> None:
        super().__init__(message)
        self.silent_ranks = list(silent_ranks)

    def at(self, where: str, advice: str = "") -> PeerLostError:
        """The same error, prefixed with where the run was (step, interval) and followed by what to
        do."""
        message = f"{where}: {self}" + (f"; {advice}" if advice else "")
        return PeerLostError(message, self.silent_ranks)


# gloo's "[/path/pair.cc:78] " prefix
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*")


def describe_backend_error(err: BaseException) -> str:
    """The backend's first sentence without its C++ source location (one line for the user)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return _SOURCE_PREFIX.sub("", text).split(". ")[0]


def peer_lost(
    err: BaseException,
    operation: str,
    rank: int,
    others: Sequence[int],
    timeout_s: float | None,
) -> PeerLostError:
    """The one-line :class:`PeerLostError` for a collective of ``rank`` with ``others`` that failed
    with ``err``."""
    if len(others) == 1:
        who = f"rank {others[0]}"
    else:
        who = f"one of ranks {list(others)} (the backend does not say which)"
    detail = describe_backend_error(err)
    if any(word in detail.lower() for word in ("closed", "reset")):
        what = "closed its connection (its process ended)"
    else:
        bound = f" within sync_timeout_s={timeout_s:g}" if timeout_s is not None else ""
        what = "did not answer" + bound
    return PeerLostError(f"{operation} on rank {rank}: {who} {what} ({detail})", others)


# How an overlapped average of a lossy wire aggregates (docs/algorithm.md#overlap). ALL_GATHER, the
# default: every worker's encoded buffer reaches every worker through asynchronous all-gathers
# started by the training thread, decoded and summed in worker order at the merge, with no Python
# work between the exchanges. OWNER_REDUCE: the blocking average's owner-reduce (two exchanges
# with a decode and an encode between them) on a background thread; it rounds the mean once more,
# so its bits differ.
ALL_GATHER = "all_gather"
OWNER_REDUCE = "owner_reduce"
OVERLAP_AGGREGATIONS = (ALL_GATHER, OWNER_REDUCE)


def gathered_bytes_sent(codec: WireCodec, num_workers: int) -> int:
    """Bytes one worker sends in the all-gather of the encoded buffers: ``N - 1`` whole buffers (a
    ring).

    Every worker's buffer has the same size (the owner parts' layout), and each receives the ``N -
    1`` others' as many bytes. Owner-reduce sends about ``2 (N-1)/N`` buffers instead: the same for
    two workers, fewer for more (:func:`~autoloco_hf.wire.accounting.wire_bytes_sent`).
    """
    whole = sum(codec.wire_bytes(s, e - s) for s, e in codec.partition(num_workers))
    return (num_workers - 1) * whole


# check(sums, rows), run on the gathered scalars before the payload is exchanged
# (see Communicator.average)
ScalarCheck = Callable[[torch.Tensor, torch.Tensor], None]


class PendingAverage:
    """An average in flight (overlapped synchronization, docs/algorithm.md#overlap).

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

    def state_dict(self) -> dict[str, Any]:
        """The average, waited for and stored as its result:
        a checkpoint cannot hold a collective."""
        result = self.wait()
        return {
            "mean": result.mean.detach().clone(),
            "scalar_sums": result.scalar_sums.clone(),
            "scalar_rows": result.scalar_rows.clone(),
            "traffic": asdict(result.traffic),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> PendingAverage:
        """A completed average from :meth:`state_dict`, its mean moved to ``device``."""
        traffic = Traffic(**state["traffic"])
        result = AverageResult(
            state["mean"].to(device), state["scalar_sums"], traffic, state["scalar_rows"]
        )
        return cls.completed(result)


def sum_in_worker_order(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """Float64 ``v0 + v1 + ... + v_{N-1}`` in this fixed order on both paths.

    An all-reduce picks its own addition order (gloo's differs from the simulation's
    for N >= 3), so the scalar sums would differ in the last bit of the squared norms
    and loss sums; gathering the N tiny vectors and adding them in worker order keeps
    the simulation and N processes bit-identical (docs/algorithm.md#simulation).
    """
    total = values[0].to(torch.float64, copy=True)
    for v in values[1:]:
        total += v.to(torch.float64)
    return total


def worker_label(worker: int, rank: int, host: str) -> str:
    """How logs, errors and records name a worker: its index, global rank and host, so an operator
    can find it."""
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
        # the codec checks the names, block size and fraction once here: bad input fails at
        # construction
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
        # one per layout and wire: the whole model, or each streaming fragment in turn
        # (docs/algorithm.md#fragments)
        self._codecs: dict[tuple, WireCodec] = {}

    def codec(self, segment_sizes: Sequence[int], wire_dtype: str | None = None) -> WireCodec:
        """The wire codec for a flat buffer made of ``segment_sizes`` tensors (built once per layout
        and wire).

        ``topk_fraction`` sparsifies this communicator's own wire only, not an override (gradients
        in FP32).
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
        collective's timing exactly (docs/algorithm.md#overlap).
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

        Here every worker lives in this process, on this host; simulated worker ``i`` stands for
        rank ``i`` of the same run on ``N`` processes, which labels it alike.
        """
        host = socket.gethostname()
        return [worker_label(i, i, host) for i in range(self.num_workers)]

    def global_worker(self, local: int) -> int:
        """The index among all workers of this process's local worker ``local``."""
        return local

    def sum_over_workers(self, rows: Sequence[torch.Tensor]) -> torch.Tensor:
        """Float64 sums of a few scalars (one row per local worker) over every worker, in worker
        order.

        A collective of its own, between synchronizations: a horizon rule's shared measurement
        (docs/algorithm.md#rule-plugins).
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
        """Float64 sums over this shard's ranks (squared norms, tokens, counts) -> sums over every
        rank of every worker."""
        return partial

    def max_over_shards(self, partial: torch.Tensor) -> torch.Tensor:
        """Float64 maxima over this worker's ranks (the slowest rank's seconds, docs/algorithm.md
        docs/algorithm.md#pacing-with-overlap)."""
        return partial

    def gather_shards(self, shard: torch.Tensor, numel: int) -> torch.Tensor:
        """The whole flat model from this worker's shards (``shard`` covers :meth:`shard_range`)."""
        return shard

    def worker_tensor_sizes(self, local_sizes: Sequence[int]) -> list[int]:
        """Each parameter tensor's elements in the whole worker model (this rank's tensors may be
        shards of them)."""
        return list(local_sizes)
