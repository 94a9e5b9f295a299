"""benchmarks/campaigns/frontier.py: the non-IID shards, the report regenerated from the committed
runs, and the GPU campaign's dry run."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "results" / "frontier"
SWITCH = ROOT / "results" / "switch_cost"


# frontier -> campaigns ...
KINDS = {p.stem: p.parent.name for p in (ROOT / "benchmarks").glob("*/*.py")}


def load(name: str):
    """A fresh copy of ``benchmarks/<kind>/<name>.py``, as
    ``<kind>.<name>`` (the name its neighbours import)."""
    spec = importlib.util.spec_from_file_location(
        f"{KINDS[name]}.{name}", ROOT / "benchmarks" / KINDS[name] / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_packages_go_whole_to_one_worker_each_and_the_shards_are_balanced():
    frontier = load("frontier")
    names = [
        "email/a.py",
        "email/mime/b.py",
        "json/c.py",
        "os.py",
        "pydoc:x",
        "pydoc:y",
        "test/t1.py",
        "test/t2.py",
    ]
    docs = [torch.full((n,), i) for i, n in enumerate([30, 30, 40, 10, 5, 5, 100, 20])]
    shards = frontier.shard_by_package(names, docs, 3)
    owner = {}
    for w, shard in enumerate(shards):
        for doc in shard.unique().tolist():
            owner[frontier.package_of(names[doc])] = owner.get(
                frontier.package_of(names[doc]), set()
            ) | {w}
    assert all(len(ws) == 1 for ws in owner.values()), owner  # no package is split between workers
    # largest first to the lightest worker
    assert sorted(s.numel() for s in shards) == [60, 60, 120]
    assert sum(s.numel() for s in shards) == sum(d.numel() for d in docs)


def test_each_worker_reads_only_its_own_shard_and_never_a_window_twice():
    frontier = load("frontier")
    shards = [torch.arange(0, 64), torch.arange(1000, 1128)]
    sampler = frontier.ShardedWindowSampler(shards, seq_len=8, batch_size=2, seed=3)
    assert sampler.capacity_steps() == 4
    seen: list[set[int]] = [set(), set()]
    for _ in range(4):
        for w, batch in enumerate(sampler.next_batches()):
            ids = batch["input_ids"]
            assert bool(((ids >= shards[w].min()) & (ids <= shards[w].max())).all())
            starts = {int(x) for x in ids[:, 0]}
            assert not starts & seen[w]
            seen[w] |= starts


def test_the_document_stream_splits_back_into_its_documents():
    frontier = load("frontier")
    eos = 9
    stream = torch.tensor([1, 2, eos, 3, eos, 4, 5, 6, eos])
    assert [d.tolist() for d in frontier.document_tokens(stream, eos, 3)] == [
        [1, 2, eos],
        [3, eos],
        [4, 5, 6, eos],
    ]
    with pytest.raises(SystemExit, match="rebuild the cache"):
        frontier.document_tokens(stream, eos, 4)


def test_curve_interpolation_is_linear_in_syncs_and_undefined_outside():
    frontier = load("frontier")
    curve, syncs = {10: 4.0, 20: 3.8}, {10: 100.0, 20: 50.0}
    assert frontier.curve_at(curve, 75.0, syncs) == pytest.approx(3.9)
    assert frontier.curve_at(curve, 100.0, syncs) == pytest.approx(4.0)
    assert frontier.curve_at(curve, 120.0, syncs) != frontier.curve_at(curve, 120.0, syncs)  # NaN


def test_setting_names_carry_the_outer_lr_only_where_it_is_not_the_base_one():
    frontier = load("frontier")
    assert frontier.fixed_name(0.5, 20) == "diloco_mu0.5_h20"
    assert frontier.fixed_name(0.5, 20, 1.0) == "diloco_lr1_mu0.5_h20"
    assert frontier.parse_setting("diloco_lr0.35_mu0.9_h40") == (0.35, 0.9, 40)
    assert frontier.parse_setting("diloco_mu0.7_h10") == (frontier.BASE_OUTER_LR, 0.7, 10)
    # not on the base-LR momentum curves
    assert frontier.parse_fixed("diloco_lr1_mu0.5_h20") is None
    assert (
        frontier.parse_setting("diloco_f4_delayed") is None
        and frontier.parse_setting("descent_k0.9") is None
    )
    points = frontier.grid([10], 0.7, [], [], frontier.tuned_grid([1.0], [0.5], [40, 10]))
    assert [(p.name, p.h_base, p.overrides) for p in points] == [
        ("diloco_mu0.7_h10", 10, {"outer_momentum": 0.7}),
        # the middle horizons first
        ("diloco_lr1_mu0.5_h10", 10, {"outer_momentum": 0.5, "outer_lr": 1.0}),
        ("diloco_lr1_mu0.5_h40", 40, {"outer_momentum": 0.5, "outer_lr": 1.0}),
    ]


def test_the_tuned_frontier_is_the_lower_envelope_of_each_horizons_best_setting():
    frontier = load("frontier")

    def runs(syncs: float, *vals: float) -> dict:
        return {
            s: frontier.Result(syncs, v, v, v, [], 0.7, {"h_base": 10}) for s, v in enumerate(vals)
        }

    cells = {
        "diloco_mu0.7_h10": runs(100, 4.00, 4.10),
        "diloco_lr1_mu0.5_h10": runs(100, 3.90, 3.96),  # best at H 10
        "diloco_mu0.7_h20": runs(50, 4.20, 4.30),
        "diloco_lr1_mu0.5_h20": runs(50, 4.10, 4.10),  # best at H 20
        # best at H 40, and better than H 20: the envelope takes it
        "diloco_mu0.7_h40": runs(25, 4.00, 4.10),
        "diloco_lr1_mu0.5_h40": runs(25, 4.40, 4.40),
        "rule": runs(75, 3.95, 4.00),
    }
    tuned = frontier.TunedFrontier.of(cells)
    assert tuned.best == {
        10: "diloco_lr1_mu0.5_h10",
        20: "diloco_lr1_mu0.5_h20",
        40: "diloco_mu0.7_h40",
    }
    assert tuned.envelope(cells, [0, 1])[20] == "diloco_mu0.7_h40"
    # at 75 syncs, halfway between H 10 (100 syncs) and the envelope at 50 syncs (H 40's runs)
    assert tuned.at(cells, [0, 1], 0, 75.0) == pytest.approx((3.90 + 4.00) / 2)
    report = "\n".join(tuned.report(cells, ["rule"]))
    assert "| rule | 0-1 | 75.0 | 0.75x | -0.0150 ± 0.0150 |" in report
    # the grid: (LR 0.7, mu 0.7), then (LR 1, mu 0.5)
    assert "| 10 | 0-1 | 4.050 | 3.930 |" in report
    assert frontier.TunedFrontier.of({n: r for n, r in cells.items() if "_lr" not in n}) is None
    assert "held-out seeds" not in report  # every seed chose
    # seed 2 ran only the chosen settings and the rule: it is
    # held out, and paired on its own envelope
    held = {n: {**r, 2: frontier.Result(r[0].syncs, r[0].val + 0.1, 0, 0, [], 0.7, {"h_base": 10})}
            for n, r in cells.items() if n in tuned.best.values() or n == "rule"}  # fmt: skip
    held["rule"][2] = frontier.Result(75, 4.2, 0, 0, [], 0.7, {"h_base": 10})
    report = "\n".join(
        frontier.TunedFrontier.of({**cells, **held}).report({**cells, **held}, ["rule"])
    )
    assert "| rule | 0-2 | 75.0 | 0.75x |" in report
    assert "| rule | 2 | +0.1500 | +0.150 |" in report  # 4.2 against (4.0 + 4.1) / 2 + 0.1
    # H 40's runner-up ran seed 2 too: its margin is paired
    # over seeds 0-2, though the choice was made on 0-1
    more = {
        **cells,
        **held,
        "diloco_lr1_mu0.5_h40": runs(25, 4.40, 4.40, 4.40),
        "diloco_mu0.5_h40": runs(25, 4.5, 4.5),
    }
    report = "\n".join(frontier.TunedFrontier.of(more).report(more, ["rule"]))
    assert (
        "| 40 | 25 | diloco_mu0.7_h40 | 0-2 | 4.0667 ± 0.0333 | 0-1 | +0.3333 ± 0.0333 "
        "(diloco_lr1_mu0.5_h40; 0-2) |" in report
    )
    # a horizon whose piece of the grid is not complete (no LR 1 run at H 5 yet) is left out
    partial = frontier.TunedFrontier.of(
        {**cells, "diloco_mu0.7_h5": runs(200, 3.0, 3.0), "diloco_mu0.5_h5": runs(200, 3.1, 3.1)}
    )
    assert set(partial.best) == {10, 20, 40}
    # ... and so is one whose grid is complete on fewer seeds than the others' (seed 0 only)
    one_seed = {s: r for s, r in runs(200, 3.0).items()}
    fewer = frontier.TunedFrontier.of(
        {**cells, "diloco_mu0.7_h5": one_seed, "diloco_lr1_mu0.5_h5": one_seed}
    )
    assert set(fewer.best) == {10, 20, 40}


def test_log_interpolation_is_linear_in_log_syncs_and_never_extrapolates():
    frontier = load("frontier")
    points = [(100.0, 4.0), (25.0, 4.2)]
    # halfway in log(syncs); in syncs: 4.133
    assert frontier.log_interpolate(points, 50.0) == pytest.approx(4.1)
    assert frontier.log_interpolate(points, 25.0) == pytest.approx(4.2)
    assert math.isnan(frontier.log_interpolate(points, 120.0)) and math.isnan(
        frontier.log_interpolate(points, 20.0)
    )
    assert frontier.log_interpolate([(50.0, 3.0)], 50.0) == 3.0 and math.isnan(
        frontier.log_interpolate([(50.0, 3.0)], 51.0)
    )


def test_syncs_at_equal_loss_is_the_fewest_syncs_that_reach_the_loss():
    frontier = load("frontier")
    curve = [(100.0, 3.9), (50.0, 4.0), (25.0, 4.2)]  # the rule at 1x, 2x, 4x h_base
    # halfway in log(syncs)
    assert frontier.syncs_at_loss(curve, 3.95).syncs == pytest.approx(50 * math.sqrt(2))
    assert not frontier.syncs_at_loss(curve, 3.95).bound
    assert frontier.syncs_at_loss(curve, 4.0) == frontier.Crossing(50.0)
    # below at its fewest syncs
    assert frontier.syncs_at_loss(curve, 4.3) == frontier.Crossing(25.0, bound=True)
    assert frontier.syncs_at_loss(curve, 3.8) is None  # no point reaches it: no extrapolation
    # a curve that is not monotone: the crossing with the fewest syncs
    bumpy = [(25.0, 4.2), (50.0, 3.9), (100.0, 4.0)]
    assert frontier.syncs_at_loss(bumpy, 3.95).syncs == pytest.approx(25 * 2 ** (25 / 30))


def test_the_comparators_pair_the_rule_with_the_tuned_diloco_per_seed():
    frontier = load("frontier")

    def runs(syncs: float, h_base: int, *vals: float) -> dict:
        return {
            s: frontier.Result(syncs, v, v, v, [], 0.5, {"h_base": h_base})
            for s, v in enumerate(vals)
        }

    one_x = 50 * math.sqrt(2)  # the rule's syncs: halfway between H 20 and H 10 in log(syncs)
    cells = {
        "diloco_mu0.5_h10": runs(100, 10, 4.00, 4.10),  # the tuned DiLoCo at h_base 10
        "diloco_lr1_mu0.5_h10": runs(100, 10, 4.10, 4.20),
        "diloco_mu0.5_h20": runs(50, 20, 4.10, 4.20),
        "diloco_lr1_mu0.5_h20": runs(50, 20, 4.20, 4.30),
        "diloco_mu0.5_h40": runs(25, 40, 4.30, 4.40),
        "diloco_lr1_mu0.5_h40": runs(25, 40, 4.20, 4.30),
        "rule": runs(one_x, 10, 4.00, 4.06),
        "rule_hb20": runs(one_x / 2, 20, 4.10, 4.14),
        "paper": runs(120, 10, 4.30, 4.30),  # more syncs than the grid's H 10: outside the frontier
    }
    tuned = frontier.TunedFrontier.of(cells)
    found = frontier.Comparison.of(cells, tuned, "rule")
    assert found.tuned == "diloco_mu0.5_h10" and found.curve == ["rule", "rule_hb20"]
    assert found.a == pytest.approx([0.0, -0.04])
    # the frontier at one_x: 4.05 and 4.15
    assert found.b == pytest.approx([4.00 - 4.05, 4.06 - 4.15])
    # seed 0 reaches DiLoCo's 4.00 at 1x (70.7 syncs), seed 1
    # its 4.10 halfway between 2x and 1x (50 syncs)
    assert found.c_ratio == pytest.approx([one_x / 100, 0.5])
    assert found.a_text() == "-0.020 ± 0.020 (diloco_mu0.5_h10; seeds 0-1)"
    assert found.b_text() == "-0.070 ± 0.020 at 70.7 syncs (seeds 0-1)"
    assert found.c_text(cells) == "0.60x ± 0.10 (h_base 1x, 2x; seeds 0-1)"
    paper = frontier.Comparison.of(cells, tuned, "paper")
    assert (
        paper.b_text()
        == "outside the tuned grid's 25-100 syncs on seeds 0-1 (120.0 syncs): not extrapolated"
    )
    assert paper.c_text(cells) == "not reached on seeds 0-1 (its curve: h_base 1x, seeds 0-1)"
    # a rule below the DiLoCo's loss at its fewest syncs: the
    # crossing is beyond the curve, an upper bound
    low = {**cells, "rule_hb20": runs(one_x / 2, 20, 3.90, 4.00)}
    assert (
        frontier.Comparison.of(low, tuned, "rule").c_text(low).startswith("at most 0.35x (below at")
    )
    report = "\n".join(frontier.comparisons_report(cells, tuned, ["rule", "paper"]))
    assert "| rule | 10 | -0.020 ± 0.020 (diloco_mu0.5_h10; seeds 0-1) |" in report
    # outer LR 1 run on seed 0 only: each H's choice is made on seed 0 alone, and (a)'s text says so
    cut = {n: {0: r[0]} if n.startswith("diloco_lr1") else r for n, r in cells.items()}
    cut_found = frontier.Comparison.of(cut, frontier.TunedFrontier.of(cut), "rule")
    assert cut_found.chosen_on == [0] and cut_found.a_seeds == [0, 1]
    assert cut_found.a_text() == "-0.020 ± 0.020 (diloco_mu0.5_h10, chosen on seeds 0; seeds 0-1)"
    # outer LR 1 on seeds 0-1 at H 10, on seed 0 at H 20 and 40: H 20 is chosen on seed 0, but its
    # winner ran both seeds and stays; H 40's winner (LR 1) ran seed 0 only: it would cut the
    # pairing
    uneven = {
        n: {0: r[0]} if n in ("diloco_lr1_mu0.5_h20", "diloco_lr1_mu0.5_h40") else r
        for n, r in cells.items()
    }
    uneven_tuned = frontier.TunedFrontier.of(uneven)
    assert uneven_tuned.best == {10: "diloco_mu0.5_h10", 20: "diloco_mu0.5_h20"}
    assert uneven_tuned.choice_seeds == {10: [0, 1], 20: [0]}


def test_the_rules_curve_over_h_base_keeps_the_seeds_of_its_first_two_points():
    frontier = load("frontier")

    def runs(h_base: int, *seeds: int) -> dict:
        return {
            s: frontier.Result(100 / h_base, 4.0, 4.0, 4.0, [], 0.5, {"h_base": h_base})
            for s in seeds
        }

    cells = {
        "rule": runs(10, 0, 1, 2),
        "rule_hb40": runs(40, 0),
        "rule_hb20": runs(20, 0, 1),
        "rules": runs(20, 0),
    }
    # 4x still running on seed 1: it would cut the curve to seed 0, so it waits
    assert frontier.Comparison.curve_of(cells, "rule", [0, 1, 2]) == (["rule", "rule_hb20"], [0, 1])
    cells["rule_hb40"] = runs(40, 0, 1)
    assert frontier.Comparison.curve_of(cells, "rule", [0, 1, 2]) == (
        ["rule", "rule_hb20", "rule_hb40"],
        [0, 1],
    )
    # no other point ran seed 2
    assert frontier.Comparison.curve_of(cells, "rule", [2]) == (["rule"], [2])


@pytest.mark.parametrize(
    ("folder", "row"),
    [
        ("frontier", "autoloco"),
        ("fragments", "autoloco"),
        # regime B at 4x the inner LR (docs/results.md, "A regime ...")
        ("regime_search/lr8e-3", "autoloco"),
        ("regime_search/batch1", "descent_k0.9"),
        # regime D, the larger batch (docs/results.md)
        ("frontier_d", "descent_k0.9_guard_mu0.5_hmax20"),
        # regime A at 14.5M parameters, the first GPU runs (docs/gpu.md)
        ("gpu_frontier_14m", "default"),
        # the ladder's CPU rungs, each rung's tuned baseline (results/ladder.md)
        ("ladder/h128_l4", "default"),
        ("ladder/h192_l4", "default"),
    ],
)
def test_the_committed_frontier_report_regenerates_from_the_committed_runs(
    tmp_path, monkeypatch, folder, row
):
    """Every number in results/<folder>/frontier.md comes from the run folders next to it."""
    frontier = load("frontier")
    monkeypatch.chdir(ROOT)
    out = f"results/{folder}"
    args = frontier.parse_args(["--out", out, "--report-only", "--report-dir", str(tmp_path)])
    regenerated = frontier.write_report(args).read_text()
    assert regenerated == (ROOT / out / "frontier.md").read_text()
    assert f"| {row} |" in regenerated  # the report has its rows


@pytest.mark.skipif(
    not (SWITCH / "switch_cost.md").exists(), reason="no committed switch-cost runs"
)
def test_the_committed_switch_cost_table_regenerates_from_the_committed_runs(tmp_path, monkeypatch):
    switch_cost = load("switch_cost")
    monkeypatch.chdir(ROOT)
    out = tmp_path / "switch_cost"
    shutil.copytree(SWITCH, out)  # the report is written next to the runs
    (out / "switch_cost.md").unlink()
    args = ["--out", str(out), "--frontier", "results/frontier", "--report-only"]
    switch_cost.main(args)
    expected = (SWITCH / "switch_cost.md").read_text().replace("results/switch_cost", str(out))
    assert (out / "switch_cost.md").read_text() == expected
    assert "| 10to15_at130 |" in expected  # the table has rows


def test_gpu_campaign_dry_run_measures_plans_and_reports(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "campaigns" / "gpu_frontier.py"),
            "--cpu-dry-run",
            "--budget-s",
            "60",
            # the plan fills the budget with 16 runs of 0.2 s here: 3 show the same
            "--max-runs",
            "3",
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["flops_per_worker_step"] > 0 and plan["seconds_per_step"] > 0
    assert plan["runs"] and set(plan["actual_seconds"]) == set(plan["runs"])
    assert plan["within_time_limit"] is True
    for run in plan["runs"]:
        name, _, seed = run.partition(" seed ")
        assert (out / "iid" / f"seed{seed}" / name / "summary.json").exists()
    assert "## Regime iid" in (out / "frontier.md").read_text()


def test_gpu_campaign_runs_the_tuned_grid_in_pieces_that_resume(tmp_path):
    """Each call runs the next unfinished runs of the tuned
    grid: the default rule and the paper's first."""
    gpu = load("gpu_frontier")
    names = gpu.points(gpu.Grid.TUNED, 1000)
    assert len(names) == 2 + 3 * 3 * 4 and list(names)[:3] == [
        "default",
        "autoloco",
        "diloco_mu0.5_h10",
    ]
    # the config's own rule and options
    assert names["default"].overrides == {"controller": "descent"}
    out = tmp_path / "out"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "campaigns" / "gpu_frontier.py"),
        "--cpu-dry-run",
        "--grid",
        "tuned",
        "--max-runs",
        "2",
        "--out",
        str(out),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    pieces = []
    for _ in range(2):
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        pieces.append(json.loads((out / "plan.json").read_text()))
    assert pieces[0]["runs"] == ["default seed 0", "autoloco seed 0"]
    assert pieces[1]["runs"] == ["diloco_mu0.5_h10 seed 0", "diloco_mu0.7_h10 seed 0"]
    assert pieces[1]["runs_left_after"] == 3 * len(names) - 4


