"""``autoloco plan``: what a recipe's run will execute and save, before renting machines.

$ autoloco plan --recipe c4
autoloco: 500x7, 550x5, 600x5, 650x5, 700x5, 750x45, 250x1
syncs: 73 (diloco: 100, -27.0%)
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from autoloco_hf.algorithm.preview import preview_run, run_length
from autoloco_hf.algorithm.rules import get_rule, rule_names
from autoloco_hf.algorithm.schedule import warmup_cosine, warmup_linear
from autoloco_hf.config import (
    METHODS,
    RECIPE_SCHEDULES,
    RECIPES,
    WIRE_DTYPES,
    AutoLoCoConfig,
    ConfigError,
    Method,
    WireDtype,
)
from autoloco_hf.sync.pacing import BudgetPacer
from autoloco_hf.usage import non_negative_int, positive_int, usage_error
from autoloco_hf.wire.accounting import outer_state_bytes_per_rank, payload_bytes

# Trainable parameters of each recipe's model, for the payload estimate: the C4 recipe's LLaMA-style
# model (recipes/pretrain_c4.py, 32k vocabulary) and Llama-3.1-8B (the SFT recipe).
RECIPE_PARAMS = {"c4": 214_983_680, "sft": 8_030_261_248}
# the built-in rules' default H_max, from the rules
# themselves so that the help cannot drift from them
RULE_H_MAX_FACTORS = ", ".join(f"{name} {get_rule(name).h_max_factor:g}" for name in rule_names())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--recipe", choices=sorted(RECIPES), default="c4", help="the paper recipe to start from"
    )
    parser.add_argument("--method", default=Method.AUTOLOCO, help=", ".join(METHODS))
    parser.add_argument(
        "--controller",
        help="AutoLoCo's horizon rule by registered name: paper (default), descent, or one "
        "--rule-module registers (docs/algorithm.md#rule-plugins)",
    )
    parser.add_argument(
        "--rule-options", help="the rule's options as NAME=VALUE,... or JSON, e.g. gain=0.9"
    )
    parser.add_argument(
        "--rule-module", help="module to import first: it registers rules by name (@register_rule)"
    )
    parser.add_argument("--steps", type=positive_int, help="training budget in optimizer steps")
    parser.add_argument("--warmup", type=non_negative_int, help="inner-LR warm-up steps")
    parser.add_argument("--schedule", choices=["cosine", "linear"], help="decay after warm-up")
    parser.add_argument("--h-base", type=positive_int, help="recipe horizon H_base (steps)")
    parser.add_argument(
        "--q-h", type=positive_int, help="horizon granularity q_H (default H_base/10)"
    )
    parser.add_argument(
        "--h-max",
        type=positive_int,
        help="largest horizon (default: the rule's factor x H_base, " + RULE_H_MAX_FACTORS + ")",
    )
    parser.add_argument(
        "--params",
        type=float,
        help="model parameters, for the payload estimate (default: the recipe's model, "
        "215M for c4, 8.03B for sft)",
    )
    parser.add_argument(
        "--wire-dtype",
        default=WireDtype.BF16,
        choices=WIRE_DTYPES,
        help="wire format of the payload",
    )
    parser.add_argument(
        "--ranks-per-worker",
        type=positive_int,
        default=1,
        help="ranks sharding each worker's model (FSDP2): outer state and "
        "bytes per rank fall by it",
    )
    parser.add_argument(
        "--speeds",
        help="the workers' relative speeds, comma-separated (e.g. 1,1,1,0.5): preview "
        "pacing='budget' against lockstep, each worker's inner steps per interval and the run's "
        "time (docs/algorithm.md#pacing)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    schedule_cfg = dict(RECIPE_SCHEDULES[args.recipe])
    if args.steps is not None:
        schedule_cfg["total_steps"] = args.steps
    if args.warmup is not None:
        schedule_cfg["warmup_steps"] = args.warmup
    if args.schedule is not None:
        schedule_cfg["schedule"] = args.schedule
    overrides = {"method": args.method}
    for name in ("controller", "rule_options", "rule_module"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.h_base is not None:  # q_h and h_max follow H_base unless given
        overrides.update(h_base=args.h_base, q_h=None, h_max=None)
    if args.q_h is not None:
        overrides["q_h"] = args.q_h
    if args.h_max is not None:
        overrides["h_max"] = args.h_max
    given = [
        name
        for name in ("controller", "rule_options", "rule_module", "q_h", "h_max")
        if getattr(args, name) is not None
    ]
    try:
        config = AutoLoCoConfig.for_recipe(args.recipe, **overrides)
        # a flag typed under a method where it does nothing, even at its default
        config.check_given(given)
    # a field that does nothing here names its flag's field, e.g. controller
    except ConfigError as err:
        usage_error(str(err), "autoloco plan")
    # the controller's horizons live on the q_H grid (docs/algorithm.md#notation):
    # H_max would never be reached
    if config.h_max % config.q_h:
        below = config.h_max // config.q_h * config.q_h
        usage_error(
            f"--h-max {config.h_max} is not a multiple of q_H={config.q_h}: use "
            f"{below} or {below + config.q_h}",
            "autoloco plan",
        )
    total, warmup = schedule_cfg["total_steps"], schedule_cfg["warmup_steps"]
    if warmup >= total:  # name only the flags given: the other value is the recipe's
        if args.warmup is None:
            usage_error(
                f"--steps {total}: the {args.recipe} recipe warms up for {warmup} steps; "
                f"pass --steps above {warmup}, or a shorter --warmup",
                "autoloco plan",
            )
        given = (
            f"--steps {total}"
            if args.steps is not None
            else f"the {args.recipe} recipe's {total} steps"
        )
        usage_error(f"--warmup {warmup}: pass a warm-up below {given}", "autoloco plan")
    if args.params is None:
        args.params = RECIPE_PARAMS[args.recipe]
    if not args.params > 0:
        usage_error(
            f"--params {args.params:g}: pass a positive parameter count, e.g. 8.03e9",
            "autoloco plan",
        )
    make = warmup_cosine if schedule_cfg["schedule"] == "cosine" else warmup_linear
    schedule = make(1.0, warmup, total)
    result = preview_run(config, schedule, warmup)
    diloco_syncs = math.ceil(total / config.h_base)  # DiLoCo at the same H_base
    params = int(args.params)
    payload = payload_bytes(result.syncs, params, args.wire_dtype)
    diloco_payload = payload_bytes(diloco_syncs, params, WireDtype.BF16)
    summary = {
        "recipe": args.recipe,
        "method": config.method,
        "steps": total,
        "warmup_steps": warmup,
        "h_base": config.h_base,
        "q_h": config.q_h,
        "h_max": config.h_max,
        "intervals": result.intervals,
        "run_length": run_length(result.intervals),
        "syncs": result.syncs,
        "diloco_syncs": diloco_syncs,
        "sync_reduction": 1.0 - result.syncs / diloco_syncs,
        "payload_bytes_per_worker": payload,
        "diloco_bf16_payload_bytes_per_worker": diloco_payload,
        "payload_reduction": 1.0 - payload / diloco_payload,
        "ranks_per_worker": args.ranks_per_worker,
        "outer_state_bytes_per_rank": outer_state_bytes_per_rank(
            params, args.ranks_per_worker, config.uses_nesterov_outer, config.error_feedback
        ),
    }
    if args.speeds is not None:
        try:
            speeds = AutoLoCoConfig(worker_speeds=args.speeds).worker_speeds
        except ConfigError as err:
            usage_error(
                str(err).replace("AutoLoCoConfig.worker_speeds", "--speeds"), "autoloco plan"
            )
        summary["pacing"] = pacing_preview(speeds, result.intervals)
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{config.method}: {summary['run_length']}")
    print(
        f"syncs: {result.syncs} (diloco: {diloco_syncs}, {-100 * summary['sync_reduction']:+.1f}%)"
    )
    print(
        f"payload per worker at {args.wire_dtype}: {payload / 2**30:.1f} GiB for {_count(params)} "
        f"parameters (diloco bf16: {diloco_payload / 2**30:.1f} GiB, "
        f"{-100 * summary['payload_reduction']:+.1f}%)"
    )
    print(
        "outer state per rank (FP32 theta_t + momentum, "
        f"ranks_per_worker={args.ranks_per_worker}): "
        f"{summary['outer_state_bytes_per_rank'] / 2**30:.2f} GiB"
    )
    if args.speeds is not None:
        pace = summary["pacing"]
        print(
            f"pacing='budget' at speeds {args.speeds}: inner steps per interval of "
            f"{pace['h_step']} steps: {', '.join(map(str, pace['worker_steps']))} (lockstep: "
            f"{pace['h_step']} each); run time {pace['budget_time']:,.0f} vs lockstep "
            f"{pace['lockstep_time']:,.0f} (speed-1 steps), "
            f"{pace['lockstep_time'] / pace['budget_time']:.2f}x shorter"
        )
    return 0


def pacing_preview(speeds: list[float], intervals: list[int]) -> dict[str, Any]:
    """Budget pacing against lockstep at constant ``speeds`` over the planned ``intervals``
    (docs/algorithm.md#pacing-mechanism).

    The first interval runs in lockstep (no speed measured
    yet); times are in steps of a speed-1 worker.
    """
    pacer = BudgetPacer(
        len(speeds), range(len(speeds)), straggler_fraction=0.5, straggler_intervals=1
    )
    lockstep_time = sum(h / min(speeds) for h in intervals)
    budget_time = intervals[0] / min(speeds)
    pacer.adopt(speeds)
    for h in intervals[1:]:
        budget_time += max(n / v for n, v in zip(pacer.split(h), speeds))
    typical = intervals[min(1, len(intervals) - 1)]
    return {
        "speeds": speeds,
        "h_step": typical,
        "worker_steps": pacer.split(typical),
        "lockstep_time": lockstep_time,
        "budget_time": budget_time,
    }


def _count(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"
