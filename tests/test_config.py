"""Configuration: defaults, validation, presets (docs/algorithm.md#notation, 4, 5, 6, 7)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoloco_hf import AutoLoCoConfig, ConfigError
from autoloco_hf.config import (
    RECIPE_SCHEDULES,
    RECIPES,
    Method,
    Overlap,
    ReferenceClip,
    WireDtype,
    field_types,
)


def test_spec_defaults() -> None:
    """The spec's default constants (sections 3, 4, 5): the
    paper rule's (the default rule is descent, below)."""
    c = AutoLoCoConfig(controller="paper")
    assert c.method == "autoloco" and c.h_base == 500
    assert (c.q_h, c.h_min, c.h_max) == (50, 500, 750)
    assert (c.outer_lr, c.outer_momentum, c.mu_min, c.mu_max, c.kappa_max, c.eps) == (
        0.7,
        0.7,
        0.5,
        0.9,
        1.5,
        1e-8,
    )
    assert (c.adjust_momentum, c.scale_outer_lr, c.normalize_pseudo_grad) == (True, True, False)
    assert (c.token_calibration_intervals, c.token_ema_beta) == (3, 0.9)
    o = c.rule_options  # the paper rule's
    assert o.calibration_delay_steps == 0
    assert (
        o.calibration_intervals,
        o.recalibration_intervals,
        o.variability_intervals,
        o.monitoring_holdoff,
    ) == (
        2,
        1,
        3,
        1,
    )
    assert (o.ref_ema_alpha, o.history_size, o.sigma_floor) == (0.2, 16, 0.10)
    assert (o.k_moderate, o.k_severe, o.moderate_confirmations) == (2.0, 4.0, 2)
    assert (o.min_history, o.candidate_max_intervals) == (3, 2)
    assert (o.reduce_moderate, o.reduce_severe, o.gamma_inc) == (1.2, 1.5, 1.15)
    assert (o.rejected_bound_release, o.rejected_bound_max_age) == (0.90, 20)
    assert o.increase_requires_support is False
    assert (c.qsr_alpha, c.qsr_gamma, c.linear_increment) == (None, 2.0, 10)
    assert (c.wire_dtype, c.int8_block_size) == ("fp32", 4096)


