"""Closed-loop controller scenarios: false reductions, time above a critical horizon, NaN recovery.

Not a test (``tests/algorithm/test_closed_loop.py`` asserts bounds on a few
seeds). Drives ``AutoLoCoPolicy`` on the SFT recipe through the synthetic
statistic streams of ``benchmarks/campaigns/rule_streams.py`` (pure Python,
seeded) for every scenario and configuration column, and prints a Markdown
table (docs/controller.md):

* no blow-up: ``seeds with a false reduction / seeds`` (reductions,
  fallbacks and recalibrations-in-place; total count in brackets) and the mean
  number of syncs;
* blow-ups: intervals above the critical horizon per seed (mean), the quanta
  above it summed over intervals (mean: how far, not only how often), syncs;
* NaN: intervals from the last non-finite interval to the next proposal
  (worst seed), syncs.

    python benchmarks/campaigns/controller_scenarios.py [--seeds 10] [--student-seeds 50] \\
        [--columns default zero ...]

Column ``default`` passes no override, so running this file against an older
checkout (``PYTHONPATH=<old tree> python benchmarks/campaigns/controller_scenarios.py
--columns default``) measures that checkout's behaviour.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

# benchmarks/: its kinds import as packages
BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCHMARKS)
from campaigns.rule_settings import FIRST_DESCENT_H_MAX_FACTOR, first_descent  # noqa: E402
from campaigns.rule_streams import SCENARIOS, Kind, Scenario  # noqa: E402

from autoloco_hf.config import RECIPES, AutoLoCoConfig  # noqa: E402

H_BASE = RECIPES["sft"]["h_base"]  # the scenarios' recipe


def descent(h_max: int = FIRST_DESCENT_H_MAX_FACTOR * H_BASE, **options: Any) -> dict[str, Any]:
    """The descent rule as first measured
    (rule_settings.FIRST_DESCENT), up to ``h_max``, ``options`` on top.

    "default" below is the library's default rule (descent
    from 2 h_base, gain 0.9, guarded); "paper" the paper's.
    """
    return {**first_descent(**options), "h_max": h_max}


COLUMNS: dict[str, dict[str, Any]] = {
    "paper": {},
    "zero": dict(rule_options={"reference_clip": "zero"}),
    "min_age": dict(rule_options={"rejected_bound_min_age": 20}),
    "cumulative": dict(rule_options={"cumulative_check": True}),
    "cap": dict(rule_options={"candidate_max_quanta": 1}),
    "default": dict(controller="descent"),
    "descent": descent(),
    "descent_guard": descent(drift_guard=True),
    "descent_guard_k0.9": descent(drift_guard=True, gain=0.9),
    "descent_k0.9_hmax2": descent(2 * H_BASE, gain=0.9),  # from 2 h_base
    "descent_guard_k0.9_hmax2": descent(2 * H_BASE, drift_guard=True, gain=0.9),
    "descent_guard_k0.5_hmax2": descent(2 * H_BASE, drift_guard=True, gain=0.5),
    "descent_k0.9_probe": descent(gain=0.9, start_probe=1.85),
    "descent_guard_k0.9_probe": descent(drift_guard=True, gain=0.9, start_probe=1.85),
}
TITLES = {
    "paper": "paper rule",
    "default": "default (descent, 2 h_base, gain 0.9, guarded)",
    "zero": "reference_clip=zero",
    "min_age": "+rejected_bound_min_age=20",
    "cumulative": "+cumulative_check",
    "cap": "+candidate_max_quanta=1",
    "descent": "controller=descent",
    "descent_guard": "descent + descent_drift_guard",
    "descent_guard_k0.9": "descent + guard, descent_gain=0.9",
    "descent_k0.9_hmax2": "descent, descent_gain=0.9, h_max=2 h_base",
    "descent_guard_k0.9_hmax2": "descent + guard, descent_gain=0.9, h_max=2 h_base",
    "descent_k0.9_probe": "descent, descent_gain=0.9, descent_start_probe=1.85",
    "descent_guard_k0.9_probe": "descent + guard, descent_gain=0.9, descent_start_probe=1.85",
    "descent_guard_k0.5_hmax2": "descent + guard, descent_gain=0.5, h_max=2 h_base",
}
STUDENT_SEEDS = 50  # the heavy-tail count


def cell(scenario: Scenario, seeds: int, overrides: dict[str, Any]) -> str:
    traces = [scenario.run(seed, **overrides) for seed in range(seeds)]
    syncs = statistics.fmean(t.syncs for t in traces)
    if scenario.kind == Kind.FALSE_ALARM:
        hit = sum(t.reductions() > 0 for t in traces)
        return f"{hit}/{seeds} ({sum(t.reductions() for t in traces)}), {syncs:.1f}"
    if scenario.kind == Kind.BLOWUP:
        critical, since = scenario.stream.critical, scenario.since_step()
        above = statistics.fmean(t.above(critical, since) for t in traces)
        excess = statistics.fmean(
            t.excess(critical, AutoLoCoConfig.for_recipe("sft").q_h, since) for t in traces
        )
        return f"{above:.1f} / {excess:.1f}, {syncs:.1f}"
    last_bad = max(scenario.stream.nan_intervals)
    return f"{max(t.recovery(last_bad) for t in traces)}, {syncs:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--columns", nargs="+", default=list(COLUMNS), choices=list(COLUMNS))
    parser.add_argument(
        "--student-seeds",
        type=int,
        default=STUDENT_SEEDS,
        help="seeds of the heavy-tail rows (default 50)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    print("| scenario | " + " | ".join(TITLES[c] for c in args.columns) + " |")
    print("| --- |" + " --- |" * len(args.columns))
    for name, scenario in SCENARIOS.items():
        seeds = args.student_seeds if name.startswith("student") else args.seeds
        row = [cell(scenario, seeds, COLUMNS[c]) for c in args.columns]
        print(f"| {name} ({seeds} seeds) | " + " | ".join(row) + " |")
    print(f"\n{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
