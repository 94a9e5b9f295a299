"""Wall-clock time to a target loss on a slow link: loss-per-sync curves joined with measured sync
costs.

    python benchmarks/campaigns/wan_time_to_loss.py results/wan_overlap/h52_allgather_h10.json \\
        --json results/wan_time_to_loss/h52.json
    python benchmarks/campaigns/wan_time_to_loss.py results/wan_overlap/h52_allgather_h10.json \\
        --readme

The loss campaigns (``results/frontier``) measure the training loss after every step and the syncs
made so far, at no link cost; the link testbed (``benchmarks/testbeds/wan.py --json``) measures what
a sync costs. A run of a variant reaches the target at step ``s`` after ``k(s)`` syncs, so on a link
of ``B`` bit/s with a wire ``w`` and an overlap mode::

    wall(s) = s * t + k(s) * blocked_per_sync(w, B)
    blocked_per_sync(w, B) = F * (c_w + max(0, 8 E_w / B - hidden_w))  (link_floor.py's event cost)

``t``: the compute-only step time (the testbed's ``local`` row at ``unlimited``); ``E_w``: kernel
bytes per sync event; ``c_w``: the blocked seconds per event at ``unlimited`` (codec, collective
set-up, merge), steady events only; ``F`` events per sync (fragments); ``hidden_w``: ``tau * t`` for
a delayed merge ``tau`` steps later, 0 for a blocking sync. The target per seed is the larger of the
two variants' final smoothed losses, so both reach it; the report is the median over the seeds both
ran. ``s * t`` alone is the compute-only floor.

Assumptions, stated where the table is printed: the wire and the overlap do not change the loss per
sync (the curves are FP32, blocking); the testbed's model and step time stand for the user's (the
curves come from the 197k-parameter Llama, in steps and syncs); the smoothed training loss stands
for the validation loss (the campaigns record the latter only at the end).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Any

# benchmarks/: its kinds import as packages
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from testbeds.link_floor import _rate_bits, event_blocked_seconds, overlap_steps  # noqa: E402

from autoloco_hf.state.run_folder import moving_average  # noqa: E402

SMOOTHING_STEPS = 50  # trailing mean of the per-step training loss (one step's loss is noisy)


@dataclass(frozen=True)
class SyncCost:
    """What one sync of a wire and overlap mode costs on the testbed."""

    row: str
    events: int  # per sync (fragments)
    fixed_s: float  # blocked seconds per event at unlimited
    event_bytes: float
    hidden_s: float  # transfer time hidden behind the steps before the merge (0: blocking)

    def blocked(self, bits_per_s: float) -> float:
        """Seconds one sync blocks the training loop on a link of ``bits_per_s``."""
        return self.events * event_blocked_seconds(
            self.fixed_s, self.event_bytes, bits_per_s, self.hidden_s
        )


@dataclass(frozen=True)
class Curve:
    """One run's smoothed training loss after each step and the syncs made by then."""

    losses: list[float]
    syncs: list[int]

    def first_step_at(self, target: float) -> int | None:
        """1-based step at which the smoothed loss first
        reaches ``target``; ``None`` if it never does."""
        return next((i + 1 for i, loss in enumerate(self.losses) if loss <= target), None)

    def wall_to(self, target: float, step_s: float, blocked_s: float) -> float | None:
        """``s * t + k(s) * blocked`` at the first step ``s`` that reaches ``target``."""
        step = self.first_step_at(target)
        return None if step is None else step * step_s + self.syncs[step - 1] * blocked_s


def load_curve(run_dir: str, window: int = SMOOTHING_STEPS) -> Curve:
    with gzip.open(os.path.join(run_dir, "steps.jsonl.gz"), "rt") as f:
        steps = [json.loads(line) for line in f]
    return Curve(
        moving_average([s["loss"] for s in steps], window), [int(s["syncs"]) for s in steps]
    )


