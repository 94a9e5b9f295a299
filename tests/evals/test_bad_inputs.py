"""`autoloco eval` on bad inputs: one line naming the option or
file, the value and the fix; exit 2; nothing loaded or written.

The model folder of these cases holds a config.json that cannot be loaded: a
check that ran after the model load would report "cannot load it" instead.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import nltk
import pytest
import torch

from autoloco_evals.runner import FIXTURES_DIR
from autoloco_hf.cli import main

C4, CHAT = str(FIXTURES_DIR / "c4.jsonl"), str(FIXTURES_DIR / "chat.jsonl")


@pytest.fixture(autouse=True)
def restore_offline_state(monkeypatch):
    """--offline changes the process environment; undo it after each test."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "0")
    monkeypatch.setattr(nltk.downloader._downloader, "_url", nltk.downloader._downloader._url)


def bad_files(root) -> None:
    (root / "empty.jsonl").write_text("")
    (root / "malformed.jsonl").write_text('{"text": "fine"}\n{"text": "a\x01b"}\n')
    (root / "no_text.jsonl").write_text('{"body": "a document"}\n')
    (root / "plain.jsonl").write_text("just some text\nand more\n")
    (root / "rows.csvx").write_text("text\na\n")
    (root / "a_folder").mkdir()
    with gzip.open(root / "empty.jsonl.gz", "wt") as f:
        f.write("")
    (root / "mmlu").mkdir()
    (root / "bbh").mkdir()
    (root / "ifeval.jsonl").write_text('{"key": 1, "prompt": "Write."}\n')
    (root / "no_model").mkdir()


# case -> (argv after MODEL_DIR, texts the one line must
# contain: the option or file, the value, the fix)
NLL = ["--tasks", "nll", "--offline"]
CASES = {
    "empty c4 file": (
        NLL + ["--c4-path", "{tmp}/empty.jsonl", "--chat-path", CHAT],
        ["--c4-path", "empty.jsonl", "empty"],
    ),
    "malformed line": (
        NLL + ["--c4-path", "{tmp}/malformed.jsonl", "--chat-path", CHAT],
        ["--c4-path", "malformed.jsonl", "line 2", "Invalid control character", "one JSON object"],
    ),
    "no text field": (
        NLL + ["--c4-path", "{tmp}/no_text.jsonl", "--chat-path", CHAT],
        ["--c4-path", "no_text.jsonl", "'text'", "'body'"],
    ),
    "chat rows without messages": (
        NLL + ["--c4-path", C4, "--chat-path", C4],
        ["--chat-path", "c4.jsonl", "'messages'"],
    ),
    "plain text as JSON Lines": (
        NLL + ["--c4-path", "{tmp}/plain.jsonl", "--chat-path", CHAT],
        ["--c4-path", "plain.jsonl", "line 1", "one JSON object"],
    ),
    "unknown file type": (
        NLL + ["--c4-path", "{tmp}/rows.csvx", "--chat-path", CHAT],
        ["rows.csvx", ".jsonl"],
    ),
    "a folder for a file": (
        NLL + ["--c4-path", "{tmp}/a_folder", "--chat-path", CHAT],
        ["a_folder", "not a file"],
    ),
    "empty gzipped file": (
        NLL + ["--c4-path", "{tmp}/empty.jsonl.gz", "--chat-path", CHAT],
        ["--c4-path", "empty.jsonl.gz", "empty"],
    ),
    "missing c4 file": (
        NLL + ["--c4-path", "{tmp}/nope.jsonl", "--chat-path", CHAT],
        ["--c4-path", "nope.jsonl", "does not exist"],
    ),
    "mmlu folder without test": (
        ["--tasks", "mmlu_pro", "--offline", "--mmlu-pro-path", "{tmp}/mmlu"],
        ["--mmlu-pro-path", "mmlu", "test.jsonl"],
    ),
    "empty bbh folder": (
        ["--tasks", "bbh", "--offline", "--bbh-path", "{tmp}/bbh"],
        ["--bbh-path", "bbh", "<subtask>.jsonl"],
    ),
    "ifeval rows lack a field": (
        ["--tasks", "ifeval", "--offline", "--ifeval-path", "{tmp}/ifeval.jsonl"],
        ["--ifeval-path", "ifeval.jsonl", "'instruction_id_list'"],
    ),
    "--dtype float17": (
        NLL + ["--fixtures", "--dtype", "float17"],
        ["--dtype", "'float17'", "'bfloat16'"],
    ),
    "--device gpu": (NLL + ["--fixtures", "--device", "gpu"], ["--device", "'gpu'", "cpu, cuda"]),
    "--device mps here": (
        NLL + ["--fixtures", "--device", "mps"],
        ["--device mps", "no mps device", "--device cpu"],
    ),
    "--tasks with a typo": (
        ["--tasks", "nll,ifevl", "--fixtures"],
        ["--tasks", "'ifevl'", "did you mean ifeval"],
    ),
    "--limit 0": (NLL + ["--fixtures", "--limit", "0"], ["--limit", "'0'", ">= 1"]),
}
MODEL_CASES = {  # a bad MODEL_DIR itself
    "missing MODEL_DIR": ("{tmp}/nope", ["MODEL_DIR", "nope", "does not exist", "save_pretrained"]),
    "MODEL_DIR without a model": (
        "{tmp}/no_model",
        ["MODEL_DIR", "no_model", "checkpoint-N", "save_pretrained"],
    ),
    "MODEL_DIR a file": (
        "{tmp}/ifeval.jsonl",
        ["MODEL_DIR", "ifeval.jsonl", "is a file", "save_pretrained"],
    ),
}
if not torch.cuda.is_available():
    CASES["--device cuda on a CPU build"] = (
        NLL + ["--fixtures", "--device", "cuda"],
        ["--device cuda", "no cuda device", "--device cpu"],
    )


