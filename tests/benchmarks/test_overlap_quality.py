"""benchmarks/campaigns/overlap_quality.py: the paired differences
of its report (the training itself is not run in CI)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "campaigns", "overlap_quality.py")


def load_script():
    spec = importlib.util.spec_from_file_location("overlap_quality", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_report_pairs_each_variant_with_blocking_autoloco_of_the_same_seed():
    script = load_script()

    def row(v, s, loss):
        return {
            "variant": v,
            "seed": s,
            "val_loss": loss,
            "syncs": 10,
            "mean_h_step": 4.0,
            "stale": 1 if v == "autoloco_eager" else 0,
            "wall_seconds": 1.0,
        }

    results = [
        row("autoloco", 0, 3.0),
        row("autoloco", 1, 4.0),
        row("autoloco_eager", 0, 3.1),
        row("autoloco_eager", 1, 4.3),
    ]
    args = argparse.Namespace(workers=2, steps=10, h_base=4, q_h=2)
    text = script.report(
        results,
        ["autoloco", "autoloco_eager"],
        "python benchmarks/campaigns/overlap_quality.py",
        args,
    )
    eager = next(line for line in text.splitlines() if line.startswith("| autoloco_eager ("))
    # losses 3.1, 4.3: mean 3.7; paired diffs 0.1, 0.3: mean +0.2, std 0.1414
    assert "3.7000 ± 0.8485" in eager and "+0.2000 ± 0.1414" in eager and eager.endswith("| 1.0 |")
    assert "python benchmarks/campaigns/overlap_quality.py" in text


COMMITTED = os.path.join(REPO, "docs", "results_overlap.md")
RUNS = os.path.join(REPO, "results", "overlap")


def test_the_committed_overlap_table_regenerates_from_the_committed_runs(tmp_path, monkeypatch):
    """docs/results_overlap.md's generated part (above its
    reading) comes from results/overlap/*.json."""
    script = load_script()
    committed = open(COMMITTED).read()
    generated, reading = committed.split("\n## Reading", 1)
    command = next(line for line in committed.splitlines() if line.startswith("Command: "))
    argv = (
        command.removeprefix("Command: `python benchmarks/campaigns/overlap_quality.py ")
        .removesuffix("`")
        .split()
    )
    out = argv.index("--out") + 1
    assert argv[out] == "results/overlap" and len(os.listdir(RUNS)) >= 27
    # the command as committed, run where results/overlap is
    # the committed folder and the report lands in tmp
    (tmp_path / "results").mkdir()
    (tmp_path / "docs").mkdir()
    os.symlink(RUNS, tmp_path / "results" / "overlap")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(script, "run_variant", None)  # nothing may train: every run is committed
    script.main(argv)
    regenerated = (tmp_path / argv[argv.index("--report") + 1]).read_text()
    assert regenerated.rstrip("\n") == generated.rstrip("\n")
    assert "| autoloco_eager |" in generated and reading.strip()
