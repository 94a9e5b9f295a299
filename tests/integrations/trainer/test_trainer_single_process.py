"""One-process Trainer + AutoLoCoCallback: the Trainer
contract, checkpoints and resume, data edge cases.

One process is enough here: the checkpoint/resume path and the data path are the same code on every
rank (the two-process resume test is in test_trainer_multiprocess.py). A batch without
``attention_mask`` is covered by
test_misconfiguration.py::test_single_process_trainer_runs_one_worker (every position counts).
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

pytestmark = pytest.mark.slow

SEQ = 8


def tiny_model():
    from autoloco_hf.toy.llama import tiny_llama

    return tiny_llama(
        32,
        16,
        1,
        2,
        32,
        max_position_embeddings=2048,
        seed=0,
        tie_word_embeddings=False,
        pad_token_id=0,
    )


def item(i: int, padding: bool = False) -> dict:
    """``SEQ`` real tokens, or (``padding``) ``SEQ`` padding positions with every label ignored."""
    ids = (torch.arange(SEQ) + i) % 30 + 2
    if padding:
        return {
            "input_ids": torch.zeros(SEQ, dtype=torch.long),
            "attention_mask": torch.zeros(SEQ, dtype=torch.long),
            "labels": torch.full((SEQ,), -100),
        }
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(SEQ, dtype=torch.long),
        "labels": ids.clone(),
    }


def make_trainer(output_dir, data, config: dict, eval_dataset=None, **kwargs):
    from transformers import Trainer, TrainingArguments

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig

    torch.set_num_threads(1)
    defaults = {
        "output_dir": str(output_dir),
        "use_cpu": True,
        "report_to": [],
        "save_strategy": "no",
        "disable_tqdm": True,
        "per_device_train_batch_size": 2,
        "logging_steps": 1000,
        "learning_rate": 3e-3,
        "seed": 42,
    }
    callback = AutoLoCoCallback(AutoLoCoConfig(**config))
    trainer = Trainer(
        model=tiny_model(),
        args=TrainingArguments(**{**defaults, **kwargs}),
        train_dataset=data,
        eval_dataset=eval_dataset,
        callbacks=[callback],
    )
    return trainer, callback


def stable(records) -> list[dict]:
    timing = {
        "seconds",
        "sync_seconds",
        "controller_seconds",
        "encode_seconds",
        "collective_seconds",
        "decode_seconds",
    }
    return [{k: v for k, v in r.__dict__.items() if k not in timing} for r in records]


def theta_and_replica(checkpoint: str, config: dict, params):
    """The synchronized parameters theta_t and this rank's
    local replica stored in a checkpoint's AutoLoCo state."""
    from autoloco_hf import AutoLoCoConfig
    from autoloco_hf.integrations.runtime import state_path
    from autoloco_hf.state.checkpoint import read_state

    _, state = read_state(
        state_path(checkpoint, 0),
        config=AutoLoCoConfig(**config),
        world_size=1,
        ranks_per_worker=1,
        rank=0,
    )
    flat = state["engine"]["outer"]["params"]
    theta = [c.view_as(p) for c, p in zip(torch.split(flat, [p.numel() for p in params]), params)]
    return theta, state["params"]


# ------------------------------------------------------------------ the Trainer contract and resume
CONFIG = {"method": "diloco", "h_base": 3}
DATA = [item(i) for i in range(24)]


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """6 steps, syncs at 3 and 6, checkpoints at 2, 4 (mid-interval) and 6."""
    out = tmp_path_factory.mktemp("saved")
    trainer, callback = make_trainer(
        out, DATA, CONFIG, max_steps=6, save_strategy="steps", save_steps=2
    )
    trainer.train()
    return {"out": out, "trainer": trainer, "callback": callback}


