"""Hugging Face integration: ``AutoLoCoCallback`` (Trainer,
TRL SFTTrainer) and ``AutoLoCoAccelerate``.

See docs/hf.md. Modules, top floor first:

* ``trainer/``: what only the Trainer uses: ``callback`` (the TrainerCallback),
  ``internals`` (the Trainer behaviour it relies on beyond the callback
  contract), ``collectives`` (the Trainer's own collectives, bounded),
  ``pacing`` (budget pacing), ``resume`` (which checkpoint or boundary to
  resume), ``arguments``
  (``AutoLoCoArguments`` for ``HfArgumentParser``), ``log_levels`` and ``live``
  (``train_live``: the Trainer on live membership, docs/reliability.md);
* ``accelerate``: ``AutoLoCoAccelerate``, for plain Accelerate loops;
* ``elastic/``: live membership, for both (survivors that do not restart:
  membership rounds on a store; ``LiveMembership``, ``etcd_store``);
* ``runtime`` (one worker's engine, hooks and checkpoint state, shared by
  both) and ``launch_checks`` (supported launches, for both);
* ``ddp_hooks`` (the DDP communication hook and the token/loss meter) and
  ``groups`` (worker groups and FSDP2 meshes, docs/algorithm.md#worker-groups).

Imported lazily so that ``import autoloco_hf.integrations`` does not import transformers.
"""

from typing import Any

_LAZY = {
    "AutoLoCoCallback": "autoloco_hf.integrations.trainer.callback",
    "AutoLoCoArguments": "autoloco_hf.integrations.trainer.arguments",
    "AutoLoCoConfigurationError": "autoloco_hf.errors",
    "check_launch": "autoloco_hf.integrations.launch_checks",
    "last_complete_checkpoint": "autoloco_hf.integrations.trainer.resume",
    "AutoLoCoAccelerate": "autoloco_hf.integrations.accelerate",
    "WorkerRuntime": "autoloco_hf.integrations.runtime",
    "WorkerTopology": "autoloco_hf.integrations.groups",
    "build_topology": "autoloco_hf.integrations.groups",
    "LiveMembership": "autoloco_hf.integrations.elastic.membership",
    "etcd_store": "autoloco_hf.integrations.elastic.store",
    "train_live": "autoloco_hf.integrations.trainer.live",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autoloco_hf.integrations' has no attribute {name!r}")