@pytest.mark.parametrize(
    "h_base, q_h, h_max",
    [
        (500, 50, 750),
        (100, 10, 150),
        (20, 2, 30),
        (250, 25, 375),
        (10, 1, 15),
        (5, 1, 7),
        (1, 1, 1),
        (45, 3, 66),
        (25, 1, 37),
    ],
)
def test_horizon_defaults_resolve(h_base: int, q_h: int, h_max: int) -> None:
    """q_H = H_base / 10 (the largest divisor of H_base up to that); H_min = H_base;
    H_max = 1.5 H_base rounded down to a multiple of q_H (docs/algorithm.md#notation), for the paper
    rule; the default rule's is 2 H_base."""
    c = AutoLoCoConfig(h_base=h_base, controller="paper")
    assert (c.q_h, c.h_min, c.h_max) == (q_h, h_base, h_max)
    default = AutoLoCoConfig(h_base=h_base)
    assert (default.q_h, default.h_min, default.h_max) == (
        q_h,
        h_base,
        max(h_base, (2 * h_base // q_h) * q_h),
    )


def test_default_q_h_always_divides_h_base() -> None:
    """H_base must be an admissible horizon (a multiple of q_H), or the token mapper rounds it away
    (docs/algorithm.md#token-mapper)."""
    for h_base in range(1, 1001):
        c = AutoLoCoConfig(h_base=h_base)
        assert h_base % c.q_h == 0 and 10 * c.q_h <= max(10, h_base)


@pytest.mark.parametrize("h_base, q_h", [(500, 30), (500, 1000), (25, 2), (100, 15)])
def test_h_base_must_be_a_multiple_of_q_h(h_base: int, q_h: int) -> None:
    with pytest.raises(ConfigError, match=r"AutoLoCoConfig\.q_h="):
        AutoLoCoConfig(h_base=h_base, q_h=q_h)


def test_explicit_horizon_fields_are_kept() -> None:
    c = AutoLoCoConfig(h_base=500, q_h=25, h_min=250, h_max=1000)
    assert (c.q_h, c.h_min, c.h_max) == (25, 250, 1000)
    assert AutoLoCoConfig(h_base=500, q_h=25, controller="paper").h_max == 750


@pytest.mark.parametrize(
    "method, momentum",
    [("diloco", 0.9), ("autoloco", 0.5), ("qsr", 0.7), ("linear", 0.7), ("ddp", 0.7)],
)
def test_outer_momentum_default_depends_on_method(method: str, momentum: float) -> None:
    """docs/algorithm.md#outer-correction, 6: DiLoCo's baseline
    momentum is 0.9, AutoLoCo's mu_base its rule's (descent: 0.5)."""
    assert AutoLoCoConfig(method=method).outer_momentum == momentum
    assert (
        AutoLoCoConfig(method=method, outer_momentum=0.7).outer_momentum == 0.7
    )  # the fair comparator, or the default


@pytest.mark.parametrize(
    "field, value",
    [
        ("method", "local_sgd"),
        ("method", None),
        ("h_base", 0),
        ("h_base", -500),
        ("h_base", 500.0),
        ("h_base", True),
        ("q_h", 0),
        ("q_h", 2.5),
        ("h_min", 0),
        ("h_max", "750"),
        ("outer_lr", 0.0),
        ("outer_lr", math.nan),
        ("outer_lr", math.inf),
        ("outer_lr", True),
        ("outer_momentum", 1.0),
        ("outer_momentum", 1.2),
        ("outer_momentum", -0.1),
        ("mu_min", 1.0),
        ("mu_max", math.nan),
        ("kappa_max", 0.9),
        ("eps", 0.0),
        ("token_calibration_intervals", 0),
        ("token_ema_beta", 1.0),
        ("warmup_steps", -1),
        ("warmup_steps", 1.5),
        ("qsr_alpha", 0.0),
        ("qsr_gamma", -2.0),
        ("linear_increment", 0),
        ("wire_dtype", "fp16"),
        ("int8_block_size", 0),
        ("bucket_size_mb", 0),
        ("ranks_per_worker", 0),
        ("ranks_per_worker", True),
        ("sync_timeout_s", 0),
        ("sync_timeout_s", math.inf),
        ("sync_timeout_s", "60"),
        ("max_consecutive_invalid", 0),
        ("max_consecutive_invalid", 2.0),
        ("eps", 2.0),
        ("overlap", "sometimes"),
        ("overlap_steps", -1),
        ("overlap_mix", 1.0),
    ],
)
def test_invalid_field_is_named(field: str, value: object) -> None:
    """Every field is validated when the config is built; the error names the field."""
    with pytest.raises(ConfigError, match=rf"AutoLoCoConfig\.{field}="):
        AutoLoCoConfig(**{field: value})


@pytest.mark.parametrize(
    "option, value",
    [
        ("monitoring_holdoff", 0),
        ("ref_ema_alpha", 1.5),
        ("history_size", 0),
        ("history_size", False),
        ("min_history", 0),
        ("candidate_max_intervals", 0),
        ("sigma_floor", 0.0),
        ("sigma_floor", math.nan),
        ("k_moderate", 0.0),
        ("moderate_confirmations", 0),
        ("reduce_moderate", 1.0),
        ("reduce_severe", 0.5),
        ("gamma_inc", 0.99),
        ("rejected_bound_release", 0.0),
        ("rejected_bound_release", 1.01),
        ("rejected_bound_max_age", 0),
        ("k_severe", "five"),
        ("reference_clip", "middle"),
        ("rejected_bound_min_age", -1),
        ("candidate_max_quanta", -1),
        ("calibration_delay_steps", -1),
        ("calibration_intervals", 0),
        ("recalibration_intervals", 0),
        ("variability_intervals", -1),
        ("increase_requires_support", 1),
        ("cumulative_check", None),
        ("cumulative_check", "yes"),
    ],
)
def test_invalid_rule_option_is_named_with_its_rule(option: str, value: object) -> None:
    """The paper rule's options are validated against
    PaperOptions' types and ranges: the error names both."""
    with pytest.raises(
        ConfigError, match=rf"^rule_options\['{option}'\]=.* of rule 'paper' is invalid: "
    ):
        AutoLoCoConfig(controller="paper", rule_options={option: value})


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(h_base=500, h_min=600), "h_min"),
        (dict(h_base=500, h_max=400), "h_max"),
        (dict(mu_min=0.8, mu_max=0.6), "mu_min"),
        (dict(controller="paper", rule_options={"k_moderate": 3.0, "k_severe": 2.0}), "k_severe"),
        (
            dict(controller="paper", rule_options={"history_size": 3, "min_history": 4}),
            "min_history",
        ),
        # AutoLoCo's mu_base must lie in [mu_min, mu_max]
        (dict(outer_momentum=0.95), "outer_momentum"),
        (dict(outer_momentum=0.3), "outer_momentum"),
        (dict(method="diloco", outer_momentum=1.0), "outer_momentum"),
        (dict(error_feedback=True), "error_feedback"),  # needs a lossy wire
        (dict(topk_fraction=0.02), "topk_fraction"),  # sparsifies a blockwise wire, not fp32
        (dict(wire_dtype="bf16", topk_fraction=0.02), "topk_fraction"),
        # 16-bit offsets
        (dict(wire_dtype="int2", topk_fraction=0.02, int8_block_size=70_000), "int8_block_size"),
        (
            dict(codec_kernel="compiled"),
            "codec_kernel='compiled' is invalid: the compiled kernel computes the codes",
        ),
        (dict(wire_dtype="int8", codec_kernel="compiled"), "codec_kernel"),  # int8 has one kernel
        # the flat worker-group layout counts tokens per outer
        # group: groups could map them to different horizons
        (dict(ranks_per_worker=2, hierarchical_sync=False), "hierarchical_sync"),
    ],
)
def test_inconsistent_fields_are_named(kwargs: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        AutoLoCoConfig(**kwargs)


@pytest.mark.parametrize(
    "field",
    [
        "adjust_momentum",
        "scale_outer_lr",
        "normalize_pseudo_grad",
        "adaptive_horizon",
        "map_tokens",
        "error_feedback",
        "outer_on_cpu",
        "hierarchical_sync",
    ],
)
@pytest.mark.parametrize("value", [1, 0, "false", None])
def test_switches_must_be_bools(field: str, value: object) -> None:
    """A switch given as a number or a string (``"false"`` is
    truthy) fails instead of silently turning on."""
    with pytest.raises(ConfigError, match=rf"AutoLoCoConfig\.{field}="):
        AutoLoCoConfig(**{field: value})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(h_base=0), "AutoLoCoConfig.h_base=0 is invalid: it must be >= 1"),
        (dict(outer_lr=0.0), "AutoLoCoConfig.outer_lr=0.0 is invalid: it must be > 0.0"),
        (
            dict(token_ema_beta=1.0),
            "AutoLoCoConfig.token_ema_beta=1.0 is invalid: it must be in [0.0, 1.0)",
        ),
        (dict(eps=2.0), "AutoLoCoConfig.eps=2.0 is invalid: it must be in (0.0, 1.0]"),
        (dict(q_h=2.5), "AutoLoCoConfig.q_h=2.5 is invalid: pass an integer"),
        (dict(outer_lr=math.nan), "AutoLoCoConfig.outer_lr=nan is invalid: pass a finite number"),
        (
            dict(controller="paper", rule_options={"cumulative_check": "yes"}),
            "rule_options['cumulative_check']='yes' of rule 'paper' is invalid: pass true or false",
        ),
        (
            dict(wire_dtype="fp16"),
            "AutoLoCoConfig.wire_dtype='fp16' is invalid: use one of fp32, "
            "bf16, int8, int4, fp4, int2",
        ),
        (
            dict(topk_fraction=0.0),
            "AutoLoCoConfig.topk_fraction=0.0 is invalid: it must be in (0.0, 1.0]",
        ),
        (
            dict(topk_fraction=1.5),
            "AutoLoCoConfig.topk_fraction=1.5 is invalid: it must be in (0.0, 1.0]",
        ),
        (dict(int8_block_size=-3), "AutoLoCoConfig.int8_block_size=-3 is invalid: it must be >= 1"),
        (
            dict(overlap="x"),
            "AutoLoCoConfig.overlap='x' is invalid: use one of none, delayed, eager",
        ),
    ],
)
def test_a_field_error_names_field_value_and_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        AutoLoCoConfig(**kwargs)
    assert str(err.value) == message


