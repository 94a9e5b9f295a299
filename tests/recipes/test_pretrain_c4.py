"""Smoke tests of recipes/pretrain_c4.py: a few steps of a
tiny Llama on local JSONL files, both modes."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
from recipe_helpers import RECIPES, eval_quick_nll, load_recipe

pytestmark = pytest.mark.slow


def tiny_args(
    out, tokenizer_dir, tiny_llama_config, text_files, config="c4_autoloco.yaml", workers=2
) -> list[str]:
    train, val = text_files
    return [
        "--config",
        os.path.join(RECIPES, "configs", config),
        "--output-dir",
        str(out),
        "--workers",
        str(workers),
        "--steps",
        "8",
        "--warmup-steps",
        "1",
        "--batch-size",
        "2",
        "--seq-len",
        "48",
        "--val-docs",
        "8",
        "--eval-batch-size",
        "4",
        "--train-files",
        train,
        "--val-files",
        val,
        "--tokenizer",
        tokenizer_dir,
        "--model-config",
        tiny_llama_config,
        "--lr",
        "3e-3",
        "--autoloco",
        "h_base=2",
        # AutoLoCo's horizon grid and its rule's range (DiLoCo and DDP have neither)
        *(["--autoloco", "q_h=1", "--autoloco", "h_max=3"] if "autoloco" in config else []),
    ]


def test_every_config_parses():
    c4 = load_recipe("pretrain_c4")
    for path in sorted(glob.glob(os.path.join(RECIPES, "configs", "c4_*.yaml"))):
        settings, autoloco = c4.parse_args(["--config", path])
        config = c4.autoloco_config(settings, autoloco)
        assert settings.steps == 50_000 and settings.batch_size == 128 and settings.seq_len == 1024
        assert settings.workers == (4 if "ablation" in path else 8), path
        assert settings.seed == (42 if "ablation" in path else 0), path  # the paper's ablation seed
        assert (config.h_base, config.q_h, config.h_max) == (500, 50, 750), path
    mu07 = c4.parse_args(["--config", os.path.join(RECIPES, "configs", "c4_diloco_mu07.yaml")])
    assert c4.autoloco_config(*mu07).outer_momentum == 0.7
    momentum = c4.autoloco_config(
        *c4.parse_args(["--config", os.path.join(RECIPES, "configs", "c4_ablation_momentum.yaml")])
    )
    assert (momentum.adjust_momentum, momentum.scale_outer_lr) == (True, False)
    # the recipe's ablation choices are exactly AutoLoCoConfig.ablation's variants
    from typing import get_args, get_type_hints

    for variant in get_args(get_args(get_type_hints(c4.C4Settings)["ablation"])[0]):
        assert c4.AutoLoCoConfig.ablation(variant).method == "autoloco"


def test_flags_yaml_and_autoloco_fields(tmp_path):
    """Flags beat YAML; `autoloco:` keys, `autoloco_*` flags and
    `--autoloco k=v` reach the engine; YAML 7e-1 is a number."""
    c4 = load_recipe("pretrain_c4")
    path = tmp_path / "run.yaml"
    path.write_text(
        f"base: {os.path.join(RECIPES, 'configs', 'c4_diloco.yaml')}\n"
        "lr: 1e-3\nautoloco:\n"
        "  outer_lr: 7e-1\n"
    )
    settings, autoloco = c4.parse_args(
        [
            "--config",
            str(path),
            "--batch_size",
            "4",
            "--autoloco_h_base",
            "100",
            "--autoloco",
            "outer_momentum=0.8",
        ]
    )
    config = c4.autoloco_config(settings, autoloco)
    assert (settings.lr, settings.batch_size, settings.run_name) == (1e-3, 4, "c4_diloco")
    assert (config.method, config.outer_lr, config.h_base, config.outer_momentum) == (
        "diloco",
        0.7,
        100,
        0.8,
    )


def test_reads_gzipped_json_lines_and_parquet_by_content(tmp_path):
    """The real C4 shards are `.json.gz`: the model must see
    the `text` field, not the raw JSON line."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    c4 = load_recipe("pretrain_c4")
    rows = [
        {
            "text": f"document {i}",
            "timestamp": "2019-04-25T12:57:54Z",
            "url": f"https://example.org/{i}",
        }
        for i in range(4)
    ]
    shard = tmp_path / "c4-train.00000-of-01024.json.gz"
    with gzip.open(shard, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "validation.parquet")
    # 4 rows last 2 steps
    small = ["--workers", "1", "--steps", "2", "--warmup-steps", "0", "--batch-size", "2"]
    settings, _ = c4.parse_args(
        ["--train-files", str(shard), "--val-files", str(tmp_path / "validation.parquet")] + small
    )
    for split in ("train", "validation"):
        assert list(c4.texts(c4.worker_dataset(settings, split, 0, 1), "text")) == [
            r["text"] for r in rows
        ], split