def test_checkpoint_model_file_is_the_synchronized_model(saved_run):
    """Mid-interval checkpoints hold theta_t as the model;
    the rank's own replica is in the AutoLoCo state."""
    from safetensors.torch import load_file

    model = saved_run["trainer"].model
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    initial = list(tiny_model().parameters())
    for step in (2, 4):
        checkpoint = str(saved_run["out"] / f"checkpoint-{step}")
        weights = load_file(f"{checkpoint}/model.safetensors")
        theta, replica = theta_and_replica(checkpoint, CONFIG, params)
        for name, t in zip(names, theta):
            assert torch.equal(weights[name], t), f"checkpoint-{step}/{name} is not theta_t"
        assert any(not torch.equal(t, r) for t, r in zip(theta, replica)), (
            "mid-interval the replica differs"
        )
        if step == 2:  # before the first sync theta_t is theta_0
            assert all(torch.equal(t, p0) for t, p0 in zip(theta, initial))
    # after saving, training went on from the replica, not
    # from theta_t: the final model is the uninterrupted one
    reference, _ = make_trainer(saved_run["out"] / "nosave", DATA, CONFIG, max_steps=6)
    reference.train()
    for a, b in zip(reference.model.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_resume_from_checkpoint_true_continues_the_same_trajectory(saved_run, tmp_path):
    """The documented path: trainer.train(resume_from_checkpoint=True)
    picks the last checkpoint (mid-interval)."""
    out = tmp_path / "resumed"
    shutil.copytree(saved_run["out"], out, ignore=shutil.ignore_patterns("checkpoint-6", "nosave"))
    trainer, callback = make_trainer(
        out, DATA, CONFIG, max_steps=6, save_strategy="steps", save_steps=2
    )
    trainer.train(resume_from_checkpoint=True)
    assert callback.engine.totals.syncs == 2
    for a, b in zip(saved_run["trainer"].model.parameters(), trainer.model.parameters()):
        assert torch.equal(a, b)
    assert stable(callback.engine.records) == stable(saved_run["callback"].engine.records)


@pytest.mark.parametrize(
    "log_level, printed", [("passive", True), ("info", True), ("warning", False)]
)
def test_a_resume_prints_one_line_and_the_first_log_shows_the_syncs(
    saved_run, tmp_path, caplog, log_level, printed
):
    """One "AutoLoCo: resumed" line at the Trainer's log_level;
    the first log after it carries the sync summary."""
    from transformers import TrainerCallback

    out = tmp_path / "resumed"
    shutil.copytree(saved_run["out"], out, ignore=shutil.ignore_patterns("checkpoint-6", "nosave"))
    # a resumed Trainer takes logging_steps from here
    state_file = out / "checkpoint-4" / "trainer_state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "logging_steps": 1}))
    trainer, _ = make_trainer(out, DATA, CONFIG, max_steps=6, logging_steps=1, log_level=log_level)
    seen: list[dict] = []

    class Console(TrainerCallback):  # after AutoLoCoCallback, as the Trainer's printer is
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(dict(logs or {}))

    trainer.add_callback(Console())
    with caplog.at_level(logging.DEBUG):  # the root's level; autoloco_hf's is the callback's to set
        trainer.train(resume_from_checkpoint=True)
    resumed = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("AutoLoCo: resumed")
    ]
    expected = f"AutoLoCo: resumed step 4 from {out}/checkpoint-4: 1 sync done, H 3 (steps 4-6)"
    assert resumed == ([expected] if printed else [])
    first = next(log for log in seen if "loss" in log)
    assert first["autoloco"].startswith("syncs 1 | H 3 | mu 0.90 | eta 0.70 | "), first


def test_resume_refuses_a_truncated_state(saved_run, tmp_path):
    from autoloco_hf.state.checkpoint import CheckpointError

    out = tmp_path / "truncated"
    shutil.copytree(saved_run["out"], out, ignore=shutil.ignore_patterns("checkpoint-6", "nosave"))
    state = out / "checkpoint-4" / "autoloco" / "rank0.safetensors"
    state.write_bytes(state.read_bytes()[:-100])
    trainer, _ = make_trainer(out, DATA, CONFIG, max_steps=6)
    with pytest.raises(
        CheckpointError, match=r"checkpoint-4/autoloco/rank0\.safetensors: field payload_bytes"
    ):
        trainer.train(resume_from_checkpoint=True)


