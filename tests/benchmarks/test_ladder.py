"""benchmarks/campaigns/ladder.py: the size ladder's report, regenerated from the committed runs,
and a rung read end to end."""

from __future__ import annotations

import gzip
import importlib
import json
import shutil
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "results" / "frontier"


def load(name: str):
    return importlib.import_module(f"campaigns.{name}")


def test_the_committed_ladder_report_regenerates_from_the_committed_runs(tmp_path, monkeypatch):
    """Every number of results/ladder.md comes from the run
    folders: the 197k rung and results/ladder."""
    ladder = load("ladder")
    monkeypatch.chdir(ROOT)
    regenerated = ladder.write_report(
        ladder.parse_args(["--report", str(tmp_path / "ladder.md")])
    ).read_text()
    assert regenerated == (ROOT / ladder.REPORT).read_text()
    assert "| 197k (`results/frontier`) |" in regenerated


def copy_run(source: Path, target: Path) -> None:
    shutil.copytree(source, target)
    summary = json.loads((target / "summary.json").read_text())
    (target / "summary.json").write_text(json.dumps({**summary, "variant": target.name}))


def test_a_rung_is_read_from_its_folder_and_says_what_is_missing(tmp_path, monkeypatch):
    """A CPU rung made of the 197k runs of two seeds, renamed as the ladder
    names them: its comparators are the default minus the tuned DiLoCo, and
    the runs the plan has that are not there are listed by seed."""
    ladder = load("ladder")
    monkeypatch.chdir(ROOT)
    rung = tmp_path / "ladder" / "h128_l4" / "iid"
    for seed in (0, 1):
        for name in ladder.CPU_PLAN:
            source = (
                BASE
                / "iid"
                / f"seed{seed}"
                / (ladder.BASE_DEFAULT if name == ladder.DEFAULT else name)
            )
            if source.exists():
                copy_run(source, rung / f"seed{seed}" / name)
    (tmp_path / "ladder" / "h192_l4").mkdir()  # started, nothing finished
    report = tmp_path / "ladder.md"
    ladder.main(
        [
            "--out",
            str(tmp_path / "ladder"),
            "--base",
            str(tmp_path / "none"),
            "--report",
            str(report),
        ]
    )
    text = report.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 1.18M"))
    vals = {
        name: [
            json.loads((rung / f"seed{s}" / name / "summary.json").read_text())["val_loss"]
            for s in (0, 1)
        ]
        for name in ("default", "diloco_mu0.5_h10", "diloco_lr1_mu0.5_h10")
    }
    tuned = min(
        ("diloco_mu0.5_h10", "diloco_lr1_mu0.5_h10"), key=lambda n: statistics.fmean(vals[n])
    )
    a = statistics.fmean(d - t for d, t in zip(vals["default"], vals[tuned]))
    assert f"| {a:+.3f} ± " in row and f"({tuned}; seeds 0-1)" in row
    assert "| 0-1 | none |" in row  # the default's seeds; no seed has every planned run
    assert "at most" in row  # (c): 1x only, already below the tuned DiLoCo
    assert "| 197k (" in text and "not measured (not run)" in text  # the 197k folder given is empty
    assert "| 2.56M (" in text
    missing = next(line for line in text.splitlines() if line.startswith("* 1.18M"))
    assert "seed 0: 2 of 16 runs not finished: default_hb20, default_hb40" in missing
    assert "seed 2: not started (16 runs)" in missing
    assert "* 114.05M" in text and "seed 0: not started (40 runs)" in text  # the GPU rung not run


@pytest.mark.parametrize(
    ("count", "text"), [(196_928, "197k"), (1_179_776, "1.18M"), (14_550_000, "14.55M")]
)
def test_parameter_counts_read_as_a_reader_writes_them(count, text):
    assert load("ladder").parameters_text(count) == text


