"""benchmarks/campaigns/wan_time_to_loss.py: wall = steps * step
time + syncs * blocked seconds per sync, to a target loss."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import sys

import pytest

SCRIPT = os.path.join(
    os.path.dirname(__file__), "..", "..", "benchmarks", "campaigns", "wan_time_to_loss.py"
)


@pytest.fixture(scope="module")
def ttl():
    spec = importlib.util.spec_from_file_location("wan_time_to_loss", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["wan_time_to_loss"] = module
    spec.loader.exec_module(module)
    return module


def curve(ttl, losses: list[float], every: int):
    """A run that syncs every ``every`` steps (after steps every, 2 every, ...)."""
    return ttl.Curve(losses, [(i + 1) // every for i in range(len(losses))])


def test_the_wall_to_a_target_counts_the_steps_and_the_syncs_made_by_then(ttl):
    run = curve(ttl, [10.0 - 0.1 * i for i in range(60)], every=10)  # step s has loss 10.1 - 0.1 s
    assert run.first_step_at(6.55) == 36  # 10.1 - 3.6 = 6.5 is the first loss at or below 6.55
    assert run.wall_to(6.55, step_s=0.2, blocked_s=0.5) == pytest.approx(36 * 0.2 + 3 * 0.5)
    assert run.wall_to(0.0, step_s=0.2, blocked_s=0.5) is None


def test_a_delayed_sync_hides_its_transfer_behind_the_steps_before_the_merge(ttl):
    megabyte_per_event = 1e6  # 80 ms at 100 Mbit/s
    blocking = ttl.SyncCost("blocking", 1, 0.01, megabyte_per_event, hidden_s=0.0)
    delayed = ttl.SyncCost("delayed", 1, 0.01, megabyte_per_event, hidden_s=0.05)
    fragments = ttl.SyncCost("f4", 4, 0.01, megabyte_per_event / 4, hidden_s=0.05)
    assert blocking.blocked(100e6) == pytest.approx(0.01 + 0.08)
    assert delayed.blocked(100e6) == pytest.approx(0.01 + 0.03)
    assert delayed.blocked(1e9) == pytest.approx(0.01)  # 8 ms hidden behind 50
    assert fragments.blocked(100e6) == pytest.approx(4 * 0.01)  # 20 ms each, hidden


def test_time_to_loss_picks_the_cheapest_wire_and_divides_by_the_blocking_baseline(ttl):
    # fewer syncs, same losses
    default = {0: curve(ttl, [5.0 - 0.01 * i for i in range(200)], every=20)}
    diloco = {0: curve(ttl, [5.0 - 0.01 * i for i in range(200)], every=10)}
    costs = {
        # 80 ms at 100 Mbit/s, 400 ms at 20
        "diloco": ttl.SyncCost("diloco", 1, 0.0, 1e6, hidden_s=0.0),
        "lossy": ttl.SyncCost("lossy", 1, 0.0, 1e5, hidden_s=0.0),  # 8 ms and 40 ms
    }
    [slow, fast] = ttl.time_to_loss(
        default, diloco, costs, "diloco", ["20mbit", "1gbit"], step_s=0.1
    )
    # target: the final loss (5 - 1.99), reached at step 200 by both: 10 and 20 syncs
    assert slow["best"] == "lossy"
    assert slow["default_s"] == pytest.approx(200 * 0.1 + 10 * 0.04)
    assert slow["diloco_baseline_s"] == pytest.approx(200 * 0.1 + 20 * 0.4)
    assert slow["ratio_to_same"] == pytest.approx((20 + 10 * 0.04) / (20 + 20 * 0.04))
    assert slow["floor_s"] == pytest.approx(20.0)
    # the slower the link, the larger the gain
    assert slow["ratio_to_baseline"] < fast["ratio_to_baseline"] < 1.0


def _write_run(folder, losses: list[float], every: int) -> None:
    os.makedirs(folder)
    with gzip.open(os.path.join(folder, "steps.jsonl.gz"), "wt") as f:
        for i, loss in enumerate(losses):
            f.write(json.dumps({"step": i + 1, "loss": loss, "syncs": (i + 1) // every}) + "\n")


def _wan_row(row: str, rate: str, **extra) -> dict:
    base = dict(
        row=row, rate=rate, method="diloco", fragments=0, sync_events=8, syncs=8, steady_share=0.1
    )
    return {**base, "train_seconds": 16.0, "tx_bytes_per_event": 5e5, "step_seconds": 0.2, **extra}


def test_the_command_writes_the_table_and_refuses_a_run_without_the_compute_only_row(
    ttl, tmp_path, capsys
):
    for seed in (0, 1):
        _write_run(
            tmp_path / "iid" / f"seed{seed}" / "default",
            [4.0 - 0.01 * i for i in range(100)],
            every=20,
        )
        _write_run(
            tmp_path / "iid" / f"seed{seed}" / "dil", [4.0 - 0.01 * i for i in range(100)], every=10
        )
    rows = [
        _wan_row("local", "unlimited", method="none", sync_events=0, syncs=0, steady_share=0.0),
        _wan_row("diloco", "unlimited"),
        _wan_row("diloco", "100mbit", steady_share=0.2),
        _wan_row("wire-int4-ef-f1-delayed", "unlimited", steady_share=0.01),
    ]
    wan = tmp_path / "wan.json"
    wan.write_text(json.dumps(rows))
    out = tmp_path / "ttl.json"
    argv = [
        str(wan),
        "--frontier",
        str(tmp_path / "iid"),
        "--default",
        "default",
        "--diloco",
        "dil",
    ]
    assert ttl.main([*argv, "--json", str(out)]) == 0
    table = json.loads(out.read_text())["table"]
    assert [t["rate"] for t in table] == ["20mbit", "100mbit", "1gbit"] and table[0]["seeds"] == [
        0,
        1,
    ]
    assert table[0]["best"] == "wire-int4-ef-f1-delayed" and table[0]["ratio_to_baseline"] < 1.0
    assert "| 20mbit | wire-int4-ef-f1-delayed" in capsys.readouterr().out
    wan.write_text(json.dumps(rows[1:]))
    with pytest.raises(SystemExit) as refused:
        ttl.main(argv)
    assert refused.value.code == 2
    assert "no `local` row at unlimited" in capsys.readouterr().err


def test_the_readme_lines_regenerate_from_the_committed_runs(ttl, capsys):
    """README's time-to-loss lines are what the script
    computes from the committed testbed rows and curves."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    wan = os.path.join(root, "results", "wan_overlap", "h52_allgather_h10.json")
    out = os.path.join(root, "results", "wan_time_to_loss", "h52.json")
    rows = json.load(open(wan))
    local = next(r for r in rows if r["row"] == "local" and r["rate"] == "unlimited")
    costs = ttl.sync_costs(rows, 10, 3, local["step_seconds"])
    frontier = os.path.join(root, "results", "frontier", "iid")
    rates = ["20mbit", "100mbit", "1gbit"]
    default = ttl.seed_curves(frontier, "descent_k0.9_guard_mu0.5_hmax20")
    diloco = ttl.seed_curves(frontier, "diloco_mu0.5_h10")
    table = ttl.time_to_loss(default, diloco, costs, "diloco", rates, local["step_seconds"])
    assert [t["ratio_to_baseline"] for t in table] == pytest.approx(
        [t["ratio_to_baseline"] for t in json.load(open(out))["table"]]
    )  # the committed numbers
    lines = open(os.path.join(root, "README.md")).read().split("\n")
    start, end = ttl.readme_span(lines)
    assert lines[start:end] == ttl.readme_lines(table)
    assert (
        ttl.wire_name("wire-int4-ef-f4-delayed-thread")
        == "int4 + EF, 4 fragments, delayed, on the sync thread"
    )


