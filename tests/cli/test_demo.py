"""`autoloco demo` end to end at a tiny scale: every artifact
of the run folder, and tables that match the records."""

from __future__ import annotations

import json
import re

import pytest

from autoloco_hf.cli import main
from autoloco_hf.state.run_plots import PLOTS

pytestmark = pytest.mark.slow


def table_rows(markdown: str) -> dict[str, list[str]]:
    """Rows of the first Markdown table (Table 1), keyed by run."""
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(header) or cells[0] == "run":
            break
        rows[cells[0]] = cells
    return rows


def test_demo_writes_every_artifact(tmp_path, capsys):
    out = tmp_path / "demo"
    # the default run shows each rule beside DiLoCo at that rule's own base momentum
    methods = ["diloco", "diloco_mu07", "autoloco", "diloco_mu05", "autoloco_descent"]
    assert (
        main(["demo", "--steps", "40", "--workers", "2", "--h-base", "4", "--out", str(out)]) == 0
    )
    printed = capsys.readouterr().out

    report = (out / "report.md").read_text()
    assert "autoloco demo --steps 40 --workers 2" in report
    # each rule's own: 1.5 and 2 H_base
    assert "H_max 6 (autoloco), 8 (autoloco_descent);" in report
    for name in PLOTS:
        assert (out / name).stat().st_size > 1000, name
        assert f"]({name})" in report
    rows = table_rows(report)
    assert list(rows) == methods
    for method in methods:
        for artifact in ("intervals.jsonl", "steps.jsonl", "summary.json"):
            assert (out / method / artifact).stat().st_size > 0, (method, artifact)
        intervals = [
            json.loads(line) for line in (out / method / "intervals.jsonl").read_text().splitlines()
        ]
        steps = (out / method / "steps.jsonl").read_text().splitlines()
        summary = json.loads((out / method / "summary.json").read_text())
        assert len(steps) == 40 and sum(r["h_step"] for r in intervals) == 40
        assert int(rows[method][2].replace(",", "")) == len(intervals) == summary["totals"]["syncs"]
        assert summary["val_loss"] > 0 and summary["train_loss_last"] > 0
        assert re.search(rf"\| {method} \| {summary['method']} \| {len(intervals)} \|", printed)
    diloco = json.loads((out / "diloco" / "summary.json").read_text())
    assert diloco["config"]["outer_momentum"] == 0.9 and diloco["config"]["h_base"] == 4
    mu07 = json.loads((out / "diloco_mu07" / "summary.json").read_text())
    assert mu07["config"]["outer_momentum"] == 0.7
    default = json.loads((out / "autoloco_descent" / "summary.json").read_text())["config"]
    # AutoLoCoConfig's own default
    assert default["controller"] == "descent" and default["outer_momentum"] == 0.5
    mu05 = json.loads((out / "diloco_mu05" / "summary.json").read_text())["config"]
    assert mu05["method"] == "diloco" and mu05["outer_momentum"] == default["outer_momentum"]


def test_demo_baselines_and_same_data(tmp_path):
    """DDP, QSR, Linear Interval and the descent rule run too,
    from the same initialization on the same first batches."""
    out = tmp_path / "baselines"
    methods = "ddp,qsr,linear,autoloco_descent"
    assert (
        main(["demo", "--steps", "20", "--workers", "2", "--methods", methods, "--out", str(out)])
        == 0
    )
    descent = json.loads((out / "autoloco_descent" / "summary.json").read_text())
    assert (
        descent["config"]["controller"] == "descent"
        and descent["config"]["h_max"] == 2 * descent["config"]["h_base"]
    )
    ddp = json.loads((out / "ddp" / "summary.json").read_text())
    assert ddp["totals"]["syncs"] == 20  # one gradient all-reduce per step
    firsts = {
        m: json.loads((out / m / "steps.jsonl").read_text().splitlines()[0])["loss"]
        for m in methods.split(",")
    }
    assert len(set(firsts.values())) == 1  # same initialization and the same first batches


def test_demo_rejects_unknown_method(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--methods", "diloco,nope", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "unknown method" in capsys.readouterr().err
