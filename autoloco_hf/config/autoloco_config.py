"""Typed configuration of every AutoLoCo constant
(docs/algorithm.md, sections 1 to 8: #notation to #engineering).

One dataclass, :class:`AutoLoCoConfig`, holds the method, the horizon domain, the
outer optimizer, the controller thresholds and the communication settings. Each
field carries its help text and admissible range in its metadata; one loop
checks them all when the object is built, so a typo fails before any machine is
rented, and ``AutoLoCoArguments`` builds its ``--help`` from the same metadata.
Defaults are the spec's; help marked *[reconstruction]* is a choice the spec had
to make where the paper lost its equations.

Example::

    >>> from autoloco_hf import AutoLoCoConfig
    >>> cfg = AutoLoCoConfig(method="autoloco", h_base=500)
    >>> cfg.q_h, cfg.h_min, cfg.h_max, cfg.outer_momentum
    (50, 500, 1000, 0.5)
    >>> AutoLoCoConfig.for_recipe("sft").normalize_pseudo_grad
    True
"""

from __future__ import annotations

import dataclasses
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

from autoloco_hf import rule_registry
from autoloco_hf.config.choices import (
    RECIPES,
    CodecKernel,
    Controller,
    Method,
    Overlap,
    Pacing,
    WireDtype,
)
from autoloco_hf.config.fields import (
    AT_LEAST_ONE,
    COUNT,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    Range,
    _checked,
    _fail,
    field_types,
    option,
    suggest,
)
from autoloco_hf.config.relations import check_relations
from autoloco_hf.config.scopes import FIELD_SCOPES
from autoloco_hf.errors import ConfigError

_DERIVED = ("q_h", "h_min", "h_max", "outer_momentum")  # None: derived from the other fields