def test_data_that_runs_out_is_one_line_before_training(tmp_path, text_files, capsys):
    """A local file's rows are counted up front: not 8 steps
    of training, then "the training data ran out"."""
    c4 = load_recipe("pretrain_c4")
    train, val = text_files
    rows = sum(1 for line in open(train) if line.strip())
    # 2 workers, batch 4: each worker gets rows // 2 rows
    # (one file: every other row), ceil(that / 4) steps
    lasts = -(-(rows // 2) // 4)
    argv = [
        "--train-files",
        train,
        "--val-files",
        val,
        "--workers",
        "2",
        "--batch-size",
        "4",
        "--warmup-steps",
        "0",
    ]
    assert c4.parse_args(argv + ["--steps", str(lasts)])[0].steps == lasts
    with pytest.raises(SystemExit) as exc:
        c4.parse_args(argv + ["--steps", str(lasts + 1)])
    line = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in line, line
    assert (
        f"--train-files {train}: the training data runs out at step {lasts + 1} of {lasts + 1}"
        in line
    ), line
    assert f"({rows} rows over 2 workers" in line and "lower --steps" in line, line


@pytest.mark.parametrize(
    "file_rows, workers", [([7], 3), ([5, 2, 9, 4], 2), ([5, 2, 9], 2), ([3, 3], 1)]
)
def test_rows_per_worker_is_what_datasets_gives_each_worker(tmp_path, file_rows, workers):
    """The up-front count follows ``split_dataset_by_node``:
    whole files when they divide evenly, else every N-th row."""
    from datasets.distributed import split_dataset_by_node
    from recipe_config import rows_per_worker

    c4 = load_recipe("pretrain_c4")
    files = []
    for k, n in enumerate(file_rows):
        files.append(str(tmp_path / f"part{k}.jsonl"))
        with open(files[-1], "w") as f:
            f.writelines(json.dumps({"text": f"{k}-{i}"}) + "\n" for i in range(n))
    stream = c4.load_data_files(files, "--train-files", streaming=True)
    theirs = [
        sum(1 for _ in split_dataset_by_node(stream, rank=w, world_size=workers))
        for w in range(workers)
    ]
    assert rows_per_worker(file_rows, workers) == theirs


def test_default_model_is_215m():
    from transformers import LlamaConfig, LlamaForCausalLM

    c4 = load_recipe("pretrain_c4")
    with __import__("torch").device("meta"):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=32_000, **c4.MODEL_215M))
    assert 210e6 < sum(p.numel() for p in model.parameters()) < 220e6


def test_simulated_mode(tmp_path, tokenizer_dir, tiny_llama_config, text_files, monkeypatch):
    # `eval --offline` sets them
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, os.environ.get(var, "0"))
    c4 = load_recipe("pretrain_c4")
    assert (
        c4.main(
            tiny_args(tmp_path, tokenizer_dir, tiny_llama_config, text_files, "c4_autoloco.yaml")
        )
        == 0
    )
    ddp_args = tiny_args(tmp_path, tokenizer_dir, tiny_llama_config, text_files, "c4_ddp.yaml")
    assert c4.main(ddp_args + ["--micro-batch-size", "1"]) == 0
    auto = json.loads((tmp_path / "c4_autoloco" / "summary.json").read_text())
    assert (
        auto["totals"]["steps"] == 8
        and auto["totals"]["syncs"] >= 3
        and auto["mode"] == "simulated"
    )
    assert 0 < auto["val_loss"] < 10
    records = (tmp_path / "c4_autoloco" / "intervals.jsonl").read_text().splitlines()
    assert len(records) == auto["totals"]["syncs"]
    # padding without packing: the records count only the non-padding tokens
    assert sum(json.loads(r)["tokens"] for r in records) < 8 * 2 * 2 * 48
    ddp = json.loads((tmp_path / "c4_ddp" / "summary.json").read_text())
    assert ddp["totals"]["syncs"] == 8
    # the run folder holds the final model and tokenizer: evaluate it as the docs say
    record = eval_quick_nll(tmp_path / "c4_autoloco", tmp_path / "eval")
    assert 0 < record["scores"]["nll_c4"] < 10 and record["details"]["nll"]["nll_c4_tokens"] > 0


