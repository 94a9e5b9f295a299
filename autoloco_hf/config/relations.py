"""The rules that relate fields: checked once every field has its type and its default.

Each check refuses a combination of fields that cannot run, naming the field to change.
They read the config and change nothing in it, except the speeds, which they parse into lists.
"""

from __future__ import annotations

import typing

from autoloco_hf.config.choices import (
    BLOCKWISE_WIRES,
    GRID_WIRES,
    LOSSY_WIRES,
    MAX_TOPK_BLOCK,
    CodecKernel,
    Method,
    Overlap,
    Pacing,
    WireDtype,
)
from autoloco_hf.config.fields import _fail, _speed_changes, _speed_list

if typing.TYPE_CHECKING:
    from autoloco_hf.config.autoloco_config import AutoLoCoConfig


def check_relations(config: AutoLoCoConfig) -> None:
    """Every rule below, in this order: the first refusal is the one raised."""
    check_horizon_domain(config)
    check_outer_step(config)
    check_communication(config)
    check_overlap(config)
    check_fragments(config)
    check_pacing(config)


def check_horizon_domain(config: AutoLoCoConfig) -> None:
    # else the token mapper rounds H_base itself away (docs/algorithm.md#token-mapper)
    if config.h_base % config.q_h:
        divisor = next(
            q for q in range(min(config.q_h, config.h_base), 0, -1) if config.h_base % q == 0
        )
        _fail("q_h", config.q_h, f"it must divide h_base={config.h_base} (e.g. q_h={divisor})")
    if config.h_min % config.q_h:  # else a reduction or fallback executes a horizon off the grid
        nearest = max(config.h_min // config.q_h, 1) * config.q_h
        _fail(
            "h_min",
            config.h_min,
            f"it must be a multiple of q_h={config.q_h} (e.g. h_min={nearest})",
        )
    if config.h_min > config.h_base:
        _fail(
            "h_min",
            config.h_min,
            f"it must not exceed h_base={config.h_base} (h_min <= h_base <= h_max)",
        )
    if config.h_max < config.h_base:
        _fail(
            "h_max",
            config.h_max,
            f"it must be at least h_base={config.h_base} (h_min <= h_base <= h_max)",
        )


def check_outer_step(config: AutoLoCoConfig) -> None:
    if config.mu_min > config.mu_max:
        _fail("mu_min", config.mu_min, f"it must not exceed mu_max={config.mu_max}")
    if (
        config.method == Method.AUTOLOCO
        and not config.mu_min <= config.outer_momentum <= config.mu_max
    ):
        _fail(
            "outer_momentum",
            config.outer_momentum,
            f"AutoLoCo needs mu_min <= outer_momentum <= mu_max = [{config.mu_min}, "
            f"{config.mu_max}] (docs/algorithm.md#outer-correction)",
        )


def check_communication(config: AutoLoCoConfig) -> None:
    if config.codec_kernel == CodecKernel.COMPILED and config.wire_dtype.value not in GRID_WIRES:
        _fail(
            "codec_kernel",
            config.codec_kernel.value,
            f"the compiled kernel computes the codes of the {', '.join(GRID_WIRES)} wires, not "
            f"wire_dtype={config.wire_dtype.value!r}: set "
            "codec_kernel='eager' or one of those wires",
        )
    if config.error_feedback and config.wire_dtype == WireDtype.FP32:
        lossy = ", ".join(LOSSY_WIRES)
        _fail(
            "error_feedback",
            True,
            f"it only applies to a lossy wire: set wire_dtype to one of {lossy}",
        )
    if config.topk_fraction is not None and not config.wire_dtype.blockwise:
        _fail(
            "topk_fraction",
            config.topk_fraction,
            "it sparsifies a blockwise wire: set wire_dtype to one of "
            f"{BLOCKWISE_WIRES}, or topk_fraction=None",
        )
    if config.topk_fraction is not None and config.int8_block_size > MAX_TOPK_BLOCK:
        _fail(
            "int8_block_size",
            config.int8_block_size,
            "with topk_fraction the offsets in a block travel as 16 bits: use "
            f"int8_block_size <= {MAX_TOPK_BLOCK}",
        )
    if (
        config.ranks_per_worker > 1
        and not config.hierarchical_sync
        and config.map_tokens
        and config.method == Method.AUTOLOCO
    ):
        # each outer group would count only its own ranks' tokens and could map them to another
        # horizon than the worker's other groups, splitting the worker
        # (docs/algorithm.md#worker-groups)
        _fail(
            "hierarchical_sync",
            False,
            "with ranks_per_worker > 1 only the hierarchical layout sums the token counts over "
            "the worker: keep hierarchical_sync=True or set map_tokens=False",
        )


def check_overlap(config: AutoLoCoConfig) -> None:
    """Overlap needs intervals and a merge due before the next boundary."""
    if config.overlap == Overlap.NONE:
        return
    if not config.is_interval_method:
        _fail(
            "overlap",
            config.overlap,
            "DDP averages gradients every step: use overlap='none' or an interval method",
        )
    if config.overlap == Overlap.DELAYED and config.overlap_steps >= config.min_interval_steps:
        _fail(
            "overlap_steps",
            config.overlap_steps,
            "the merge must land inside the next interval, whose shortest length for "
            f"method={config.method} is {config.min_interval_steps} steps: use overlap_steps < "
            f"{config.min_interval_steps}",
        )


def check_fragments(config: AutoLoCoConfig) -> None:
    """Fragments need intervals, one whole-model start point,
    and room for every fragment's sync (and merge)."""
    if config.fragments == 1:
        return
    if not config.is_interval_method:
        _fail("fragments", config.fragments, "DDP averages gradients every step: use fragments=1")
    refusals = {
        "overlap": (
            config.overlap == Overlap.EAGER,
            "eager overlap does not combine with fragments > 1: use overlap='delayed'",
        ),
    }
    for name, (refused, fix) in refusals.items():
        if refused:
            _fail(name, getattr(config, name), f"with fragments={config.fragments}, {fix}")
    needed = config.fragments * (config.fragment_delay + 1)
    if config.min_interval_steps < needed:
        _fail(
            "fragments",
            config.fragments,
            f"each of the {config.fragments} fragments needs {config.fragment_delay + 1} step(s) "
            f"of the interval (its sync{' and its merge' if config.fragment_delay else ''}), so "
            f"intervals must be at least {needed} steps but method={config.method} plans "
            f"{config.min_interval_steps}: use fragments <= "
            f"{max(config.min_interval_steps // (config.fragment_delay + 1), 1)} or "
            "longer intervals",
        )


def check_pacing(config: AutoLoCoConfig) -> None:
    """Speeds as positive numbers, one list, and the speed changes of those workers
    (docs/algorithm.md#pacing)."""
    if config.worker_speeds is not None:
        config.worker_speeds = _speed_list(config.worker_speeds)
    if config.speed_changes is not None:
        if config.worker_speeds is None:
            _fail(
                "speed_changes",
                config.speed_changes,
                "it changes worker_speeds: set worker_speeds too",
            )
        config.speed_changes = _speed_changes(config.speed_changes, len(config.worker_speeds))
    if (
        config.pacing == Pacing.BUDGET
        and config.ranks_per_worker > 1
        and not config.hierarchical_sync
    ):
        _fail(
            "hierarchical_sync",
            config.hierarchical_sync,
            "pacing='budget' with ranks_per_worker > 1 agrees a worker's speed over its ranks in "
            "the hierarchical sync: use hierarchical_sync=True (the default)",
        )
