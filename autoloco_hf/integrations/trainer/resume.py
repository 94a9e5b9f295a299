"""Where a Trainer run resumes: its last checkpoint, or its
last boundary with any number of workers.

A Trainer checkpoint holds every rank's AutoLoCo state:
:func:`last_complete_checkpoint` finds the newest one a killed worker did not
leave half-written, and :func:`restore` checks that the state belongs to the
weights the Trainer loaded. Resuming it with another number of processes is
refused. A boundary snapshot resumes with any number (docs/algorithm.md#boundary-snapshots).

With ``AutoLoCoConfig.snapshot_dir`` set, the callback's boundary snapshot holds,
next to the engine's shared state, the Trainer's at that boundary
(:func:`trainer_boundary_state`): its ``TrainerState``, the LR scheduler's state
and the inner optimizer's parameter groups (learning rate, betas, ...), all the
same on every rank. After a (re)start :func:`resume_point` picks what to resume:
the last complete Trainer checkpoint when it is at least as new and has this
launch's layout (it also carries every rank's inner state: an exact resume),
else the newest snapshot, turned into a Trainer checkpoint folder
``<snapshot_dir>/resume-<step>`` (written once, by the main process):

* ``model.safetensors`` (``save_pretrained``): ``theta_t``;
* ``optimizer.pt``: the parameter groups and no state (fresh moments on every worker);
* ``scheduler.pt`` and ``trainer_state.json``: the Trainer's, at the boundary step;
* ``autoloco/boundary.safetensors``: the snapshot itself, verified again when loaded.

``trainer.train(resume_from_checkpoint=folder)`` then resumes by the Trainer's
own path (model, optimizer and scheduler loaded, ``global_step`` restored, the
batches of the steps before the boundary skipped with ``skip_first_batches``),
and the callback resumes the engine from the snapshot. There is no RNG file:
the random state after a resume with another layout is the launch's own.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
from typing import Any

import torch
from transformers import Trainer, TrainerState
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from autoloco_hf.config import AutoLoCoConfig
from autoloco_hf.errors import AutoLoCoConfigurationError
from autoloco_hf.integrations.runtime import (
    STATE_DIRNAME,
    TrainableParameters,
    WorkerRuntime,
    state_path,
)
from autoloco_hf.integrations.trainer.internals import checkpoint_dir
from autoloco_hf.state.checkpoint import CheckpointError, peek_header
from autoloco_hf.sync.snapshot import (
    Snapshot,
    latest_snapshot,
    read_snapshot,
    snapshot_paths,
    step_of,
)

TRAINER_KEY = "trainer"
BOUNDARY_FILE = "boundary.safetensors"
RESUME_PREFIX = "resume-"


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-*`` in ``output_dir`` that
    holds the Trainer's state and every rank's AutoLoCo state.

    For scripts restarted by ``torchrun --max-restarts`` (or an equivalent launcher):
    ``trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir))`` starts fresh
    on the first attempt and resumes after a restart. Unlike ``get_last_checkpoint`` it skips a
    folder a killed worker left half-written (no ``trainer_state.json``, a missing or short
    ``autoloco/rank{r}.safetensors``); checksums are verified when the state is loaded.
    """
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for name in os.listdir(output_dir):
        prefix, _, step = name.partition("-")
        if (
            prefix == PREFIX_CHECKPOINT_DIR
            and step.isdigit()
            and os.path.isdir(os.path.join(output_dir, name))
        ):
            steps.append(int(step))
    for step in sorted(steps, reverse=True):
        folder = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if not os.path.isfile(os.path.join(folder, TRAINER_STATE_NAME)):
            continue
        first = peek_header(state_path(folder, 0))
        if first is None or first.step != step:
            continue
        if all(
            peek_header(state_path(folder, rank)) is not None for rank in range(1, first.world_size)
        ):
            return folder
    return None


