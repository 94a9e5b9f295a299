"""Every place a user types: a bad value is one line naming the flag, the value and the fix, exit code 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autoloco_hf.cli import main

RECIPES = os.path.join(os.path.dirname(__file__), "..", "..", "recipes")


def recipe(name: str):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "recipes"))
    try:
        from recipe_helpers import load_recipe
    finally:
        sys.path.pop(0)
    return load_recipe(name)


# case -> (entry point, argv, texts the one line must contain: the flag, the value, the fix)
CASES = {
    "demo --h-base -5": ("autoloco", ["demo", "--h-base", "-5"], ["--h-base", "'-5'", ">= 1"]),
    "demo --h-base 0": ("autoloco", ["demo", "--h-base", "0"], ["--h-base", "'0'", ">= 1"]),  # was: the default
    "demo --threads 0": ("autoloco", ["demo", "--threads", "0"], ["--threads", "'0'", ">= 1"]),
    "report --thresholds abc": (
        "autoloco",
        ["report", "{tmp}", "--thresholds", "abc"],
        ["--thresholds", "'abc'", "3.5,3.2"],
    ),
    "report --out FILE": ("autoloco", ["report", "{tmp}", "--out", "{file}"], ["--out", "{file}", "existing file"]),
    "eval --out FILE": ("autoloco", ["eval", "{tmp}", "--out", "{file}"], ["--out", "{file}", "existing file"]),
    "eval --compare MISSING": (
        "autoloco",
        ["eval", "--compare", "{tmp}/missing.json"],
        ["--compare", "missing.json", "no such file"],
    ),
    "eval --limit -3": (
        "autoloco",
        ["eval", "{tmp}", "--limit", "-3"],
        ["--limit", "'-3'", ">= 1"],
    ),  # was: drop the last 3
    "eval MISSING_MODEL": (
        "autoloco",
        ["eval", "{tmp}/no-model", "--tasks", "nll", "--fixtures"],
        ["MODEL_DIR", "no-model", "save_pretrained"],
    ),
    "c4 --config MISSING": (
        "pretrain_c4",
        ["--config", "{tmp}/missing.yaml"],
        ["--config", "missing.yaml", "no such file"],
    ),
    "c4 --autoloco h_bse=5": (
        "pretrain_c4",
        ["--autoloco", "h_bse=5"],
        ["--autoloco", "h_bse=5", "did you mean h_base"],
    ),
    "c4 --method foo": ("pretrain_c4", ["--method", "foo"], ["--method", "'foo'", "'diloco'"]),
    "c4 --ablation fulll": ("pretrain_c4", ["--ablation", "fulll"], ["--ablation", "'fulll'", "'full'"]),
    "c4 --bf16 ture": ("pretrain_c4", ["--bf16", "ture"], ["--bf16", "ture", "true/false"]),  # was: False
    "c4 unknown flag": ("pretrain_c4", ["--batch-siz", "3"], ["--batch-siz", "did you mean batch_size"]),
    "c4 bad engine field": ("pretrain_c4", ["--autoloco", "q_h=3"], ["q_h=3", "it must divide h_base=500"]),
    "c4 unknown YAML key": (
        "pretrain_c4",
        ["--config", "{yaml}"],
        ["--config", "'batch_siz'", "did you mean batch_size"],
    ),
    "sft --config MISSING": (
        "sft_ultrachat",
        ["--config", "{tmp}/missing.yaml"],
        ["--config", "missing.yaml", "no such file"],
    ),
    "sft --method foo": ("sft_ultrachat", ["--method", "foo"], ["--method", "'foo'", "'autoloco'"]),
    "sft --bf16 ture": ("sft_ultrachat", ["--bf16", "ture"], ["--bf16", "ture", "true/false"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_line_exit_2(case, tmp_path, capsys):
    entry, argv, expected = CASES[case]
    existing = tmp_path / "existing.txt"
    existing.write_text("not a folder")
    bad_yaml = tmp_path / "typo.yaml"
    bad_yaml.write_text("batch_siz: 3\n")

    def fill(text: str) -> str:
        return text.format(tmp=tmp_path, file=existing, yaml=bad_yaml)

    with pytest.raises(SystemExit) as exc:
        if entry == "autoloco":
            main([fill(a) for a in argv])
        else:
            recipe(entry).parse_args([fill(a) for a in argv])
    assert exc.value.code == 2, case
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for text in expected:
        assert fill(text) in lines[0], (case, lines[0])


def test_console_script_has_no_traceback(tmp_path):
    """The installed entry point, in a fresh process: one line on stderr, exit code 2."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from autoloco_hf.cli import main; sys.exit(main())",
            "demo",
            "--threads",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        (
            "autoloco demo: error: argument --threads: invalid value '0': "
            "pass a whole number >= 1 (see autoloco demo --help)"
        )
    ]