def test_every_number_of_the_readmes_results_table_comes_from_the_committed_runs(monkeypatch):
    """The results table of the README and of docs/results.md is
    `python benchmarks/campaigns/ladder.py --readme` over the committed runs, row for row."""
    ladder = load("ladder")
    monkeypatch.chdir(ROOT)
    expected = ladder.readme_table(
        Path(ladder.parse_args([]).out), Path(ladder.parse_args([]).base)
    )
    assert "| A (IID) | 197k | the default |" in expected
    for doc in ladder.TABLE_DOCS:
        lines = (ROOT / doc).read_text().splitlines()
        start, end = ladder.table_span(lines)
        assert "\n".join(lines[start:end]) == expected, (
            f"{doc}: rerun python benchmarks/campaigns/ladder.py --readme"
        )


def study(ladder, table: dict[str, dict[str, tuple[float, float, float]]]):
    """{rule: {rung: (mean (b), s.e., syncs)}} -> the study's cells."""
    return [
        ladder.StudyCell(rung, rule, [0, 1], b, se, syncs)
        for rule, by_rung in table.items()
        for rung, (b, se, syncs) in by_rung.items()
    ]


def test_the_rule_study_applies_its_written_criterion():
    """Eligible: (b) <= 0 on every rung; the lowest (b) on the
    largest rung wins, a tie there goes to fewer syncs."""
    ladder = load("ladder")
    order = ["197k", "1.18M", "2.56M"]
    both = {"197k": (-0.03, 0.01, 95.0), "1.18M": (-0.02, 0.01, 92.0)}
    rows = {
        # above the frontier on the largest rung: not eligible
        "default": {**both, "2.56M": (0.05, 0.01, 90.0)},
        "cand_hmin5": {**both, "2.56M": (-0.010, 0.004, 120.0)},
        "cand_hmin5_k1.8": {**both, "2.56M": (-0.020, 0.004, 130.0)},  # the lowest (b) at 2.56M
        # above at 197k
        "cand_from_hbase": {**both, "197k": (0.01, 0.01, 140.0), "2.56M": (-0.09, 0.01, 150.0)},
    }
    verdict = ladder.study_verdict(study(ladder, rows), "default", order)
    assert (
        "Eligible: cand_hmin5, cand_hmin5_k1.8." in verdict
        and "Chosen: cand_hmin5_k1.8 (the lowest" in verdict
    )
    rows["cand_hmin5"]["197k"] = (-0.03, 0.01, 80.0)  # fewer syncs at 197k ...
    # ... and within one s.e. of the lowest at 2.56M
    rows["cand_hmin5"]["2.56M"] = (-0.017, 0.004, 120.0)
    assert "Chosen: cand_hmin5 (within 0.004" in ladder.study_verdict(
        study(ladder, rows), "default", order
    )
    del rows["cand_hmin5"]["2.56M"]
    assert ladder.study_verdict(study(ladder, rows), "default", order).startswith(
        "Not decided: cand_hmin5 "
    )
    rows["cand_hmin5"]["2.56M"] = rows["cand_hmin5_k1.8"]["2.56M"] = (0.01, 0.01, 100.0)
    rows["cand_from_hbase"]["197k"] = (0.001, 0.01, 100.0)
    assert ladder.study_verdict(study(ladder, rows), "default", order).startswith(
        "No rule is eligible"
    )


def test_the_diagnostic_compares_a_rule_with_the_fixed_curve_at_its_own_outer_settings():
    """Interpolated in log(syncs) on the fixed DiLoCo at the
    rule's outer LR and momentum, other LRs ignored."""
    import math

    ladder = load("ladder")
    frontier = load("frontier")

    def run(syncs: float, val: float, lr: float) -> object:
        return frontier.Result(syncs, val, 0.0, 0.0, [], 0.5, {"outer_lr": lr})

    cells = {
        "default": {0: run(150, 3.6, 0.7), 1: run(300, 3.0, 0.7)},
        "diloco_mu0.5_h10": {0: run(100, 4.0, 0.7), 1: run(100, 4.0, 0.7)},
        "diloco_mu0.5_h5": {0: run(200, 3.0, 0.7), 1: run(200, 3.0, 0.7)},
        # another outer LR: not the default's curve
        "diloco_lr0.35_mu0.5_h5": {0: run(200, 1.0, 0.35)},
        "diloco_lr0.35_mu0.5_h10": {0: run(100, 2.0, 0.35)},
        "diag_lr0.35": {0: run(100, 2.5, 0.35)},
    }
    expected = 3.6 - (4.0 - 1.0 * math.log(1.5) / math.log(2))
    assert ladder.same_settings_excess(cells, "default", 0) == pytest.approx(expected)
    # its own LR's curve
    assert ladder.same_settings_excess(cells, "diag_lr0.35", 0) == pytest.approx(0.5)
    # beyond the curve: not extrapolated
    assert math.isnan(ladder.same_settings_excess(cells, "default", 1))


