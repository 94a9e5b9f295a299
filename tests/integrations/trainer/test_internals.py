"""The contract tests of autoloco_hf/integrations/trainer/internals.py:
the Trainer behaviour AutoLoCo relies on beyond the callback contract.
Each failure names the function to update after a transformers upgrade."""

from __future__ import annotations

import dataclasses
import inspect
import json
from types import SimpleNamespace

import pytest
import torch
from test_callback_input import Tokens, tiny_llama
from transformers import Trainer, TrainingArguments
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
from autoloco_hf.errors import AutoLoCoConfigurationError
from autoloco_hf.integrations.trainer.collectives import GUARDED_METHOD
from autoloco_hf.integrations.trainer.internals import (
    checkpoint_dir,
    follow_process_group,
    is_sync_only,
    resume_in_memory,
)


def args(tmp_path, **overrides) -> TrainingArguments:
    values = dict(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=2, disable_tqdm=True
    )
    return TrainingArguments(**{**values, **overrides})


def test_the_callback_finds_the_trainer_being_built(tmp_path):
    callback = AutoLoCoCallback(AutoLoCoConfig(method="diloco", h_base=2))
    trainer = Trainer(
        model=tiny_llama(), args=args(tmp_path), train_dataset=Tokens(), callbacks=[callback]
    )
    assert callback.trainer is trainer, (
        "AutoLoCoCallback no longer finds its Trainer during Trainer.__init__ (on_init_end): "
        "transformers changed how it fires on_init_end; update trainer_being_built"
    )


def test_the_class_instead_of_an_instance_is_refused(tmp_path):
    """`callbacks=[AutoLoCoCallback]` would silently train with the defaults
    (built_from_the_class_by_the_trainer)."""
    with pytest.raises(TypeError, match=r"passes the class"):
        Trainer(
            model=tiny_llama(),
            args=args(tmp_path),
            train_dataset=Tokens(),
            callbacks=[AutoLoCoCallback],
        )
    # a user's own AutoLoCoCallback() keeps the defaults
    assert AutoLoCoCallback().config == AutoLoCoConfig()


@pytest.mark.parametrize(
    "disable_tqdm, console", [(True, PrinterCallback), (False, ProgressCallback)]
)
def test_the_console_skips_sync_only_logs(tmp_path, capsys, disable_tqdm, console):
    callback = AutoLoCoCallback(AutoLoCoConfig(method="diloco", h_base=2))
    trainer = Trainer(
        model=tiny_llama(),
        args=args(tmp_path, disable_tqdm=disable_tqdm),
        train_dataset=Tokens(),
        callbacks=[callback],
    )
    assert any(type(c) is console for c in trainer.callback_handler.callbacks), (
        f"the Trainer's console callback is no longer {console.__name__}: update quiet_console"
    )
    trainer.state.is_local_process_zero = trainer.state.is_world_process_zero = True
    handler = trainer.callback_handler
    handler.on_log(
        trainer.args, trainer.state, trainer.control, logs={"autoloco/syncs": 1.0, "epoch": 0.5}
    )
    assert "autoloco/syncs" not in capsys.readouterr().out
    handler.on_log(trainer.args, trainer.state, trainer.control, logs={"loss": 1.25, "epoch": 0.5})
    # the progress bar prints only once its bar exists (on_train_begin)
    if console is PrinterCallback:
        assert "'loss'" in capsys.readouterr().out
    assert (
        is_sync_only({"autoloco/H_step": 2.0, "step": 3})
        and not is_sync_only({"loss": 1.0})
        and not is_sync_only({})
    )


def test_checkpoints_are_where_checkpoint_dir_says(tmp_path):
    torch.set_num_threads(1)
    callback = AutoLoCoCallback(AutoLoCoConfig(method="diloco", h_base=1))
    trainer = Trainer(
        model=tiny_llama(),
        args=args(tmp_path, save_strategy="steps", save_steps=2, per_device_train_batch_size=2),
        train_dataset=Tokens(),
        callbacks=[callback],
    )
    trainer.train()
    folder = checkpoint_dir(trainer.args, trainer.state)
    found = sorted(p.name for p in (tmp_path / "checkpoint-2").iterdir())
    assert folder == str(tmp_path / "checkpoint-2") and "trainer_state.json" in found, (
        f"the Trainer no longer writes checkpoints to {folder} ({found}): update checkpoint_dir"
    )
    assert "autoloco" in found and "model.safetensors" in found


def test_hyperparameter_search_trials_are_refused():
    state = SimpleNamespace(trial_name="trial-3", global_step=4)
    with pytest.raises(
        AutoLoCoConfigurationError, match=r"hyperparameter search \(trial 'trial-3'\)"
    ):
        checkpoint_dir(SimpleNamespace(output_dir="out"), state)


def test_the_loss_gather_of_a_logging_step_is_inside_the_guarded_method():
    """bound_trainer_collectives wraps this method: it must
    still be where the Trainer gathers the loss."""
    method = getattr(Trainer, GUARDED_METHOD, None)
    assert method is not None, (
        f"Trainer.{GUARDED_METHOD} is gone: update autoloco_hf/integrations/trainer/collectives.py"
    )
    assert "nested_gather(tr_loss" in inspect.getsource(method), (
        f"Trainer.{GUARDED_METHOD} no longer gathers the loss: update "
        "trainer.collectives.GUARDED_METHOD"
    )


def test_resume_in_memory_resumes_at_the_folders_step_with_the_callers_loader(tmp_path):
    """train() resumes from a folder holding only
    trainer_state.json, the loaders replaced for that call only."""
    torch.set_num_threads(1)
    trainer = Trainer(model=tiny_llama(), args=args(tmp_path, max_steps=6), train_dataset=Tokens())
    trainer.train()
    trainer.state.global_step = 4
    state = json.dumps(dataclasses.asdict(trainer.state))  # as trainer_boundary_state writes it
    loaded = []
    with resume_in_memory(
        trainer, state, lambda: loaded.append(trainer.state.global_step)
    ) as folder:
        trainer.train(resume_from_checkpoint=folder)
    assert loaded == [4] and trainer.state.global_step == 6, (
        f"train() resumed {trainer.state.global_step - 4} steps from the in-memory folder, loader "
        f"calls {loaded}: the Trainer's resume no longer goes through _load_from_checkpoint / "
        "_load_optimizer_and_scheduler; update resume_in_memory"
    )
    assert "_load_from_checkpoint" not in vars(
        trainer
    ) and "_load_optimizer_and_scheduler" not in vars(trainer)


def test_follow_process_group_drops_the_wrapper_and_takes_the_groups_size(tmp_path, monkeypatch):
    from accelerate.state import AcceleratorState, PartialState

    trainer = Trainer(model=tiny_llama(), args=args(tmp_path), train_dataset=Tokens())
    trainer.model_wrapped = torch.nn.DataParallel(trainer.model)  # a wrapper of an earlier group
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 3)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 2)
    for shared in (PartialState._shared_state, AcceleratorState._shared_state):
        for key in ("num_processes", "process_index"):
            monkeypatch.setitem(shared, key, shared[key])
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    follow_process_group(trainer)
    assert trainer.model_wrapped is trainer.model
    assert (trainer.accelerator.num_processes, trainer.accelerator.process_index) == (3, 2), (
        "accelerate no longer reads its world size from the shared states: "
        "update follow_process_group"
    )
    assert (trainer.args.world_size, trainer.args.process_index) == (3, 2)