def test_multiprocess_mode_matches_simulated(
    tmp_path, tokenizer_dir, tiny_llama_config, text_files
):
    """torchrun with 2 gloo processes runs the same trajectory as 2 simulated workers."""
    c4 = load_recipe("pretrain_c4")
    args = tiny_args(
        tmp_path / "sim", tokenizer_dir, tiny_llama_config, text_files, "c4_diloco.yaml"
    )
    assert c4.main(args + ["--mode", "simulated"]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    mp_args = tiny_args(
        tmp_path / "mp", tokenizer_dir, tiny_llama_config, text_files, "c4_diloco.yaml"
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29517",
        os.path.join(RECIPES, "pretrain_c4.py"),
        *mp_args,
        "--mode",
        "multiprocess",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    sim = json.loads((tmp_path / "sim" / "c4_diloco" / "summary.json").read_text())
    mp = json.loads((tmp_path / "mp" / "c4_diloco" / "summary.json").read_text())
    assert mp["mode"] == "multiprocess" and mp["totals"]["syncs"] == sim["totals"]["syncs"] == 4
    assert mp["val_loss"] == pytest.approx(sim["val_loss"], rel=1e-4)


def test_micro_batches_give_the_full_batch_gradient():
    import torch

    from autoloco_hf.toy.llama import tiny_llama

    c4 = load_recipe("pretrain_c4")
    ids = torch.randint(0, 50, (4, 12))
    labels = ids.masked_fill(torch.rand(4, 12) < 0.3, -100)  # uneven target counts per row
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    grads, values = [], []
    for micro in (None, 1, 3):
        model = tiny_llama(50, 16, 1, 2, seed=0)
        loss = c4.accumulated_loss(model, batch, micro)
        loss.backward()
        values.append(loss.item())
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    assert values[1] == pytest.approx(values[0], rel=1e-5) and values[2] == pytest.approx(
        values[0], rel=1e-5
    )
    assert torch.allclose(grads[1], grads[0], atol=1e-6) and torch.allclose(
        grads[2], grads[0], atol=1e-6
    )


def test_resume_continues_the_same_trajectory(
    tmp_path, tokenizer_dir, tiny_llama_config, text_files
):
    """Resuming from the step-4 checkpoint (replicas, AdamW,
    engine, data position) reproduces the uninterrupted run."""
    import shutil

    c4 = load_recipe("pretrain_c4")
    full = tmp_path / "full"
    args = tiny_args(full, tokenizer_dir, tiny_llama_config, text_files) + ["--save-every", "4"]
    assert c4.main(args) == 0
    # a crashed run: its logs went past the checkpoint at
    # step 4; the resumed run must drop those lines
    shutil.copytree(full / "c4_autoloco", tmp_path / "crashed" / "c4_autoloco")
    resumed = tmp_path / "crashed"
    args = tiny_args(resumed, tokenizer_dir, tiny_llama_config, text_files) + [
        "--save-every",
        "4",
        "--resume",
        "true",
    ]
    assert c4.main(args) == 0

    def read(root, name):
        return [json.loads(line) for line in (root / "c4_autoloco" / name).read_text().splitlines()]

    keys = ("start_step", "h_step", "mean_loss", "drift_energy", "coherence", "tokens")
    assert [[r[k] for k in keys] for r in read(resumed, "intervals.jsonl")] == [
        [r[k] for k in keys] for r in read(full, "intervals.jsonl")
    ]
    assert [r["loss"] for r in read(resumed, "steps.jsonl")] == [
        r["loss"] for r in read(full, "steps.jsonl")
    ]
    a, b = (
        json.loads((root / "c4_autoloco" / "summary.json").read_text()) for root in (full, resumed)
    )
    assert (a["resumed_from_step"], b["resumed_from_step"]) == (0, 4)
    assert a["val_loss"] == b["val_loss"] and a["totals"]["syncs"] == b["totals"]["syncs"]