def test_the_horizon_rows_name_the_intervals_after_which_the_drift_guard_fired(tmp_path):
    """A severe assessment of the descent rule is its guard halving the horizon: its intervals are
    listed (1-based), and a run it never trips says 'never'."""
    ladder = load("ladder")
    rung = ladder.Rung(tmp_path, 128, 4, 4, "CPU")
    for seed, trail in {
        0: [(20, "consistent"), (20, "severe"), (10, "consistent"), (10, "consistent")],
        1: [(20, "consistent"), (15, "consistent"), (10, "consistent"), (10, "consistent")],
    }.items():
        folder = tmp_path / "iid" / f"seed{seed}" / rung.default
        folder.mkdir(parents=True)
        with gzip.open(folder / "intervals.jsonl.gz", "wt") as f:
            f.writelines(
                json.dumps({"h_step": h, "assessment": a, "coherence": 4.0 - k / 3}) + "\n"
                for k, (h, a) in enumerate(trail)
            )
    rows = ladder.horizon_rows(rung, "1.18M")
    assert [r[-1] for r in rows] == ["4.00 3.67 3.33"] * 2  # the first three intervals' coherence
    assert [(r[1], r[2], r[4], r[-2]) for r in rows] == [
        ("0", "20 20 10 10", "3", "2"),
        ("1", "20 15 10 10", "3", "never"),
    ]


def run(syncs: float, val: float, h: int, lr: float = 0.7) -> object:
    """A finished run as the comparators read it: syncs, validation loss, ``h_base``, outer LR."""
    return load("frontier").Result(syncs, val, 0.0, 0.0, [], 0.5, {"outer_lr": lr, "h_base": h})


def test_the_held_out_row_uses_only_seeds_outside_the_tuning_seeds():
    """The default's held-out seeds are compared alone, against the DiLoCo chosen on the tuning
    seeds: a held-out seed where another setting would have won does not change the choice."""
    ladder = load("ladder")

    tuning = (0, 1, 2)
    cells = {
        # chosen at H 10 and H 20 on the tuning seeds (LR 0.7 beats LR 1.0 there)
        "diloco_mu0.5_h10": {s: run(100, 4.0, 10) for s in tuning} | {3: run(100, 4.2, 10)},
        "diloco_lr1_mu0.5_h10": {s: run(100, 4.1, 10, 1.0) for s in tuning},
        "diloco_mu0.5_h20": {s: run(50, 4.4, 20) for s in tuning} | {3: run(50, 4.6, 20)},
        "diloco_lr1_mu0.5_h20": {s: run(50, 4.5, 20, 1.0) for s in tuning},
        "default": {s: run(100, 3.0, 10) for s in tuning} | {3: run(100, 4.3, 10)},
    }
    row = ladder.held_out_row("1.18M", cells, "default")
    assert row[:3] == ["1.18M", "3", "100.0"]
    assert row[3] == "+0.100 (seeds 3)" and row[4] == "+0.100 (seeds 3)"  # 4.3 - 4.2, not - 4.0
    # no held-out seed: no row
    cells["default"] = {s: run(100, 3.0, 10) for s in tuning}
    assert ladder.held_out_row("1.18M", cells, "default") == []