def resumed_checkpoint(args: Any, state: Any, explicit: str | None = None) -> str:
    """The checkpoint the Trainer resumed from: ``explicit``, ``args.resume_from_checkpoint``, else
    the folder of the restored ``global_step``.

    ``trainer.train(resume_from_checkpoint=True)`` resumes ``get_last_checkpoint(args.output_dir)``,
    the folder :func:`checkpoint_dir` names; a path given to ``train()`` is not visible to
    callbacks, hence ``explicit``.
    """
    candidates = [
        explicit,
        getattr(args, "resume_from_checkpoint", None),
        checkpoint_dir(args, state),
    ]
    found = [c for c in candidates if isinstance(c, str) and os.path.isdir(c)]
    if not found:
        raise FileNotFoundError(
            f"the Trainer resumes at step {state.global_step} but {checkpoint_dir(args, state)} "
            "does not exist: pass the checkpoint folder as "
            "AutoLoCoCallback(resume_from_checkpoint=...)"
        )
    return found[0]


def restore(runtime: WorkerRuntime, checkpoint: str, global_step: int) -> str:
    """Load this rank's AutoLoCo state from ``checkpoint``;
    refuse one that is not the Trainer's (step, weights).

    The Trainer loaded the checkpoint's model file, which holds theta_t
    (the callback's ``on_save``), so the synchronized parameters in the
    AutoLoCo state must equal the model's weights before the load.
    """
    loaded = [p.detach().to("cpu", copy=True) for p in runtime.trainable.params]
    path = runtime.load(checkpoint)
    if runtime.step != global_step:
        raise RuntimeError(
            f"{path}: field step={runtime.step} but the Trainer resumes at step {global_step}: "
            "pass the checkpoint the Trainer resumes from as "
            "AutoLoCoCallback(resume_from_checkpoint=...)"
        )
    if not all(torch.equal(a, b.cpu()) for a, b in zip(loaded, runtime.global_parameters())):
        raise RuntimeError(
            f"{path}: the synchronized parameters in the AutoLoCo state differ from the model "
            "weights the Trainer loaded: the Trainer resumed from another checkpoint than "
            f"{checkpoint}; pass that one as AutoLoCoCallback(resume_from_checkpoint=...)"
        )
    return path


def boundary_file(checkpoint: str) -> str:
    """Where a boundary resume folder holds its snapshot (absent from a Trainer checkpoint)."""
    return os.path.join(checkpoint, STATE_DIRNAME, BOUNDARY_FILE)


