"""The five plots that compare run folders: loss against steps and bytes, horizons, outer values.

``autoloco report`` draws them beside its tables, and the benchmarks beside theirs, for the
runs that :func:`~autoloco_hf.state.run_folder.find_runs` reads back.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from autoloco_hf.config import Method
from autoloco_hf.state.run_folder import Run

PLOTS = {
    "loss_vs_step.png": "Training loss vs step",
    "loss_vs_bytes.png": "Training loss vs bytes communicated",
    "horizon.png": "Horizon trajectory",
    "outer_mu_eta.png": "Outer momentum mu_t and outer learning rate eta_t",
    "drift_coherence.png": "Drift energy D_t and coherence C_t",
}


def write_plots(runs: Sequence[Run], out_dir: str) -> list[str]:
    """The five comparison plots as PNGs in ``out_dir``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    from cycler import cycler

    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    # past the palette's 10 colors, lines change style rather than repeat a color
    with matplotlib.rc_context(
        {"axes.prop_cycle": cycler(linestyle=["-", "--", ":"]) * cycler(color=colors)}
    ):
        return _write_plots(runs, out_dir)


def _write_plots(runs: Sequence[Run], out_dir: str) -> list[str]:
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    interval_runs = [r for r in runs if r.intervals and r.summary.get("method") != Method.DDP]

    def save(fig, name: str) -> None:
        fig.suptitle(PLOTS[name])
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        ax.plot([s["step"] for s in run.steps], run.smoothed_loss, label=run.name, lw=1.2)
    ax.set(xlabel="step", ylabel="training loss (moving average, 2% of steps)")
    _zoom_on_tail(ax, runs)
    ax.legend()
    save(fig, "loss_vs_step.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        points = [
            (s["payload_bytes"] / 2**20, loss)
            for s, loss in zip(run.steps, run.smoothed_loss)
            if s["payload_bytes"] > 0
        ]
        if points:
            ax.plot(*zip(*points), label=run.name, lw=1.2)
    ax.set(
        xscale="log",
        xlabel="payload communicated per worker (MiB, log scale)",
        ylabel="training loss (moving average)",
    )
    _zoom_on_tail(ax, runs)
    # a one-worker run sends nothing: no curve, so no legend (matplotlib warns on an empty one)
    if ax.lines:
        ax.legend()
    save(fig, "loss_vs_bytes.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    cut_any = False
    for run in interval_runs:
        xs, ys, cut = horizon_series(run.intervals)
        (line,) = ax.step(xs, ys, where="post", label=f"{run.name} ({len(run.intervals)} syncs)")
        # drawn apart, not as a drop of H: the budget cut it, not the controller
        for start, h in cut:
            ax.plot([start, start + h], [h, h], ls=":", marker="x", color=line.get_color())
        cut_any = cut_any or bool(cut)
    if cut_any:
        ax.plot(
            [],
            [],
            ls=":",
            marker="x",
            color="gray",
            label="cut short by the step budget (no decision)",
        )
    ax.set(xlabel="step", ylabel="H_step (local steps per interval)")
    ax.legend()
    save(fig, "horizon.png")

    def two_panels(
        top: str, bottom: str, top_label: str, bottom_label: str, name: str, log_top: bool = False
    ) -> None:
        fig, (ax_top, ax_bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
        for run in interval_runs:
            starts = [r["start_step"] for r in run.intervals]
            ax_top.plot(starts, [r[top] for r in run.intervals], marker=".", label=run.name)
            ax_bottom.plot(starts, [r[bottom] for r in run.intervals], marker=".", label=run.name)
        ax_top.set(yscale="log" if log_top else "linear", ylabel=top_label)
        ax_bottom.set(xlabel="interval start step", ylabel=bottom_label)
        ax_top.legend()
        save(fig, name)

    two_panels("mu", "eta", "outer momentum mu_t", "outer LR eta_t", "outer_mu_eta.png")
    two_panels(
        "drift_energy",
        "coherence",
        "drift energy D_t",
        "coherence C_t (0..N)",
        "drift_coherence.png",
        log_top=True,
    )
    return list(PLOTS)


def truncated(intervals: Sequence[dict[str, Any]], index: int) -> bool:
    """Whether interval ``index`` was cut short by the step budget rather than chosen.

    The controller records it (assessment ``truncated``); a fixed-horizon
    policy does not, so its last interval counts when shorter than the one before.
    """
    record = intervals[index]
    if record.get("assessment") == "truncated":
        return True
    last = index == len(intervals) - 1
    return (
        last
        and index > 0
        and record.get("assessment") == "fixed"
        and record["h_step"] < intervals[index - 1]["h_step"]
    )


def horizon_series(
    intervals: Sequence[dict[str, Any]],
) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """The chosen horizons as a step curve (x, y, closed at the end
    of the last chosen interval) and the cut ones ((start, h))."""
    chosen = [r for i, r in enumerate(intervals) if not truncated(intervals, i)]
    cut = [
        (r["start_step"], r["h_step"]) for i, r in enumerate(intervals) if truncated(intervals, i)
    ]
    xs = [r["start_step"] for r in chosen]
    ys = [r["h_step"] for r in chosen]
    if chosen:
        xs.append(chosen[-1]["start_step"] + chosen[-1]["h_step"])
        ys.append(chosen[-1]["h_step"])
    return xs, ys, cut


def _zoom_on_tail(ax: Any, runs: Sequence[Run]) -> str | None:
    """Clip the y axis above the early-training spike so the
    differences at the end stay visible, and say so on the plot.

    Returns the note drawn (None when nothing is clipped).
    """
    tails = [loss for r in runs for loss in r.smoothed_loss[len(r.smoothed_loss) // 10 :]]
    if not tails:
        return None
    low, high = min(tails), max(tails)
    pad = 0.05 * (high - low) or 0.05 * max(abs(high), 1.0)  # a flat tail still gets a visible band
    top = high + pad
    ax.set_ylim(low - pad, top)
    everything = [loss for r in runs for loss in r.smoothed_loss]
    above = [r for r in runs if any(loss > top for loss in r.smoothed_loss)]
    if not above:
        return None
    last_clipped = max(
        s["step"] for r in above for s, loss in zip(r.steps, r.smoothed_loss) if loss > top
    )
    note = (
        f"y axis clipped at {top:.3g}: steps <= {last_clipped:,} reach up to "
        f"{max(everything):.3g} (off the top)"
    )
    ax.text(
        0.98, 0.98, note, transform=ax.transAxes, ha="right", va="top", fontsize=8, color="dimgray"
    )
    return note