def test_every_field_has_help_and_every_number_a_range() -> None:
    """The metadata that one loop checks and AutoLoCoArguments
    shows: a field added without it fails here."""
    kinds = field_types(AutoLoCoConfig)
    for f in dataclasses.fields(AutoLoCoConfig):
        assert len(f.metadata["help"]) > 20, f.name
        numeric = kinds[f.name][0] in (int, float)
        assert (f.metadata["range"] is not None) == numeric, f.name
        assert f"        {f.name}:" in AutoLoCoConfig.__doc__  # help(AutoLoCoConfig) lists it


def test_enum_fields_become_enums() -> None:
    c = AutoLoCoConfig(
        wire_dtype="int8",
        controller="paper",
        rule_options={"reference_clip": "zero"},
        overlap="eager",
    )
    assert (
        type(c.method),
        type(c.wire_dtype),
        type(c.rule_options.reference_clip),
        type(c.overlap),
    ) == (
        Method,
        WireDtype,
        ReferenceClip,
        Overlap,
    )


def test_the_flat_worker_group_layout_needs_no_token_mapping() -> None:
    assert not AutoLoCoConfig(
        ranks_per_worker=2, hierarchical_sync=False, map_tokens=False
    ).map_tokens
    assert (
        AutoLoCoConfig(
            method="diloco", ranks_per_worker=2, hierarchical_sync=False
        ).ranks_per_worker
        == 2
    )


