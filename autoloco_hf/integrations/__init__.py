"""Hugging Face integration: ``AutoLoCoCallback`` (Trainer, TRL SFTTrainer) and ``AutoLoCoAccelerate``.

See docs/hf.md. Modules: ``trainer`` (the TrainerCallback), ``trainer_internals``
(the Trainer behaviour it relies on beyond the callback contract), ``resume``
(which checkpoint, and whether its AutoLoCo state matches), ``boundary_resume``
(a restart from the last boundary snapshot, any number of workers), ``run_log`` (the run
files ``autoloco report`` reads), ``launch_checks`` (supported launches, for the
callback and ``AutoLoCoAccelerate``), ``accelerate`` (plain Accelerate loops),
``arguments`` (``AutoLoCoArguments`` for ``HfArgumentParser``), ``runtime`` (one
worker's engine, hooks and checkpoint state, shared by both), ``ddp_hooks`` (the
DDP communication hook and the token/loss meter), ``groups`` (worker groups,
docs/algorithm.md §8.3), ``live_membership`` (survivors that do not restart: membership rounds
on a store), ``live_trainer`` (the Trainer on those rounds, docs/reliability.md). Imported lazily so that ``import autoloco_hf.integrations``
does not import transformers.
"""

from typing import Any

_LAZY = {
    "AutoLoCoCallback": "autoloco_hf.integrations.trainer",
    "AutoLoCoArguments": "autoloco_hf.integrations.arguments",
    "AutoLoCoConfigurationError": "autoloco_hf.integrations.launch_checks",
    "check_launch": "autoloco_hf.integrations.launch_checks",
    "last_complete_checkpoint": "autoloco_hf.integrations.resume",
    "AutoLoCoAccelerate": "autoloco_hf.integrations.accelerate",
    "WorkerRuntime": "autoloco_hf.integrations.runtime",
    "WorkerTopology": "autoloco_hf.integrations.groups",
    "build_topology": "autoloco_hf.integrations.groups",
    "LiveMembership": "autoloco_hf.integrations.live_membership",
    "etcd_store": "autoloco_hf.integrations.live_membership",
    "train_live": "autoloco_hf.integrations.live_trainer",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autoloco_hf.integrations' has no attribute {name!r}")
