"""Every place a user types: a bad value is one line naming
the flag, the value and the fix, exit code 2, no traceback."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import pytest

from autoloco_hf.cli import main
from autoloco_hf.state.records import RunTotals
from autoloco_hf.state.run_folder import RunWriter

RECIPES = os.path.join(os.path.dirname(__file__), "..", "..", "recipes")


def recipe(name: str):
    from recipe_helpers import load_recipe

    return load_recipe(name)


# case -> (entry point, argv, texts the one line must contain: the flag, the value, the fix)
CASES = {
    "demo --h-base -5": ("autoloco", ["demo", "--h-base", "-5"], ["--h-base", "'-5'", ">= 1"]),
    # was: the default
    "demo --h-base 0": ("autoloco", ["demo", "--h-base", "0"], ["--h-base", "'0'", ">= 1"]),
    "demo --threads 0": ("autoloco", ["demo", "--threads", "0"], ["--threads", "'0'", ">= 1"]),
    "report --thresholds abc": (
        "autoloco",
        ["report", "{tmp}", "--thresholds", "abc"],
        ["--thresholds", "'abc'", "3.5,3.2"],
    ),
    "report --out FILE": (
        "autoloco",
        ["report", "{tmp}", "--out", "{file}"],
        ["--out", "{file}", "existing file"],
    ),
    "report --out inside a FILE": (
        "autoloco",
        ["report", "{run}", "--out", "{file}/report"],
        ["--out", "{file}/report", "existing file"],
    ),  # was: NotADirectoryError traceback
    "report MISSING": (
        "autoloco",
        ["report", "{tmp}/missing"],
        ["RUN_DIR", "missing", "does not exist"],
    ),
    "report a file": ("autoloco", ["report", "{file}"], ["RUN_DIR", "existing.txt", "is a file"]),
    "report a folder without runs": (
        "autoloco",
        ["report", "{tmp}/a_folder"],
        ["RUN_DIR", "a_folder", "finished run"],
    ),
    "report broken summary": (
        "autoloco",
        ["report", "{tmp}/broken_summary"],
        ["broken_summary/summary.json", "not valid JSON", "interrupted"],
    ),  # was: JSONDecodeError traceback
    "report broken steps": (
        "autoloco",
        ["report", "{tmp}/broken_steps"],
        ["broken_steps/steps.jsonl", "not valid JSON Lines"],
    ),
    "report summary without totals": (
        "autoloco",
        ["report", "{tmp}/no_totals"],
        ["no_totals/summary.json", "'totals'", "AutoLoCoCallback"],
    ),  # was: KeyError traceback
    "report truncated .gz log": (
        "autoloco",
        ["report", "{tmp}/cut_gz"],
        ["cut_gz/steps.jsonl.gz", "not a complete gzip file", "interrupted", "Delete it"],
    ),  # was: EOFError traceback
    "report non-gzip .gz log": (
        "autoloco",
        ["report", "{tmp}/plain_gz"],
        ["plain_gz/steps.jsonl.gz", "not a complete gzip file", "Delete it"],
    ),  # was: BadGzipFile traceback
    "report summary with text syncs": (
        "autoloco",
        ["report", "{tmp}/text_syncs"],
        ["text_syncs/summary.json", "'totals.syncs' is \"7\"", "not a number", "fix or remove it"],
    ),  # was: TypeError traceback
    "report summary with text wall_seconds": (
        "autoloco",
        ["report", "{tmp}/text_wall"],
        ["text_wall/summary.json", "'wall_seconds' is \"1 min\"", "not a number"],
    ),  # was: ValueError traceback
    "report summary with a numeric steps_file": (
        "autoloco",
        ["report", "{tmp}/int_steps_file"],
        ["int_steps_file/summary.json", "'steps_file' is 3", "not a file name"],
    ),  # was: TypeError traceback
    "report --thresholds nan": (
        "autoloco",
        ["report", "{run}", "--thresholds", "nan"],
        ["--thresholds", "'nan'", "3.5,3.2"],
    ),
    "report --thresholds empty": (
        "autoloco",
        ["report", "{run}", "--thresholds", ","],
        ["--thresholds", "','", "3.5,3.2"],
    ),
    "report --bogus": (
        "autoloco",
        ["report", "{run}", "--bogus"],
        ["autoloco report", "--bogus", "autoloco report --help"],
    ),
    "report no RUN_DIR": ("autoloco", ["report"], ["autoloco report", "RUN_DIR"]),
    # autoloco plan
    "plan --bogus": (
        "autoloco",
        ["plan", "--bogus"],
        ["autoloco plan: error", "--bogus", "see autoloco plan --help"],
    ),
    # was: blamed --warmup (1000)
    "plan --steps 0": ("autoloco", ["plan", "--steps", "0"], ["--steps", "'0'", ">= 1"]),
    "plan --steps below the warm-up": (
        "autoloco",
        ["plan", "--steps", "500"],
        ["--steps 500", "warms up for 1000 steps", "--steps above 1000"],
    ),
    "plan --warmup past the budget": (
        "autoloco",
        ["plan", "--warmup", "60000"],
        ["--warmup 60000", "below the c4 recipe's 50000 steps"],
    ),
    "plan --warmup -1": ("autoloco", ["plan", "--warmup", "-1"], ["--warmup", "'-1'", ">= 0"]),
    "plan --method sgd": ("autoloco", ["plan", "--method", "sgd"], ["sgd", "diloco"]),
    # a flag typed where it does nothing, at its default value too (the default rule is descent)
    "plan --method diloco --controller descent": (
        "autoloco",
        ["plan", "--method", "diloco", "--controller", "descent"],
        ["controller='descent'", "only applies with method='autoloco'", "remove it"],
    ),
    "plan --method qsr --h-max 1000": (
        "autoloco",
        ["plan", "--method", "qsr", "--h-max", "1000"],
        ["h_max=1000", "only applies with method='autoloco'", "remove it"],
    ),
    "plan --rule-module with a syntax error": (
        "autoloco",
        ["plan", "--rule-module", "rules_with_syntax_error"],
        ["rule_module='rules_with_syntax_error'", "SyntaxError", "line 1", "fix the module"],
    ),  # was: SyntaxError traceback
    "plan --rule-module raising on import": (
        "autoloco",
        ["plan", "--rule-module", "rules_raising"],
        ["rule_module='rules_raising'", "RuntimeError: no GPU here", "fix the module"],
    ),  # was: RuntimeError traceback
    "plan --rule-module importing a missing package": (
        "autoloco",
        ["plan", "--rule-module", "rules_needing_a_package"],
        ["rule_module='rules_needing_a_package'", "no_such_package", "fix that import"],
    ),
    "plan --rule-module MISSING": (
        "autoloco",
        ["plan", "--rule-module", "no_such_rules"],
        ["rule_module='no_such_rules'", "PYTHONPATH"],
    ),
    "plan --h-base 0": ("autoloco", ["plan", "--h-base", "0"], ["--h-base", "'0'", ">= 1"]),
    "plan --h-max off the grid": (
        "autoloco",
        ["plan", "--h-max", "740"],
        ["--h-max 740", "use 700 or 750"],
    ),
    "plan --params 0": (
        "autoloco",
        ["plan", "--params", "0"],
        ["--params 0", "positive parameter count"],
    ),
    "plan --ranks-per-worker 0": (
        "autoloco",
        ["plan", "--ranks-per-worker", "0"],
        ["--ranks-per-worker", "'0'", ">= 1"],
    ),
    "plan --recipe wiki": (
        "autoloco",
        ["plan", "--recipe", "wiki"],
        ["--recipe", "'wiki'", "'c4'"],
    ),
    "plan --wire-dtype fp8": (
        "autoloco",
        ["plan", "--wire-dtype", "fp8"],
        ["--wire-dtype", "'fp8'", "'int8'"],
    ),
    "eval --out FILE": (
        "autoloco",
        ["eval", "{tmp}", "--out", "{file}"],
        ["--out", "{file}", "existing file"],
    ),
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
    "c4 --ablation fulll": (
        "pretrain_c4",
        ["--ablation", "fulll"],
        ["--ablation", "'fulll'", "'full'"],
    ),
    # was: False
    "c4 --bf16 ture": ("pretrain_c4", ["--bf16", "ture"], ["--bf16", "ture", "true/false"]),
    "c4 unknown flag": (
        "pretrain_c4",
        ["--batch-siz", "3"],
        ["--batch-siz", "did you mean batch_size"],
    ),
    "c4 bad engine field": (
        "pretrain_c4",
        ["--autoloco", "q_h=3"],
        ["q_h=3", "it must divide h_base=500"],
    ),
    "c4 a rule under DiLoCo": (  # the default rule, typed: it would never run
        "pretrain_c4",
        ["--method", "diloco", "--autoloco", "controller=descent"],
        ["controller='descent'", "only applies with method='autoloco'", "remove it"],
    ),
    "c4 hierarchical_sync=false on one rank": (  # was: accepted, and did nothing
        "pretrain_c4",
        ["--autoloco", "hierarchical_sync=false"],
        [
            "hierarchical_sync=False",
            "only applies with ranks_per_worker > 1",
            "remove it",
            "here ranks_per_worker=1",
        ],
    ),
    "c4 hierarchical_sync typed on one rank": (  # its default, typed: it would do nothing either
        "pretrain_c4",
        ["--autoloco", "hierarchical_sync=true"],
        ["hierarchical_sync=True", "only applies with ranks_per_worker > 1", "remove it"],
    ),
    "sft a rule under DiLoCo": (
        "sft_ultrachat",
        ["--method", "diloco", "--autoloco_controller", "descent"],
        ["controller='descent'", "only applies with method='autoloco'", "remove it"],
    ),
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
    # the recipes' data files and paths: refused before a model, a dataset or a training step
    "c4 --train-files MISSING": (
        "pretrain_c4",
        ["--train-files", "{tmp}/missing.jsonl", "--val-files", "{docs}"],
        ["--train-files", "missing.jsonl", "no such file"],
    ),
    "c4 empty train file": (
        "pretrain_c4",
        ["--train-files", "{tmp}/empty.jsonl", "--val-files", "{docs}"],
        ["--train-files", "empty.jsonl", "empty"],
    ),
    "c4 plain-text train file": (
        "pretrain_c4",
        ["--train-files", "{tmp}/plain.jsonl", "--val-files", "{docs}"],
        ["--train-files", "plain.jsonl", "line 1", "one JSON object"],
    ),
    "c4 rows without text": (
        "pretrain_c4",
        ["--train-files", "{chats}", "--val-files", "{docs}"],
        ["--train-files", "chats.jsonl", "'text'", "--text-field"],
    ),
    "c4 malformed val line": (
        "pretrain_c4",
        ["--train-files", "{docs}", "--val-files", "{tmp}/malformed.jsonl"],
        ["--val-files", "malformed.jsonl", "line 2", "one JSON object"],
    ),
    "c4 local train, hub validation": (
        "pretrain_c4",
        ["--train-files", "{docs}"],
        ["--train-files", "docs.jsonl", "--val-files", "allenai/c4"],
    ),
    "c4 --steps 0": ("pretrain_c4", ["--steps", "0"], ["--steps 0", ">= 1"]),
    "c4 --warmup-steps past the budget": (
        "pretrain_c4",
        ["--steps", "100", "--warmup-steps", "100"],
        ["--warmup-steps 100", "--steps (100)"],
    ),
    "c4 --model-config MISSING": (
        "pretrain_c4",
        ["--model-config", "{tmp}/missing.json"],
        ["--model-config", "missing.json", "no such file"],
    ),
    "c4 --tokenizer MISSING": (
        "pretrain_c4",
        ["--tokenizer", "{tmp}/no-tokenizer"],
        ["--tokenizer", "no-tokenizer", "hub id"],
    ),
    "c4 --mode bogus": ("pretrain_c4", ["--mode", "bogus"], ["--mode", "'bogus'", "'simulated'"]),
    "sft --model-dtype float17": (
        "sft_ultrachat",
        ["--model-dtype", "float17"],
        ["--model-dtype", "'float17'", "'bfloat16'"],
    ),  # was: accepted
    "sft --train-files MISSING": (
        "sft_ultrachat",
        ["--train-files", "{tmp}/missing.jsonl", "--test-files", "{chats}"],
        ["--train-files", "missing.jsonl", "no such file"],
    ),  # was: FileNotFoundError traceback
    "sft empty train file": (
        "sft_ultrachat",
        ["--train-files", "{tmp}/empty.jsonl", "--test-files", "{chats}"],
        ["--train-files", "empty.jsonl", "empty"],
    ),
    "sft plain-text train file": (
        "sft_ultrachat",
        ["--train-files", "{tmp}/plain.txt", "--test-files", "{chats}"],
        ["--train-files", "plain.txt", "'messages'"],
    ),
    "sft rows without messages": (
        "sft_ultrachat",
        ["--train-files", "{docs}", "--test-files", "{chats}"],
        ["--train-files", "docs.jsonl", "'messages'", "'text'"],
    ),
    "sft malformed test line": (
        "sft_ultrachat",
        ["--train-files", "{chats}", "--test-files", "{tmp}/malformed.jsonl"],
        ["--test-files", "malformed.jsonl", "line 2"],
    ),
    "sft local train, hub test": (
        "sft_ultrachat",
        ["--train-files", "{chats}"],
        ["--train-files", "chats.jsonl", "--test-files", "HuggingFaceH4/ultrachat_200k"],
    ),  # was: found after the whole epoch
    "sft --model-name-or-path MISSING": (
        "sft_ultrachat",
        ["--model-name-or-path", "{tmp}/no-model"],
        ["--model-name-or-path", "no-model", "no such file or folder"],
    ),
    "sft --chat-template MISSING": (
        "sft_ultrachat",
        ["--chat-template", "{tmp}/missing.jinja"],
        ["--chat-template", "missing.jinja", "no such file"],
    ),
    "sft --global-batch-size 0": (
        "sft_ultrachat",
        ["--global-batch-size", "0"],
        ["--global-batch-size 0", ">= 1"],
    ),
    "sft --test-files FOLDER": (
        "sft_ultrachat",
        ["--train-files", "{chats}", "--test-files", "{tmp}"],
        ["--test-files", "not a file"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_line_exit_2(case, tmp_path, capsys, monkeypatch):
    entry, argv, expected = CASES[case]
    existing = tmp_path / "existing.txt"
    existing.write_text("not a folder")
    bad_yaml = tmp_path / "typo.yaml"
    bad_yaml.write_text("batch_siz: 3\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "plain.jsonl").write_text("a plain text document\n")
    (tmp_path / "plain.txt").write_text("a plain text document\n")
    (tmp_path / "malformed.jsonl").write_text('{"text": "fine", "messages": []}\n{"text": "cut\n')
    docs, chats = tmp_path / "docs.jsonl", tmp_path / "chats.jsonl"
    docs.write_text('{"text": "a document"}\n')
    chats.write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": '
        '"assistant", "content": "hello"}]}\n'
    )

    run = tmp_path / "run"
    RunWriter(str(run), "run").finish(RunTotals(), {"method": "diloco"}, 1.0)
    (tmp_path / "a_folder").mkdir()
    for name, summary, steps in (
        ("broken_summary", '{"totals": ', None),
        ("broken_steps", '{"totals": {"syncs": 1, "payload_bytes": 2}}', '{"step": 1, "loss": \n'),
        ("no_totals", '{"name": "x"}', None),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(summary)
        if steps:
            (tmp_path / name / "steps.jsonl").write_text(steps)

    intact = '{"totals": {"syncs": 7, "payload_bytes": 2}, "wall_seconds": 1.0}'
    for name, summary in (
        ("text_syncs", '{"totals": {"syncs": "7", "payload_bytes": 2}}'),
        ("text_wall", '{"totals": {"syncs": 7, "payload_bytes": 2}, "wall_seconds": "1 min"}'),
        ("int_steps_file", '{"totals": {"syncs": 7, "payload_bytes": 2}, "steps_file": 3}'),
        ("cut_gz", intact),
        ("plain_gz", intact),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(summary)
    steps = "".join(f'{{"step": {i}, "loss": 3.0}}\n' for i in range(1, 200)).encode()
    # what a kill leaves
    (tmp_path / "cut_gz" / "steps.jsonl.gz").write_bytes(gzip.compress(steps)[:-12])
    (tmp_path / "plain_gz" / "steps.jsonl.gz").write_bytes(steps)  # a plain log under the .gz name
    (tmp_path / "rules_with_syntax_error.py").write_text("def rule(:\n")
    (tmp_path / "rules_raising.py").write_text("raise RuntimeError('no GPU here')\n")
    (tmp_path / "rules_needing_a_package.py").write_text("import no_such_package\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def fill(text: str) -> str:
        return text.format(
            tmp=tmp_path, file=existing, yaml=bad_yaml, docs=docs, chats=chats, run=run
        )

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
