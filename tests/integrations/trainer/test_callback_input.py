"""AutoLoCoCallback in one process: what it accepts, what it
refuses, what it prints and what it leaves behind."""

from __future__ import annotations

import ast
import json
import logging

import pytest
import torch
from transformers import LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
from autoloco_hf.config import ConfigError
from autoloco_hf.integrations.trainer.arguments import AutoLoCoArguments
from autoloco_hf.toy.llama import tiny_llama as build

STEPS = 8


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        ids = (torch.arange(12) + i) % 40 + 3
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def tiny_llama() -> LlamaForCausalLM:
    return build(48, 16, 1, 2, 32, max_position_embeddings=32, seed=0, tie_word_embeddings=False)


def training_args(tmp_path, **overrides) -> TrainingArguments:
    values = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 2,
        "max_steps": STEPS,
        "learning_rate": 1e-2,
        "warmup_steps": 1,
        "logging_steps": 4,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
    }
    return TrainingArguments(**{**values, **overrides})


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_arguments_are_exported_at_the_top():
    from autoloco_hf import AutoLoCoArguments as exported

    assert exported is AutoLoCoArguments


def test_config_as_a_dict_or_parsed_arguments():
    assert AutoLoCoCallback({"method": "diloco", "h_base": 4}).config.h_base == 4
    assert (
        AutoLoCoCallback(
            AutoLoCoArguments(autoloco_method="diloco", autoloco_h_base=4)
        ).config.method
        == "diloco"
    )
    with pytest.raises(
        ConfigError, match=r"AutoLoCoConfig has no field 'h_bse' \(given 4\): did you mean h_base\?"
    ):
        AutoLoCoCallback({"h_bse": 4})


@pytest.mark.parametrize(
    "config, line",
    [
        ({"hbase": 5}, "AutoLoCoConfig has no field 'hbase' (given 5): did you mean h_base?"),
        (
            {"methd": "diloco"},
            "AutoLoCoConfig has no field 'methd' (given 'diloco'): did you mean method?",
        ),
        (
            {"method": "dilco"},
            "AutoLoCoConfig.method='dilco' is invalid: use one of ddp, "
            "diloco, autoloco, qsr, linear",
        ),
        ({"h_base": 0}, "AutoLoCoConfig.h_base=0 is invalid: it must be >= 1"),
        ({"h_base": "100"}, "AutoLoCoConfig.h_base='100' is invalid: pass an integer"),
        ({"outer_lr": -0.5}, "AutoLoCoConfig.outer_lr=-0.5 is invalid: it must be > 0.0"),
        (
            {"outer_lr": float("nan")},
            "AutoLoCoConfig.outer_lr=nan is invalid: pass a finite number",
        ),
        (
            {"adaptive_horizon": "false"},
            "AutoLoCoConfig.adaptive_horizon='false' is invalid: pass True or False",
        ),
        (
            {"wire_dtype": "fp16"},
            "AutoLoCoConfig.wire_dtype='fp16' is invalid: use one of fp32, "
            "bf16, int8, int4, fp4, int2",
        ),
        (
            {"h_base": 100, "q_h": 30},
            "AutoLoCoConfig.q_h=30 is invalid: it must divide h_base=100 (e.g. q_h=25)",
        ),
        (
            {"h_base": 100, "h_max": 90},
            "AutoLoCoConfig.h_max=90 is invalid: it must be at least h_base=100 "
            "(h_min <= h_base <= h_max)",
        ),
        (
            {"mu_min": 0.8, "mu_max": 0.6},
            "AutoLoCoConfig.mu_min=0.8 is invalid: it must not exceed mu_max=0.6",
        ),
        (
            {"error_feedback": True},
            "AutoLoCoConfig.error_feedback=True is invalid: it only applies to a lossy wire: "
            "set wire_dtype to one of bf16, int8, int4, fp4, int2",
        ),
        (
            {"method": "ddp", "overlap": "eager"},
            "AutoLoCoConfig.overlap='eager' is invalid: DDP averages gradients every step: use "
            "overlap='none' or an interval method",
        ),
        ({"ranks_per_worker": 0}, "AutoLoCoConfig.ranks_per_worker=0 is invalid: it must be >= 1"),
    ],
)
def test_a_bad_config_is_one_line_naming_field_value_and_fix(config, line):
    with pytest.raises(ConfigError) as err:
        AutoLoCoCallback(config)
    assert str(err.value) == line