def seed_curves(frontier: str, variant: str) -> dict[int, Curve]:
    """A variant's curve per seed of a campaign's regime folder (``seed<k>/<variant>``)."""
    found = {}
    for seed_dir in sorted(os.listdir(frontier)):
        run = os.path.join(frontier, seed_dir, variant)
        if os.path.exists(os.path.join(run, "steps.jsonl.gz")):
            found[int(seed_dir.removeprefix("seed"))] = load_curve(run)
    return found


def sync_costs(
    rows: list[dict[str, Any]], h_base: int, tau: int, step_s: float
) -> dict[str, SyncCost]:
    """Each testbed row's cost per sync from its
    ``unlimited`` run (bytes: the same at every rate)."""
    costs = {}
    for r in rows:
        if r["rate"] != "unlimited" or r["method"] == "none":
            continue
        f = max(r.get("fragments") or 1, 1)
        steady_events = max(r["sync_events"] - f, 1)  # the last interval blocks whatever the link
        delayed = "delayed" in r["row"]
        costs[r["row"]] = SyncCost(
            r["row"],
            f,
            r["steady_share"] * r["train_seconds"] / steady_events,
            r["tx_bytes_per_event"],
            overlap_steps(f, h_base, tau) * step_s if delayed else 0.0,
        )
    return costs


def model_check(rows: list[dict[str, Any]], costs: dict[str, SyncCost]) -> list[dict[str, Any]]:
    """The model's blocked seconds per steady sync at each
    limited rate next to the testbed's measured ones."""
    out = []
    for r in rows:
        if r["rate"] == "unlimited" or r["row"] not in costs:
            continue
        cost = costs[r["row"]]
        steady_syncs = max(r["syncs"] - 1, 1)
        out.append(
            {
                "row": r["row"],
                "rate": r["rate"],
                "model_s": cost.blocked(_rate_bits(r["rate"])),
                "measured_s": r["steady_share"] * r["train_seconds"] / steady_syncs,
            }
        )
    return out


def time_to_loss(
    default: dict[int, Curve],
    diloco: dict[int, Curve],
    costs: dict[str, SyncCost],
    baseline_row: str,
    rates: list[str],
    step_s: float,
) -> list[dict[str, Any]]:
    """Per link rate: medians over the seeds of the walls to
    the target, and their ratios to the baseline."""
    seeds = sorted(set(default) & set(diloco))
    if not seeds:
        raise ValueError("the two variants share no seed: pick runs of the same campaign")
    out = []
    for rate in rates:
        bits = _rate_bits(rate)
        per_seed: dict[str, list[float]] = {}
        for seed in seeds:
            a, b = default[seed], diloco[seed]
            target = max(a.losses[-1], b.losses[-1])
            walls = {
                "floor": a.wall_to(target, step_s, 0.0),
                "diloco_floor": b.wall_to(target, step_s, 0.0),
            }
            for name, cost in costs.items():
                walls[f"default:{name}"] = a.wall_to(target, step_s, cost.blocked(bits))
                walls[f"diloco:{name}"] = b.wall_to(target, step_s, cost.blocked(bits))
            for key, wall in walls.items():
                assert wall is not None  # both reach the larger final loss by their last step
                per_seed.setdefault(key, []).append(wall)
        median = {key: statistics.median(v) for key, v in per_seed.items()}
        best = min((k for k in median if k.startswith("default:")), key=median.__getitem__)
        same = "diloco:" + best.split(":", 1)[1]
        baseline = median[f"diloco:{baseline_row}"]
        out.append(
            {
                "rate": rate,
                "seeds": seeds,
                "best": best.split(":", 1)[1],
                "default_s": median[best],
                "diloco_baseline_s": baseline,
                "diloco_same_s": median[same],
                "floor_s": median["floor"],
                "ratio_to_baseline": median[best] / baseline,
                "ratio_to_same": median[best] / median[same],
                "floor_ratio": median["floor"] / baseline,
                "medians": median,
            }
        )
    return out


TESTBED_WINDOW = 5  # wan.py's LOSS_WINDOW: its time to a target smooths the per-step loss so