@dataclass
class AutoLoCoConfig:
    """All settings of a low-communication run (each field's help follows, from its metadata)."""

    # ---------------------------------------- method and horizon domain
    method: Method = option(
        Method.AUTOLOCO,
        """One of `ddp` (gradient all-reduce every step), `diloco` (fixed horizon, Nesterov outer
        step), `autoloco` (adaptive horizon and corrected outer step), `qsr` and `linear` (interval
        baselines with direct model averaging). docs/algorithm.md#baselines.""",
    )
    h_base: int = option(
        500,
        """Recipe horizon in optimizer steps: DiLoCo's fixed `H`, AutoLoCo's starting and reference
        horizon (docs/algorithm.md#notation).""",
        COUNT,
    )
    q_h: int | None = option(
        None,
        """Horizon granularity in steps; `h_base` must be a multiple of it. Default: `h_base // 10`,
        or the largest divisor of `h_base` below that (docs/algorithm.md#notation).""",
        COUNT,
    )
    h_min: int | None = option(
        None,
        "Lower end of the token-equivalent horizon domain, a multiple of `q_h`; default `h_base`.",
        COUNT,
    )
    h_max: int | None = option(
        None,
        """Upper end of the domain; default the rule's `h_max_factor` times `h_base`: 1.5
        (controller `paper`) or 2 (controller `descent`, where it is also the starting horizon),
        rounded down to a multiple of `q_h`.""",
        COUNT,
    )

    # ---------------------------------------- outer step (docs/algorithm.md#outer-correction)
    outer_lr: float = option(
        0.7,
        "Base outer learning rate `eta_base^out` (docs/algorithm.md#outer-correction, 6).",
        POSITIVE,
    )
    outer_momentum: float | None = option(
        None,
        """Base Nesterov momentum `mu_base`. Default 0.9 for `diloco` (the paper's
        baseline); for `autoloco` the rule's own (0.5 for `descent`, 0.7 for
        `paper`), else 0.7; 0.7 with `diloco` is the fair comparator of
        docs/algorithm.md#baselines. AutoLoCo needs it within [mu_min, mu_max].""",
        FRACTION,
    )
    mu_min: float = option(
        0.5, "Lower end of the clip range of the retained momentum `mu_base ** rho_t`.", FRACTION
    )
    mu_max: float = option(
        0.9, "Upper end of the clip range of the retained momentum `mu_base ** rho_t`.", FRACTION
    )
    kappa_max: float = option(
        1.5, "Bound on the outer-step scale `kappa_t` *[reconstruction]*.", AT_LEAST_ONE
    )
    eps: float = option(
        1e-8,
        "Epsilon of the ratios `C_t`, `d_t`, `rho_t` and of normalization.",
        Range(0.0, 1.0, low_open=True),
    )
    adjust_momentum: bool = option(True, "Momentum retention; off gives `mu_t = mu_base`.")
    scale_outer_lr: bool = option(True, "Bounded outer-step scaling; off gives `eta_t = outer_lr`.")
    normalize_pseudo_grad: bool = option(
        False, "Divide the mean pseudo-gradient by `rho_t`; on for SFT."
    )

    # ---------------------------------------- horizon controller (docs/algorithm.md#horizon-rule)
    adaptive_horizon: bool = option(
        True,
        """For `autoloco`, run the horizon controller; off keeps `h_base` (with the three outer-step
        switches off too this is DiLoCo, docs/algorithm.md#outer-correction).""",
    )
    controller: str = option(
        Controller.DESCENT,
        """Horizon rule, by its registered name: `descent` (the default: start at `h_max` = 2
        `h_base`, shorten as the coherence falls; docs/algorithm.md#descent-rule), `paper` (the
        paper's state machine, docs/algorithm.md docs/algorithm.md#phases), or a rule registered by
        `rule_module` (docs/algorithm.md#rule-plugins).""",
    )
    rule_options: Any = option(
        None,
        """Options of the chosen horizon rule: a dict, `name=value,...` text, JSON, or the rule's
        options dataclass (e.g. `gain=0.9,start_probe=1.85` for `descent`); unset: the rule's
        defaults. Checked against the rule's options dataclass; after construction it is that
        dataclass (docs/algorithm.md#rule-plugins).""",
    )
    rule_module: str | None = option(
        None,
        """Python module imported before the rule is looked up, so that its `@register_rule` classes
        can be named in `controller` (a rule written outside the package,
        docs/algorithm.md#rule-plugins).""",
    )
    warmup_steps: int | None = option(
        None,
        """Inner-LR warm-up length; the controller keeps `h_base` until it ends
        (docs/algorithm.md#warm-up). The integrations read it from the trainer when unset.""",
        NON_NEGATIVE,
    )

    # ---------------------------------------- token mapping (docs/algorithm.md#token-mapper)
    map_tokens: bool = option(
        True,
        """For `autoloco`, map token-equivalent horizons to steps with the observed token density;
        off executes `H_step = H_tok`.""",
    )
    token_calibration_intervals: int = option(
        3, "Recipe-horizon intervals whose global token counts give `M_base`.", COUNT
    )
    token_ema_beta: float = option(0.9, "EMA factor of the tokens-per-step estimate.", FRACTION)

    # ---------------------------------------- interval baselines (docs/algorithm.md#baselines)
    qsr_alpha: float | None = option(
        None, "QSR's `alpha`; default `sqrt(h_base) * eta_peak`.", POSITIVE
    )
    qsr_gamma: float = option(
        2.0, "QSR's exponent `gamma` (docs/algorithm.md#baselines).", POSITIVE
    )
    linear_increment: int = option(10, "Linear Interval's `a` in `H_k = a * k`.", COUNT)

    # ---------------------------------------- communication (docs/algorithm.md#wire-codecs, 8)
    wire_dtype: WireDtype = option(
        WireDtype.FP32, "Pseudo-gradient wire format (docs/algorithm.md#wire-codecs)."
    )
    int8_block_size: int = option(
        4096,
        "Elements per block of a blockwise wire (int8, int4, fp4, int2), each with an FP32 scale.",
        COUNT,
    )
    topk_fraction: float | None = option(
        None,
        """Send only the largest `ceil(topk_fraction * n)` entries (by magnitude) of every block of
        `n` elements, with their offsets in the block as 16-bit indices, the values in `wire_dtype`
        (int8, int4, fp4 or int2; docs/algorithm.md#low-bit-wires). None: dense. Pair it with
        error_feedback=True, or the rest is lost.""",
        Range(0.0, 1.0, low_open=True),
    )
    codec_kernel: CodecKernel = option(
        CodecKernel.EAGER,
        """How the int4, fp4 and int2 wires compute their codes: `eager` torch ops, or `compiled`,
        one `torch.compile`d kernel per group of blocks (bit for bit the same bytes; the first sync
        pays the compilation, seconds, cached on disk by torch). Needs a C++ compiler on CPU.""",
    )
    error_feedback: bool = option(
        False,
        """Carry the codec's residual to the next interval (costs one FP32 model copy per worker;
        needs a lossy wire). Not in the paper.""",
    )
    outer_on_cpu: bool = option(
        False, "Keep the FP32 outer parameters and momentum in host memory."
    )
    bucket_size_mb: float = option(
        64.0, "Size of one all-reduce bucket of the flat pseudo-gradient.", POSITIVE
    )
    ranks_per_worker: int = option(
        1, "Ranks forming one worker (inner DDP inside, docs/algorithm.md#worker-groups).", COUNT
    )
    hierarchical_sync: bool = option(
        True,
        """With `ranks_per_worker = R > 1`, rank `r` of a worker owns shard `r` of the
        flat model: it syncs only that 1/R shard with the other workers and keeps the
        outer parameters and momentum of that shard only; the worker then all-gathers
        the shards over its fast link, so each node sends every byte across the slow
        link once instead of R times. False: every rank syncs the whole model.""",
    )

    # ---------------------------------------- reliability (docs/reliability.md)
    sync_timeout_s: float = option(
        600.0,
        """Upper bound, in seconds, on every collective AutoLoCo issues (outer sync,
        start-up broadcast, the per-step gradient average inside a worker group),
        run on AutoLoCo's own process groups: a dead or partitioned peer stops every
        survivor after at most this long with an error naming the step, the interval
        and the silent rank, instead of waiting for `TrainingArguments.ddp_timeout`
        (30 min). Keep it above the slowest worker's lag at a boundary.""",
        POSITIVE,
    )
    snapshot_dir: str | None = option(
        None,
        """Folder, on storage every node reads, where the main process writes the shared
        outer state at every synchronization boundary (off the training thread; the last
        two kept). A restarted run, with the same or another number of workers, goes on
        from the last boundary (`resume_point(trainer)`, docs/reliability.md); interval
        methods with `overlap = none` only. Not set: no snapshots.""",
    )
    max_consecutive_invalid: int = option(
        3,
        """Consecutive intervals with a non-finite loss or pseudo-gradient on any worker
        after which the run stops with an error (each one skips the outer step and restarts
        from the last synchronized parameters, docs/algorithm.md#interval-assessment); the
        last checkpoint written before them stays intact.""",
        COUNT,
    )

    # ---------------------------------------- overlap (docs/algorithm.md#overlap, not in the paper)
    overlap: Overlap = option(
        Overlap.NONE,
        """`none` blocks every worker at a boundary until the average arrives (the paper). `delayed`
        starts the collective asynchronously, trains on from the local replica and merges the outer
        result `overlap_steps` inner steps later with mixing factor `overlap_mix` (Streaming
        DiLoCo). `eager` lets the collective run behind the whole next interval: each worker starts
        it from an outer step that uses its own fresh pseudo-gradient in place of its stale
        contribution, and the horizon controller decides one interval later.""",
    )
    overlap_steps: int = option(
        1,
        """`delayed`: inner steps between a boundary and the merge of its outer result
        (`tau`); must be shorter than `h_min` (AutoLoCo) or the fixed horizon; an interval
        the token mapper maps shorter than the merge is stretched past it and recorded as
        `stretched`. At least one sync's duration in inner steps hides the sync
        (docs/results_overlap.md); 0 with `overlap_mix=0` is the blocking algorithm.""",
        NON_NEGATIVE,
    )
    overlap_mix: float = option(
        0.5,
        """`delayed`: weight `alpha` of the local replica in the merge
        `x <- alpha x + (1 - alpha) theta` (Streaming DiLoCo's mixing
        factor; 0 replaces the replica by the outer parameters).""",
        FRACTION,
    )

    fragments: int = option(
        1,
        """Streaming fragments `F`: the flat model is split into `F` contiguous pieces at parameter
        boundaries, balanced by bytes; fragment `f` is synchronized at step `ceil((f + 1) H / F)` of
        each interval of `H` steps (the last at the boundary), each with its own slice of the outer
        parameters and momentum, so a sync event sends about `1/F` of the model and the link is busy
        all interval. The controller decides `H` once per interval from the fragments' summed
        statistics. 1: the whole model at the boundary (docs/algorithm.md#fragments).""",
        COUNT,
    )

    # ---------------------------------------- unequal speeds (docs/algorithm.md#pacing)
    pacing: Pacing = option(
        Pacing.LOCKSTEP,
        """`lockstep`: every worker takes the interval's `H` steps, so the slowest sets the pace.
        `budget`: the interval's `N * H` inner steps are split among the workers in proportion to
        the speeds (steps per second) measured over the previous interval and agreed at its sync, so
        that all of them end together; the average weighs each worker by the steps it took
        (docs/algorithm.md#pacing).""",
    )
    worker_speeds: Any = option(
        None,
        """Each worker's relative speed (steps per virtual second) on a virtual clock that times the
        workers instead of the wall clock (simulations, reproducible tests;
        docs/algorithm.md#virtual-clock), as a list or comma-separated text, one positive number per
        worker (e.g. `1,1,1,0.5`). Unset: the wall clock.""",
    )
    speed_changes: Any = option(
        None,
        """Speed changes on the virtual clock of `worker_speeds`, `step:worker:speed` entries as a
        list of triples or comma-separated text (e.g. `500:3:0.25`: from step 500 worker 3 runs at
        0.25). Needs `worker_speeds`.""",
    )
    straggler_fraction: float = option(
        0.5,
        """`budget` pacing: a worker whose measured speed stays below this
        fraction of the median speed for `straggler_intervals` intervals in
        a row is reported as a straggler (log and interval records).""",
        Range(0.0, 1.0, low_open=True, high_open=True),
    )
    straggler_intervals: int = option(
        3,
        "Intervals in a row below `straggler_fraction` of the median speed before "
        "a straggler is reported.",
        COUNT,
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            kind, optional = field_types(type(self))[f.name]
            value = getattr(self, f.name)
            # None: a default derived below
            if (value is not None or not optional) and kind is not Any:
                setattr(self, f.name, _checked(f.name, value, kind, f.metadata["range"]))
        self._check_scopes()  # before defaults are derived: only what the caller set is refused
        self._resolve_rule()
        self._derive_defaults()
        check_relations(self)
        if self.runs_horizon_rule:
            self.rule_class.check_config(self)

    def _check_scopes(self) -> None:
        """Refuse a field set away from its default where it does nothing (:data:`FIELD_SCOPES`).

        A derived field's default is what it would derive
        (``to_dict`` -> ``from_dict`` round-trips).
        """
        for f in dataclasses.fields(self):
            if not self._in_scope(f.name) and not self._is_default(f):
                self._refuse_out_of_scope(f.name)

    def _in_scope(self, name: str) -> bool:
        scope = FIELD_SCOPES.get(name)
        return scope is None or scope.applies(self)

    def _refuse_out_of_scope(self, name: str) -> None:
        scope = FIELD_SCOPES[name]
        here = f"{scope.setting}={getattr(self, scope.setting)}"
        _fail(
            name,
            getattr(self, name),
            f"it only applies with {scope.where}: remove it (here {here})",
        )

    def check_given(self, given: typing.Iterable[str]) -> None:
        """Refuse the fields a user named (flags, YAML keys)
        where they do nothing, at their default value too.

        Construction refuses only values away from the default, which is all a
        dataclass can tell from unset; a command line knows what was typed:
        ``--method diloco --controller descent`` names a rule that never runs.
        """
        for name in given:
            if not self._in_scope(name):
                self._refuse_out_of_scope(name)

    def _is_default(self, f: dataclasses.Field) -> bool:
        """Whether field ``f`` holds its default: unset, the
        declared one, the derived one, or the rule's defaults."""
        value = getattr(self, f.name)
        if value is None or value == f.default:
            return True
        if f.name in _DERIVED:
            return value == self._derived_default(f.name)
        if f.name == "rule_options":
            try:
                options = self.rule_class.Options
                if isinstance(value, str) or (
                    isinstance(value, typing.Mapping)
                    and set(value) != {o.name for o in dataclasses.fields(options)}
                ):
                    return False  # options named one by one were typed; ``to_dict`` writes them all
                return rule_registry.rule_options(str(self.controller), value) == options()
            except ConfigError:
                return False
        return False

    def _resolve_rule(self) -> None:
        """``controller`` as a registered rule (after importing
        ``rule_module``), ``rule_options`` as its Options."""
        rule_registry.import_rule_module(self.rule_module)
        name = str(self.controller)
        self.controller = Controller(name) if name in {c.value for c in Controller} else name
        self.rule_options = rule_registry.rule_options(self.controller, self.rule_options)

    # -- defaults that depend on other fields (the rules that relate them: relations.py) --
    def _derived_default(self, name: str) -> Any:
        """The value an unset (``None``) field of :data:`_DERIVED` takes, from the other fields
        (docs/algorithm.md#notation, 4)."""
        if name == "q_h":  # h_base / 10, or the largest divisor of h_base below it
            return next(q for q in range(max(1, self.h_base // 10), 0, -1) if self.h_base % q == 0)
        if name == "h_min":
            return self.h_base
        if name == "h_max":
            q_h = self.q_h if self.q_h is not None else self._derived_default("q_h")
            factor = self.rule_class.h_max_factor if self._rule_runs else 1.5
            return max(self.h_base, (int(factor * self.h_base) // q_h) * q_h)
        assert name == "outer_momentum"
        if self._rule_runs:
            return self.rule_class.base_outer_momentum
        return 0.9 if self.method == Method.DILOCO else 0.7

    @property
    def _rule_runs(self) -> bool:
        return self.method == Method.AUTOLOCO and self.adaptive_horizon

    def _derive_defaults(self) -> None:
        for name in _DERIVED:
            if getattr(self, name) is None:
                setattr(self, name, self._derived_default(name))

    # -- derived properties -------------------------------------------------
    @property
    def fragment_delay(self) -> int:
        """Steps between a fragment's sync and the use of its
        result: ``overlap_steps`` when delayed, else 0."""
        return self.overlap_steps if self.overlap == Overlap.DELAYED else 0

    @property
    def runs_horizon_rule(self) -> bool:
        """Whether a horizon rule chooses the intervals: only
        then do ``controller`` and ``rule_options`` apply."""
        return self.method == Method.AUTOLOCO and self.adaptive_horizon

    @property
    def rule_class(self) -> Any:
        """The registered class of ``controller`` (a
        :class:`~autoloco_hf.algorithm.rules.HorizonRule`)."""
        return rule_registry.get_rule(self.controller)

    @property
    def is_interval_method(self) -> bool:
        """Whether workers run local intervals (everything but DDP)."""
        return self.method != Method.DDP

    @property
    def uses_nesterov_outer(self) -> bool:
        """DiLoCo and AutoLoCo use a Nesterov outer step; QSR and Linear average models
        (docs/algorithm.md#baselines)."""
        return self.method in (Method.DILOCO, Method.AUTOLOCO)

    @property
    def min_interval_steps(self) -> int:
        """Shortest interval a policy plans on its own (AutoLoCo's token mapper may map below h_min;
        a delayed merge then stretches it)."""
        # shorter mapped intervals are stretched past a delayed merge
        if self.method == Method.AUTOLOCO:
            return self.h_min
        if self.method == Method.LINEAR:
            return self.linear_increment
        return self.h_base

    @property
    def outer_correction_enabled(self) -> bool:
        """The docs/algorithm.md#outer-correction correction runs only for AutoLoCo."""
        return self.method == Method.AUTOLOCO

    # -- construction helpers -------------------------------------------------
    @classmethod
    def for_recipe(cls, recipe: str, **overrides: Any) -> AutoLoCoConfig:
        """Config preset of the paper's `c4` or `sft` recipe, with overrides."""
        if recipe not in RECIPES:
            raise ConfigError(f"unknown recipe {recipe!r}: use one of {', '.join(RECIPES)}")
        # a preset field that does nothing under the chosen method is left out, not refused
        method = cls(**{k: overrides[k] for k in ("method",) if k in overrides})
        preset = {
            k: v
            for k, v in RECIPES[recipe].items()
            if k not in FIELD_SCOPES or FIELD_SCOPES[k].applies(method)
        }
        return cls(**{**preset, **overrides})

    @classmethod
    def ablation(cls, variant: str, **overrides: Any) -> AutoLoCoConfig:
        """The paper's Table 7 ablation variants of AutoLoCo, with the paper's rule.

        `intervals_only` (adaptive horizon, no outer correction), `momentum`
        (+ momentum retention), `full` (+ bounded outer-step scaling),
        `full_normalized` (+ pseudo-gradient normalization).
        """
        variants = {
            "intervals_only": dict(
                adjust_momentum=False, scale_outer_lr=False, normalize_pseudo_grad=False
            ),
            "momentum": dict(
                adjust_momentum=True, scale_outer_lr=False, normalize_pseudo_grad=False
            ),
            "full": dict(adjust_momentum=True, scale_outer_lr=True, normalize_pseudo_grad=False),
            "full_normalized": dict(
                adjust_momentum=True, scale_outer_lr=True, normalize_pseudo_grad=True
            ),
        }
        if variant not in variants:
            raise ConfigError(f"unknown ablation {variant!r}: use one of {', '.join(variants)}")
        return cls(
            **{
                "method": Method.AUTOLOCO,
                "controller": Controller.PAPER,
                **variants[variant],
                **overrides,
            }
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AutoLoCoConfig:
        """A config from a mapping of its fields; an unknown
        name fails with the closest known one."""
        unknown = [name for name in values if name not in field_types(cls)]
        if unknown:
            name, others = (
                unknown[0],
                f" (also unknown: {', '.join(unknown[1:])})" if unknown[1:] else "",
            )
            raise ConfigError(
                f"AutoLoCoConfig has no field {name!r} (given {values[name]!r}): "
                f"{suggest(name, field_types(cls))}{others}"
            )
        return cls(**values)


def nest_rule_options(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the old flat spellings of rule options moved into ``rule_options``.

    Before rules were plug-ins their options were config fields: ``descent_gain=0.9`` (the descent
    rule's ``gain``), ``k_severe=5`` (the paper rule's). The benchmarks' ``NAME:field=value`` specs
    and committed commands still use them; this is their one translation
    (docs/algorithm.md#rule-plugins).
    """
    controller = str(values.get("controller", AutoLoCoConfig.controller))
    options = {f.name for f in dataclasses.fields(rule_registry.get_rule(controller).Options)}
    nested, rest = dict(values.get("rule_options") or {}), {}
    for key, value in values.items():
        option = key.removeprefix(f"{controller}_")
        if key not in field_types(AutoLoCoConfig) and option in options:
            nested[option] = value
        else:
            rest[key] = value
    return {**rest, "rule_options": nested} if nested else rest


# help(AutoLoCoConfig) lists every field with its help
AutoLoCoConfig.__doc__ += "\n\n    Args:\n" + "".join(
    f"        {f.name}:\n"
    + textwrap.fill(f.metadata["help"], 100, initial_indent=" " * 12, subsequent_indent=" " * 12)
    + "\n"
    for f in dataclasses.fields(AutoLoCoConfig)
)
