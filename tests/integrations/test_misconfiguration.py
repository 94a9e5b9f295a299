"""Misconfiguration detection (issue item 7), in-process: no launch needed to hit these errors."""

from __future__ import annotations

import pytest
import torch

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.errors import AutoLoCoConfigurationError
from autoloco_hf.integrations.launch_checks import check_launch


def test_world_size_env_but_single_process_accelerator(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(AutoLoCoConfigurationError, match="use_cpu=True"):
        check_launch(1, "NO")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(distributed_type="DEEPSPEED"), "DeepSpeed"),
        (dict(deepspeed=True), "DeepSpeed"),
        (dict(distributed_type="FSDP"), "FSDP version 1"),
        (dict(fsdp=True), "FSDP version 1"),
        (dict(distributed_type="FSDP", fsdp_version=1), "fsdp_version': 2"),
        (dict(deepspeed=True), "FSDP2 inside each worker"),
        (dict(distributed_type="XLA"), "XLA"),
        (dict(n_gpu=2), "DataParallel"),
        (dict(ranks_per_worker=3), "ranks_per_worker=3"),
    ],
)
def test_unsupported_setups_name_what_is_supported(monkeypatch, kwargs, match):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(AutoLoCoConfigurationError, match=match) as info:
        check_launch(4, **kwargs)
    if "ranks_per_worker" not in kwargs:
        assert "supported:" in str(info.value)


@pytest.mark.parametrize("version", [None, "1"])
def test_an_fsdp1_plugin_from_the_environment_is_named(monkeypatch, version):
    """accelerate leaves ACCELERATE_USE_FSDP=true behind an
    FSDP Accelerator; the next one makes FSDP1 from it."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    if version is None:
        monkeypatch.delenv("FSDP_VERSION", raising=False)
    else:
        monkeypatch.setenv("FSDP_VERSION", version)
    with pytest.raises(AutoLoCoConfigurationError) as info:
        check_launch(4, "FSDP", fsdp_version=1)
    named = "from ACCELERATE_USE_FSDP=true in the environment, without FSDP_VERSION" in str(
        info.value
    )
    assert named == (version is None)  # FSDP_VERSION=1 was asked for: nothing to explain
    assert "\n" not in str(info.value)


def test_supported_setups_pass(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    check_launch(4, "MULTI_CPU")
    check_launch(4, "MULTI_GPU", ranks_per_worker=2)
    check_launch(4, "FSDP", ranks_per_worker=2, fsdp_version=2)
    check_launch(4, "MULTI_GPU", fsdp=True, fsdp_version=2)
    monkeypatch.delenv("WORLD_SIZE")
    check_launch(1, "NO")


@pytest.mark.slow
def test_trainer_refuses_the_each_rank_trains_alone_trap(monkeypatch, tmp_path):
    """A real Trainer built with WORLD_SIZE=2 in the
    environment but no process group: fails at construction."""
    from transformers import Trainer, TrainingArguments

    from autoloco_hf import AutoLoCoCallback
    from autoloco_hf.toy.llama import tiny_llama

    model = tiny_llama(32, 16, 1, 2, 32, max_position_embeddings=2048, tie_word_embeddings=False)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    data = [{"input_ids": torch.arange(8), "labels": torch.arange(8)}] * 4
    with pytest.raises(AutoLoCoConfigurationError, match="every rank would train alone"):
        Trainer(
            model=model,
            args=args,
            train_dataset=data,
            callbacks=[AutoLoCoCallback(AutoLoCoConfig(h_base=2))],
        )


@pytest.mark.slow
def test_single_process_trainer_runs_one_worker(tmp_path):
    """One process (bf16 autocast, accumulation 2): the outer
    loop runs on one worker; metrics reach TensorBoard."""
    from transformers import Trainer, TrainingArguments

    from autoloco_hf import AutoLoCoCallback
    from autoloco_hf.toy.llama import tiny_llama

    model = tiny_llama(
        32, 16, 1, 2, 32, max_position_embeddings=2048, seed=0, tie_word_embeddings=False
    )
    try:
        import tensorboard  # noqa: F401

        report_to = ["tensorboard"]
    except ImportError:
        report_to = []
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=report_to,
        max_steps=6,
        bf16=True,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        save_strategy="no",
        disable_tqdm=True,
    )
    data = [{"input_ids": torch.arange(8) + i, "labels": torch.arange(8) + i} for i in range(24)]
    callback = AutoLoCoCallback(AutoLoCoConfig(method="diloco", h_base=3))
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    assert callback.engine.totals.syncs == 2
    # no attention_mask: every position counts
    assert callback.engine.totals.tokens == 6 * 2 * 2 * 8
    assert (tmp_path / "autoloco_intervals.jsonl").read_text().count("\n") == 2
    # the autoloco/* scalars reach the report_to integration (TensorBoard prefixes train/)
    if report_to:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(next(tmp_path.glob("runs/*"))))
        events.Reload()
        assert [e.step for e in events.Scalars("train/autoloco/H_step")] == [3, 6]
        assert "train/autoloco/C_t" in events.Tags()["scalars"]


def test_fsdp2_plugin_with_several_workers_needs_a_presharded_model():
    """Accelerate's FSDP2 plugin shards over the whole world
    (one worker); several workers must shard themselves."""
    from autoloco_hf.integrations.launch_checks import check_fsdp2_workers

    model = torch.nn.Linear(4, 4)
    with pytest.raises(AutoLoCoConfigurationError, match=r"worker_mesh\(R"):
        check_fsdp2_workers(model, world_size=4, ranks_per_worker=2)
    # one worker of every rank: the plugin's sharding
    check_fsdp2_workers(model, world_size=4, ranks_per_worker=4)
