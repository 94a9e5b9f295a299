"""IntervalEngine with simulated workers: DiLoCo special case, invalid intervals, resume
(docs/algorithm.md#outer-correction, #interval-assessment, 8.2)."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from toy import TIMING_FIELDS

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.algorithm.policies import FixedPolicy
from autoloco_hf.algorithm.schedule import warmup_cosine
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model


def train(
    config: AutoLoCoConfig,
    steps: int,
    workers: int = 2,
    padded: bool = False,
    warmup: int = 0,
    stop_after: int | None = None,
    **kwargs,
):
    runner = LocalWorkers(
        config,
        make_model(),
        SimulatedCommunicator(workers),
        optimizer_factory=adamw,
        scheduler_factory=cosine(steps, warmup),
        total_steps=steps,
        warmup_steps=warmup,
        **kwargs,
    )
    for step in range(steps if stop_after is None else stop_after):
        runner.train_step([batch_for(w, step, padded) for w in range(workers)])
    return runner


def reference_diloco(steps: int, h: int, outer_lr: float, momentum: float, workers: int = 2):
    """DiLoCo written independently: per-parameter outer
    copies, Nesterov SGD on the averaged pseudo-gradient."""
    base = make_model()
    replicas = [copy.deepcopy(base) for _ in range(workers)]
    inner = [adamw(m.parameters()) for m in replicas]
    schedulers = [cosine(steps, 0)(o) for o in inner]
    outer_params = [p.detach().clone().requires_grad_(True) for p in base.parameters()]
    outer = torch.optim.SGD(outer_params, lr=outer_lr, momentum=momentum, nesterov=True)
    for step in range(steps):
        for w, (model, opt, sched) in enumerate(zip(replicas, inner, schedulers)):
            model(**batch_for(w, step)).loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        if (step + 1) % h == 0:
            with torch.no_grad():
                for i, theta in enumerate(outer_params):
                    deltas = [theta - list(m.parameters())[i] for m in replicas]
                    total = deltas[0].clone()
                    for d in deltas[1:]:
                        total += d
                    theta.grad = total / workers
                outer.step()
                for m in replicas:
                    for p, theta in zip(m.parameters(), outer_params):
                        p.copy_(theta)
    return replicas


@pytest.mark.parametrize(
    "config",
    [
        AutoLoCoConfig(method="diloco", h_base=5, outer_momentum=0.7),
        # AutoLoCo at base settings: fixed horizon, identity mapping; rho = 1 makes all switches
        # neutral (docs/algorithm.md#outer-correction)
        AutoLoCoConfig(method="autoloco", h_base=5, adaptive_horizon=False, map_tokens=False),
        AutoLoCoConfig(
            method="autoloco",
            h_base=5,
            adaptive_horizon=False,
            map_tokens=False,
            adjust_momentum=False,
            scale_outer_lr=False,
            normalize_pseudo_grad=False,
        ),
    ],
    ids=["diloco-mu0.7", "autoloco-base-switches-on", "autoloco-base-switches-off"],
)
def test_autoloco_at_base_settings_is_bit_exact_diloco(config):
    """docs/algorithm.md#outer-correction 'DiLoCo as a special
    case': identical parameters after 4 outer steps."""
    runner = train(config, steps=20)
    assert runner.engine.totals.syncs == 4
    reference = reference_diloco(steps=20, h=5, outer_lr=0.7, momentum=0.7)
    for ours, theirs in zip(runner.models, reference):
        for p, q in zip(ours.parameters(), theirs.parameters()):
            assert torch.equal(p, q)
    assert all(r.mu == 0.7 and r.eta == 0.7 and r.rho == 1.0 for r in runner.engine.records)


def test_reference_differs_when_momentum_differs():
    """Guard for the test above: the comparison is sensitive to the outer settings."""
    runner = train(AutoLoCoConfig(method="diloco", h_base=5, outer_momentum=0.9), steps=20)
    reference = reference_diloco(steps=20, h=5, outer_lr=0.7, momentum=0.7)
    assert not torch.equal(next(runner.models[0].parameters()), next(reference[0].parameters()))


