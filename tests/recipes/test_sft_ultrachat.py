"""Smoke test of recipes/sft_ultrachat.py: SFTTrainer +
AutoLoCoCallback on a tiny Llama and local conversations."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
from recipe_helpers import RECIPES, eval_quick_nll, load_recipe

pytestmark = pytest.mark.slow


def chats(n: int, offset: int = 0) -> list[dict]:
    from autoloco_hf.toy.text import corpus_documents

    docs = corpus_documents()[offset:]
    return [
        {
            "messages": [
                {"role": "user", "content": f"Explain part {i} of the Python docs."},
                {"role": "assistant", "content": docs[i][:200]},
            ]
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory, tokenizer_dir, tiny_llama_config):
    """A tiny Llama saved like a hub checkpoint, and
    train/test JSONL with invalid conversations mixed in."""
    from transformers import AutoTokenizer

    from autoloco_hf.toy.llama import tiny_llama

    root = tmp_path_factory.mktemp("sft")
    config = json.loads(open(tiny_llama_config).read())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = tiny_llama(
        len(tokenizer),
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        max_position_embeddings=config["max_position_embeddings"],
    )
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    invalid = [
        {"messages": [{"role": "user", "content": "no reply"}]},
        {
            "messages": [
                {"role": "assistant", "content": "reply first"},
                {"role": "user", "content": "then a user"},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": ""},
                {"role": "assistant", "content": "empty prompt"},
            ]
        },
        # the prompt alone fills max_length: no assistant token survives truncation
        {
            "messages": [
                {"role": "user", "content": "word " * 400},
                {"role": "assistant", "content": "cut off"},
            ]
        },
    ]
    for name, rows in (
        ("train.jsonl", chats(24) + invalid),
        ("test.jsonl", chats(6, offset=40) + invalid),
    ):
        with open(root / name, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return str(root / "model"), str(root / "train.jsonl"), str(root / "test.jsonl")


def test_filters():
    sft = load_recipe("sft_ultrachat")
    ok = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert sft.valid_conversation(ok) and sft.valid_conversation(
        [{"role": "system", "content": "s"}] + ok
    )
    assert not sft.valid_conversation(ok[:1]) and not sft.valid_conversation(ok[::-1])
    assert not sft.valid_conversation(
        [{"role": "user", "content": " "}, ok[1]]
    ) and not sft.valid_conversation("text")


def test_every_config_parses():
    sft = load_recipe("sft_ultrachat")
    for path in sorted(glob.glob(os.path.join(RECIPES, "configs", "sft_*.yaml"))):
        s, args, a = sft.parse_args(["--config", path])
        config = sft.autoloco_config(s, a)
        assert (s.global_batch_size, args.max_length, args.num_train_epochs, config.h_base) == (
            32,
            2048,
            1,
            100,
        ), path
        assert (
            args.learning_rate,
            args.save_steps,
            args.save_total_limit,
            args.assistant_only_loss,
        ) == (
            2e-5,
            1000,
            2,
            True,
        )
    config = sft.autoloco_config(
        *sft.parse_args(["--config", os.path.join(RECIPES, "configs", "sft_autoloco_int8.yaml")])[
            ::2
        ]
    )
    assert config.normalize_pseudo_grad and config.wire_dtype == "int8" and config.outer_on_cpu
    diloco = sft.autoloco_config(
        *sft.parse_args(["--config", os.path.join(RECIPES, "configs", "sft_diloco.yaml")])[::2]
    )
    assert (diloco.method, diloco.outer_momentum) == ("diloco", 0.9)


def test_every_trainer_field_is_settable():
    """Any SFTConfig / TrainingArguments field is a flag:
    trackers, optimizer, checkpoint retention, ..."""
    sft = load_recipe("sft_ultrachat")
    _, args, _ = sft.parse_args(
        [
            "--config",
            os.path.join(RECIPES, "configs", "sft_autoloco.yaml"),
            "--report_to",
            "tensorboard",
            "--optim",
            "adamw_torch_fused",
            "--save_total_limit",
            "5",
            "--neftune_noise_alpha",
            "5",
        ]
    )
    assert (args.report_to, args.optim, args.save_total_limit, args.neftune_noise_alpha) == (
        ["tensorboard"],
        "adamw_torch_fused",
        5,
        5.0,
    )
    source = open(os.path.join(RECIPES, "sft_ultrachat.py")).read()
    assert "report_to=" not in source  # the recipe leaves the trackers to the user


def tiny_args(out, sft_files, config: str) -> list[str]:
    model, train, test = sft_files
    return [
        "--config",
        os.path.join(RECIPES, "configs", config),
        "--output-dir",
        str(out),
        "--model-name-or-path",
        model,
        "--train-files",
        train,
        "--test-files",
        test,
        "--global-batch-size",
        "4",
        "--per-device-train-batch-size",
        "2",
        "--max-length",
        "64",
        "--max-steps",
        "6",
        "--learning-rate",
        "1e-3",
        "--dataset-num-proc",
        "1",
        "--eval-batch-size",
        "4",
        "--autoloco",
        "h_base=2",
        # AutoLoCo's horizon grid and its rule's range (DiLoCo has neither)
        *(["--autoloco", "q_h=1", "--autoloco", "h_max=3"] if "autoloco" in config else []),
        "--autoloco",
        "outer_on_cpu=false",
    ]


def test_sft_smoke(tmp_path, sft_files, monkeypatch):
    # `eval --offline` sets them
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, os.environ.get(var, "0"))
    sft = load_recipe("sft_ultrachat")
    assert sft.main(tiny_args(tmp_path, sft_files, "sft_autoloco_int8.yaml")) == 0
    run = tmp_path / "sft_autoloco_int8"
    # one set of run files: the callback's, its summary extended
    # by the recipe (was: steps.jsonl and summary.json too)
    assert sorted(
        p.name for p in run.iterdir() if p.suffix in (".json", ".jsonl") and "autoloco" in p.name
    ) == [
        "autoloco_intervals.jsonl",
        "autoloco_steps.jsonl",
        "autoloco_summary.json",
    ]
    assert not (run / "summary.json").exists() and not (run / "steps.jsonl").exists()
    summary = json.loads((run / "autoloco_summary.json").read_text())
    # invalid ones filtered out
    assert summary["train_conversations"] == 24 and summary["test_conversations"] == 6
    assert summary["totals"]["syncs"] >= 2 and summary["config"]["wire_dtype"] == "int8"
    assert (
        len((run / "autoloco_intervals.jsonl").read_text().splitlines())
        == summary["totals"]["syncs"]
    )
    steps = [json.loads(line) for line in (run / "autoloco_steps.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps] == [1, 2, 3, 4, 5, 6]
    assert steps[-1]["syncs"] == summary["totals"]["syncs"]
    assert 0 < summary["test_nll"] < 10
    # `autoloco report` reads the run: its test NLL as the validation loss, the steps and intervals
    from autoloco_hf.state.run_folder import find_runs

    (read,) = find_runs([str(run)])
    assert (read.name, read.summary["val_loss"], len(read.steps)) == (
        "sft_autoloco_int8",
        summary["test_nll"],
        6,
    )
    assert len(read.intervals) == summary["totals"]["syncs"]
    # the run folder holds the final model and tokenizer: `autoloco eval` it as the docs say
    record = eval_quick_nll(run, tmp_path / "eval")
    assert 0 < record["scores"]["nll_chat"] < 10 and 0 < record["scores"]["nll_c4"] < 10


def test_sft_two_processes(tmp_path, sft_files):
    """One worker per process under torchrun (gloo): 2 workers
    x batch 2 = global batch 4, DiLoCo syncs every 2 steps."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29533",
        os.path.join(RECIPES, "sft_ultrachat.py"),
        *tiny_args(tmp_path, sft_files, "sft_diloco.yaml"),
    ]
    done = subprocess.run(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sft_diloco" / "autoloco_summary.json").read_text())
    assert (
        summary["workers"] == 2
        and summary["totals"]["syncs"] == 3
        and summary["totals"]["wire_bytes"] > 0
    )
    assert summary["config"]["method"] == "diloco" and summary["config"]["outer_momentum"] == 0.9
    assert len((tmp_path / "sft_diloco" / "autoloco_intervals.jsonl").read_text().splitlines()) == 3


def test_sft_resume(tmp_path, sft_files):
    """A Trainer checkpoint at step 4 carries the AutoLoCo
    state: the resumed run ends where the full one does."""
    import shutil

    sft = load_recipe("sft_ultrachat")
    full = tmp_path / "full"
    assert (
        sft.main(
            tiny_args(full, sft_files, "sft_autoloco.yaml")
            + ["--save-strategy", "steps", "--save-steps", "4"]
        )
        == 0
    )
    crashed = tmp_path / "crashed" / "sft_autoloco"
    shutil.copytree(full / "sft_autoloco", crashed)
    shutil.rmtree(crashed / "checkpoint-6")  # the crash came before the last checkpoint
    assert (
        sft.main(
            tiny_args(tmp_path / "crashed", sft_files, "sft_autoloco.yaml")
            + ["--save-strategy", "steps", "--save-steps", "4", "--resume", "true"]
        )
        == 0
    )
    a, b = (
        json.loads((root / "autoloco_summary.json").read_text())
        for root in (full / "sft_autoloco", crashed)
    )
    assert (a["resumed_from_step"], b["resumed_from_step"]) == (0, 4)
    assert b["totals"]["syncs"] == a["totals"]["syncs"] and b["test_nll"] == pytest.approx(
        a["test_nll"], rel=1e-5
    )
    steps = [
        json.loads(line)["step"]
        for line in (crashed / "autoloco_steps.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_fsdp2_workers_are_requested_and_checked(monkeypatch, capsys):
    """``--fsdp`` (version 2 by default) or an accelerate
    FSDP2 config with ranks_per_worker > 1: the recipe shards.

    The settings it cannot run with stop before anything is loaded, one line each (exit 2); on CPU
    the last one is always the device (accelerate enables FSDP on GPUs only).
    """
    sft = load_recipe("sft_ultrachat")
    config = os.path.join(RECIPES, "configs", "sft_autoloco_fsdp2.yaml")
    for var in ("ACCELERATE_USE_FSDP", "FSDP_VERSION", "FSDP_CPU_RAM_EFFICIENT_LOADING"):
        monkeypatch.delenv(var, raising=False)
    s, args, a = sft.parse_args(["--config", config])
    assert (
        s.model_dtype,
        sft.autoloco_config(s, a).ranks_per_worker,
        sft.autoloco_config(s, a).outer_on_cpu,
    ) == (
        "float32",
        8,
        False,
    )
    assert not sft.fsdp2_requested(args)
    assert sft.fsdp2_requested(sft.parse_args(["--config", config, "--fsdp"])[1])
    # what `accelerate launch` sets from an FSDP config
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    assert not sft.fsdp2_requested(args)
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert sft.fsdp2_requested(args)

    def refusal(*extra: str) -> str:
        with pytest.raises(SystemExit) as exit_info:
            sft.main(["--config", config, "--output-dir", "unused", *extra])
        assert exit_info.value.code == 2
        return capsys.readouterr().err

    assert "--model-dtype bfloat16: FSDP2 workers keep FP32 master weights" in refusal(
        "--model-dtype", "bfloat16"
    )
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "true")
    assert "fsdp_cpu_ram_efficient_loading: true" in refusal()
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
    assert "ranks_per_worker=8 with FSDP2 needs GPUs" in refusal()


def _shard_worker_rank(rank: int, world_size: int) -> dict:
    """The recipe's sharding of a tiny Llama over 2 workers x
    2 ranks, bf16 compute, then one AdamW step."""
    import torch
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from autoloco_hf import AutoLoCoConfig
    from autoloco_hf.integrations.launch_checks import check_fsdp2_workers
    from autoloco_hf.toy.llama import tiny_llama

    def llama() -> torch.nn.Module:
        return tiny_llama(
            64,
            hidden_size=16,
            num_layers=2,
            num_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
        )

    sft = load_recipe("sft_ultrachat")
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(rank))
    expected = float(llama()(input_ids=ids, labels=ids).loss)
    model = sft.shard_workers(
        llama(), AutoLoCoConfig(ranks_per_worker=2), bf16=True, device_type="cpu"
    )
    # the layout the callback accepts under accelerate's FSDP2 plugin
    check_fsdp2_workers(model, world_size, 2)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()
    params = list(model.parameters())
    return {
        "layers_sharded": all(isinstance(layer, FSDPModule) for layer in model.model.layers),
        "root_sharded": isinstance(model, FSDPModule),
        "fp32_master": all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in params),
        "fp32_grads": all(p.grad.dtype == torch.float32 for p in params),
        "fp32_adamw": all(s["exp_avg"].dtype == torch.float32 for s in optimizer.state.values()),
        "loss_dtype": str(loss.dtype),
        "loss": float(loss),
        "expected": expected,
    }


def test_sft_fsdp2_workers_shard_each_worker():
    """4 gloo processes, ranks_per_worker=2: FP32 master weights,
    gradients and AdamW; bf16 compute (the recipe's path)."""
    from _dist import run_gloo

    for result in run_gloo(_shard_worker_rank, 4):
        assert result["layers_sharded"] and result["root_sharded"]
        assert result["fp32_master"] and result["fp32_grads"] and result["fp32_adamw"]
        assert result["loss_dtype"] == "torch.float32"  # the logits are upcast for the loss
        assert result["loss"] == pytest.approx(result["expected"], rel=2e-2)  # bf16 compute
        assert result["loss"] != result["expected"]  # and it did compute in bf16
