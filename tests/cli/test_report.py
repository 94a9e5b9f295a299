"""Run folders read back, the paper's two tables, and `autoloco report` on synthetic runs."""

from __future__ import annotations

import json
import math

import pytest

from autoloco_hf.cli import main
from autoloco_hf.cli.report import (
    PLOTS,
    RunWriter,
    _zoom_on_tail,
    default_thresholds,
    find_runs,
    horizon_series,
    last_fraction_mean,
    moving_average,
    reach,
    table1,
    table2,
)
from autoloco_hf.sync.records import RunTotals


def interval(start: int, h: int, mu: float = 0.9) -> dict:
    return dict(start_step=start, h_step=h, mu=mu, eta=0.7, drift_energy=1.0 / (start + 1), coherence=2.0)


def fake_run(root, name: str, method: str, syncs_every: int, final_loss: float, steps: int = 100) -> None:
    """A run folder whose loss falls linearly from 5 to ``final_loss`` and that syncs every ``syncs_every`` steps."""
    writer = RunWriter(str(root / name), name)
    totals = RunTotals()
    with open(writer.intervals_path, "w") as f:
        for start in range(0, steps, syncs_every):
            f.write(json.dumps(interval(start, syncs_every)) + "\n")
    for step in range(1, steps + 1):
        if step % syncs_every == 0:
            totals.syncs += 1
            totals.payload_bytes += 2**20
        totals.steps = step
        loss = 5.0 + (final_loss - 5.0) * step / steps
        writer.log_step(step, loss, 1e-3, totals, seconds=step * 0.1)
    writer.finish(totals, {"method": method}, wall_seconds=10.0, val_loss=final_loss + 0.1)


def test_helpers():
    assert last_fraction_mean([1.0] * 98 + [3.0, 5.0]) == 4.0  # last 2 of 100
    assert last_fraction_mean([2.0]) == 2.0 and math.isnan(last_fraction_mean([]))
    assert moving_average([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]


def test_tables_and_report(tmp_path, capsys):
    fake_run(tmp_path / "a", "diloco", "diloco", 10, 3.0)
    fake_run(tmp_path / "a", "autoloco", "autoloco", 20, 2.9)
    runs = find_runs([str(tmp_path / "a")])
    assert [r.name for r in runs] == ["autoloco", "diloco"]
    text = table1(runs)
    assert "| autoloco | autoloco | 5 | 5.0 | -50.0% |" in text and "| diloco | diloco | 10 | 10.0 | +0.0% |" in text
    assert text.splitlines()[0].startswith("| run | method | syncs |")  # was: run names under "method"
    assert text.splitlines()[0].endswith("| wall (s) | CPU (s) |")
    assert default_thresholds(runs) == [3.01, 2.92]  # each run's final smoothed loss
    hit = reach(runs[0], 4.0)
    assert hit is not None and 40 <= hit["step"] <= 60 and hit["payload_bytes"] <= 3 * 2**20

    out = tmp_path / "cmp"
    assert (
        main(
            [
                "report",
                str(tmp_path / "a" / "diloco"),
                str(tmp_path / "a" / "autoloco"),
                "--out",
                str(out),
                "--thresholds",
                "4,3.5",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "loss <= 3.5" in printed and "Table 1" in printed
    report = (out / "report.md").read_text()
    assert "autoloco report" in report
    for name in PLOTS:
        assert (out / name).stat().st_size > 1000
    assert main(["report", str(tmp_path / "a")]) == 0  # a folder of runs; the report goes inside it
    assert (tmp_path / "a" / "report" / "report.md").exists()
    assert [r.name for r in find_runs([str(tmp_path / "a")])] == ["autoloco", "diloco"]


def test_budget_truncated_intervals_are_not_a_drop_of_h():
    """DiLoCo's last interval (2 of 10 steps) and AutoLoCo's `truncated` one are drawn apart, not as H falling to 2."""
    diloco = [dict(interval(s, 10), assessment="fixed") for s in range(0, 100, 10)] + [
        dict(interval(100, 2), assessment="fixed")
    ]
    xs, ys, cut = horizon_series(diloco)
    assert (xs[-1], ys[-1], min(ys), cut) == (100, 10, 10, [(100, 2)])
    autoloco = [dict(interval(0, 5), assessment="grow"), dict(interval(5, 3), assessment="truncated")]
    assert horizon_series(autoloco) == ([0, 5], [5, 5], [(5, 3)])
    shrunk = [dict(interval(0, 8), assessment="shrink"), dict(interval(8, 4), assessment="accept")]
    assert horizon_series(shrunk)[2] == []  # a controller's shorter last interval is its decision: drawn as one


def test_loss_plot_says_when_it_clips_the_first_points(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fake_run(tmp_path, "spiky", "diloco", 10, 3.0)
    (run,) = find_runs([str(tmp_path / "spiky")])
    run.steps[0]["loss"] = 40.0  # an early spike far above the tail
    _, ax = plt.subplots()
    note = _zoom_on_tail(ax, [run])
    assert note is not None and "clipped" in note and [t.get_text() for t in ax.texts] == [note]
    assert ax.get_ylim()[1] < 40.0
    plt.close("all")
    fake_run(tmp_path, "flat", "diloco", 10, 4.99)
    (flat,) = find_runs([str(tmp_path / "flat")])
    flat.steps[:] = [dict(s, loss=5.0) for s in flat.steps]
    _, ax = plt.subplots()
    assert _zoom_on_tail(ax, [flat]) is None and not ax.texts
    plt.close("all")


def test_table2_rows_are_runs(tmp_path):
    fake_run(tmp_path, "a", "diloco", 10, 3.0)
    assert table2(find_runs([str(tmp_path / "a")]), [4.0]).splitlines()[0].startswith("| run | loss <= 4")


def test_report_rejects_a_folder_without_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", str(tmp_path)])
    assert exc.value.code == 2 and "no summary.json" in capsys.readouterr().err


def test_a_committed_benchmark_run_with_a_thinned_gzipped_step_log_reports(tmp_path):
    """benchmarks/ commit runs with gzipped logs and steps of (step, loss) only: syncs and payload come from the intervals."""
    import gzip
    import json

    from autoloco_hf.cli.report import load_run

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "summary.json").write_text(
        json.dumps({"name": "r", "method": "diloco", "steps": 4, "totals": {"syncs": 2, "payload_bytes": 20}})
    )
    with gzip.open(folder / "steps.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"step": s, "loss": 5.0 - s}) + "\n" for s in range(1, 5))
    with gzip.open(folder / "intervals.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"start_step": a, "h_step": 2, "payload_bytes": 10}) + "\n" for a in (0, 2))
    run = load_run(str(folder))
    assert [(s["syncs"], s["payload_bytes"]) for s in run.steps] == [(0, 0), (1, 10), (1, 10), (2, 20)]
    assert len(run.intervals) == 2 and run.summary["train_loss_last"] == 1.0
