"""The Trainer's own collectives (loss gather, evaluation,
checkpoint barriers) end within ``sync_timeout_s``.

AutoLoCo's collectives run on groups it creates with ``AutoLoCoConfig.sync_timeout_s``; the
Trainer's run on the default process group, whose timeout is ``TrainingArguments.ddp_timeout`` (30
minutes by default). A peer lost while the survivors are in the loss gather of a logging step used
to surface as gloo's raw ``RuntimeError`` (a closed connection) or after ``ddp_timeout`` (a
partition). :func:`bound_trainer_collectives` sets the default group's timeout to the smaller of the
two bounds and turns a failed collective inside the Trainer's log / evaluate / save step into
:class:`~autoloco_hf.sync.communicators.PeerLostError`.
"""

from __future__ import annotations

import datetime
import functools
import os
import traceback
from collections.abc import Callable
from typing import Any

from transformers import Trainer

from autoloco_hf.sync.communicators import PeerLostError, peer_lost

GUARDED_METHOD = (
    # Trainer's log / evaluate / save step (tests/integrations/trainer/test_internals.py)
    "_maybe_log_save_evaluate"
)


def raised_by_a_collective(err: BaseException) -> bool:
    """Whether ``err`` left a ``torch.distributed`` function
    (not, e.g., the model's forward during evaluation)."""
    import torch.distributed as dist

    if isinstance(err, dist.DistError):
        return True
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and f"{os.sep}torch{os.sep}distributed{os.sep}" in frames[-1].filename


def bound_trainer_collectives(
    trainer: Trainer, timeout_s: float, advice: Callable[[], str]
) -> None:
    """Bound the default group's collectives by
    ``min(timeout_s, ddp_timeout)``; name a lost peer in one line.

    ``advice``: what to do next, asked when the error happens. Nothing to do in a single process.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    bound = min(float(timeout_s), float(trainer.args.ddp_timeout))
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=bound))
    method = getattr(trainer, GUARDED_METHOD)
    if getattr(method, "autoloco_guarded", False):  # a second train() on the same Trainer
        return

    @functools.wraps(method)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except RuntimeError as err:
            if isinstance(err, PeerLostError) or not raised_by_a_collective(err):
                raise
            # of this train(): live membership changes them
            rank, world = dist.get_rank(), dist.get_world_size()
            others = [r for r in range(world) if r != rank]
            lost = peer_lost(
                err, "the loss gather, evaluation or checkpoint barrier", rank, others, bound
            )
            raise lost.at(
                f"AutoLoCo: the Trainer's collectives at step {trainer.state.global_step} failed",
                advice(),
            ) from None

    guarded.autoloco_guarded = True  # type: ignore[attr-defined]
    setattr(trainer, GUARDED_METHOD, guarded)
