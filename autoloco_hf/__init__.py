"""autoloco-hf: AutoLoCo adaptive-horizon low-communication training for Hugging Face.

The pure algorithm (``config`` and ``algorithm/``: schedule, stats,
token_mapper, controller, correction, policies, preview) imports neither
``torch.distributed`` nor ``transformers``; ``sync/`` moves the bytes;
``integrations/`` touches Hugging Face; ``cli/`` holds the tools. Heavier
pieces are imported lazily so that ``from autoloco_hf import AutoLoCoConfig``
stays cheap.

Glossary (one name per concept):

* worker: one model replica of the paper, the unit whose pseudo-gradient is
  averaged at a boundary. It is one process, several processes
  (``ranks_per_worker``, mapped by ``integrations.groups.WorkerTopology``), or
  one of ``N`` replicas simulated inside one process.
* local workers: the workers this process holds (``N`` simulated, else 1):
  ``Communicator.local_workers``; ``sync.workers.local_workers.LocalWorkers`` is the
  plain PyTorch training loop over them.
* ``integrations.runtime.WorkerRuntime``: what one process needs under the
  Trainer or Accelerate (engine, DDP hook, token meter, checkpoint state).
  Nothing else is called a runtime.
* interval: the optimizer steps between two synchronizations.
  ``algorithm.policies.NextInterval`` is what a policy chooses at an interval's
  start (``IntervalPolicy.next_interval``); ``IntervalEngine.current_interval``
  is the one being executed.
* preview: a computation that trains nothing: LR-mass previews
  (``algorithm.schedule``) and ``algorithm.preview.preview_run`` /
  ``RunPreview``, a whole run's horizons, shown by ``autoloco plan`` (the only
  thing called "plan").
* control message: the float64 scalars each worker sends next to its
  pseudo-gradient (``sync.control.ControlMessage``).
* payload bytes (the paper's logical count) and wire bytes (what a worker
  really sends): ``wire.accounting``.
"""

from typing import Any

from autoloco_hf.config import AutoLoCoConfig, ConfigError
from autoloco_hf.errors import AutoLoCoError

__version__ = "0.1.0"

_LAZY = {
    "AutoLoCoCallback": "autoloco_hf.integrations.trainer.callback",
    "AutoLoCoAccelerate": "autoloco_hf.integrations.accelerate",
    "AutoLoCoArguments": "autoloco_hf.integrations.trainer.arguments",
    "IntervalEngine": "autoloco_hf.sync.engine.engine",
    "make_engine": "autoloco_hf.sync.schedules.factory",
    "LocalWorkers": "autoloco_hf.sync.workers.local_workers",
    "SimulatedCommunicator": "autoloco_hf.sync.communicators",
    "ProcessGroupCommunicator": "autoloco_hf.sync.communicators",
}

__all__ = ["AutoLoCoConfig", "AutoLoCoError", "ConfigError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autoloco_hf' has no attribute {name!r}")
