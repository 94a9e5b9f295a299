"""Hugging Face integration: ``AutoLoCoCallback`` (Trainer, TRL SFTTrainer) and ``AutoLoCoAccelerate``.

See docs/hf.md. Modules: ``trainer`` (the TrainerCallback and launch checks),
``accelerate`` (plain Accelerate loops), ``runtime`` (one worker's engine, hooks
and checkpoint state, shared by both), ``ddp_hooks`` (the DDP communication hook
and the token/loss meter), ``groups`` (worker groups, docs/algorithm.md §8.3). Imported lazily so
that ``import autoloco_hf.integrations`` does not import transformers.
"""

from typing import Any

_LAZY = {
    "AutoLoCoCallback": "autoloco_hf.integrations.trainer",
    "AutoLoCoConfigurationError": "autoloco_hf.integrations.trainer",
    "check_launch": "autoloco_hf.integrations.trainer",
    "last_complete_checkpoint": "autoloco_hf.integrations.trainer",
    "AutoLoCoAccelerate": "autoloco_hf.integrations.accelerate",
    "WorkerRuntime": "autoloco_hf.integrations.runtime",
    "WorkerTopology": "autoloco_hf.integrations.groups",
    "build_topology": "autoloco_hf.integrations.groups",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autoloco_hf.integrations' has no attribute {name!r}")
