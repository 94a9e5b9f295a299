"""Run folders read back, the paper's two tables, and `autoloco report` on synthetic runs."""

from __future__ import annotations

import json
import math
import socket

import pytest

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.cli import main
from autoloco_hf.cli.report import (
    default_thresholds,
    interval_tokens_table,
    reach,
    render,
    table1,
    table2,
    workers_table,
)
from autoloco_hf.state.records import RunTotals, read_jsonl
from autoloco_hf.state.run_folder import (
    Run,
    RunWriter,
    find_runs,
    last_fraction_mean,
    load_run,
    moving_average,
)
from autoloco_hf.state.run_plots import PLOTS, _zoom_on_tail, horizon_series
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model


def interval(start: int, h: int, mu: float = 0.9) -> dict:
    return dict(
        start_step=start, h_step=h, mu=mu, eta=0.7, drift_energy=1.0 / (start + 1), coherence=2.0
    )


def fake_run(
    root, name: str, method: str, syncs_every: int, final_loss: float, steps: int = 100
) -> None:
    """A run folder whose loss falls linearly from 5 to
    ``final_loss`` and that syncs every ``syncs_every`` steps."""
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
    assert (
        "| autoloco | autoloco | 5 | 5.0 | -50.0% |" in text
        and "| diloco | diloco | 10 | 10.0 | +0.0% |" in text
    )
    # was: run names under "method"
    assert text.splitlines()[0].startswith("| run | method | syncs |")
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
    """DiLoCo's last interval (2 of 10 steps) and AutoLoCo's
    `truncated` one are drawn apart, not as H falling to 2."""
    diloco = [dict(interval(s, 10), assessment="fixed") for s in range(0, 100, 10)] + [
        dict(interval(100, 2), assessment="fixed")
    ]
    xs, ys, cut = horizon_series(diloco)
    assert (xs[-1], ys[-1], min(ys), cut) == (100, 10, 10, [(100, 2)])
    autoloco = [
        dict(interval(0, 5), assessment="grow"),
        dict(interval(5, 3), assessment="truncated"),
    ]
    assert horizon_series(autoloco) == ([0, 5], [5, 5], [(5, 3)])
    shrunk = [dict(interval(0, 8), assessment="shrink"), dict(interval(8, 4), assessment="accept")]
    # a controller's shorter last interval is its decision: drawn as one
    assert horizon_series(shrunk)[2] == []


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
    assert (
        table2(find_runs([str(tmp_path / "a")]), [4.0])
        .splitlines()[0]
        .startswith("| run | loss <= 4")
    )


def test_report_rejects_a_folder_without_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", str(tmp_path)])
    assert exc.value.code == 2 and "no summary.json" in capsys.readouterr().err


