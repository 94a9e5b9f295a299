"""Offline errors, the command end to end, and the comparison table."""

import argparse
import json
import time

import nltk
import pytest
from evals_scripted import tiny_llama

from autoloco_evals.cli import add_arguments, run
from autoloco_evals.report import scores_table
from autoloco_evals.runner import FIXTURES_DIR


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([str(a) for a in argv])


@pytest.fixture(autouse=True)
def restore_offline_state(monkeypatch):
    """--offline changes the process environment; undo it after each test."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "0")
    monkeypatch.setattr(nltk.downloader._downloader, "_url", nltk.downloader._downloader._url)


@pytest.mark.parametrize(
    "argv, option",
    [
        (["--tasks", "mmlu_pro", "ifbench"], "--mmlu-pro-path"),
        (["--tasks", "nll", "--c4-path", "/nonexistent/c4.jsonl"], "--c4-path"),
        (["--tasks", "nll", "--c4-path", "{fixtures}/c4.jsonl"], "--chat-path"),
    ],
)
def test_offline_missing_data_fails_fast_naming_the_option(
    argv, option, monkeypatch, tmp_path, capsys
):
    # Any network attempt would hang on this unroutable proxy instead of failing.
    monkeypatch.setenv("HTTPS_PROXY", "http://10.255.255.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://10.255.255.1:9")
    argv = [a.format(fixtures=FIXTURES_DIR) for a in argv]
    (tmp_path / "model").mkdir()
    # the data check comes before the model load
    (tmp_path / "model" / "config.json").write_text("{}")
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exc:
        run(parse(tmp_path / "model", "--offline", "--out", tmp_path / "out", *argv))
    assert time.perf_counter() - start < 5
    assert exc.value.code == 2
    assert option in capsys.readouterr().err


def test_eval_command_end_to_end(tmp_path, capsys):
    """Save a tiny checkpoint, evaluate NLL on the bundled fixtures offline, compare two runs."""
    model, tokenizer = tiny_llama()
    model_dir = tmp_path / "tiny"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "out"

    assert (
        run(
            parse(
                model_dir,
                "--tasks",
                "nll",
                "--fixtures",
                "--offline",
                "--out",
                out,
                "--run-name",
                "a",
            )
        )
        == 0
    )
    # the overall bar over tasks: "1/1 [time<left]"
    assert "autoloco eval: task: 100%" in capsys.readouterr().err
    record = json.loads((out / "a.json").read_text())
    assert record["model"] == str(model_dir) and record["chat_template"] is True
    assert record["data"]["c4"].endswith("fixtures/c4.jsonl")
    assert set(record["scores"]) == {"nll_c4", "nll_chat"}
    assert record["details"]["nll"]["nll_chat_tokens"] > 0

    capsys.readouterr()
    assert run(parse("--compare", out / "a.json", out / "a.json", "--out", tmp_path / "table")) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| Run | Test NLL (chat) | NLL (C4) |"
    assert (
        table[2]
        == table[3]
        == f"| a | {record['scores']['nll_chat']:.4f} | {record['scores']['nll_c4']:.4f} |"
    )
    assert (tmp_path / "table" / "table.md").read_text().splitlines() == table[:4]


def test_scores_table_layout():
    runs = [
        {"run": "DDP", "scores": {"nll_chat": 0.8745, "ifeval": 0.5, "humaneval_plus": 0.25}},
        {"run": "AutoLoCo", "scores": {"ifeval": 0.4813}},
    ]
    assert scores_table(runs) == (
        "| Run | Test NLL (chat) | IFEval | HumanEval+ |\n"
        "| --- | ---: | ---: | ---: |\n"
        "| DDP | 0.8745 | 50.00 | 25.00 |\n"
        "| AutoLoCo | - | 48.13 | - |\n"
    )


def test_offline_is_set_before_the_hub_clients_load(tmp_path):
    """A fresh `autoloco eval --offline` process: the hub
    clients see offline mode, a bad MODEL_DIR is one line."""
    import subprocess
    import sys

    (tmp_path / "model").mkdir()
    # a folder that is not a loadable checkpoint
    (tmp_path / "model" / "config.json").write_text("{}")
    script = (
        "import sys\n"
        "from autoloco_hf.cli import main\ntry:\n"
        f"    main(['eval', {str(tmp_path / 'model')!r}, '--offline', '--tasks', 'nll', "
        f"'--fixtures', '--out', {str(tmp_path / 'out')!r}])\n"
        "except SystemExit as exc:\n"
        "    import huggingface_hub.constants as hub\n"
        "    print(exc.code, hub.HF_HUB_OFFLINE)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.endswith("_OFFLINE")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.stdout.split() == ["2", "True"], done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("autoloco eval: error:")]
    assert len(errors) == 1 and "cannot load it" in errors[0] and "Traceback" not in done.stderr