def test_the_targets_table_says_met_only_where_the_runs_meet_it():
    """Each target's verdict follows the committed runs: enough seeds, the default at or below
    the tuned frontier, two held-out seeds within one standard error; a GPU rung that has not run
    is not measured."""
    ladder = load("ladder")
    frontier = load("frontier")

    def cells(default_val: float, seeds=(0, 1, 2, 3, 4)) -> dict:
        noise = {s: 0.001 * s for s in seeds}  # a standard error that is not 0
        return {
            "diloco_mu0.5_h10": {s: run(100, 4.0, 10) for s in seeds},
            "diloco_lr1_mu0.5_h10": {s: run(100, 4.1, 10, 1.0) for s in seeds},
            "diloco_mu0.5_h20": {s: run(50, 4.4, 20) for s in seeds},
            "diloco_lr1_mu0.5_h20": {s: run(50, 4.5, 20, 1.0) for s in seeds},
            "default": {s: run(100, default_val + noise[s], 10) for s in seeds},
            frontier.REFERENCE: {s: run(75, 4.5, 10) for s in seeds},
        }

    def rung(label: str, parameters: int, default_val: float, seeds=(0, 1, 2, 3, 4)):
        return ladder.Measured(label, parameters, cells(default_val, seeds), "default")

    gpu = ladder.Measured("14.55M", 14_550_000, {}, "default")
    good = [
        rung("197k", 200_000, 3.9),
        rung("1.18M", 1_200_000, 3.9),
        rung("2.56M", 2_600_000, 3.9),
    ]
    rows = ladder.target_rows(good, rung("B at 1.18M", 1_200_000, 3.9), gpu)
    verdicts = [r[-1] for r in rows]
    # the sync target needs the default's curve over h_base: not run here, so not met
    assert verdicts == ["met", "met", "met", "met", "**missed**", "not measured"]
    assert "span 13.0x" in rows[0][1] and "2.56M -0.098 ± 0.001" in rows[2][1]

    # the largest rung above the frontier; B on two seeds; the smaller rungs spanning 6x
    above = [*good[:2], rung("2.56M", 2_600_000, 4.05)]
    rows = ladder.target_rows(above, rung("B at 1.18M", 1_200_000, 3.9, (0, 1)), gpu)
    assert [r[-1] for r in rows][:4] == ["met", "**missed**", "**missed**", "**missed**"]
    assert "2.56M +0.052" in rows[2][1] and "2.56M: +0.053 on seeds 3-4" in rows[3][1]
    short = ladder.target_rows(good[:2], rung("B at 1.18M", 1_200_000, 3.9), gpu)
    assert short[0][-1] == "**missed**" and "span 6.0x" in short[0][1]

    # B's larger rung needs its own held-out seeds, however good the A rungs are
    rows = ladder.target_rows(good, rung("B at 1.18M", 1_200_000, 3.9, (0, 1, 2)), gpu)
    assert rows[3][-1] == "**missed**" and "B at 1.18M: none" in rows[3][1]

    # one held-out seed is not enough, however low it is
    one = [rung(m.label, m.parameters, 3.9, (0, 1, 2, 3)) for m in good]
    rows = ladder.target_rows(one, rung("B at 1.18M", 1_200_000, 3.9), gpu)
    assert rows[3][-1] == "**missed**" and "fewer than 2 seeds" in rows[3][1]


def test_the_start_signal_reads_the_calibration_and_the_seeds_own_a(tmp_path):
    """The calibration's coherence is the geometric mean of the first two intervals, its correlation
    ``(C - 1) / (N - 1)``, and (a) the default minus the tuned DiLoCo at ``h_base`` on that seed."""
    ladder = load("ladder")
    rung = ladder.Rung(tmp_path, 128, 4, 4, "CPU")

    def write(name: str, seed: int, val: float, syncs: int, h_base: int, coherence=(2.0, 8.0)):
        folder = tmp_path / "iid" / f"seed{seed}" / name
        folder.mkdir(parents=True)
        summary = {
            "totals": {"syncs": syncs},
            "val_loss": val,
            "workers": 5,
            "config": {"outer_momentum": 0.5, "outer_lr": 0.7, "h_base": h_base},
        }
        (folder / "summary.json").write_text(json.dumps(summary))
        with gzip.open(folder / "steps.jsonl.gz", "wt") as f:
            f.write(json.dumps({"loss": val}) + "\n")
        with gzip.open(folder / "intervals.jsonl.gz", "wt") as f:
            f.writelines(
                json.dumps({"h_step": h_base, "assessment": "consistent", "coherence": c}) + "\n"
                for c in (*coherence, 1.0)
            )

    for seed, val in ((0, 3.9), (1, 4.1)):
        write("diloco_mu0.5_h10", seed, 4.0, 100, 10)
        write("diloco_mu0.5_h20", seed, 4.2, 50, 20)
        # the tuned grid's second outer LR, worse at both horizons
        write("diloco_lr1_mu0.5_h10", seed, 4.5, 100, 10)
        write("diloco_lr1_mu0.5_h20", seed, 4.5, 50, 20)
        write(rung.default, seed, val, 95, 10)
    found = ladder.start_signals(rung, "1.18M")
    assert [(s.regime, s.seed) for s in found] == [("iid", 0), ("iid", 1)]
    assert found[0].coherence == pytest.approx(4.0)  # sqrt(2 * 8), not the third interval's 1.0
    assert found[0].correlation == pytest.approx(0.75)  # (4 - 1) / (5 - 1)
    assert [s.a for s in found] == pytest.approx([-0.1, 0.1])