def test_config_error_is_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_boundary_values_are_accepted() -> None:
    assert AutoLoCoConfig(method="diloco", outer_momentum=0.0).outer_momentum == 0.0
    assert AutoLoCoConfig(method="diloco", outer_momentum=0.95).outer_momentum == 0.95
    assert AutoLoCoConfig(error_feedback=True, wire_dtype="int8").error_feedback
    c = AutoLoCoConfig(
        controller="paper",
        h_base=500,
        h_min=500,
        h_max=500,
        outer_momentum=0.6,
        mu_min=0.6,
        mu_max=0.6,
        kappa_max=1.0,
        rule_options={
            "k_moderate": 3.0,
            "k_severe": 3.0,
            "gamma_inc": 1.0,
            "rejected_bound_release": 1.0,
            "ref_ema_alpha": 0.0,
            "variability_intervals": 0,
            "history_size": 1,
            "min_history": 1,
            "candidate_max_intervals": 1,
        },
        warmup_steps=0,
    )
    assert c.h_max == 500


# ------------------------------------------------------------ dict round trip
def test_to_dict_from_dict_round_trip() -> None:
    c = AutoLoCoConfig(method="diloco", h_base=100, wire_dtype="int8", warmup_steps=65)
    d = c.to_dict()
    assert set(d) == {f.name for f in dataclasses.fields(AutoLoCoConfig)}
    assert AutoLoCoConfig.from_dict(d) == c


@pytest.mark.parametrize("method", [m.value for m in Method])
def test_every_method_round_trips_its_derived_horizon_fields(method: str) -> None:
    """q_h, h_min and h_max come back at the values they
    derived, which count as unset where nothing reads them."""
    c = AutoLoCoConfig(method=method, h_base=40)
    assert AutoLoCoConfig.from_dict(c.to_dict()) == c


def test_from_dict_rejects_unknown_fields() -> None:
    with pytest.raises(ConfigError) as err:
        AutoLoCoConfig.from_dict({"h_bse": 500, "q_hh": 5})
    assert (
        str(err.value) == "AutoLoCoConfig has no field 'h_bse' (given 500): did you mean "
        "h_base? (also unknown: q_hh)"
    )
    with pytest.raises(
        ConfigError, match=r"no field 'zzz' \(given 1\): help\(AutoLoCoConfig\) lists the fields$"
    ):
        AutoLoCoConfig.from_dict({"zzz": 1})


def test_from_dict_validates() -> None:
    with pytest.raises(ConfigError, match=r"rule_options\['k_severe'\]=1.0 of rule 'paper'"):
        AutoLoCoConfig.from_dict({"controller": "paper", "rule_options": {"k_severe": 1.0}})


# ------------------------------------------------------------------ presets
def test_recipes() -> None:
    """docs/algorithm.md#notation, 5.4: C4 (H_base 500, q_H
    50, H_max 750); SFT (100, 10, 150, normalization on)."""
    c4 = AutoLoCoConfig.for_recipe("c4")
    assert (c4.h_base, c4.q_h, c4.h_max, c4.normalize_pseudo_grad, c4.method) == (
        500,
        50,
        750,
        False,
        "autoloco",
    )
    sft = AutoLoCoConfig.for_recipe("sft")
    assert (sft.h_base, sft.q_h, sft.h_max, sft.normalize_pseudo_grad) == (100, 10, 150, True)
    assert RECIPE_SCHEDULES["c4"] == dict(total_steps=50_000, warmup_steps=1_000, schedule="cosine")
    assert RECIPE_SCHEDULES["sft"]["total_steps"] == 6_490
    assert set(RECIPES) == set(RECIPE_SCHEDULES) == {"c4", "sft"}