def trainer_boundary_state(trainer: Trainer) -> dict[str, Any]:
    """The Trainer's shared state at a boundary, stored in
    the snapshot (called by its writer at the boundary)."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    return {
        TRAINER_KEY: {
            "trainer_state": json.dumps(dataclasses.asdict(trainer.state), sort_keys=True),
            "scheduler": trainer.lr_scheduler.state_dict(),
            "param_groups": optimizer.state_dict()["param_groups"],
        }
    }


def check_no_newer_snapshots(config: AutoLoCoConfig, step: int) -> None:
    """Refuse a start at ``step`` over snapshots past it
    (another run's, or a later point of this one).

    A later restart would resume from them: a fresh start over an earlier
    run's folder, or a resume from an older Trainer checkpoint than the
    last boundary (``resume_point()`` would have chosen the boundary).
    """
    if config.snapshot_dir is None:
        return
    newer = [p for p in snapshot_paths(config.snapshot_dir) if step_of(p) > step]
    if newer:
        raise AutoLoCoConfigurationError(
            f"AutoLoCoConfig.snapshot_dir={config.snapshot_dir!r} holds boundary snapshots past "
            f"step {step}, where this run starts (newest {os.path.basename(newer[0])}): resume "
            "with trainer.train(resume_from_checkpoint=callback.resume_point()), or "
            "give a new or empty folder"
        )


def _checkpoint_suffices(
    checkpoint: str | None, snapshot: Snapshot, world_size: int, ranks_per_worker: int
) -> bool:
    """Whether the Trainer checkpoint is as new as the snapshot
    and has this launch's layout (an exact resume)."""
    if checkpoint is None:
        return False
    header = peek_header(state_path(checkpoint, 0))
    layout = (header.world_size, header.ranks_per_worker) == (world_size, ranks_per_worker)
    return layout and header.step >= snapshot.step


def resume_point(trainer: Trainer, config: AutoLoCoConfig) -> str | None:
    """What ``trainer.train(resume_from_checkpoint=...)``
    resumes after a (re)start; ``None``: a fresh start.

    The last complete Trainer checkpoint, unless the newest boundary snapshot is newer or the
    checkpoint was written by another launch layout: then the snapshot's resume folder (written
    here; see the module docstring).
    """
    args = trainer.args
    checkpoint = last_complete_checkpoint(args.output_dir)
    if config.snapshot_dir is None:
        return checkpoint
    snapshot = latest_snapshot(config.snapshot_dir, config)
    if snapshot is None or _checkpoint_suffices(
        checkpoint, snapshot, args.world_size, config.ranks_per_worker
    ):
        return checkpoint
    if TRAINER_KEY not in snapshot.state:
        raise CheckpointError(
            f"{snapshot.path}: field {TRAINER_KEY} is missing: the snapshot was not written by a "
            "Trainer run (WorkerRuntime or LocalWorkers wrote it); resume it with "
            "WorkerRuntime.resume_from_snapshot"
        )
    folder = os.path.join(config.snapshot_dir, f"{RESUME_PREFIX}{snapshot.step:09d}")
    with args.main_process_first(local=False, desc="AutoLoCo boundary resume folder"):
        if not os.path.isfile(os.path.join(folder, TRAINER_STATE_NAME)):
            if args.process_index != 0:
                raise FileNotFoundError(
                    f"{folder} is missing on rank {args.process_index} after the main process "
                    f"wrote it: AutoLoCoConfig.snapshot_dir={config.snapshot_dir!r} must be "
                    "storage every node reads"
                )
            _write_resume_folder(trainer, snapshot, folder)
    return folder


def _write_resume_folder(trainer: Trainer, snapshot: Snapshot, folder: str) -> None:
    """A Trainer checkpoint of the boundary (see the module
    docstring), written whole or not at all."""
    shared = snapshot.state[TRAINER_KEY]
    state = TrainerState(**json.loads(shared["trainer_state"]))
    if state.global_step != snapshot.step:
        raise CheckpointError(
            f"{snapshot.path}: field trainer.global_step={state.global_step} but the snapshot is "
            f"of step {snapshot.step}: the file is inconsistent; remove it to "
            "resume from the one before"
        )
    temporary = f"{folder}.tmp-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(os.path.join(temporary, STATE_DIRNAME))
    _load_theta(trainer.model, snapshot)
    trainer.model.save_pretrained(temporary)
    torch.save(
        {"state": {}, "param_groups": shared["param_groups"]},
        os.path.join(temporary, OPTIMIZER_NAME),
    )
    torch.save(shared["scheduler"], os.path.join(temporary, SCHEDULER_NAME))
    state.save_to_json(os.path.join(temporary, TRAINER_STATE_NAME))
    shutil.copyfile(snapshot.path, boundary_file(temporary))
    os.replace(temporary, folder)
    for old in glob.glob(os.path.join(glob.escape(os.path.dirname(folder)), f"{RESUME_PREFIX}*")):
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)


@torch.no_grad()
def _load_theta(model: torch.nn.Module, snapshot: Snapshot) -> None:
    """Put the snapshot's ``theta_t`` into the model's
    trainable parameters (the outer parameters' order)."""
    params = TrainableParameters(model).params
    flat = snapshot.engine_state["outer"]["params"]
    if flat.numel() != sum(p.numel() for p in params):
        raise CheckpointError(
            f"{snapshot.path}: field outer.params holds {flat.numel()} values but the model has "
            f"{sum(p.numel() for p in params)} trainable ones: the snapshot "
            "belongs to another model"
        )
    for p, chunk in zip(params, torch.split(flat, [p.numel() for p in params])):
        p.copy_(chunk.view_as(p).to(p.device, p.dtype))


def resume_from_boundary(runtime: WorkerRuntime, checkpoint: str, global_step: int) -> Snapshot:
    """Resume the engine from a resume folder's snapshot
    (verified again), at the step the Trainer restored."""
    snapshot = read_snapshot(boundary_file(checkpoint), runtime.config)
    if snapshot.step != global_step:
        raise CheckpointError(
            f"{snapshot.path}: field step={snapshot.step} but the Trainer resumes at step "
            f"{global_step}: pass the folder that callback.resume_point() returned to "
            "trainer.train(resume_from_checkpoint=...)"
        )
    runtime.resume_from_snapshot(snapshot)
    return snapshot