def run_with_hook(hook, steps: int = 20) -> LocalWorkers:
    """DiLoCo at H_base 5 whose engine gets a fixed horizon of 4 from ``policy_factory``, and
    ``hook`` before each outer step."""
    config = AutoLoCoConfig(method="diloco", h_base=5, outer_momentum=0.7)
    runner = train(
        config, steps, stop_after=0, policy_factory=lambda c, s, total, w: FixedPolicy(s, total, 4)
    )
    runner.engine.before_outer_step.append(hook)
    for step in range(steps):
        runner.train_step([batch_for(w, step) for w in range(2)])
    return runner


def test_an_experiment_sets_the_policy_and_sees_each_outer_step_without_patching_the_engine():
    """The seam of benchmarks/campaigns/switch_cost.py: the factory's policy runs, and a hook that
    only reads changes nothing."""
    seen = []
    runner = run_with_hook(
        lambda interval, mean, outer: seen.append(
            (interval.start_step, mean.numel() == outer.numel)
        )
    )
    assert seen == [(0, True), (4, True), (8, True), (12, True), (16, True)]
    reference = reference_diloco(steps=20, h=4, outer_lr=0.7, momentum=0.7)
    for ours, theirs in zip(runner.models, reference):
        for p, q in zip(ours.parameters(), theirs.parameters()):
            assert torch.equal(p, q)
    # a hook may change the outer state before the step: zeroing the momentum moves the result
    zeroed = run_with_hook(
        lambda interval, mean, outer: (
            outer.momentum_buffer is not None and outer.momentum_buffer.zero_()
        )
    )
    assert not torch.equal(next(zeroed.models[0].parameters()), next(runner.models[0].parameters()))


def test_replicas_identical_after_sync_and_differ_between():
    config = AutoLoCoConfig(method="diloco", h_base=5)
    runner = LocalWorkers(config, make_model(), SimulatedCommunicator(3), adamw, total_steps=10)
    for step in range(10):
        record = runner.train_step([batch_for(w, step) for w in range(3)])
        a, b = (next(m.parameters()) for m in runner.models[:2])
        assert torch.equal(a, b) == (record is not None)


def test_nan_in_one_worker_skips_outer_step_and_training_goes_on():
    """docs/algorithm.md#interval-assessment invalid: theta and momentum unchanged on every worker,
    reduction path taken, training continues."""
    config = AutoLoCoConfig(method="autoloco", controller="paper", h_base=10, q_h=2, h_min=6)
    steps = 80
    runner = LocalWorkers(
        config,
        make_model(),
        SimulatedCommunicator(2),
        adamw,
        scheduler_factory=cosine(steps, 0),
        total_steps=steps,
    )
    poisoned_at = 24  # inside the third interval
    for step in range(steps):
        if step == 20:
            theta_before = runner.engine.outer.params.detach().clone()
            momentum_before = runner.engine.outer.momentum_buffer.clone()
        if step == poisoned_at:
            with torch.no_grad():
                next(runner.models[1].parameters()).fill_(float("nan"))
        record = runner.train_step([batch_for(w, step) for w in range(2)])
        if step == 29:
            assert record is not None and not record.outer_step_applied
            assert record.assessment == "invalid" and record.decision == "reduce"
            assert record.next_h_tok == 6
            assert torch.equal(runner.engine.outer.params, theta_before)
            assert torch.equal(runner.engine.outer.momentum_buffer, momentum_before)
            for model in runner.models:
                flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                assert torch.equal(flat, theta_before)
    records = runner.engine.records
    assert runner.engine.totals.skipped_outer_steps == 1
    after = [r for r in records if r.start_step >= 30]
    assert after and all(r.outer_step_applied and math.isfinite(r.mean_loss) for r in after)
    assert all(torch.isfinite(p).all() for m in runner.models for p in m.parameters())


def comparable(records):
    return [{k: v for k, v in r.__dict__.items() if k not in TIMING_FIELDS} for r in records]


