"""Which Trainer checkpoint to resume from, and the check that the AutoLoCo state belongs to the weights loaded."""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from autoloco_hf.integrations.runtime import WorkerRuntime, state_path
from autoloco_hf.integrations.trainer_internals import checkpoint_dir
from autoloco_hf.state.checkpoint import peek_header


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-*`` in ``output_dir`` that holds the Trainer's state and every rank's AutoLoCo state.

    For scripts restarted by ``torchrun --max-restarts`` (or an equivalent launcher):
    ``trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir))`` starts fresh on the first
    attempt and resumes after a restart. Unlike ``get_last_checkpoint`` it skips a folder a killed worker left
    half-written (no ``trainer_state.json``, a missing or short ``autoloco/rank{r}.safetensors``); checksums are verified
    when the state is loaded.
    """
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for name in os.listdir(output_dir):
        prefix, _, step = name.partition("-")
        if prefix == PREFIX_CHECKPOINT_DIR and step.isdigit() and os.path.isdir(os.path.join(output_dir, name)):
            steps.append(int(step))
    for step in sorted(steps, reverse=True):
        folder = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if not os.path.isfile(os.path.join(folder, TRAINER_STATE_NAME)):
            continue
        first = peek_header(state_path(folder, 0))
        if first is None or first.step != step:
            continue
        if all(peek_header(state_path(folder, rank)) is not None for rank in range(1, first.world_size)):
            return folder
    return None


def resumed_checkpoint(args: Any, state: Any, explicit: str | None = None) -> str:
    """The checkpoint the Trainer resumed from: ``explicit``, ``args.resume_from_checkpoint``, else the folder of
    the restored ``global_step``.

    ``trainer.train(resume_from_checkpoint=True)`` resumes ``get_last_checkpoint(args.output_dir)``, the folder
    :func:`checkpoint_dir` names; a path given to ``train()`` is not visible to callbacks, hence ``explicit``.
    """
    candidates = [explicit, getattr(args, "resume_from_checkpoint", None), checkpoint_dir(args, state)]
    found = [c for c in candidates if isinstance(c, str) and os.path.isdir(c)]
    if not found:
        raise FileNotFoundError(
            f"the Trainer resumes at step {state.global_step} but {checkpoint_dir(args, state)} does not exist: "
            "pass the checkpoint folder as AutoLoCoCallback(resume_from_checkpoint=...)"
        )
    return found[0]


def restore(runtime: WorkerRuntime, checkpoint: str, global_step: int) -> str:
    """Load this rank's AutoLoCo state from ``checkpoint``; refuse one that is not the Trainer's (step, weights).

    The Trainer loaded the checkpoint's model file, which holds theta_t (the callback's ``on_save``), so the
    synchronized parameters in the AutoLoCo state must equal the model's weights before the load.
    """
    loaded = [p.detach().to("cpu", copy=True) for p in runtime.trainable.params]
    path = runtime.load(checkpoint)
    if runtime.step != global_step:
        raise RuntimeError(
            f"{path}: field step={runtime.step} but the Trainer resumes at step {global_step}: pass "
            "the checkpoint the Trainer resumes from as AutoLoCoCallback(resume_from_checkpoint=...)"
        )
    if not all(torch.equal(a, b.cpu()) for a, b in zip(loaded, runtime.global_parameters())):
        raise RuntimeError(
            f"{path}: the synchronized parameters in the AutoLoCo state differ from the model weights the "
            f"Trainer loaded: the Trainer resumed from another checkpoint than {checkpoint}; pass that one as "
            "AutoLoCoCallback(resume_from_checkpoint=...)"
        )
    return path