def full_run_check(rows: list[dict[str, Any]], h_base: int, tau: int) -> list[dict[str, Any]]:
    """The model against whole runs on the testbed: per
    limited rate, each row's wall to the rate's target.

    The target is the largest final smoothed loss of the rate's rows (wan.py's), so
    every row reaches it. Measured: the seconds at which the row's own smoothed loss
    reached it. Model: the step ``s`` and the syncs ``k(s)`` of that same run,
    ``s * t + k(s) * blocked``, with ``t`` and the sync costs from the ``unlimited``
    runs; so the check tests the wall-clock model, not the loss curves.
    """
    local = next(r for r in rows if r["row"] == "local" and r["rate"] == "unlimited")
    step_s = local["step_seconds"]
    costs = sync_costs(rows, h_base, tau, step_s)
    out = []
    for rate in dict.fromkeys(r["rate"] for r in rows if r["rate"] != "unlimited"):
        mine = [r for r in rows if r["rate"] == rate and r["row"] in costs]
        smoothed = {r["row"]: moving_average(r["losses"], TESTBED_WINDOW) for r in mine}
        target = max(s[-1] for s in smoothed.values())
        for r in mine:
            step = next(i for i, loss in enumerate(smoothed[r["row"]]) if loss <= target)  # 0-based
            measured = r["loss_times"][step]
            syncs = sum(1 for interval in r["intervals"] if interval[0] <= measured)
            model = (step + 1) * step_s + syncs * costs[r["row"]].blocked(_rate_bits(rate))
            out.append(
                {"row": r["row"], "rate": rate, "target": target, "step": step + 1, "syncs": syncs,
                 "model_s": model, "measured_s": measured}
            )  # fmt: skip
    return out


# the line above README's lines
README_MARKER = "<!-- generated: python benchmarks/campaigns/wan_time_to_loss.py"
RATE_NAMES = {"20mbit": "20 Mbit/s", "100mbit": "100 Mbit/s", "1gbit": "1 Gbit/s"}


def wire_name(row: str) -> str:
    """A testbed row in words: ``wire-int4-ef-f1-delayed-thread`` ->
    ``int4 + EF, delayed, on the sync thread``."""
    parts = row.removeprefix("wire-").split("-")
    wire = parts[0].upper() if parts[0] in ("fp32", "int8") else parts[0]
    words = [wire + (" + EF" if "ef" in parts else "")]
    fragments = next((p for p in parts if p.startswith("f") and p[1:].isdigit()), "f1")
    words += [f"{fragments[1:]} fragments"] if fragments != "f1" else []
    words += [p for p in parts if p in ("delayed", "eager")]
    return ", ".join(words) + (", on the sync thread" if parts[-1] == "thread" else "")


def readme_lines(table: list[dict[str, Any]]) -> list[str]:
    """One line per link speed: the default's wall-clock to the target as a ratio to DiLoCo's."""
    return [
        f"- {RATE_NAMES.get(t['rate'], t['rate'])}: **{t['ratio_to_baseline']:.2f}x** the time of "
        f"DiLoCo at `h_base` with FP32 blocking syncs ({t['default_s']:.0f} s against "
        f"{t['diloco_baseline_s']:.0f} s, the default with {wire_name(t['best'])}); "
        f"{t['ratio_to_same']:.2f}x DiLoCo with the same wire and overlap; compute-only "
        f"floor {t['floor_ratio']:.2f}x"
        for t in table
    ]