@pytest.mark.parametrize("method", ["autoloco", "diloco", "qsr"])
def test_resume_mid_interval_continues_the_same_trajectory(method):
    """docs/algorithm.md#state: save in the middle of an interval, rebuild from scratch, load,
    finish: same as uninterrupted."""
    steps, interrupt = 90, 45
    # AutoLoCo's grid and its rule's range
    horizons = dict(q_h=2, h_max=8) if method == "autoloco" else {}
    config = AutoLoCoConfig(method=method, h_base=4, **horizons)
    kwargs = dict(padded=True, warmup=8)
    uninterrupted = train(config, steps, **kwargs)

    first = LocalWorkers(
        config,
        make_model(),
        SimulatedCommunicator(2),
        adamw,
        scheduler_factory=cosine(steps, 8),
        total_steps=steps,
        warmup_steps=8,
    )
    for step in range(interrupt):
        first.train_step([batch_for(w, step, padded=True) for w in range(2)])
    assert first.engine.current_interval.start_step < interrupt  # really inside an interval
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)

    resumed = LocalWorkers(
        config,
        make_model(seed=123),
        SimulatedCommunicator(2),
        adamw,
        scheduler_factory=cosine(steps, 8),
        total_steps=steps,
        warmup_steps=8,
    )
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    for step in range(interrupt, steps):
        resumed.train_step([batch_for(w, step, padded=True) for w in range(2)])

    assert comparable(resumed.engine.records) == comparable(uninterrupted.engine.records)
    for a, b in zip(resumed.models, uninterrupted.models):
        for p, q in zip(a.parameters(), b.parameters()):
            assert torch.equal(p, q)
    if method == "autoloco":  # the run really adapted its horizon and mapped tokens
        assert len({r.h_step for r in uninterrupted.engine.records}) > 1


def test_autoloco_adapts_and_records_every_field(tmp_path):
    path = tmp_path / "intervals.jsonl"
    runner = train(
        AutoLoCoConfig(method="autoloco", controller="paper", h_base=4, q_h=2, h_max=8),
        steps=120,
        padded=True,
        records_path=str(path),
    )
    from autoloco_hf.state.records import read_jsonl

    rows = read_jsonl(str(path))
    assert len(rows) == runner.engine.totals.syncs == len(runner.engine.records)
    assert sum(r["h_step"] for r in rows) == 120
    expected = {
        "start_step",
        "h_tok",
        "h_step",
        "h_ref",
        "lr_mass",
        "rho",
        "mu",
        "eta",
        "drift_energy",
        "coherence",
        "assessment",
        "decision",
        "tokens",
        "seconds",
    }
    assert expected <= set(rows[0])
    # global non-padding tokens of an interval = sum over workers and steps of the attention masks
    first = rows[0]
    tokens = sum(
        int(batch_for(w, s, True)["attention_mask"].sum())
        for w in range(2)
        for s in range(first["h_step"])
    )
    assert first["tokens"] == tokens
    # measured LR mass equals the preview for full intervals (docs/algorithm.md#interval-statistics)
    for row in rows:
        assert row["lr_mass"] == pytest.approx(row["lr_mass_preview"], rel=1e-9, abs=1e-12)
    assert 0 <= min(r["coherence"] for r in rows) and max(r["coherence"] for r in rows) <= 2 + 1e-6


def test_ddp_averages_gradients_every_step():
    runner = train(AutoLoCoConfig(method="ddp"), steps=6, workers=2)
    assert runner.engine.totals.syncs == 6
    a, b = (list(m.parameters()) for m in runner.models)
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_engine_rejects_mismatched_worker_count():
    with pytest.raises(ValueError, match="SimulatedCommunicator"):
        from autoloco_hf.algorithm.schedule import FunctionSchedule
        from autoloco_hf.sync.schedules.factory import make_engine

        make_engine(
            AutoLoCoConfig(),
            [make_model()],
            FunctionSchedule(lambda s: 1.0, 10),
            SimulatedCommunicator(2),
            10,
        )