def one_line_exit_2(argv: list[str], expected: list[str], tmp_path, capsys) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["eval", *argv, "--out", str(out)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in lines[0], (text, lines[0])
    assert not out.exists()  # nothing written before the inputs are checked


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_before_the_model_loads(case, tmp_path, capsys):
    bad_files(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # loading it would fail with "cannot load it"
    argv, expected = CASES[case]
    one_line_exit_2(
        [str(model)] + [a.format(tmp=tmp_path) for a in argv], expected, tmp_path, capsys
    )


@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_bad_model_dir_is_one_line(case, tmp_path, capsys):
    bad_files(tmp_path)
    model, expected = MODEL_CASES[case]
    one_line_exit_2(
        [model.format(tmp=tmp_path), "--tasks", "nll", "--fixtures"], expected, tmp_path, capsys
    )


def test_missing_model_dir_imports_nothing_heavy(tmp_path):
    """The path check comes first: no torch, transformers,
    datasets or nltk (5 to 18 s) to say a folder is missing."""
    script = (
        "import sys\n"
        "from autoloco_hf.cli import main\ntry:\n"
        f"    main(['eval', {str(tmp_path / 'nope')!r}, '--tasks', 'nll', '--fixtures', "
        "'--offline'])\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, *[m for m in ('torch', 'transformers', 'datasets', "
        "'nltk') if m in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["2"], done.stdout + done.stderr[-2000:]


def test_lm_eval_spellings_are_accepted(tmp_path):
    """lm-eval users type --output_path, --batch_size and comma-separated --tasks."""
    from autoloco_evals.cli import add_arguments
    from autoloco_hf.usage import OneLineParser

    parser = OneLineParser(prog="autoloco eval")
    add_arguments(parser)
    ours = parser.parse_args(
        ["m", "--out", str(tmp_path), "--batch-size", "4", "--tasks", "nll", "ifeval"]
    )
    theirs = parser.parse_args(
        ["m", "--output_path", str(tmp_path), "--batch_size", "4", "--tasks", "nll,ifeval"]
    )
    assert (theirs.out, theirs.batch_size) == (ours.out, ours.batch_size) == (tmp_path, 4)
    assert [t for group in theirs.tasks for t in group] == [
        t for group in ours.tasks for t in group
    ]


def test_a_trainer_output_dir_evaluates_its_last_checkpoint(tmp_path, capsys, monkeypatch):
    """`autoloco eval OUTPUT_DIR` with only checkpoint-N folders: the last one, said in one line."""
    from evals_scripted import tiny_llama

    model, tokenizer = tiny_llama()
    output_dir = tmp_path / "trainer_out"
    for step in (3, 10):
        model.save_pretrained(output_dir / f"checkpoint-{step}")
        tokenizer.save_pretrained(output_dir / f"checkpoint-{step}")
    (output_dir / "checkpoint-20").mkdir()  # not a checkpoint: no config.json
    argv = [
        "eval",
        str(output_dir),
        "--tasks",
        "nll",
        "--fixtures",
        "--offline",
        "--out",
        str(tmp_path / "out"),
    ]
    assert main(argv + ["--num-documents", "4", "--num-conversations", "4"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "checkpoint" in line]
    assert said == [
        f"autoloco eval: {output_dir} holds no final model (config.json): evaluating its last "
        f"checkpoint, {output_dir / 'checkpoint-10'}"
    ]
    record = json.loads((tmp_path / "out" / "trainer_out.json").read_text())
    assert record["model"] == str(output_dir / "checkpoint-10") and record["run"] == "trainer_out"


@pytest.mark.parametrize("allow", [False, True], ids=["refused", "--approximate-punkt"])
def test_ifeval_without_punkt_tab_is_refused_before_the_model_loads(
    allow, tmp_path, capsys, monkeypatch
):
    """No official sentence splitter: one line with the command
    that installs it, unless the user allows the empty one."""
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "no_nltk_data")])  # punkt_tab is nowhere
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    ifeval = str(FIXTURES_DIR / "ifeval.jsonl")
    argv = [str(model), "--tasks", "ifeval", "--offline", "--ifeval-path", ifeval] + (
        ["--approximate-punkt"] * allow
    )
    expected = (
        ["cannot load it"]
        if allow
        else ["punkt_tab", "python -m nltk.downloader punkt_tab", "--approximate-punkt"]
    )
    # allowed: it goes on to the model, which fails to load
    one_line_exit_2(argv, expected, tmp_path, capsys)