@pytest.mark.parametrize("bad", ["diloco", 4, [("method", "diloco")]])
def test_anything_else_is_refused_in_one_line(bad):
    with pytest.raises(TypeError) as exc:
        AutoLoCoCallback(bad)
    assert "expected an AutoLoCoConfig or a dict of its fields" in str(
        exc.value
    ) and "\n" not in str(exc.value)


def test_load_best_model_at_end_exports_a_synchronized_checkpoint(tmp_path):
    """Checkpoints hold theta_t (the synchronized model), so
    the best one is a model the workers agreed on."""
    from safetensors.torch import load_file

    callback = AutoLoCoCallback(AutoLoCoConfig(method="diloco", h_base=4))
    best = {
        "load_best_model_at_end": True,
        "eval_strategy": "steps",
        "save_strategy": "steps",
        "save_steps": 2,
        "eval_steps": 2,
        "metric_for_best_model": "eval_loss",
        "greater_is_better": True,
    }
    # "best" = the highest loss: an early, mid-interval
    # checkpoint (step 2), where the replica differs from theta_t
    trainer = Trainer(
        model=tiny_llama(),
        args=training_args(tmp_path, **best),
        train_dataset=Tokens(),
        eval_dataset=Tokens(),
        callbacks=[callback],
    )
    saved = {}

    class RecordTheta(TrainerCallback):
        # runs after AutoLoCo's on_save restored the replica
        def on_save(self, args, state, control, **kwargs):
            saved[state.global_step] = [
                p.detach().clone() for p in callback.runtime.global_parameters()
            ]

    trainer.add_callback(RecordTheta())
    trainer.train()
    best_step = int(trainer.state.best_model_checkpoint.rsplit("-", 1)[1])
    assert best_step % 4, f"the test needs a mid-interval best checkpoint, got step {best_step}"
    weights = load_file(f"{trainer.state.best_model_checkpoint}/model.safetensors")
    final = dict(trainer.model.named_parameters())
    assert all(torch.equal(final[name], weights[name]) for name in weights if name in final)
    assert all(
        torch.equal(a, b.cpu())
        for a, b in zip([final[n] for n, _ in trainer.model.named_parameters()], saved[best_step])
    )


class Tracker(TrainerCallback):
    """Stands in for a report_to integration: records every log it receives."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


class StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


def test_console_follows_logging_steps_and_trackers_get_every_sync(tmp_path, capsys):
    """H = 1: a sync every step. The console prints the Trainer's
    2 logs (with a one-field summary), not 8 sync dicts."""
    tracker = Tracker()
    callback = AutoLoCoCallback(AutoLoCoConfig(method="diloco", h_base=1))
    trainer = Trainer(
        model=tiny_llama(),
        args=training_args(tmp_path),
        train_dataset=Tokens(),
        callbacks=[tracker, callback],
    )
    trainer.train()
    printed = [
        ast.literal_eval(line)
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("{")
    ]
    assert [p for p in printed if any(k.startswith("autoloco/") for k in p)] == []
    losses = [p for p in printed if "loss" in p]
    assert len(losses) == STEPS // 4
    assert losses[-1]["autoloco"].startswith(f"syncs {STEPS} | H 1 | mu 0.90 | eta 0.70 | ")
    syncs = [log for log in tracker.logs if "autoloco/syncs" in log]
    assert [log["autoloco/syncs"] for log in syncs] == [float(i) for i in range(1, STEPS + 1)]
    # the run folder that `autoloco report` reads
    rows = [
        json.loads(line) for line in (tmp_path / "autoloco_steps.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [4, 8] and rows[-1]["syncs"] == STEPS
    summary = json.loads((tmp_path / "autoloco_summary.json").read_text())
    assert summary["totals"]["syncs"] == STEPS and summary["method"] == "diloco"


def test_early_stop_warns_that_the_model_is_not_synchronized(tmp_path, caplog):
    callback = AutoLoCoCallback(AutoLoCoConfig(method="diloco", h_base=4))
    trainer = Trainer(
        model=tiny_llama(),
        args=training_args(tmp_path),
        train_dataset=Tokens(),
        callbacks=[callback, StopAt(6)],
    )
    with caplog.at_level(logging.WARNING, logger="autoloco_hf"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "stopped at step" in r.getMessage()]
    assert warnings == [
        (
            "AutoLoCo: training stopped at step 6 of 8 planned; the model holds this rank's local "
            "weights 2 steps after the last synchronization (step 4), not a synchronized model"
        )
    ]
