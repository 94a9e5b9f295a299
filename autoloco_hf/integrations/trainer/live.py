"""The Trainer on live membership: survivors of a lost peer
and joining processes go on without a restart.

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
from enum import Enum
from typing import Any

import torch.distributed as dist
from transformers import Trainer

from autoloco_hf.integrations.elastic.agreement import Agreement
from autoloco_hf.integrations.elastic.errors import JoinRefused, MembershipChange
from autoloco_hf.integrations.elastic.membership import LiveMembership
from autoloco_hf.integrations.trainer.callback import AutoLoCoCallback
from autoloco_hf.integrations.trainer.internals import follow_process_group, resume_in_memory
from autoloco_hf.integrations.trainer.resume import TRAINER_KEY
from autoloco_hf.sync.communicators import PeerLostError, peer_lost

__all__ = ["SHARED_TRAINING_ARGUMENTS", "train_live"]

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
    """The source's LR schedule at the boundary; this
    process's AdamW moments stay (a new process: none yet)."""
    trainer.lr_scheduler.load_state_dict(shared["scheduler"])
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    for group, lr in zip(optimizer.param_groups, trainer.lr_scheduler.get_last_lr()):
        group["lr"] = lr


# The TrainingArguments every member must share. The boundary state a member goes on from (the
# source's TrainerState and LR schedule) assumes the same steps, batch and schedule; a process with
# others would train another run under the same outer state.
SHARED_TRAINING_ARGUMENTS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_steps",
    "num_train_epochs",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "warmup_ratio",
    "weight_decay",
)


def shared_training_arguments(args: Any) -> dict[str, Any]:
    """The values of :data:`SHARED_TRAINING_ARGUMENTS` in ``args``, comparable across processes."""
    # a version may lack one
    values = {name: getattr(args, name, None) for name in SHARED_TRAINING_ARGUMENTS}
    return {
        name: value.value if isinstance(value, Enum) else value for name, value in values.items()
    }


def _first_difference(run: dict[str, Any], theirs: dict[str, Any]) -> tuple[str, Any, Any]:
    name = next(n for n in SHARED_TRAINING_ARGUMENTS if run[n] != theirs[n])
    return name, run[name], theirs[name]


def refused_ranks(
    gathered: list[dict[str, Any]], agreement: Agreement, member_id: str
) -> list[int]:
    """The members whose shared training arguments differ
    from the run's, the run's being the source's.

    At the launch nobody holds a boundary, so arrival order would pick the source: there the values
    most members share are the run's, and only when a majority of the round has them; without one,
    every process is refused in one line naming the field.
    """
    if agreement.state is not None:
        run = gathered[agreement.source_rank]
    else:
        groups: list[list[int]] = []
        for rank, values in enumerate(gathered):
            group = next((g for g in groups if gathered[g[0]] == values), None)
            if group is None:
                groups.append([rank])
            else:
                group.append(rank)
        largest = max(groups, key=len)  # the first of equal size: the same on every member
        if 2 * len(largest) <= len(gathered):
            other = next(g for g in groups if g is not largest)[0]
            name, ours, theirs = _first_difference(gathered[largest[0]], gathered[other])
            raise JoinRefused(
                f"{member_id} may not start the run (membership round {agreement.round}): no "
                f"majority of the {len(gathered)} process(es) agrees on its TrainingArguments: "
                f"field {name} is {ours!r} at {agreement.members[largest[0]]}, {theirs!r} at "
                f"{agreement.members[other]}; start every process with the same TrainingArguments"
            )
        run = gathered[largest[0]]
    return [rank for rank, values in enumerate(gathered) if values != run]


def _check_training_arguments(trainer: Trainer, agreement: Agreement, member_id: str) -> list[int]:
    """Compare this round's training arguments; raise :class:`JoinRefused` on a refused member.

    Returns the ranks the others must go on without. One all-gather on the round's group: every
    member gets the same list and decides alike.
    """
    mine = shared_training_arguments(trainer.args)
    gathered: list[Any] = [None] * agreement.world_size
    try:
        dist.all_gather_object(gathered, mine)
    except RuntimeError as err:
        others = [r for r in range(agreement.world_size) if r != agreement.rank]
        raise peer_lost(
            err, "the check of the training arguments", agreement.rank, others, None
        ) from err
    refused = refused_ranks(gathered, agreement, member_id)
    if agreement.rank in refused:
        run = gathered[next(rank for rank in range(len(gathered)) if rank not in refused)]
        name, expected, given = _first_difference(run, mine)
        raise JoinRefused(
            f"{member_id} may not join the run (membership round {agreement.round}): field "
            f"TrainingArguments.{name}={given!r} but the run has {name}={expected!r}: start it "
            "with the run's TrainingArguments"
        )
    return refused


def train_live(
    trainer: Trainer, membership: LiveMembership, agreement: Agreement, **train_kwargs: Any
) -> Any:
    """``trainer.train(**train_kwargs)`` through every change
    of membership; returns the last call's output.

    ``agreement``: this process's first round (``membership.start(world_size)``, the same call for
    the launch's processes and for one started later, taken in at a boundary), formed before the
    ``TrainingArguments`` so that accelerate sees its process group. A ``PeerLostError`` or
    ``MembershipChange`` reforms the run; any other error ends it as before (the restart path is the
    fallback: docs/reliability.md).
    """
    _callback(trainer, membership)
    while True:
        follow_process_group(trainer)
        try:
            if agreement.world_size > 1:
                refused = _check_training_arguments(trainer, agreement, membership.member_id)
                if refused:
                    names = [agreement.members[r] for r in refused]
                    logger.warning(
                        "membership round %d: %s refused: its TrainingArguments differ from the "
                        "run's (%s); the members go on without it",
                        agreement.round,
                        names,
                        ", ".join(SHARED_TRAINING_ARGUMENTS),
                    )
                    agreement = membership.reform(refused=refused)
                    continue
            if agreement.state is None:  # round 0 of a fresh run
                return trainer.train(**train_kwargs)
            shared = agreement.state[TRAINER_KEY]
            load = functools.partial(_load_boundary, trainer, shared)
            with resume_in_memory(trainer, shared["trainer_state"], load) as folder:
                return trainer.train(resume_from_checkpoint=folder, **train_kwargs)
        except PeerLostError as err:
            # it names the lost rank and the boundary the members go on from
            logger.warning("%s", err)
            agreement = membership.reform(lost=err.silent_ranks)
        except MembershipChange:
            agreement = membership.reform()
