"""Worker topology: which ranks form one worker, which ranks talk at a sync
(docs/algorithm.md#worker-groups).

With ``WORLD_SIZE = W`` processes and ``ranks_per_worker = R`` (``W % R == 0``)
there are ``N = W / R`` workers. Worker ``g`` is the ranks
``g*R .. g*R + R - 1``; they keep normal data parallelism among themselves
(gradients averaged inside the *inner group* every step). The outer
synchronization runs in *outer groups* of ranks with equal local rank
``r = rank % R``: ``{r, r + R, r + 2R, ...}``. With ``torchrun
--nproc_per_node R`` on ``N`` nodes a worker is a node and the outer
collective runs between the nodes.

``torch.distributed.new_group`` must be called by every rank, in the same
order, for every group: :func:`build_topology` does exactly that.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any


@dataclass
class WorkerTopology:
    world_size: int
    rank: int
    ranks_per_worker: int
    inner_group: Any = None  # process group of this rank's worker (None: single-rank worker)
    outer_group: Any = None  # process group of the outer collective (None: the world)

    @property
    def num_workers(self) -> int:
        return self.world_size // self.ranks_per_worker

    @property
    def worker_index(self) -> int:
        return self.rank // self.ranks_per_worker

    @property
    def rank_in_worker(self) -> int:
        return self.rank % self.ranks_per_worker

    def inner_ranks(self) -> list[int]:
        g = self.worker_index * self.ranks_per_worker
        return list(range(g, g + self.ranks_per_worker))

    def outer_ranks(self) -> list[int]:
        return list(range(self.rank_in_worker, self.world_size, self.ranks_per_worker))


def check_worker_layout(world_size: int, ranks_per_worker: int) -> None:
    """Fail clearly when ``ranks_per_worker`` does not divide the world."""
    if ranks_per_worker < 1 or world_size % ranks_per_worker != 0:
        raise ValueError(
            f"AutoLoCoConfig.ranks_per_worker={ranks_per_worker} does not divide the world size "
            f"{world_size}: every worker must have the same number of ranks (e.g. "
            "ranks_per_worker = GPUs per node)"
        )


def build_topology(
    ranks_per_worker: int = 1, backend: str | None = None, timeout_s: float | None = None
) -> WorkerTopology:
    """Create the inner and outer process groups of this run (collective: call on every rank).

    ``timeout_s`` (``AutoLoCoConfig.sync_timeout_s``) bounds every collective on
    these groups; without it they inherit the default group's timeout.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if ranks_per_worker != 1:
            raise ValueError(
                f"ranks_per_worker={ranks_per_worker} needs a distributed launch (torchrun / "
                "accelerate launch) with a multiple of that many processes"
            )
        return WorkerTopology(world_size=1, rank=0, ranks_per_worker=1)
    world, rank = dist.get_world_size(), dist.get_rank()
    check_worker_layout(world, ranks_per_worker)
    topo = WorkerTopology(world_size=world, rank=rank, ranks_per_worker=ranks_per_worker)
    if ranks_per_worker == 1:
        return topo  # every rank is a worker: the outer collective is the world
    R = ranks_per_worker
    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s is not None else None
    for g in range(world // R):  # every rank creates every group, in the same order
        group = dist.new_group(list(range(g * R, g * R + R)), backend=backend, timeout=timeout)
        if g == topo.worker_index:
            topo.inner_group = group
    for r in range(R):
        group = dist.new_group(list(range(r, world, R)), backend=backend, timeout=timeout)
        if r == topo.rank_in_worker:
            topo.outer_group = group
    return topo


def worker_mesh(ranks_per_worker: int, device_type: str = "cpu") -> Any:
    """The 1-D device mesh of this rank's worker, to shard it
    with FSDP2 (collective: call on every rank).

    ``fully_shard(module, mesh=worker_mesh(R, "cuda"))`` shards each worker over its own ``R`` ranks
    (``g*R .. g*R + R - 1``, the topology's inner group), so gradients
    are averaged inside the worker only and rank ``r`` of every worker
    holds the same shard: the outer sync runs shard by shard.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    check_worker_layout(world, ranks_per_worker)
    mesh = init_device_mesh(
        device_type,
        (world // ranks_per_worker, ranks_per_worker),
        mesh_dim_names=("worker", "shard"),
    )
    return mesh["shard"]


def shard_worker(
    model: Any,
    ranks_per_worker: int,
    device_type: str = "cuda",
    *,
    block_classes: list[str] | None = None,
    compute_dtype: Any = None,
) -> Any:
    """Shard ``model`` with FSDP2 over this rank's worker: each
    block, then the root (collective: call on every rank).

    The parameters keep their dtype (load FP32 for FP32 master weights): ``compute_dtype`` (e.g.
    bf16) is what FSDP gathers them in for the forward and backward, with gradients reduced in FP32.
    Blocks are the modules whose class is named in ``block_classes`` (default: a transformers
    model's ``_no_split_modules``, its decoder layers); the root module keeps what is left
    (embeddings, final norm, LM head, tied or not). A model sharded this way is one Accelerate's
    FSDP2 plugin keeps as it is (docs/algorithm.md#worker-groups).
    """
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    names = set(block_classes or getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if not blocks:
        raise ValueError(
            f"shard_worker: no module of {type(model).__name__} is a block (classes "
            f"{sorted(names) or 'none'}): pass block_classes=[<the decoder layer class name>]"
        )
    policy = (
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        if compute_dtype is not None
        else MixedPrecisionPolicy()
    )
    mesh = worker_mesh(ranks_per_worker, device_type)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def fsdp2_mesh(model: Any) -> Any:
    """The device mesh an FSDP2 (``fully_shard``) model is
    sharded over, or ``None`` for a model held whole."""
    from torch.distributed.tensor import DTensor

    meshes = {
        id(p.device_mesh): p.device_mesh for p in model.parameters() if isinstance(p, DTensor)
    }
    if len(meshes) > 1:
        raise ValueError(
            "the model's parameters are sharded over several device meshes: AutoLoCo needs one "
            "fully_shard mesh per worker (see autoloco_hf.integrations.groups.worker_mesh)"
        )
    return next(iter(meshes.values()), None)
