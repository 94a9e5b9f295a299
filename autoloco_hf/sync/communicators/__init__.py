"""Communicators: one collective per synchronization, real or simulated
(docs/algorithm.md#interval-statistics, 7, 8.4).

One module per implementation, so each can be read and changed alone:

* :mod:`.base`: the :class:`Communicator` contract, results, errors and helpers;
* :mod:`.simulated`: :class:`SimulatedCommunicator`, ``N`` workers in one process;
* :mod:`.process_group`: :class:`ProcessGroupCommunicator`, one worker per process;
* :mod:`.hierarchical`: :class:`HierarchicalCommunicator` and
  :class:`ShardedWorkerCommunicator`, workers of several ranks.

This package re-exports them all, so ``from autoloco_hf.sync.communicators import ...``
keeps working, and holds :func:`make_communicator`, which picks one from a config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autoloco_hf.sync.communicators.base import (
    ALL_GATHER,
    OVERLAP_AGGREGATIONS,
    OWNER_REDUCE,
    AverageResult,
    Communicator,
    PeerLostError,
    PendingAverage,
    ScalarCheck,
    Traffic,
    collective_device,
    describe_backend_error,
    gathered_bytes_sent,
    peer_lost,
    sum_in_worker_order,
    worker_label,
)
from autoloco_hf.sync.communicators.hierarchical import (
    HierarchicalCommunicator,
    ShardedWorkerCommunicator,
)
from autoloco_hf.sync.communicators.process_group import ProcessGroupCommunicator
from autoloco_hf.sync.communicators.simulated import SimulatedCommunicator

if TYPE_CHECKING:
    from autoloco_hf.config import AutoLoCoConfig

__all__ = [
    "ALL_GATHER",
    "OVERLAP_AGGREGATIONS",
    "OWNER_REDUCE",
    "AverageResult",
    "Communicator",
    "HierarchicalCommunicator",
    "PeerLostError",
    "PendingAverage",
    "ProcessGroupCommunicator",
    "ScalarCheck",
    "ShardedWorkerCommunicator",
    "SimulatedCommunicator",
    "Traffic",
    "collective_device",
    "describe_backend_error",
    "gathered_bytes_sent",
    "make_communicator",
    "peer_lost",
    "sum_in_worker_order",
    "worker_label",
]


def make_communicator(
    config: AutoLoCoConfig,
    distributed: bool,
    simulated_workers: int = 1,
    group: Any = None,
    inner_group: Any = None,
    rank_in_worker: int = 0,
    fsdp_worker: bool = False,
) -> Communicator:
    """The communicator of a run of ``config``, with its wire dtype, block size, top-k fraction and
    bucket size.

    ``distributed``: one worker per process over ``torch.distributed`` (``group``, default a new
    group over the world), every collective bounded by ``config.sync_timeout_s``; else
    ``simulated_workers`` workers inside this process. With worker groups (``config.ranks_per_worker
    > 1``, ``inner_group`` the worker's ranks) and ``config.hierarchical_sync``, each rank syncs its
    shard (:class:`HierarchicalCommunicator`). ``fsdp_worker``: the ranks hold FSDP2 shards of the
    worker's model, each syncs its own (:class:`ShardedWorkerCommunicator`, whatever
    ``hierarchical_sync``).
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
        comm = ProcessGroupCommunicator(
            group=group, timeout_s=config.sync_timeout_s, worker_rank=first, **kwargs,
        )  # fmt: skip
        if config.ranks_per_worker > 1 and (config.hierarchical_sync or fsdp_worker):
            if inner_group is None:
                raise ValueError(
                    "ranks_per_worker > 1 with hierarchical_sync needs the worker's inner_group",
                )
            sharded = ShardedWorkerCommunicator if fsdp_worker else HierarchicalCommunicator
            comm = sharded(comm, inner_group, config.ranks_per_worker, rank_in_worker)
        return comm
    return SimulatedCommunicator(simulated_workers, **kwargs)