def test_the_start_signal_verdict_finds_a_threshold_only_where_one_separates():
    ladder = load("ladder")

    def signal(correlation: float, a: float) -> object:
        return ladder.StartSignal("1.18M", "iid", 0, 1.0, correlation, a)

    apart = [signal(0.5, -0.02), signal(0.45, -0.01), signal(0.3, 0.03), signal(0.35, 0.01)]
    assert ladder.start_signal_verdict(apart).startswith("A threshold between 0.350 and 0.450")
    overlap = [*apart, signal(0.28, -0.07)]  # a start that paid below one that cost
    verdict = ladder.start_signal_verdict(overlap)
    assert verdict.startswith("No threshold separates them")
    assert "as low as 0.280" in verdict and "as high as 0.350" in verdict
    assert ladder.start_signal_verdict(apart[:2]).startswith("Not decided")


def test_the_doubling_cost_pairs_the_tuned_diloco_at_two_horizons_per_seed():
    """The cost of doubling ``h_base`` is the tuned DiLoCo at 2 ``h_base`` minus the one at
    ``h_base`` (the better outer LR at each H), paired per seed; None without 2 ``h_base``."""
    ladder = load("ladder")

    seeds = (0, 1, 2)
    cells = {
        "diloco_mu0.5_h10": {s: run(100, 4.0 + 0.01 * s, 10) for s in seeds},
        "diloco_lr1_mu0.5_h10": {s: run(100, 4.5, 10, 1.0) for s in seeds},
        # at H 20 LR 1.0 wins: the cost is read against it, not against LR 0.7's
        "diloco_mu0.5_h20": {s: run(50, 4.9, 20) for s in seeds},
        "diloco_lr1_mu0.5_h20": {s: run(50, 4.1 + 0.03 * s, 20, 1.0) for s in seeds},
        "default": {s: run(95, 3.95, 10) for s in seeds},
    }
    found = ladder.doubling("A (IID)", "1.18M", cells, "default")
    assert found.cost == pytest.approx([0.1, 0.12, 0.14]) and found.cost_seeds == [0, 1, 2]
    assert found.a == pytest.approx([-0.05, -0.06, -0.07])
    del cells["diloco_mu0.5_h20"], cells["diloco_lr1_mu0.5_h20"]
    assert ladder.doubling("A (IID)", "1.18M", cells, "default") is None


def test_the_doubling_verdict_is_a_rank_correlation():
    ladder = load("ladder")
    assert ladder.ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]

    def row(cost: float, a: float) -> object:
        return ladder.Doubling("A (IID)", "1.18M", [cost], [0], [a], [0])

    rising = [row(0.01, -0.05), row(0.1, 0.0), row(0.2, 0.04)]
    assert "correlation of the doubling cost with the default's (a): +1.00 over 3" in (
        ladder.doubling_verdict(rising)
    )
    falling = [row(0.01, 0.04), row(0.1, 0.0), row(0.2, -0.05)]
    assert "-1.00" in ladder.doubling_verdict(falling)
    assert ladder.doubling_verdict(rising[:2]).startswith("Not decided")
