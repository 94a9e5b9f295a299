"""autoloco-hf: AutoLoCo adaptive-horizon low-communication training for Hugging Face.

The pure algorithm (``config``, ``schedule``, ``stats``, ``token_mapper``,
``controller``, ``correction``, ``policies``) imports neither
``torch.distributed`` nor ``transformers``. Heavier pieces are imported lazily
so that ``from autoloco_hf import AutoLoCoConfig`` stays cheap.
"""

from typing import Any

from autoloco_hf.config import AutoLoCoConfig, ConfigError

__version__ = "0.1.0"

_LAZY = {
    "AutoLoCoCallback": "autoloco_hf.integrations.trainer",
    "AutoLoCoAccelerate": "autoloco_hf.integrations.accelerate",
    "IntervalEngine": "autoloco_hf.sync.engine",
    "LocalWorkers": "autoloco_hf.sync.local_workers",
    "SimulatedCommunicator": "autoloco_hf.sync.communicators",
    "ProcessGroupCommunicator": "autoloco_hf.sync.communicators",
}

__all__ = ["AutoLoCoConfig", "ConfigError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autoloco_hf' has no attribute {name!r}")