def test_the_full_run_check_puts_the_models_wall_beside_the_measured_one(ttl, tmp_path, capsys):
    """A run whose steps take the compute-only time and whose
    syncs block what the model says: model == measured."""
    step_s = 0.2
    rows = [_wan_row("local", "unlimited", method="none", sync_events=0, syncs=0, steady_share=0.0)]
    # at unlimited: 8 syncs, 7 steady, each blocking 0.1 s of
    # 16 s -> fixed cost 0.1 s per event (blocking)
    rows.append(_wan_row("diloco", "unlimited", steady_share=0.7 / 16.0))
    losses = [4.0 - 0.01 * i for i in range(80)]
    cost = ttl.sync_costs(rows, 10, 3, step_s)["diloco"].blocked(100e6)
    times, clock = [], 0.0
    for i in range(80):
        clock += step_s + (cost if (i + 1) % 10 == 0 else 0.0)
        times.append(clock)
    intervals = [[times[i], losses[i], 0] for i in range(9, 80, 10)]
    rows.append(_wan_row("diloco", "100mbit", losses=losses, loss_times=times, intervals=intervals))
    rows.append(_wan_row("slower", "unlimited", steady_share=0.7 / 16.0))
    rows.append(
        _wan_row(
            "slower",
            "100mbit",
            losses=[4.5 - 0.01 * i for i in range(80)],
            loss_times=times,
            intervals=intervals,
        )
    )
    run = tmp_path / "run.json"
    run.write_text(json.dumps(rows))
    (checked,) = [c for c in ttl.full_run_check(rows, 10, 3) if c["row"] == "diloco"]
    # the target is the slower row's final smoothed loss (the
    # larger); diloco reaches it at step 30, after 3 syncs
    assert checked["step"] == 30 and checked["syncs"] == 3
    assert checked["model_s"] == pytest.approx(checked["measured_s"]) and checked[
        "measured_s"
    ] == pytest.approx(30 * step_s + 3 * cost)
    # one file, or several (unlimited and limited runs apart)
    assert ttl.main(["--check-run", str(run)]) == 0
    assert "100mbit diloco: target" in capsys.readouterr().out


def test_the_committed_full_run_check_regenerates_from_its_testbed_rows(ttl):
    """docs/benchmarks.md's full-run check: the model's and
    the measured walls come from the committed run."""
    root = os.path.join(os.path.dirname(__file__), "..", "..", "results", "wan_time_to_loss")
    rows = json.load(open(os.path.join(root, "check_run.json")))
    committed = json.load(open(os.path.join(root, "check_run_model.json")))["check"]
    assert ttl.full_run_check(rows, 10, 3) == committed  # JSON keeps a float exactly
    assert {c["row"] for c in committed} == {"diloco", "autoloco-int8-delayed"}
