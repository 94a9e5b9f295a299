"""After live membership replaced the default process group, accelerate goes on with the new one.

A plain Accelerate loop calls :func:`adopt_process_group` after each round
(docs/reliability.md); the Trainer does it through
:func:`~autoloco_hf.integrations.trainer.internals.follow_process_group`.
"""

from __future__ import annotations

import os
from typing import Any


def adopt_process_group(accelerator: Any) -> None:
    """Make ``accelerator`` work on the current default
    process group after live membership replaced it.

    accelerate reads the world size and rank once, into its shared state, when the first
    ``Accelerator`` or ``TrainingArguments`` is built, and its prepared model is wrapped in DDP on
    the old group. So: the group's size and rank go into both shared states (``LOCAL_RANK``, the
    device, stays; ``RANK`` and ``WORLD_SIZE`` in the environment follow), and ``free_memory`` drops
    accelerate's references to what it prepared, so that the next ``prepare`` wraps the model again,
    on the new group (docs/reliability.md).
    """
    import torch.distributed as dist
    from accelerate.state import AcceleratorState, PartialState

    size, rank = dist.get_world_size(), dist.get_rank()
    for shared in (PartialState._shared_state, AcceleratorState._shared_state):
        shared["num_processes"], shared["process_index"] = size, rank
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(size)
    accelerator.free_memory()