def test_resume_refuses_a_state_from_another_checkpoint(saved_run, tmp_path):
    """AutoLoCo state of another run at the same step: its
    theta_t differs from the weights the Trainer loaded."""
    out = tmp_path / "mixed"
    shutil.copytree(saved_run["out"], out, ignore=shutil.ignore_patterns("checkpoint-6", "nosave"))
    other, _ = make_trainer(
        tmp_path / "other", DATA, CONFIG, max_steps=6, save_strategy="steps", save_steps=4, seed=7
    )
    other.train()
    shutil.rmtree(out / "checkpoint-4" / "autoloco")
    shutil.copytree(
        tmp_path / "other" / "checkpoint-4" / "autoloco", out / "checkpoint-4" / "autoloco"
    )
    trainer, _ = make_trainer(out, DATA, CONFIG, max_steps=6)
    with pytest.raises(RuntimeError, match="differ from the model weights the Trainer loaded"):
        trainer.train(resume_from_checkpoint=True)


def test_callback_added_after_construction_needs_attach(tmp_path):
    from transformers import Trainer, TrainingArguments

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
    from autoloco_hf.errors import AutoLoCoConfigurationError

    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=2, disable_tqdm=True
    )
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=DATA)
    callback = AutoLoCoCallback(AutoLoCoConfig(**CONFIG))
    trainer.add_callback(callback)
    with pytest.raises(AutoLoCoConfigurationError, match=r"callback\.attach\(trainer\)"):
        trainer.train()
    trainer.remove_callback(callback)
    callback = AutoLoCoCallback(AutoLoCoConfig(**CONFIG))
    trainer.add_callback(callback)
    callback.attach(trainer)
    trainer.train()
    assert callback.engine.totals.syncs == 1