def test_int8_error_feedback_carries_the_residual_and_resumes():
    """With error feedback, what INT8 dropped is added to the
    next contribution (and is checkpointed)."""
    config = AutoLoCoConfig(method="diloco", h_base=5, wire_dtype="int8", error_feedback=True)
    runner = LocalWorkers(
        config, make_model(), SimulatedCommunicator(2, wire_dtype="int8"), adamw, total_steps=10
    )
    for step in range(5):
        runner.train_step([batch_for(w, step) for w in range(2)])
    residuals = [f.residual for f in runner.engine.error_feedback]
    assert all(0 < float(r.abs().max()) < 1e-2 for r in residuals)
    state = runner.engine.state_dict()
    assert torch.equal(state["error_feedback"][1]["residual"], residuals[1])
    plain = LocalWorkers(
        AutoLoCoConfig(method="diloco", h_base=5, wire_dtype="int8"),
        make_model(),
        SimulatedCommunicator(2, wire_dtype="int8"),
        adamw,
        total_steps=10,
    )
    for step in range(10):
        plain.train_step([batch_for(w, step) for w in range(2)])
        if step >= 5:
            runner.train_step([batch_for(w, step) for w in range(2)])
    assert not torch.equal(next(plain.models[0].parameters()), next(runner.models[0].parameters()))


def test_warns_when_the_schedule_preview_does_not_match_the_learning_rates_used():
    from autoloco_hf.algorithm.schedule import FunctionSchedule
    from autoloco_hf.sync.schedules.factory import make_engine

    engine = make_engine(
        AutoLoCoConfig(method="diloco", h_base=2),
        [make_model()],
        FunctionSchedule(lambda s: 1e-3, 4),
        SimulatedCommunicator(1),
        total_steps=4,
    )
    engine.after_optimizer_step([1], [1.0], lr=1e-3)
    with pytest.warns(RuntimeWarning, match="schedule preview"):
        engine.after_optimizer_step([1], [1.0], lr=5e-3)


def test_resume_in_a_new_process_keeps_the_records_of_the_checkpoint(tmp_path):
    """The JSONL ends up with the checkpoint's history plus
    what the resumed run adds, nothing twice."""
    from autoloco_hf.state.records import read_jsonl

    path = str(tmp_path / "intervals.jsonl")
    config = AutoLoCoConfig(method="diloco", h_base=4)
    first = LocalWorkers(
        config, make_model(), SimulatedCommunicator(2), adamw, total_steps=24, records_path=path
    )
    for step in range(10):
        first.train_step([batch_for(w, step) for w in range(2)])
    state = copy.deepcopy(first.state_dict())
    for step in range(10, 14):  # logged after the checkpoint: must disappear on resume
        first.train_step([batch_for(w, step) for w in range(2)])
    assert len(read_jsonl(path)) == 3
    resumed = LocalWorkers(
        config, make_model(), SimulatedCommunicator(2), adamw, total_steps=24, records_path=path
    )
    resumed.load_state_dict(state)
    for step in range(10, 24):
        resumed.train_step([batch_for(w, step) for w in range(2)])
    rows = read_jsonl(path)
    assert [r["start_step"] for r in rows] == [0, 4, 8, 12, 16, 20]
    assert [r["index"] for r in rows] == list(range(6))


def test_gradient_clipping_and_last_losses():
    clipped = train(AutoLoCoConfig(method="diloco", h_base=4), steps=4, max_grad_norm=1e-3)
    free = train(AutoLoCoConfig(method="diloco", h_base=4), steps=4)
    assert len(clipped.last_losses) == 2
    assert not torch.equal(next(clipped.models[0].parameters()), next(free.models[0].parameters()))


def test_engine_rejects_a_communicator_with_another_wire_than_the_config():
    from autoloco_hf.algorithm.schedule import FunctionSchedule
    from autoloco_hf.sync.schedules.factory import make_engine

    with pytest.raises(ValueError, match="wire_dtype='int8'"):
        make_engine(
            AutoLoCoConfig(method="diloco", wire_dtype="int8"),
            [make_model()],
            FunctionSchedule(lambda s: 1.0, 10),
            SimulatedCommunicator(1),
            10,
        )