def test_recipe_overrides() -> None:
    c = AutoLoCoConfig.for_recipe("c4", method="diloco")
    assert (c.method, c.outer_momentum, c.h_base) == ("diloco", 0.9, 500)
    # AutoLoCo's switch: left out
    assert not AutoLoCoConfig.for_recipe("sft", method="diloco").normalize_pseudo_grad
    assert AutoLoCoConfig.for_recipe("c4", h_max=600).h_max == 600
    with pytest.raises(ConfigError, match=r"h_max=90 is invalid: it must be at least h_base=100"):
        AutoLoCoConfig.for_recipe("sft", h_max=90)


def test_unknown_recipe() -> None:
    with pytest.raises(ConfigError, match="unknown recipe 'wiki'"):
        AutoLoCoConfig.for_recipe("wiki")


@pytest.mark.parametrize(
    "variant, switches",
    [
        ("intervals_only", (False, False, False)),
        ("momentum", (True, False, False)),
        ("full", (True, True, False)),
        ("full_normalized", (True, True, True)),
    ],
)
def test_ablation_variants(variant: str, switches: tuple) -> None:
    """The paper's Table 7 ablation: switches on one by one (docs/algorithm.md#outer-correction)."""
    c = AutoLoCoConfig.ablation(variant, h_base=100)
    assert c.method == "autoloco" and c.adaptive_horizon and c.h_base == 100
    assert (c.adjust_momentum, c.scale_outer_lr, c.normalize_pseudo_grad) == switches


def test_unknown_ablation() -> None:
    with pytest.raises(ConfigError, match="unknown ablation"):
        AutoLoCoConfig.ablation("everything")


@pytest.mark.parametrize(
    "method, interval, nesterov, corrected",
    [
        ("ddp", False, False, False),
        ("diloco", True, True, False),
        ("autoloco", True, True, True),
        ("qsr", True, False, False),
        ("linear", True, False, False),
    ],
)
def test_method_properties(method: str, interval: bool, nesterov: bool, corrected: bool) -> None:
    """docs/algorithm.md#baselines: DiLoCo/AutoLoCo take a Nesterov
    outer step, QSR/Linear average, DDP has no intervals."""
    c = AutoLoCoConfig(method=method)
    assert (c.is_interval_method, c.uses_nesterov_outer, c.outer_correction_enabled) == (
        interval,
        nesterov,
        corrected,
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(worker_speeds=[1, 0, 1]),
            r"^AutoLoCoConfig\.worker_speeds=\[1, 0, 1\] is invalid: every speed must be",
        ),
        (
            dict(worker_speeds="1,-0.5"),
            r"^AutoLoCoConfig\.worker_speeds='1,-0.5' is invalid: every speed must be",
        ),
        (
            dict(worker_speeds=[1, math.inf]),
            r"^AutoLoCoConfig\.worker_speeds=.* every speed must be a finite",
        ),
        (
            dict(worker_speeds="1,fast"),
            r"^AutoLoCoConfig\.worker_speeds='1,fast' is invalid: 'fast' is not a number",
        ),
        (
            dict(worker_speeds=""),
            r"^AutoLoCoConfig\.worker_speeds='' is invalid: give one speed per worker",
        ),
        (
            dict(speed_changes="10:0:0.5"),
            r"^AutoLoCoConfig\.speed_changes=.* set worker_speeds too",
        ),
        (
            dict(worker_speeds=[1, 1], speed_changes="10:2:0.5"),
            r"^AutoLoCoConfig\.speed_changes=.*worker in 0\.\.1",
        ),
        (
            dict(worker_speeds=[1, 1], speed_changes="10:1:0"),
            r"^AutoLoCoConfig\.speed_changes=.* > 0, got '0'",
        ),
        (
            dict(worker_speeds=[1, 1], speed_changes="10:1"),
            r"^AutoLoCoConfig\.speed_changes=.* is not step:worker",
        ),
        (
            dict(pacing="paced"),
            r"^AutoLoCoConfig\.pacing='paced' is invalid: use one of lockstep, budget",
        ),
        (
            dict(pacing="budget", ranks_per_worker=2, hierarchical_sync=False, map_tokens=False),
            r"^AutoLoCoConfig\.hierarchical_sync=False is invalid: pacing='budget' .* "
            r"use hierarchical_sync=True",
        ),
        (
            dict(straggler_fraction=0.3),
            r"^AutoLoCoConfig\.straggler_fraction=0\.3 .* only applies with pacing='budget'",
        ),
        (
            dict(pacing="budget", straggler_fraction=1.0),
            r"^AutoLoCoConfig\.straggler_fraction=1\.0 .* in \(0\.0, 1\.0\)",
        ),
        (
            dict(method="ddp", pacing="budget"),
            r"^AutoLoCoConfig\.pacing='budget' .* only applies with an interval",
        ),
    ],
)
def test_unequal_speed_settings_are_refused_naming_the_option(kwargs: dict, message: str) -> None:
    """docs/algorithm.md#pacing-bad-input: one line naming the option and the fix."""
    with pytest.raises(ConfigError, match=message) as caught:
        AutoLoCoConfig(**kwargs)
    assert "\n" not in str(caught.value)