def test_the_gpu_campaigns_large_model_has_over_100m_parameters():
    gpu = load("gpu_frontier")
    from autoloco_hf.toy.llama import tiny_llama

    sizes = gpu.MODELS["114m"]
    with torch.device("meta"):
        model = tiny_llama(
            1024, sizes.hidden, sizes.layers, sizes.heads, max_position_embeddings=64
        )
    assert 100e6 < sum(p.numel() for p in model.parameters()) < 130e6


def test_gpu_campaign_without_a_gpu_says_how_to_dry_run(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "campaigns" / "gpu_frontier.py"),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert result.returncode == 2 and "--cpu-dry-run" in result.stderr


def test_a_fragments_variant_is_paired_with_the_setting_that_differs_in_fragments_only():
    frontier = load("frontier")
    f4 = {"method": "diloco", "outer_momentum": 0.7, "fragments": 4, "overlap": "delayed"}
    assert frontier.same_but_fragments(f4, {**f4, "fragments": 1})
    assert frontier.same_but_fragments(
        f4, {"method": "diloco", "outer_momentum": 0.7, "overlap": "delayed"}
    )  # older run
    assert not frontier.same_but_fragments(f4, {**f4, "fragments": 1, "overlap": "none"})


def test_a_dry_run_checks_every_setting_lists_the_runs_and_writes_nothing(tmp_path, capsys):
    """``--dry-run``: each run's folder, done or to do, with
    its method; nothing is trained or written."""
    frontier = load("frontier")
    done = tmp_path / "iid" / "seed0" / "diloco_mu0.5_h10"
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    argv = [
        "--out",
        str(tmp_path),
        "--seeds",
        "0",
        "--regimes",
        "iid",
        "--h-list",
        "",
        "--mu-list",
        "",
    ]
    argv += [
        "--adaptive",
        "rule:controller=descent,h_min=5",
        "--tuned-outer-lrs",
        "0.7",
        "--tuned-momenta",
        "0.5",
    ]
    assert frontier.main([*argv, "--tuned-h-list", "10,20", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["to", "do"],
        ["done", str(done)],
        ["to", "do"],
    ]
    assert "autoloco H_base 10 {'controller': 'descent', 'h_min': 5}" in lines[0]
    assert sorted(p.name for p in (tmp_path / "iid" / "seed0").iterdir()) == ["diloco_mu0.5_h10"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("x:controller=descnt", "controller='descnt' is not a registered horizon rule"),
        ("x:h_bse=3", "unexpected keyword argument 'h_bse'"),
    ],
)
def test_a_bad_run_setting_ends_the_campaign_in_one_line_before_it_trains(
    spec, says, tmp_path, capsys
):
    frontier = load("frontier")
    with pytest.raises(SystemExit) as stop:
        frontier.main(
            [
                "--out",
                str(tmp_path),
                "--h-list",
                "",
                "--mu-list",
                "",
                "--adaptive",
                spec,
                "--dry-run",
            ]
        )
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert (
        err.count("\n") == 1
        and err.startswith("frontier: the run 'x' (--adaptive or a grid flag): ")
        and says in err
    )
    assert not any(tmp_path.iterdir())
