"""The link speed at which each wire's blocked share reaches 2 %, from a
``benchmarks/testbeds/wan.py --json`` run (not a test).

    python benchmarks/testbeds/link_floor.py results/wan_wires/h10.json [--step-seconds 0.02]

The run must hold each row at ``unlimited`` and at one limited rate. Per row (a wire format at ``F``
fragments, a delayed merge ``tau`` steps after each fragment's sync, ``H`` steps per interval):

* ``E``: the kernel bytes a node sent per sync event (``tx_bytes_per_event``), measured;
* ``t``: the median step time at ``unlimited``, measured (or
  ``--step-seconds``: a stated step time, e.g. a GPU's);
* ``c``: the blocked seconds per event at ``unlimited`` (codec, collective set-up, the merge),
  measured, without the run's last interval, which blocks whatever the link (``steady_share``);
* the transfer of an event hides behind the ``tau`` steps before its merge, so at ``B`` bit/s an
  event blocks ``c + max(0, 8 E / B - tau t)`` seconds, ``F`` times per ``H t`` seconds of training;
* blocked share ``s(B) = F (c + max(0, 8 E / B - tau t)) / (H t)``; ``s = 2 %`` at
  ``B_2% = 8 E / (tau t + 0.02 H t / F - c)``, never when ``c`` alone exceeds 2 % of the interval;
* the floor with no overlap at all (the transfer blocks): ``8 E / (0.02 H t / F - c)``; the physical
  floor (the link busy all the time): ``8 E F / (H t)``.

``s(B)`` at the limited rate is printed next to the share measured there, which checks the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

TARGET = 0.02


def overlap_steps(fragments: int, h: int, tau: int) -> int:
    """wan.py's delayed rows: ``min(--overlap-steps, h // F - 1)``
    with fragments, else ``--overlap-steps``."""
    return min(tau, h // fragments - 1) if fragments > 1 else tau


def event_blocked_seconds(
    fixed_s: float, event_bytes: float, bits_per_s: float, hidden_s: float
) -> float:
    """Seconds one sync event blocks: its fixed cost plus the
    part of its transfer not hidden behind ``hidden_s``."""
    return fixed_s + max(0.0, 8 * event_bytes / bits_per_s - hidden_s)


def mbit(bits_per_s: float) -> str:
    return "never" if bits_per_s == float("inf") else f"{bits_per_s / 1e6:.1f}"


def floors(
    free: dict[str, Any], limited: dict[str, Any], h: int, tau: int, step: float | None
) -> dict[str, Any]:
    """One row's measured inputs, the model's share at the limited rate, and the 2 % link speeds."""
    f = max(free.get("fragments") or 1, 1)
    # the last interval's events block whatever the link: not steady
    events = free["sync_events"] - f
    t = step if step is not None else free["step_seconds"]
    c = free["steady_share"] * free["train_seconds"] / max(events, 1)
    e = limited["tx_bytes_per_event"]
    delay = overlap_steps(f, h, tau)
    budget = TARGET * h * t / f

    def share(bits_per_s: float) -> float:
        return f * event_blocked_seconds(c, e, bits_per_s, delay * t) / (h * t)

    def needed(window: float) -> float:
        return 8 * e / window if window > 0 else float("inf")

    return {
        "row": free["row"],
        "F": f,
        "tau": delay,
        "kB/event": e / 1e3,
        "t": t,
        "c": c,
        "predicted": share(_rate_bits(limited["rate"])),
        "measured": limited["steady_share"],
        "b2": needed(delay * t + budget - c),
        "blocking": needed(budget - c),
        "physical": 8 * e * f / (h * t),
    }


def _rate_bits(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, mult in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * mult
    raise ValueError(f"{rate!r} is not a limited rate")


def table(rows: list[dict[str, Any]], h: int, tau: int, step: float | None) -> str:
    by_row: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_row.setdefault(r["row"], {})[r["rate"]] = r
    limited_rate = next(r["rate"] for r in rows if r["rate"] != "unlimited")
    lines = [
        f"| row | F | tau | kB/event | step s | blocked s/event at unlimited | {limited_rate} "
        "steady % model | measured | Mbit/s for 2 % | no overlap | link busy all the time |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, rates in by_row.items():
        if "unlimited" not in rates or limited_rate not in rates or not name.startswith("wire-"):
            continue
        x = floors(rates["unlimited"], rates[limited_rate], h, tau, step)
        lines.append(
            f"| {x['row']} | {x['F']} | {x['tau']} | {x['kB/event']:.1f} | {x['t']:.3f} | "
            f"{x['c']:.4f} | {100 * x['predicted']:.1f} | {100 * x['measured']:.1f} | "
            f"{mbit(x['b2'])} | {mbit(x['blocking'])} | {mbit(x['physical'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "json", help="a benchmarks/testbeds/wan.py --json file with unlimited and one limited rate"
    )
    parser.add_argument(
        "--h-base", type=int, default=10, help="the run's --h-base (H of the DiLoCo rows)"
    )
    parser.add_argument("--overlap-steps", type=int, default=3, help="the run's --overlap-steps")
    parser.add_argument(
        "--step-seconds", type=float, help="a stated step time instead of the measured one"
    )
    args = parser.parse_args(argv)
    with open(args.json) as f:
        rows = json.load(f)
    try:
        print(table(rows, args.h_base, args.overlap_steps, args.step_seconds))
    except StopIteration:
        parser.exit(
            2,
            f"link_floor: {args.json} holds no limited rate: run wan.py with "
            "--rates unlimited 100mbit\n",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
