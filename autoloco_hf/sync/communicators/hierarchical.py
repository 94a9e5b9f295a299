"""Workers of several ranks: each rank syncs its shard across workers, then the worker regathers.

Both classes wrap an outer :class:`~autoloco_hf.sync.communicators.process_group.
ProcessGroupCommunicator` and add the intra-worker collectives, so the outer
collective code stays the same whether a worker has one rank or many.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from autoloco_hf.sync.communicators.base import (
    AverageResult,
    Communicator,
    PendingAverage,
    collective_device,
    sum_in_worker_order,
)
from autoloco_hf.wire.codec import WireCodec, balanced_parts

__all__ = ["HierarchicalCommunicator", "ShardedWorkerCommunicator"]


class HierarchicalCommunicator(Communicator):
    """A worker of ``R`` ranks syncing shard by shard
    (docs/algorithm.md#worker-groups): each byte crosses the slow link once.

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

    def __init__(
        self,
        outer: Communicator,
        inner_group: Any,
        ranks_per_worker: int,
        rank_in_worker: int,
    ) -> None:
        import torch.distributed as dist

        super().__init__(
            wire_dtype=outer.wire_dtype,
            block_size=outer.block_size,
            topk_fraction=outer.topk_fraction,
        )
        inner_ranks = dist.get_world_size(inner_group)
        if inner_ranks != ranks_per_worker:
            raise ValueError(
                f"the inner group has {inner_ranks} ranks but ranks_per_worker={ranks_per_worker}"
            )  # fmt: skip
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
        """The outer collective on this rank's shard (``flats`` and ``segment_sizes`` describe the
        shard)."""
        return self.outer.average(flats, scalars, segment_sizes, wire_dtype, check=check)

    def start_average(self, flats, scalars, segment_sizes, wire_dtype=None) -> PendingAverage:
        """The overlapped outer collective on this rank's shard; the worker's gather waits for it to
        land."""
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
        """All-gather inside the worker; shards differ by at most one element, so they travel
        padded."""
        parts = balanced_parts(numel, self.ranks_per_worker)
        width = parts[0][1] - parts[0][0]
        if self._full is None or self._full.numel() != numel or self._full.device != shard.device:
            carrier = collective_device(str(self.dist.get_backend(self.inner_group)), shard.device)
            padded = width * self.ranks_per_worker
            self._gather = torch.empty(padded, dtype=torch.float32, device=carrier)
            self._send = torch.zeros(width, dtype=torch.float32, device=carrier)
            self._full = torch.empty(numel, dtype=torch.float32, device=shard.device)
        self._send[: shard.numel()].copy_(shard)
        self.dist.all_gather_single(self._gather, self._send, group=self.inner_group)
        for r, (s, e) in enumerate(parts):
            self._full[s:e].copy_(self._gather[r * width : r * width + e - s])
        return self._full


class ShardedWorkerCommunicator(HierarchicalCommunicator):
    """A worker whose ``R`` ranks each hold one shard of its model already (FSDP2 ``fully_shard``
    inside the worker).

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
        """The local shards' sizes summed over the worker's ranks: every rank then cuts fragments at
        the same tensors."""
        backend = str(self.dist.get_backend(self.inner_group))
        sizes = torch.tensor(
            list(local_sizes),
            dtype=torch.int64,
            device=collective_device(backend, torch.device("cpu")),
        )
        self.dist.all_reduce(sizes, group=self.inner_group)
        return sizes.tolist()
