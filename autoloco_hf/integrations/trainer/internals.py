"""The ``Trainer`` behaviour AutoLoCo relies on beyond the
callback contract, kept in this one module.

The callback contract hands callbacks no Trainer, and says nothing about the
console callbacks or where checkpoints go. Each function here reads one such
behaviour; tests/integrations/trainer/test_internals.py fails loudly, naming the
function to update, when a transformers upgrade changes any of them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from autoloco_hf.errors import AutoLoCoConfigurationError
from autoloco_hf.integrations.elastic.process_group import adopt_process_group


def built_from_the_class_by_the_trainer(max_depth: int = 4) -> bool:
    """Whether ``Trainer(callbacks=[AutoLoCoCallback])`` is
    instantiating the class itself (no config given).

    ``CallbackHandler.add_callback`` calls ``callback()`` when it is handed a class; its frame holds
    the class as ``callback``, a few frames above the callback's ``__init__``.
    """
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            break
        if frame.f_code.co_name == "add_callback" and isinstance(
            frame.f_locals.get("callback"), type
        ):
            return True
        frame = frame.f_back
    return False


def trainer_being_built(callback: Any, max_depth: int = 8) -> Trainer | None:
    """The Trainer whose ``__init__`` is firing
    ``on_init_end`` with ``callback`` registered, or ``None``.

    AutoLoCo must adjust the Trainer's accelerator (DDP kwargs) before ``train()`` wraps the model,
    and needs ``model_wrapped`` and ``Trainer.log`` later. ``Trainer.__init__`` calls
    ``callback_handler.on_init_end`` itself, so its frame is a few levels up;
    ``callback.attach(trainer)`` is the explicit alternative.
    """
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            break
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer) and callback in getattr(
            candidate.callback_handler, "callbacks", ()
        ):
            return candidate
        frame = frame.f_back
    return None


def is_sync_only(logs: dict[str, Any] | None) -> bool:
    """Whether a log holds only ``autoloco/*`` scalars (plus
    the ``epoch`` / ``step`` that ``Trainer.log`` adds)."""
    return bool(logs) and all(
        key.startswith("autoloco/") or key in ("epoch", "step") for key in logs
    )


def quiet_console(trainer: Trainer) -> None:
    """Keep the console callbacks (progress bar, printer) from
    printing the per-sync logs meant for the trackers."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, (ProgressCallback, PrinterCallback)):
            printer_on_log = callback.on_log

            def on_log(args, state, control, logs=None, _print=printer_on_log, **kwargs):
                return (
                    None
                    if is_sync_only(logs)
                    else _print(args, state, control, logs=logs, **kwargs)
                )

            callback.on_log = on_log


def checkpoint_dir(args: Any, state: Any) -> str:
    """The folder ``Trainer._save_checkpoint`` writes at ``state.global_step`` (and
    ``get_last_checkpoint`` finds).

    ``<output_dir>/checkpoint-<global_step>``:
    hyperparameter-search trials write elsewhere and are refused.
    """
    if getattr(state, "trial_name", None):
        raise AutoLoCoConfigurationError(
            "AutoLoCo does not support hyperparameter search (trial "
            f"{state.trial_name!r}): run each configuration as its own job"
        )
    return os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


def follow_process_group(trainer: Trainer) -> None:
    """Make ``trainer`` train on the current default process
    group after live membership replaced it.

    accelerate's shared state follows the group
    (:func:`~autoloco_hf.integrations.elastic.process_group.adopt_process_group`); and ``train()``
    keeps a model already wrapped (``model_wrapped``) instead of wrapping it again, so the wrapper
    of the old group is dropped here.
    """
    adopt_process_group(trainer.accelerator)
    trainer.model_wrapped = trainer.model


@contextlib.contextmanager
def resume_in_memory(
    trainer: Trainer, trainer_state: str, load_optimizer_and_scheduler: Callable[[], None]
) -> Iterator[str]:
    """A ``resume_from_checkpoint`` folder for one ``train()``
    call whose tensors come from memory, not files.

    ``train()`` resumes (global step, data skipped, callbacks' ``on_train_begin`` at that step) only
    from a folder. This one holds just ``trainer_state.json`` (``trainer_state``: its JSON); the
    Trainer's two loaders are replaced meanwhile: the model's by nothing (the caller's
    ``on_train_begin`` puts the parameters in), the optimizer's and scheduler's by
    ``load_optimizer_and_scheduler``.
    """
    with tempfile.TemporaryDirectory(prefix="autoloco-live-") as folder:
        with open(os.path.join(folder, TRAINER_STATE_NAME), "w") as f:
            f.write(trainer_state)
        trainer._load_from_checkpoint = lambda *args, **kwargs: None
        trainer._load_optimizer_and_scheduler = lambda *args, **kwargs: (
            load_optimizer_and_scheduler()
        )
        try:
            yield folder
        finally:
            # the class's methods again
            del trainer._load_from_checkpoint, trainer._load_optimizer_and_scheduler