def readme_span(lines: list[str]) -> tuple[int, int]:
    """README's generated lines: those after the marker that start with ``- ``."""
    start = next(i for i, line in enumerate(lines) if line.startswith(README_MARKER)) + 1
    return start, next(
        (i for i in range(start, len(lines)) if not lines[i].startswith("- ")), len(lines)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "wan",
        nargs="*",
        help="benchmarks/testbeds/wan.py --json files: the rows at unlimited and limited rates",
    )
    parser.add_argument(
        "--frontier", default="results/frontier/iid", help="the campaign's seed folders"
    )
    parser.add_argument(
        "--default", default="descent_k0.9_guard_mu0.5_hmax20", help="the default rule's variant"
    )
    parser.add_argument(
        "--diloco", default="diloco_mu0.5_h10", help="DiLoCo at h_base, the default's momentum"
    )
    parser.add_argument(
        "--baseline-row", default="diloco", help="the testbed row of FP32 blocking syncs"
    )
    parser.add_argument("--rates", nargs="+", default=["20mbit", "100mbit", "1gbit"])
    parser.add_argument("--h-base", type=int, default=10)
    parser.add_argument("--overlap-steps", type=int, default=3)
    parser.add_argument("--json", help="write the numbers here")
    parser.add_argument(
        "--readme", action="store_true", help="write the table's lines into README.md as well"
    )
    parser.add_argument(
        "--check-run",
        nargs="+",
        metavar="WAN_JSON",
        help="wan.py --json runs of whole rows (local at unlimited, rows at unlimited and limited "
        "rates): print the model's wall to the target against the measured "
        "one, row by row, and stop",
    )
    args = parser.parse_args(argv)
    if args.check_run:
        check_rows = [r for path in args.check_run for r in json.load(open(path))]
        if not any(r["row"] == "local" and r["rate"] == "unlimited" for r in check_rows):
            parser.exit(
                2,
                f"wan_time_to_loss: --check-run {' '.join(args.check_run)}: no `local` "
                "row at unlimited: add it\n",
            )
        checked = full_run_check(check_rows, args.h_base, args.overlap_steps)
        for c in checked:
            print(
                f"{c['rate']} {c['row']}: target {c['target']:.3f} at step {c['step']} after "
                f"{c['syncs']} syncs: model {c['model_s']:.1f} s, measured {c['measured_s']:.1f} s "
                f"({c['model_s'] / c['measured_s']:.2f}x)"
            )
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"check": checked, "command": " ".join(sys.argv)}, f, indent=1)
        return 0
    if not args.wan:
        parser.exit(
            2, "wan_time_to_loss: give the wan.py --json files of the sync costs (or --check-run)\n"
        )
    rows = [r for path in args.wan for r in json.load(open(path))]
    local = [r for r in rows if r["row"] == "local" and r["rate"] == "unlimited"]
    if not local:
        parser.exit(
            2,
            "wan_time_to_loss: no `local` row at unlimited (the compute-only step "
            "time): add it to the run\n",
        )
    step_s = local[0]["step_seconds"]
    costs = sync_costs(rows, args.h_base, args.overlap_steps, step_s)
    if args.baseline_row not in costs:
        parser.exit(
            2,
            f"wan_time_to_loss: --baseline-row={args.baseline_row!r} is not in the runs: add it\n",
        )

    default, diloco = (
        seed_curves(args.frontier, args.default),
        seed_curves(args.frontier, args.diloco),
    )
    table = time_to_loss(default, diloco, costs, args.baseline_row, args.rates, step_s)
    check = model_check(rows, costs)
    print(f"compute-only step {step_s:.3f} s; seeds {table[0]['seeds']}")
    print(
        "| link | default rule, best wire and overlap | x DiLoCo FP32 blocking | x DiLoCo "
        "same wire | compute floor |"
    )
    print("| --- | --- | --- | --- | --- |")
    for t in table:
        print(
            f"| {t['rate']} | {t['best']}: {t['default_s']:.0f} s | {t['ratio_to_baseline']:.2f} "
            f"({t['diloco_baseline_s']:.0f} s) | {t['ratio_to_same']:.2f} | {t['floor_ratio']:.2f} "
            f"({t['floor_s']:.0f} s) |"
        )
    print("\nmodel check: blocked s per steady sync, model from unlimited vs measured")
    for c in check:
        print(f"  {c['row']} {c['rate']}: model {c['model_s']:.3f} measured {c['measured_s']:.3f}")
    if args.readme:
        lines = open("README.md").read().split("\n")
        start, end = readme_span(lines)
        open("README.md", "w").write("\n".join(lines[:start] + readme_lines(table) + lines[end:]))
        print("updated: README.md")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(
                {
                    "step_seconds": step_s,
                    "costs": [c.__dict__ for c in costs.values()],
                    "table": table,
                    "check": check,
                    "command": " ".join(sys.argv),
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