RULE_ONLY = (
    "it only applies with method='autoloco' and adaptive_horizon=True (a "
    "horizon rule runs): remove it"
)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(method="diloco", h_max=40), f"h_max=40 is invalid: {RULE_ONLY} (here method=diloco)"),
        (
            dict(method="qsr", h_base=10, h_min=5),
            f"h_min=5 is invalid: {RULE_ONLY} (here method=qsr)",
        ),
        (dict(method="linear", h_max=20), f"h_max=20 is invalid: {RULE_ONLY} (here method=linear)"),
        (
            dict(adaptive_horizon=False, h_max=1000),
            f"h_max=1000 is invalid: {RULE_ONLY} (here method=autoloco)",
        ),
        # a rule option named at its default value was typed
        # (to_dict writes every option of the rule)
        (
            dict(method="diloco", rule_options={"gain": 0.9}),
            f"rule_options={{'gain': 0.9}} is invalid: {RULE_ONLY} (here method=diloco)",
        ),
        (
            dict(method="qsr", rule_options="gain=0.9"),
            f"rule_options='gain=0.9' is invalid: {RULE_ONLY} (here method=qsr)",
        ),
        (
            dict(method="diloco", h_base=20, q_h=1),
            "q_h=1 is invalid: it only applies with method='autoloco': "
            "remove it (here method=diloco)",
        ),
        (
            dict(method="ddp", q_h=25),
            "q_h=25 is invalid: it only applies with method='autoloco': "
            "remove it (here method=ddp)",
        ),
    ],
)
def test_a_horizon_field_is_refused_where_nothing_reads_it(kwargs: dict, message: str) -> None:
    """Only AutoLoCo rounds horizons to q_h, only a horizon
    rule reads h_min and h_max: elsewhere they do nothing."""
    with pytest.raises(ConfigError) as caught:
        AutoLoCoConfig(**kwargs)
    assert str(caught.value) == f"AutoLoCoConfig.{message}"


def test_the_horizon_fields_are_taken_where_they_are_read() -> None:
    rule = AutoLoCoConfig(controller="paper", h_base=100, q_h=20, h_min=60, h_max=200)
    assert (rule.q_h, rule.h_min, rule.h_max) == (20, 60, 200)
    # the token mapper's grid
    assert AutoLoCoConfig(adaptive_horizon=False, h_base=100, q_h=20).q_h == 20
    # the values it derives
    diloco = AutoLoCoConfig(method="diloco", h_base=100, q_h=10, h_min=100, h_max=150)
    assert (diloco.q_h, diloco.h_min, diloco.h_max) == (10, 100, 150)


def test_speeds_are_normalized_and_round_trip() -> None:
    c = AutoLoCoConfig(
        pacing="budget", worker_speeds="1, 1,0.5", speed_changes=["20:2:0.25", (5, 0, 2)]
    )
    assert c.pacing == "budget" and c.worker_speeds == [1.0, 1.0, 0.5]
    assert c.speed_changes == [[5, 0, 2.0], [20, 2, 0.25]]
    assert AutoLoCoConfig.from_dict(c.to_dict()) == c