# ------------------------------------------------------------------
# data edge cases (issue 10 item 6)
def test_all_padding_batches_carry_no_loss(tmp_path):
    """Every other step is all padding (transformers' loss is
    0/0 = NaN there, gradient zero): intervals stay valid."""
    data = [item(i, padding=(i // 2) % 2 == 1) for i in range(16)]
    trainer, callback = make_trainer(
        tmp_path,
        data,
        {"method": "autoloco", "controller": "paper", "h_base": 2},
        max_steps=8,
        train_sampling_strategy="sequential",
    )
    trainer.train()
    records = callback.engine.records
    assert [r.tokens for r in records] == [2 * SEQ] * 4, (
        "one real step of 2 x 8 tokens per interval"
    )
    assert all(r.outer_step_applied for r in records), "an all-padding step is not a divergence"
    assert all(0.0 < r.mean_loss < 10.0 for r in records)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_dataset_shorter_than_one_interval(tmp_path):
    """2 optimizer steps with h_base=5: one interval, cut to
    the budget, synchronized at the last step."""
    trainer, callback = make_trainer(
        tmp_path,
        [item(i) for i in range(4)],
        {"method": "autoloco", "controller": "paper", "h_base": 5},
        num_train_epochs=1,
    )
    trainer.train()
    assert trainer.state.global_step == callback.engine.step == 2
    assert [(r.start_step, r.h_step, r.tokens) for r in callback.engine.records] == [
        (0, 2, 4 * SEQ)
    ]


def test_run_shorter_than_warmup(tmp_path):
    trainer, callback = make_trainer(
        tmp_path,
        [item(i) for i in range(8)],
        {"method": "autoloco", "controller": "paper", "h_base": 2},
        max_steps=4,
        warmup_steps=10,
    )
    trainer.train()
    records = callback.engine.records
    assert sum(r.h_step for r in records) == 4 and all(r.outer_step_applied for r in records)
    assert callback.engine.warmup_steps == 10


def test_gradient_accumulation_that_does_not_divide_the_dataset(tmp_path):
    """5 micro-batches per epoch, accumulation 2: steps of 2,
    2 and 1 micro-batches; every token counted once."""
    trainer, callback = make_trainer(
        tmp_path,
        [item(i) for i in range(10)],
        {"method": "diloco", "h_base": 2},
        num_train_epochs=2,
        gradient_accumulation_steps=2,
    )
    trainer.train()
    engine = callback.engine
    assert trainer.state.global_step == trainer.state.max_steps == engine.step == 6
    assert [r.h_step for r in engine.records] == [2, 2, 2], (
        "the last interval closes at the last step"
    )
    assert callback.runtime.meter.forwards == 10 and engine.totals.tokens == 2 * 10 * SEQ


def test_last_complete_checkpoint_skips_half_written_folders(tmp_path):
    """What a restarted script resumes from: the newest
    folder with trainer_state.json and every rank's state."""
    from autoloco_hf import AutoLoCoConfig
    from autoloco_hf.integrations.runtime import state_path
    from autoloco_hf.integrations.trainer.resume import last_complete_checkpoint
    from autoloco_hf.state.checkpoint import write_state

    config = AutoLoCoConfig(**CONFIG)
    assert (
        last_complete_checkpoint(str(tmp_path / "missing")) is None
        and last_complete_checkpoint(str(tmp_path)) is None
    )

    def checkpoint(step: int, ranks=(0, 1), trainer_state: bool = True):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        if trainer_state:
            (folder / "trainer_state.json").write_text("{}")
        for rank in ranks:
            write_state(
                state_path(str(folder), rank),
                {"x": torch.zeros(64)},
                config=config,
                world_size=2,
                ranks_per_worker=1,
                rank=rank,
                step=step,
            )
        return str(folder)

    good = checkpoint(10)
    checkpoint(20, ranks=(0,))  # rank 1 died before writing its state
    checkpoint(30, trainer_state=False)  # killed before the Trainer finished
    short = checkpoint(40)
    path = state_path(short, 1)
    with open(path, "r+b") as f:
        f.truncate(100)
    (tmp_path / "checkpoint-50").mkdir()  # killed right after creating the folder
    (tmp_path / "checkpoint-x").mkdir()
    assert last_complete_checkpoint(str(tmp_path)) == good


def test_save_strategy_best_saves_theta_and_training_goes_on_from_the_replica(tmp_path, saved_run):
    """save_strategy="best" decides after evaluating: theta_t
    is shown from on_evaluate, the replica restored after."""
    from safetensors.torch import load_file

    trainer, _ = make_trainer(
        tmp_path,
        DATA,
        CONFIG,
        max_steps=6,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="best",
        metric_for_best_model="loss",
        greater_is_better=False,
        eval_dataset=DATA[:2],
    )
    trainer.train()
    saved = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    assert saved, "at least the first evaluation is a new best"
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    for name in saved:
        weights = load_file(str(tmp_path / name / "model.safetensors"))
        theta, _ = theta_and_replica(str(tmp_path / name), CONFIG, params)
        assert all(torch.equal(weights[n], t) for n, t in zip(names, theta)), name
    for a, b in zip(saved_run["trainer"].model.parameters(), trainer.model.parameters()):
        assert torch.equal(a, b), "evaluating and saving did not change the trajectory"


def test_save_strategy_epoch_saves_theta(tmp_path):
    """An epoch of 3 steps with h_base=4: the checkpoint at
    the end of epoch 1 is mid-interval and holds theta_t."""
    from safetensors.torch import load_file

    trainer, _ = make_trainer(
        tmp_path,
        [item(i) for i in range(6)],
        CONFIG | {"h_base": 4},
        num_train_epochs=2,
        save_strategy="epoch",
    )
    trainer.train()
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    weights = load_file(str(tmp_path / "checkpoint-3" / "model.safetensors"))
    theta, replica = theta_and_replica(
        str(tmp_path / "checkpoint-3"), CONFIG | {"h_base": 4}, params
    )
    assert all(torch.equal(weights[n], t) for n, t in zip(names, theta))
    assert any(not torch.equal(t, r) for t, r in zip(theta, replica))


def test_streaming_fragments_resume_in_the_middle_of_a_round(tmp_path):
    """fragments=2 with a delayed merge through the Trainer: a
    checkpoint with a fragment in flight resumes exactly."""
    config = {
        "method": "diloco",
        "h_base": 4,
        "fragments": 2,
        "overlap": "delayed",
        "overlap_steps": 1,
    }
    # interval [4, 8): fragment 0 synchronized at step 6,
    # merged at 7; the checkpoint at 6 holds it in flight
    full, full_callback = make_trainer(
        tmp_path / "full", DATA, config, max_steps=12, save_strategy="steps", save_steps=6
    )
    full.train()
    assert full_callback.engine.totals.syncs == 3
    out = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full", out, ignore=shutil.ignore_patterns("checkpoint-12"))
    resumed, callback = make_trainer(
        out, DATA, config, max_steps=12, save_strategy="steps", save_steps=6
    )
    resumed.train(resume_from_checkpoint=True)
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert stable(callback.engine.records) == stable(full_callback.engine.records)


def test_streaming_fragments_checkpoint_at_a_boundary_holds_theta(tmp_path):
    """At a boundary only the last fragment was just
    synchronized: the model file is theta_t, not the replica."""
    from safetensors.torch import load_file

    config = {"method": "diloco", "h_base": 4, "fragments": 2}
    trainer, _ = make_trainer(
        tmp_path, DATA, config, max_steps=8, save_strategy="steps", save_steps=4
    )
    trainer.train()
    model = trainer.model
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    checkpoint = str(tmp_path / "checkpoint-4")
    weights = load_file(f"{checkpoint}/model.safetensors")
    theta, replica = theta_and_replica(checkpoint, config, params)
    for name, t in zip(names, theta):
        assert torch.equal(weights[name], t), f"checkpoint-4/{name} is not theta_t"
    assert any(not torch.equal(t, r) for t, r in zip(theta, replica)), (
        "fragment 0 trained on since its sync at 2"
    )


@pytest.mark.parametrize(
    "config", [{"overlap": "delayed", "overlap_steps": 1}, {"overlap": "eager"}]
)
def test_a_checkpoint_at_a_boundary_with_the_average_in_flight_holds_theta(tmp_path, config):
    """The boundary's average lands later (delayed merge, eager
    update): the model file is theta_t, not the replica."""
    from safetensors.torch import load_file

    config = {"method": "diloco", "h_base": 4, **config}
    trainer, first = make_trainer(
        tmp_path / "full", DATA, config, max_steps=8, save_strategy="steps", save_steps=4
    )
    trainer.train()
    model = trainer.model
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    checkpoint = str(tmp_path / "full" / "checkpoint-4")
    weights = load_file(f"{checkpoint}/model.safetensors")
    theta, replica = theta_and_replica(checkpoint, config, params)
    for name, t in zip(names, theta):
        assert torch.equal(weights[name], t), f"checkpoint-4/{name} is not theta_t"
    assert any(not torch.equal(t, r) for t, r in zip(theta, replica)), (
        "the replica trained on from its own point"
    )
    # and the Trainer resumes from it (its check: model file
    # == theta_t in the AutoLoCo state), exactly
    out = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full", out, ignore=shutil.ignore_patterns("checkpoint-8"))
    resumed, callback = make_trainer(
        out, DATA, config, max_steps=8, save_strategy="steps", save_steps=4
    )
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    for a, b in zip(model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert stable(callback.engine.records) == stable(first.engine.records)


@pytest.mark.parametrize("log_level, printed", [("passive", True), ("warning", False)])
def test_a_run_says_what_it_will_do_and_what_it_did(tmp_path, caplog, log_level, printed):
    """A start line (workers, method, rule, H), warnings for
    h_base > max_steps and for one worker, an end summary."""
    trainer, callback = make_trainer(
        tmp_path,
        DATA,
        {"method": "autoloco", "controller": "paper", "h_base": 500},
        max_steps=6,
        logging_steps=1,
        log_level=log_level,
    )
    seen: list[dict] = []

    from transformers import TrainerCallback

    class Console(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(dict(logs or {}))

    trainer.add_callback(Console())
    with caplog.at_level(logging.DEBUG):
        trainer.train()
    said = [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.getMessage().startswith("AutoLoCo: ")
    ]
    start = (
        logging.INFO,
        "AutoLoCo: 1 worker, method autoloco, controller paper, h_base 500, H 6, 6 steps planned",
    )
    end = (
        logging.INFO,
        "AutoLoCo: 1 sync in 6 steps, nothing sent (1 worker), final H 6; report: "
        f"autoloco report {tmp_path}",
    )
    warnings = [m for level, m in said if level == logging.WARNING]
    assert [m for m in warnings if "h_base 500 is longer than the run's 6 steps" in m] == warnings[
        :1
    ], said
    # warnings at any log level
    assert len(warnings) == 2 and "1 worker: nothing is exchanged" in warnings[1], said
    assert [(level, m) for level, m in said if level == logging.INFO] == (
        [start, end] if printed else []
    )
    assert all("MiB" not in log.get("autoloco", "") for log in seen) and any(
        "autoloco" in log for log in seen
    )
    assert callback.engine.totals.syncs == 1