def test_make_engine_gives_ddp_its_own_engine_without_outer_state():
    from autoloco_hf.algorithm.schedule import FunctionSchedule
    from autoloco_hf.sync.engine.engine import BlockingSchedule, IntervalEngine
    from autoloco_hf.sync.schedules.factory import make_engine
    from autoloco_hf.sync.schedules.gradient_averaging import GradientAveragingEngine

    schedule = FunctionSchedule(lambda s: 1e-2, 4)
    engine = make_engine(
        AutoLoCoConfig(method="ddp"), [make_model()], schedule, SimulatedCommunicator(1), 4
    )
    assert (
        isinstance(engine, GradientAveragingEngine)
        and engine.averages_gradients
        and engine.outer is None
    )
    assert engine.after_optimizer_step([1], [1.0]) is None and engine.current_interval is None
    with pytest.raises(ValueError, match="method='ddp' has no intervals"):
        IntervalEngine(
            AutoLoCoConfig(method="ddp"),
            [make_model()],
            schedule,
            SimulatedCommunicator(1),
            4,
            sync=BlockingSchedule(),
        )
    with pytest.raises(ValueError, match="config.overlap='eager' but the schedule is 'none'"):
        IntervalEngine(
            AutoLoCoConfig(method="diloco", h_base=2, overlap="eager"),
            [make_model()],
            schedule,
            SimulatedCommunicator(1),
            4,
            sync=BlockingSchedule(),
        )


# ------------------------------------------------------------------ the descent rule's drift guard
# (docs/algorithm.md#descent-rule) the descent rule as these tests were written for: from 4 h_base,
# gain 1, base momentum 0.7 (its first defaults)
FIRST_DESCENT = dict(
    method="autoloco", h_base=4, q_h=2, h_max=16, outer_momentum=0.7, controller="descent"
)
GUARDED = AutoLoCoConfig(**FIRST_DESCENT, rule_options={"gain": 1.0, "drift_guard": True})
UNGUARDED = AutoLoCoConfig(**FIRST_DESCENT, rule_options={"gain": 1.0, "drift_guard": False})
ANCHOR_FIELDS = ("anchor_normalized_drift", "drift_exponent")


def test_the_drift_guards_anchor_is_the_drift_of_the_intervals_first_h_ref_steps():
    guarded = train(GUARDED, 40)
    # the same first h_ref steps (same init, data and schedule), closed by a sync
    short = train(AutoLoCoConfig(method="diloco", h_base=4, outer_momentum=0.7), 40, stop_after=4)
    first = guarded.engine.records[0]
    assert (first.h_step, first.h_ref) == (16, 4)
    # eps
    assert first.anchor_normalized_drift == pytest.approx(
        short.engine.records[0].normalized_drift, rel=1e-5
    )
    assert all(
        r.anchor_normalized_drift is not None for r in guarded.engine.records if r.h_step > r.h_ref
    )
    assert all(r.anchor_normalized_drift is None for r in train(UNGUARDED, 40).engine.records)


def test_the_drift_guard_reads_only_until_it_trips():
    plain = train(UNGUARDED, 60)
    guarded = train(GUARDED, 60)
    # no trip here
    assert all(r.decision != "reduce" or r.assessment != "severe" for r in guarded.engine.records)

    def strip(records):
        return [{k: v for k, v in r.items() if k not in ANCHOR_FIELDS} for r in comparable(records)]

    assert strip(guarded.engine.records) == strip(plain.engine.records)
    for a, b in zip(guarded.models, plain.models):
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_the_records_drift_exponent_is_the_growth_of_d_from_its_anchor():
    plain = train(UNGUARDED, 60).engine.records
    guarded = train(GUARDED, 60).engine.records
    first = guarded[0]
    # p of D ~ Lambda^p: d's fall from its anchor over the LR mass's growth, plus 2
    fall = math.log(first.normalized_drift / first.anchor_normalized_drift)
    growth = math.log(first.lr_mass / plain[0].lr_mass_base)
    assert first.drift_exponent == pytest.approx(2 + fall / growth, rel=1e-3)
    assert all(1.0 < r.drift_exponent < 2.0 for r in guarded if r.h_step > r.h_ref)
    assert all(r.drift_exponent is None for r in plain)


def test_resume_between_the_anchor_and_the_boundary_continues_the_same_trajectory():
    steps, interrupt = 40, 10  # the first interval runs 0-16; its anchor is taken at step 4
    uninterrupted = train(GUARDED, steps)
    first = train(GUARDED, steps, stop_after=interrupt)
    assert first.engine.counters.anchor_sq_norms is not None
    resumed = finish_from_snapshot(GUARDED, steps, first, interrupt)
    assert comparable(resumed.engine.records) == comparable(uninterrupted.engine.records)