def test_a_committed_benchmark_run_with_a_thinned_gzipped_step_log_reports(tmp_path):
    """benchmarks/ commit runs with gzipped logs and steps of (step,
    loss) only: syncs and payload come from the intervals."""
    import gzip
    import json

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "summary.json").write_text(
        json.dumps(
            {
                "name": "r",
                "method": "diloco",
                "steps": 4,
                "totals": {"syncs": 2, "payload_bytes": 20},
            }
        )
    )
    with gzip.open(folder / "steps.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"step": s, "loss": 5.0 - s}) + "\n" for s in range(1, 5))
    with gzip.open(folder / "intervals.jsonl.gz", "wt") as f:
        f.writelines(
            json.dumps({"start_step": a, "h_step": 2, "payload_bytes": 10}) + "\n" for a in (0, 2)
        )
    run = load_run(str(folder))
    assert [(s["syncs"], s["payload_bytes"]) for s in run.steps] == [
        (0, 0),
        (1, 10),
        (1, 10),
        (2, 20),
    ]
    assert len(run.intervals) == 2 and run.summary["train_loss_last"] == 1.0


def budget_run(root, steps: int = 24) -> None:
    """A real run folder: 4 simulated workers with budget pacing; worker 2 at 0.3 is a straggler,
    worker 3 at 0.01 too slow for one step of an interval (idle after the first, lockstep one)."""
    config = AutoLoCoConfig(
        method="diloco",
        h_base=4,
        pacing="budget",
        worker_speeds=[1, 1, 0.3, 0.01],
        straggler_intervals=2,
    )
    writer = RunWriter(str(root / "budget"), "budget")
    workers = LocalWorkers(
        config,
        make_model(),
        SimulatedCommunicator(4),
        adamw,
        total_steps=steps,
        scheduler_factory=cosine(steps, 0),
        records_path=writer.intervals_path,
    )
    taken = [0] * 4

    def draw(worker: int) -> dict:
        taken[worker] += 1
        return batch_for(worker, taken[worker] - 1)

    for step in range(1, steps + 1):
        workers.train_paced(draw)
        losses = [loss for loss in workers.last_losses if not math.isnan(loss)]
        writer.log_step(
            step, sum(losses) / len(losses), 1e-3, workers.engine.totals, seconds=float(step)
        )
    writer.finish(workers.engine.totals, config.to_dict(), wall_seconds=1.0)


def cells(text: str, first: str) -> list[str]:
    """The cells of the Markdown table row of ``text`` whose first cell is ``first``."""
    (line,) = [line for line in text.splitlines() if line.startswith(f"| {first} |")]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_budget_paced_run_reports_each_workers_tokens_steps_and_speed(tmp_path, capsys):
    """The per-worker table and the tokens per interval are
    the records' own numbers, summed by hand here."""
    budget_run(tmp_path)
    records = read_jsonl(str(tmp_path / "budget" / "intervals.jsonl"))
    host = socket.gethostname()
    labels = [f"worker {i} (rank {i}, host {host})" for i in range(4)]
    assert all(r["worker_labels"] == labels for r in records)
    assert main(["report", str(tmp_path / "budget"), "--out", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "### Workers: tokens, steps and speed" in capsys.readouterr().out
    cluster = sum(sum(r["worker_tokens"]) for r in records)
    for i, label in enumerate(labels):
        tokens = sum(r["worker_tokens"][i] for r in records)
        steps = sum(r["worker_steps"][i] for r in records)
        speed = steps / sum(r["worker_seconds"][i] for r in records)
        stragglers = sum(label in r["stragglers"] for r in records)
        idle = sum(label in r["idle_workers"] for r in records)
        expected = [
            label,
            f"{tokens:,}",
            f"{100 * tokens / cluster:.1f}%",
            f"{steps:,}",
            f"{speed:.3f}",
        ]
        assert cells(report, label) == expected + [str(stragglers), str(idle)]
    # the straggler and the idle worker are there to be counted
    assert (
        sum(labels[2] in r["stragglers"] for r in records) >= 4
        and sum(labels[3] in r["idle_workers"] for r in records) == 5
    )
    for index, record in enumerate(records):
        start, h = record["start_step"], record["h_step"]
        row = cells(report, str(index))
        assert row == [
            str(index),
            f"{start + 1}-{start + h}",
            *(f"{t:,}" for t in record["worker_tokens"]),
            f"{record['tokens']:,}",
        ]
    # the terminal keeps a long run short: the first and last intervals, the others in report.md
    (run,) = find_runs([str(tmp_path / "budget")])
    short = interval_tokens_table(run, limit=4)
    assert [line.split("|")[1].strip() for line in short.splitlines()[2:]] == [
        "0",
        "1",
        "... 2 intervals more in report.md",
        "4",
        "5",
    ]


def test_a_lockstep_run_has_no_workers_section(tmp_path):
    fake_run(tmp_path, "lockstep", "diloco", 10, 3.0)
    runs = find_runs([str(tmp_path / "lockstep")])
    assert "Workers" not in render(runs, [4.0]) and render(runs, [4.0], 4) == render(runs, [4.0])


def test_records_from_before_the_labels_name_their_workers_by_index():
    """Older budget-paced records: no worker_labels, stragglers
    named ``worker i``; older still: no per-worker counts."""
    old = dict(
        interval(0, 4), worker_steps=[5, 3], worker_tokens=[50, 30], worker_seconds=[5.0, 6.0]
    )
    records = [
        dict(old, stragglers=[], idle_workers=[]),
        dict(old, stragglers=["worker 1"], idle_workers=[]),
        interval(8, 4),
    ]
    table = workers_table(Run("old", {}, records, []))
    assert cells(table, "worker 0") == ["worker 0", "100", "62.5%", "10", "1.000", "0", "0"]
    assert cells(table, "worker 1") == ["worker 1", "60", "37.5%", "6", "0.500", "1", "0"]
