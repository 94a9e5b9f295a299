"""The Trainer on live membership: survivors of a lost peer and joining processes go on without a restart.

docs/reliability.md, "Live membership under the Trainer". :func:`train_live` runs
``trainer.train()`` inside the membership rounds of
:class:`~autoloco_hf.integrations.elastic.membership.LiveMembership`. When a peer is
lost (``PeerLostError`` at a boundary or in the Trainer's own gathers) or a
process waits to join (``MembershipChange`` at a boundary), ``train()`` ends
with that error; the members form the next round, and ``train()`` is called
again on the new process group from the agreed boundary: the model gets the
source's ``theta_t``, the engine its outer state, the LR scheduler and
``TrainerState`` the source's (so the Trainer skips the data of the steps
before the boundary, as after any resume), and each process keeps its own
AdamW state. Nothing is read from or written to disk; no process starts again.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from transformers import Trainer

from autoloco_hf.integrations.elastic.agreement import Agreement
from autoloco_hf.integrations.elastic.errors import MembershipChange
from autoloco_hf.integrations.elastic.membership import LiveMembership
from autoloco_hf.integrations.trainer.callback import AutoLoCoCallback
from autoloco_hf.integrations.trainer.internals import follow_process_group, resume_in_memory
from autoloco_hf.integrations.trainer.resume import TRAINER_KEY
from autoloco_hf.sync.communicators import PeerLostError

__all__ = ["train_live"]

logger = logging.getLogger("autoloco_hf")


def _callback(trainer: Trainer, membership: LiveMembership) -> AutoLoCoCallback:
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, AutoLoCoCallback) and callback.membership is membership:
            return callback
    raise ValueError(
        "train_live: the Trainer has no AutoLoCoCallback with this membership: build it with "
        "AutoLoCoCallback(config, membership=membership)"
    )


def _load_boundary(trainer: Trainer, shared: dict[str, Any]) -> None:
    """The source's LR schedule at the boundary; this process's AdamW moments stay (a new process: none yet)."""
    trainer.lr_scheduler.load_state_dict(shared["scheduler"])
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    for group, lr in zip(optimizer.param_groups, trainer.lr_scheduler.get_last_lr()):
        group["lr"] = lr


def train_live(trainer: Trainer, membership: LiveMembership, agreement: Agreement, **train_kwargs: Any) -> Any:
    """``trainer.train(**train_kwargs)`` through every change of membership; returns the last call's output.

    ``agreement``: this process's first round (``membership.start(world_size)``, the same call for the
    launch's processes and for one started later, taken in at a boundary), formed before the ``TrainingArguments``
    so that accelerate sees its process group. A ``PeerLostError`` or ``MembershipChange`` reforms the run;
    any other error ends it as before (the restart path is the fallback: docs/reliability.md).
    """
    _callback(trainer, membership)
    while True:
        follow_process_group(trainer)
        try:
            if agreement.state is None:  # round 0 of a fresh run
                return trainer.train(**train_kwargs)
            shared = agreement.state[TRAINER_KEY]
            load = functools.partial(_load_boundary, trainer, shared)
            with resume_in_memory(trainer, shared["trainer_state"], load) as folder:
                return trainer.train(resume_from_checkpoint=folder, **train_kwargs)
        except PeerLostError as err:
            logger.warning("%s", err)  # it names the lost rank and the boundary the members go on from
            agreement = membership.reform(lost=err.silent_ranks)
        except MembershipChange:
            agreement = membership.reform()
