"""Evaluation data in the hub's file formats: gzipped C4
shards and Parquet (MMLU-Pro, BBH, UltraChat test_sft)."""

from __future__ import annotations

import gzip
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from evals_scripted import fixture_rows, tiny_llama

from autoloco_evals.cli import add_arguments, run
from autoloco_evals.data_files import builder, check_files
from autoloco_evals.lm_eval_tasks import local_task_configs
from autoloco_evals.runner import FIXTURES_DIR


def write_parquet(rows: list[dict], path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.fixture
def c4_shard(tmp_path):
    """A C4 shard as on the hub: gzipped JSON Lines with text, timestamp and url."""
    path = tmp_path / "c4-validation.00000-of-00008.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for row in fixture_rows("c4.jsonl"):
            f.write(
                json.dumps(
                    {
                        "text": row["text"],
                        "timestamp": "2019-04-25T12:57:54Z",
                        "url": "https://example.org",
                    }
                )
                + "\n"
            )
    return path


def test_formats_are_read_by_datasets(tmp_path, c4_shard):
    """A gzipped C4 shard, a JSON array and Parquet chats read
    as their hub rows, by file name as `datasets` does."""
    write_parquet(fixture_rows("chat.jsonl"), tmp_path / "test_sft.parquet")
    (tmp_path / "array.json").write_text(json.dumps(fixture_rows("c4.jsonl")))
    assert (builder([c4_shard], "-"), builder([tmp_path / "test_sft.parquet"], "-")) == (
        "json",
        "parquet",
    )
    texts = [r["text"] for r in fixture_rows("c4.jsonl")]
    assert [r["text"] for r in check_files([c4_shard], "--c4-path", ["text"])] == texts
    assert [
        r["text"] for r in check_files([tmp_path / "array.json"], "--c4-path", ["text"], limit=2)
    ] == texts[:2]
    rows = check_files([tmp_path / "test_sft.parquet"], "--chat-path", ["messages"], limit=3)
    assert rows == fixture_rows("chat.jsonl")[:3]


def test_eval_nll_reads_a_gzipped_c4_shard_and_parquet_chats(tmp_path, c4_shard, monkeypatch):
    """`--c4-path shard.json.gz` (was: UnicodeDecodeError) and
    `--chat-path test_sft.parquet` give the JSONL numbers."""
    import argparse

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "0")
    write_parquet(fixture_rows("chat.jsonl"), tmp_path / "test_sft.parquet")
    model, tokenizer = tiny_llama()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    scores = {}
    for name, paths in (
        ("jsonl", [FIXTURES_DIR / "c4.jsonl", FIXTURES_DIR / "chat.jsonl"]),
        ("hub", [c4_shard, tmp_path / "test_sft.parquet"]),
    ):
        argv = [
            tmp_path / "model",
            "--tasks",
            "nll",
            "--offline",
            "--c4-path",
            paths[0],
            "--chat-path",
            paths[1],
            "--out",
            tmp_path / "out",
            "--run-name",
            name,
        ]
        assert run(parser.parse_args([str(a) for a in argv])) == 0
        scores[name] = json.loads((tmp_path / "out" / f"{name}.json").read_text())["scores"]
    assert scores["hub"] == scores["jsonl"]


def test_lm_eval_tasks_on_hub_parquet_layouts(tmp_path):
    """MMLU-Pro's data/<split>-*.parquet and BBH's
    <subtask>/test-*.parquet become parquet tasks that load."""
    from datasets import load_dataset

    mmlu = tmp_path / "mmlu_pro"
    for split in ("test", "validation"):
        write_parquet(
            fixture_rows(f"mmlu_pro/{split}.jsonl"),
            mmlu / "data" / f"{split}-00000-of-00001.parquet",
        )
    configs = local_task_configs("mmlu_pro", mmlu)
    subjects = {r["category"] for r in fixture_rows("mmlu_pro/test.jsonl")}
    tasks = [c for name, c in configs.items() if name != "local_mmlu_pro"]
    assert len(tasks) == len(subjects) and all(c["dataset_path"] == "parquet" for c in tasks)
    loaded = load_dataset("parquet", data_files=tasks[0]["dataset_kwargs"]["data_files"])
    assert len(loaded["test"]) == len(fixture_rows("mmlu_pro/test.jsonl"))

    bbh = tmp_path / "bbh"
    write_parquet(
        fixture_rows("bbh/boolean_expressions.jsonl"),
        bbh / "boolean_expressions" / "test-00000-of-00001.parquet",
    )
    shutil.copy(FIXTURES_DIR / "bbh" / "word_sorting.jsonl", bbh / "word_sorting.jsonl")
    configs = local_task_configs("bbh", bbh)
    assert configs["local_bbh_boolean_expressions"]["dataset_path"] == "parquet"
    assert configs["local_bbh_word_sorting"]["dataset_path"] == "json"
    assert configs["local_bbh"]["task"] == [
        "local_bbh_word_sorting",
        "local_bbh_boolean_expressions",
    ]
