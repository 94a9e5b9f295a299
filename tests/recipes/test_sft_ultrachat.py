"""Smoke test of recipes/sft_ultrachat.py: SFTTrainer + AutoLoCoCallback on a tiny Llama and local conversations."""

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
    from autoloco_hf.cli.demo_data import corpus_documents

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
    """A tiny Llama saved like a hub checkpoint, and train/test JSONL with invalid conversations mixed in."""
    from transformers import AutoTokenizer

    from autoloco_hf.cli.demo_data import tiny_llama

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
        {"messages": [{"role": "assistant", "content": "reply first"}, {"role": "user", "content": "then a user"}]},
        {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "empty prompt"}]},
        # the prompt alone fills max_length: no assistant token survives truncation
        {"messages": [{"role": "user", "content": "word " * 400}, {"role": "assistant", "content": "cut off"}]},
    ]
    for name, rows in (("train.jsonl", chats(24) + invalid), ("test.jsonl", chats(6, offset=40) + invalid)):
        with open(root / name, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return str(root / "model"), str(root / "train.jsonl"), str(root / "test.jsonl")


def test_filters():
    sft = load_recipe("sft_ultrachat")
    ok = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert sft.valid_conversation(ok) and sft.valid_conversation([{"role": "system", "content": "s"}] + ok)
    assert not sft.valid_conversation(ok[:1]) and not sft.valid_conversation(ok[::-1])
    assert not sft.valid_conversation([{"role": "user", "content": " "}, ok[1]]) and not sft.valid_conversation("text")


def test_every_config_parses():
    sft = load_recipe("sft_ultrachat")
    for path in sorted(glob.glob(os.path.join(RECIPES, "configs", "sft_*.yaml"))):
        s, args, a = sft.parse_args(["--config", path])
        config = sft.autoloco_config(s, a)
        assert (s.global_batch_size, args.max_length, args.num_train_epochs, config.h_base) == (32, 2048, 1, 100), path
        assert (args.learning_rate, args.save_steps, args.save_total_limit, args.assistant_only_loss) == (
            2e-5,
            1000,
            2,
            True,
        )
    config = sft.autoloco_config(
        *sft.parse_args(["--config", os.path.join(RECIPES, "configs", "sft_autoloco_int8.yaml")])[::2]
    )
    assert config.normalize_pseudo_grad and config.wire_dtype == "int8" and config.outer_on_cpu
    diloco = sft.autoloco_config(
        *sft.parse_args(["--config", os.path.join(RECIPES, "configs", "sft_diloco.yaml")])[::2]
    )
    assert (diloco.method, diloco.outer_momentum) == ("diloco", 0.9)


def test_every_trainer_field_is_settable():
    """Any SFTConfig / TrainingArguments field is a flag: trackers, optimizer, checkpoint retention, ..."""
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
        "--autoloco",
        "q_h=1",
        "--autoloco",
        "h_max=3",
        "--autoloco",
        "outer_on_cpu=false",
    ]


def test_sft_smoke(tmp_path, sft_files, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):  # `eval --offline` sets them
        monkeypatch.setenv(var, os.environ.get(var, "0"))
    sft = load_recipe("sft_ultrachat")
    assert sft.main(tiny_args(tmp_path, sft_files, "sft_autoloco_int8.yaml")) == 0
    run = tmp_path / "sft_autoloco_int8"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train_conversations"] == 24 and summary["test_conversations"] == 6  # invalid ones filtered out
    assert summary["totals"]["syncs"] >= 2 and summary["config"]["wire_dtype"] == "int8"
    assert len((run / "intervals.jsonl").read_text().splitlines()) == summary["totals"]["syncs"]
    steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps] == [1, 2, 3, 4, 5, 6]
    assert steps[-1]["syncs"] == summary["totals"]["syncs"]
    assert 0 < summary["test_nll"] < 10
    # the run folder holds the final model and tokenizer: `autoloco eval` it as the docs say
    record = eval_quick_nll(run, tmp_path / "eval")
    assert 0 < record["scores"]["nll_chat"] < 10 and 0 < record["scores"]["nll_c4"] < 10


def test_sft_two_processes(tmp_path, sft_files):
    """One worker per process under torchrun (gloo): 2 workers x batch 2 = global batch 4, DiLoCo syncs every 2 steps."""
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
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "sft_diloco" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["totals"]["syncs"] == 3 and summary["totals"]["wire_bytes"] > 0
    assert summary["config"]["method"] == "diloco" and summary["config"]["outer_momentum"] == 0.9
    assert len((tmp_path / "sft_diloco" / "intervals.jsonl").read_text().splitlines()) == 3


def test_sft_resume(tmp_path, sft_files):
    """A Trainer checkpoint at step 4 carries the AutoLoCo state: the resumed run ends where the full one does."""
    import shutil

    sft = load_recipe("sft_ultrachat")
    full = tmp_path / "full"
    assert (
        sft.main(tiny_args(full, sft_files, "sft_autoloco.yaml") + ["--save-strategy", "steps", "--save-steps", "4"])
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
    a, b = (json.loads((root / "summary.json").read_text()) for root in (full / "sft_autoloco", crashed))
    assert (a["resumed_from_step"], b["resumed_from_step"]) == (0, 4)
    assert b["totals"]["syncs"] == a["totals"]["syncs"] and b["test_nll"] == pytest.approx(a["test_nll"], rel=1e-5)
    steps = [json.loads(line)["step"] for line in (crashed / "steps.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