def finish_from_snapshot(
    config: AutoLoCoConfig, steps: int, first: LocalWorkers, done: int
) -> LocalWorkers:
    """Save ``first`` after ``done`` steps, load it into
    workers built from another init, train the rest."""
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = LocalWorkers(
        config, make_model(seed=123), SimulatedCommunicator(2), adamw,
        scheduler_factory=cosine(steps, 0), total_steps=steps, warmup_steps=0,
    )  # fmt: skip
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    for step in range(done, steps):
        resumed.train_step([batch_for(w, step, False) for w in range(2)])
    return resumed


# ------------------------------------------------------------------ the descent rule's start probe
# (docs/algorithm.md#descent-rule)
def probed(threshold: float) -> AutoLoCoConfig:
    return AutoLoCoConfig(
        **FIRST_DESCENT, rule_options={"gain": 1.0, "drift_guard": False, "start_probe": threshold}
    )


def displacement_energy(runner: LocalWorkers, start: list[torch.Tensor]) -> float:
    """Sum over workers of ``||theta_k - theta_0||^2``, written out here."""
    return sum(
        sum(
            float((p.detach().double() - p0.double()).pow(2).sum())
            for p, p0 in zip(m.parameters(), start)
        )
        for m in runner.models
    )


def test_the_start_probe_cuts_a_calibrating_interval_whose_drift_exponent_is_below_the_threshold():
    steps = 40
    start = [p.detach().clone() for p in make_model().parameters()]
    # h_ref = 4: the probe measures after 6 and 8 steps of the first interval (h_max = 16)
    at6, at8 = (train(UNGUARDED, steps, stop_after=k) for k in (6, 8))
    assert not at8.engine.records  # no sync before the probe decides
    schedule = warmup_cosine(3e-2, 0, steps)  # toy.adamw's LR under toy.cosine
    lam = [sum(schedule.lr_at(s) for s in range(k)) for k in (6, 8)]
    expected = math.log(
        displacement_energy(at8, start) / displacement_energy(at6, start)
    ) / math.log(lam[1] / lam[0])
    assert 1.0 < expected < 2.0

    cut = train(probed(2.0), steps).engine.records
    first = cut[0]
    assert first.probe_exponent == pytest.approx(expected, rel=1e-6)
    assert (first.h_step, first.h_tok, first.assessment, first.decision) == (8, 8, "bent", "reduce")
    assert first.lr_mass == pytest.approx(
        lam[1], rel=1e-9
    ) and first.lr_mass_preview == pytest.approx(lam[1], rel=1e-9)
    assert all(r.h_step <= 8 for r in cut)  # never longer after the cut
    # 8 = 2 h_ref: nothing longer left to probe
    assert all(r.probe_exponent is None for r in cut[1:])


def test_a_start_probe_that_never_trips_only_reads():
    plain = train(UNGUARDED, 60)
    read_only = train(probed(0.5), 60)

    def strip(records):
        return [{k: v for k, v in r.items() if k != "probe_exponent"} for r in comparable(records)]

    assert strip(read_only.engine.records) == strip(plain.engine.records)
    for a, b in zip(read_only.models, plain.models):
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    measured = [r for r in read_only.engine.records if r.probe_exponent is not None]
    assert [r.index for r in measured] == [0]  # the run's first interval only
    assert all(r.probe_exponent is None for r in plain.engine.records)


def test_resume_between_the_probes_two_measurements_continues_the_same_trajectory():
    steps, interrupt = 40, 7  # the probe measures at steps 6 and 8 of the first interval
    uninterrupted = train(probed(2.0), steps)
    first = train(probed(2.0), steps, stop_after=interrupt)
    # the first of the two shared measurements is held
    assert list(first.engine.counters.shared) == [6]
    resumed = finish_from_snapshot(probed(2.0), steps, first, interrupt)
    assert comparable(resumed.engine.records) == comparable(uninterrupted.engine.records)
    assert resumed.engine.records[0].assessment == "bent"
