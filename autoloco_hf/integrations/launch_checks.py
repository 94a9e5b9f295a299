"""The launches AutoLoCo supports, checked before anything
trains (``AutoLoCoCallback`` and ``AutoLoCoAccelerate``).

Refused with the supported alternative named: FSDP1, DeepSpeed, XLA / Megatron,
``torch.nn.DataParallel``, ParallelismConfig (TP/CP/SP), a worker layout that does
not divide the world, FSDP2 sharded over the whole world while several workers
are asked for, and the silent "every rank trains alone" launch.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from autoloco_hf.config import AutoLoCoConfig
from autoloco_hf.errors import AutoLoCoConfigurationError
from autoloco_hf.integrations.groups import check_worker_layout, fsdp2_mesh

logger = hf_logging.get_logger(__name__)

SUPPORTED = (
    "supported: a single process, or one process per worker (or per rank of a worker group) with "
    "DistributedDataParallel or FSDP2 (fully_shard, each worker sharded over its own ranks), on "
    "CPU (gloo) or GPU (NCCL), launched by torchrun or `accelerate launch --multi_gpu`"
)
SHARDED_ALTERNATIVE = (
    "to shard a large model use FSDP2 inside each worker: TrainingArguments(fsdp=True, "
    "fsdp_config={'fsdp_version': 2}) or accelerate's FSDP plugin with fsdp_version=2, and "
    "AutoLoCoConfig(ranks_per_worker=<ranks per worker>); with several workers, shard each over "
    "its own ranks first (autoloco_hf.integrations.groups.shard_worker, docs/hf.md)"
)


def _env_world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def fsdp_version(accelerator: Any) -> int:
    """The FSDP version of an accelerator's FSDP plugin (1
    when the plugin does not say; 0 without FSDP)."""
    plugin = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
    return int(getattr(plugin, "fsdp_version", 1) or 1) if plugin is not None else 0


def _fsdp_from_environment() -> str:
    """Why accelerate may have made an FSDP1 plugin nobody asked for, when the environment says so.

    An ``Accelerator`` without a plugin builds one from
    ``ACCELERATE_USE_FSDP=true``, at ``FSDP_VERSION`` or 1; an ``Accelerator`` given
    an FSDP plugin sets that variable and leaves it for the rest of the process.
    """
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() != "true" or "FSDP_VERSION" in os.environ:
        return ""
    return (
        ": accelerate made this plugin from ACCELERATE_USE_FSDP=true in the environment, without "
        "FSDP_VERSION (an earlier FSDP Accelerator in this process leaves it set): set "
        "FSDP_VERSION=2, or unset ACCELERATE_USE_FSDP for a run without FSDP"
    )


def check_launch(
    world_size: int,
    distributed_type: Any = None,
    n_gpu: int = 1,
    *,
    fsdp: bool = False,
    deepspeed: bool = False,
    ranks_per_worker: int = 1,
    fsdp_version: int = 1,
) -> None:
    """Raise :class:`AutoLoCoConfigurationError` for launches AutoLoCo does not support.

    FSDP is accepted in version 2 (``fully_shard``: the engine syncs each
    rank's local shards, docs/algorithm.md#worker-groups); FSDP1 and
    DeepSpeed ZeRO are refused with the supported alternatives named.
    """
    env_world = _env_world_size()
    if env_world > 1 and world_size == 1:
        raise AutoLoCoConfigurationError(
            f"WORLD_SIZE={env_world} in the environment but the accelerator sees a world size of "
            "1: every rank would train alone on the same data with no error. On CPU pass "
            "`use_cpu=True` to TrainingArguments (or `Accelerator(cpu=True)`) and launch with "
            "`torchrun --nproc_per_node N` or `accelerate launch --multi_gpu --num_processes N` "
            "(`accelerate launch --cpu` starts ONE process)."
        )
    dtype = str(getattr(distributed_type, "value", distributed_type) or "").upper()
    if deepspeed or "DEEPSPEED" in dtype:
        raise AutoLoCoConfigurationError(
            f"AutoLoCo does not support DeepSpeed (ZeRO) yet; {SHARDED_ALTERNATIVE}; {SUPPORTED}."
        )
    if (fsdp or "FSDP" in dtype) and fsdp_version != 2:
        raise AutoLoCoConfigurationError(
            f"AutoLoCo does not support FSDP version {fsdp_version} (FSDP1 flat "
            f"parameters){_fsdp_from_environment()}; {SHARDED_ALTERNATIVE}; {SUPPORTED}."
        )
    if any(name in dtype for name in ("XLA", "MEGATRON")):
        raise AutoLoCoConfigurationError(
            f"AutoLoCo does not support distributed type {dtype} yet; {SUPPORTED}."
        )
    if n_gpu > 1:
        raise AutoLoCoConfigurationError(
            f"one process drives {n_gpu} GPUs (torch.nn.DataParallel); {SUPPORTED}. "
            "Launch one process per GPU with torchrun."
        )
    try:
        check_worker_layout(world_size, ranks_per_worker)
    except ValueError as err:
        raise AutoLoCoConfigurationError(str(err)) from err


def check_fsdp2_workers(model: torch.nn.Module, world_size: int, ranks_per_worker: int) -> None:
    """Whether accelerate's FSDP2 plugin leaves every worker sharded over its own ranks
    (docs/algorithm.md#worker-groups).

    The plugin shards an unsharded model over the whole world (one worker of every rank) and keeps a
    model whose root module is already ``fully_shard``-ed
    (``accelerate.utils.fsdp_utils.fsdp2_prepare_model``). Several workers therefore need the model
    sharded over each worker's mesh before the Trainer is built; a model sharded only in parts would
    get its remaining modules sharded over the world, on a second mesh.
    """
    from torch.distributed.fsdp import FSDPModule

    example = (
        f"autoloco_hf.integrations.groups.shard_worker(model, {ranks_per_worker}, device_type) "
        "(fully_shard of every block, then of the root, over worker_mesh(R, device_type))"
    )
    if fsdp2_mesh(model) is None:
        if ranks_per_worker != world_size:
            raise AutoLoCoConfigurationError(
                f"FSDP2 with ranks_per_worker={ranks_per_worker} and {world_size} processes: "
                "accelerate's FSDP plugin would shard the model over all ranks (one worker). "
                f"Shard each worker over its own ranks before building the Trainer: {example}, or "
                f"set ranks_per_worker={world_size} for a single sharded worker"
            )
    elif not isinstance(model, FSDPModule):
        raise AutoLoCoConfigurationError(
            f"the model's root module ({type(model).__name__}) is not sharded with fully_shard "
            "while some of its modules are: accelerate's FSDP2 plugin would shard the rest over "
            "all ranks, on a second mesh. Finish the sharding before "
            f"building the Trainer: {example}"
        )


def check_presharded_without_fsdp(
    model: torch.nn.Module, world_size: int, distributed_type: Any
) -> None:
    """Refuse a ``fully_shard``-ed model in a Trainer whose accelerator did not enable FSDP.

    Accelerate then wraps the model in DDP (``Accelerator.prepare_model``), which
    cannot hold DTensor parameters (on CPU it fails in DDP's start-up broadcast with
    "c10d.broadcast_.default does not have a sharding strategy registered").
    Accelerate enables FSDP for GPU-like devices only (``AcceleratorState``: the FSDP
    distributed type is set for the ``MULTI_GPU``-like types, never ``MULTI_CPU``).
    """
    if world_size > 1 and fsdp2_mesh(model) is not None:
        dtype = getattr(distributed_type, "value", distributed_type)
        raise AutoLoCoConfigurationError(
            "the model is sharded with fully_shard but accelerate did not enable FSDP "
            f"(distributed type {dtype}): it would wrap the sharded model in DDP, which fails. "
            "Enable accelerate's FSDP2 plugin: TrainingArguments(fsdp=True, "
            "fsdp_config={'fsdp_version': 2}) or an accelerate config with distributed_type: "
            "FSDP and fsdp_version: 2. Accelerate has FSDP on GPUs only; on CPU use a plain loop "
            "with AutoLoCoAccelerate and keep the sharded model out of accelerator.prepare"
        )


def check_trainer_launch(trainer: Any, config: AutoLoCoConfig) -> None:
    """Every launch check for a ``Trainer`` (its accelerator,
    FSDP / DeepSpeed flags, model and parallelism config)."""
    args, accelerator = trainer.args, trainer.accelerator
    fsdp_enabled = bool(getattr(trainer, "is_fsdp_enabled", False))
    check_launch(
        accelerator.num_processes,
        accelerator.distributed_type,
        args.n_gpu,
        fsdp=fsdp_enabled,
        deepspeed=bool(getattr(trainer, "is_deepspeed_enabled", False)),
        ranks_per_worker=config.ranks_per_worker,
        fsdp_version=fsdp_version(accelerator),
    )
    if fsdp_enabled:
        check_fsdp2_workers(trainer.model, accelerator.num_processes, config.ranks_per_worker)
    else:
        check_presharded_without_fsdp(
            trainer.model, accelerator.num_processes, accelerator.distributed_type
        )
        if getattr(args, "fsdp", None) and accelerator.num_processes > 1 and args.should_log:
            # accelerate enables FSDP for GPU-like devices
            # only; on CPU the model is wrapped in DDP instead
            logger.warning(
                "AutoLoCo: TrainingArguments(fsdp=%r) is set but accelerate did not enable FSDP "
                "on this device (%s): every rank holds the whole model and trains as DDP",
                args.fsdp,
                accelerator.distributed_type,
            )
    if getattr(args, "parallelism_config", None) is not None:
        raise AutoLoCoConfigurationError(
            f"AutoLoCo does not support ParallelismConfig (TP/CP/SP) yet; {SUPPORTED}."
        )
