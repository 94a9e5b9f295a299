"""Workers of unequal speed on the virtual clock: budget split, weights, stragglers, bad counts
(docs/algorithm.md#pacing)."""

from __future__ import annotations

import io
import logging
import math
import re
import socket

import pytest
import torch

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.algorithm.schedule import FunctionSchedule
from autoloco_hf.sync.communicators import SimulatedCommunicator, worker_label
from autoloco_hf.sync.pacing import BudgetPacer, InconsistentCounts
from autoloco_hf.sync.schedules.factory import make_engine
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

# simulated workers live in this process: worker i is rank i on this host
HOST = socket.gethostname()
STATISTICS = (
    "drift_energy",
    "coherence",
    "normalized_drift",
    "lr_mass",
    "mean_loss",
    "mu",
    "eta",
    "tokens",
)


def runner(config: AutoLoCoConfig, workers: int, steps: int) -> LocalWorkers:
    return LocalWorkers(
        config,
        make_model(),
        SimulatedCommunicator(workers),
        optimizer_factory=adamw,
        scheduler_factory=cosine(steps, 0),
        total_steps=steps,
    )


class Draws:
    """Each worker's batches in its own order (its k-th
    batch, however many steps the others took)."""

    def __init__(self, workers: int, padded: bool = False) -> None:
        self.taken = [0] * workers
        self.padded = padded

    def __call__(self, worker: int) -> dict:
        self.taken[worker] += 1
        return batch_for(worker, self.taken[worker] - 1, self.padded)


def paced(
    config: AutoLoCoConfig, workers: int, steps: int, until: int | None = None
) -> tuple[LocalWorkers, Draws]:
    run, draws = runner(config, workers, steps), Draws(workers)
    for _ in range(steps if until is None else until):
        run.train_paced(draws)
    return run, draws


def virtual_wall(records) -> float:
    """The run's virtual time: every interval lasts as long as its slowest worker's steps."""
    return sum(max(r.worker_seconds) for r in records)


# the overlapped and streaming schedules (docs/algorithm.md#overlap, #fragments) under budget pacing
# (docs/algorithm.md#pacing-with-overlap)
SCHEDULES = {
    "delayed": dict(overlap="delayed", overlap_steps=3),
    "eager": dict(overlap="eager"),
    "fragments": dict(fragments=2),
    "fragments_delayed": dict(fragments=2, overlap="delayed", overlap_steps=1),
}


@pytest.mark.parametrize(
    "method, workers, padded, schedule",
    [
        ("diloco", 4, False, {}),
        ("autoloco", 3, True, {}),
        *[("diloco", 4, False, s) for s in SCHEDULES.values()],
        ("autoloco", 3, True, SCHEDULES["delayed"]),
        ("autoloco", 3, True, SCHEDULES["fragments"]),
    ],
    ids=[
        "diloco",
        "autoloco",
        *[f"diloco-{name}" for name in SCHEDULES],
        "autoloco-delayed",
        "autoloco-fragments",
    ],
)
def test_equal_speeds_are_lockstep_bit_for_bit(
    method: str, workers: int, padded: bool, schedule: dict
) -> None:
    """Budget pacing at equal speeds takes one step each per
    step of the run, weighs equally: today's trajectory."""
    common = dict(
        method=method,
        h_base=4,
        **(dict(q_h=1, h_max=8) if method == "autoloco" else {}),
        **schedule,
    )
    steps = 40
    lockstep = runner(AutoLoCoConfig(**common), workers, steps)
    for step in range(steps):
        lockstep.train_step([batch_for(w, step, padded) for w in range(workers)])
    budget = runner(
        AutoLoCoConfig(**common, pacing="budget", worker_speeds=[1.0] * workers), workers, steps
    )
    draws = Draws(workers, padded)
    for _ in range(steps):
        budget.train_paced(draws)
    assert len(budget.engine.records) == len(lockstep.engine.records) >= 5
    for a, b in zip(lockstep.engine.records, budget.engine.records):
        assert (a.h_step, a.start_step) == (b.h_step, b.start_step)
        for name in STATISTICS:
            assert getattr(a, name) == getattr(b, name), name
    for m_lock, m_budget in zip(lockstep.models, budget.models):
        for p, q in zip(m_lock.parameters(), m_budget.parameters()):
            assert torch.equal(p, q)
    assert torch.equal(lockstep.engine.outer.params, budget.engine.outer.params)
    assert torch.equal(lockstep.engine.outer.momentum_buffer, budget.engine.outer.momentum_buffer)


def test_one_worker_at_half_speed_splits_the_budget_and_shortens_the_wall() -> None:
    """Profile (a): after the first interval the slow worker
    takes half the steps of the others, all end together."""
    workers, h, steps = 4, 8, 64
    lock, _ = paced(
        AutoLoCoConfig(method="diloco", h_base=h, worker_speeds=[1, 1, 1, 0.5]), workers, steps
    )
    budget, draws = paced(
        AutoLoCoConfig(method="diloco", h_base=h, pacing="budget", worker_speeds=[1, 1, 1, 0.5]),
        workers,
        steps,
    )
    first, *rest = budget.engine.records
    assert first.worker_steps == [h] * workers  # speeds not measured yet: lockstep
    for record in rest:
        assert record.worker_steps == [9, 9, 9, 4]  # floor(8 * 4 * share): 32 * 2/7 and 32 * 1/7
        assert max(record.worker_seconds) == 9.0 and min(record.worker_seconds) == 8.0
        assert record.outer_step_applied and math.isfinite(record.mean_loss)
    assert draws.taken == [
        sum(r.worker_steps[w] for r in budget.engine.records) for w in range(workers)
    ]
    lock_rate = sum(r.tokens for r in lock.engine.records) / virtual_wall(lock.engine.records)
    budget_rate = sum(r.tokens for r in budget.engine.records) / virtual_wall(budget.engine.records)
    assert budget_rate >= 1.5 * lock_rate
    assert budget.engine.records[-1].mean_loss < first.mean_loss


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_overlapped_and_streaming_schedules_keep_the_split_while_an_average_is_in_flight(
    schedule: dict,
) -> None:
    """Profile (a) with each schedule: the steps taken while the interval's
    length waits for a merge count towards the interval's split, so from the
    third interval on every one is split 9, 9, 9, 4 as without overlap."""
    workers, h, steps = 4, 8, 64
    common = dict(method="diloco", h_base=h, worker_speeds=[1, 1, 1, 0.5], **schedule)
    lock, _ = paced(AutoLoCoConfig(**common), workers, steps)
    budget, draws = paced(AutoLoCoConfig(**common, pacing="budget"), workers, steps)
    records = budget.engine.records
    assert records[0].worker_steps == [h] * workers
    assert [r.worker_steps for r in records[2:]] == [[9, 9, 9, 4]] * (len(records) - 2)
    assert draws.taken == [sum(r.worker_steps[w] for r in records) for w in range(workers)]
    # eager overlap learns the speeds one interval late
    steady, lock_steady = records[2:], lock.engine.records[2:]
    lock_rate = sum(r.tokens for r in lock_steady) / virtual_wall(lock_steady)
    assert sum(r.tokens for r in steady) / virtual_wall(steady) >= 1.5 * lock_rate
    assert (
        all(r.outer_step_applied for r in records)
        and torch.isfinite(budget.engine.outer.params).all()
    )
    # the same steps of the run cost less virtual time and
    # train no worse (the toy's loss drifts up in both)
    assert records[-1].mean_loss <= lock.engine.records[-1].mean_loss + 0.05


def test_log_normal_speeds_end_every_interval_together() -> None:
    """Profile (b): steps in proportion to speed, so every
    worker's busy time is within one step of the others'."""
    workers, h = 8, 10
    speeds = torch.exp(
        0.3 * torch.randn(workers, generator=torch.Generator().manual_seed(3))
    ).tolist()
    config = AutoLoCoConfig(method="diloco", h_base=h, pacing="budget", worker_speeds=speeds)
    run, _ = paced(config, workers, 3 * h)
    for record in run.engine.records[1:]:
        assert sum(record.worker_steps) > workers * h - workers
        for n, seconds, speed in zip(record.worker_steps, record.worker_seconds, speeds):
            assert seconds == pytest.approx(n / speed)
        assert max(record.worker_seconds) - min(record.worker_seconds) <= 1.0 / min(speeds) + 1e-9
        ratio = [n / s for n, s in zip(record.worker_steps, speeds)]
        assert max(ratio) - min(ratio) <= 1.0 / min(speeds)


def test_a_worker_slowing_midway_is_measured_again_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Profile (c): worker 3 drops to 0.25 at step 24; one
    interval waits for it, then its share follows."""
    workers, h = 4, 8
    config = AutoLoCoConfig(
        method="diloco",
        h_base=h,
        pacing="budget",
        worker_speeds=[1, 1, 1, 1],
        speed_changes="24:3:0.25",
        straggler_intervals=2,
    )
    with caplog.at_level(logging.WARNING, logger="autoloco_hf"):
        run, _ = paced(config, workers, 64)
    records = run.engine.records
    assert [r.worker_steps for r in records[:3]] == [[8, 8, 8, 8]] * 3
    # the lagging interval
    assert records[3].worker_steps == [8, 8, 8, 8] and records[3].worker_seconds[3] == 32.0
    assert records[4].worker_steps == [9, 9, 9, 2]  # floor(32 * 4/13) and floor(32 * 1/13)
    straggler = f"worker 3 (rank 3, host {HOST})"
    assert records[3].stragglers == [] and records[4].stragglers == [straggler]
    assert records[4].worker_labels == [worker_label(i, i, HOST) for i in range(4)]
    assert f"{straggler} ran below 0.5 of the median speed for 2 intervals" in caplog.text


def test_a_worker_too_slow_for_one_step_contributes_nothing_and_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A share below one step of the interval: zero steps,
    zero weight, named in the log and the record."""
    config = AutoLoCoConfig(
        method="diloco", h_base=4, pacing="budget", worker_speeds=[1, 1, 1, 0.01]
    )
    with caplog.at_level(logging.WARNING, logger="autoloco_hf"):
        run, draws = paced(config, 4, 16)
    later = run.engine.records[1:]
    idle = worker_label(3, 3, HOST)
    assert all(r.worker_steps[3] == 0 and r.idle_workers == [idle] for r in later)
    assert draws.taken[3] == 4  # only the first, unmeasured interval
    assert f"{idle} took no step in the interval and contributed nothing" in caplog.text
    assert torch.isfinite(run.engine.outer.params).all()


def linear_engine(config: AutoLoCoConfig, workers: int):
    torch.manual_seed(0)
    models = [torch.nn.Linear(3, 1) for _ in range(workers)]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    engine = make_engine(
        config, models, FunctionSchedule(lambda s: 1.0, 8), SimulatedCommunicator(workers), 8
    )
    return models, engine


def test_the_average_weighs_each_worker_by_its_steps_at_the_nominal_lr_mass() -> None:
    """Outer LR 1, (almost) no momentum: theta moves by r * sum_i
    (n_i / S) Delta_i, r = Lambda S / sum_i n_i Lambda_i."""
    config = AutoLoCoConfig(
        method="diloco", h_base=1, pacing="budget", outer_lr=1.0, outer_momentum=1e-12
    )
    models, engine = linear_engine(config, 3)
    theta = engine.outer.params.detach().clone()
    deltas = [torch.full_like(theta, v) for v in (1.0, 2.0, 4.0)]
    with torch.no_grad():
        for model, delta in zip(models, deltas):
            torch.nn.utils.vector_to_parameters(theta - delta, model.parameters())
    steps = [3, 2, 1]
    record = engine.after_optimizer_step(tokens=[30, 20, 10], losses=[1.0] * 3, lr=1.0, steps=steps)
    # lr 1 for every inner step of the one step of the run
    total, masses = sum(steps), [1.0 * n for n in steps]
    rescale = 1.0 * total / sum(n * m for n, m in zip(steps, masses))
    weighted = sum(n / total * d for n, d in zip(steps, deltas))
    assert torch.allclose(engine.outer.params.detach(), theta - rescale * weighted)
    drift = rescale**2 * sum(n / total * float(d.square().sum()) for n, d in zip(steps, deltas))
    assert record.drift_energy == pytest.approx(drift)
    assert record.coherence == pytest.approx(3 * float((rescale * weighted).square().sum()) / drift)
    assert record.worker_steps == steps and record.worker_tokens == [30, 20, 10]


@pytest.mark.parametrize(
    "tokens, steps, named",
    [
        ([30, 20, 400], [3, 2, 1], ": 400 tokens in 1 steps"),
        ([30, 20, 5], [3, 2, 0], ": 5 tokens in 0 steps"),
    ],
)
def test_tokens_that_disagree_with_steps_are_refused_before_the_average(
    tokens, steps, named
) -> None:
    config = AutoLoCoConfig(method="diloco", h_base=1, pacing="budget")
    _, engine = linear_engine(config, 3)
    theta = engine.outer.params.detach().clone()
    refused = "disagree at a synchronization: " + re.escape(worker_label(2, 2, HOST) + named)
    with pytest.raises(InconsistentCounts, match=refused):
        engine.after_optimizer_step(tokens=tokens, losses=[1.0] * 3, lr=1.0, steps=steps)
    assert torch.equal(engine.outer.params.detach(), theta) and engine.outer.momentum_buffer is None


@pytest.mark.parametrize(
    "schedule, until",
    [
        ({}, 20),
        (SCHEDULES["delayed"], 18),
        (SCHEDULES["eager"], 20),
        (SCHEDULES["fragments_delayed"], 20),
    ],
    ids=["blocking", "delayed-in-flight", "eager-in-flight", "fragment-in-flight"],
)
def test_resume_mid_interval_keeps_the_measured_speeds(schedule: dict, until: int) -> None:
    """A checkpoint taken inside an interval after the speeds were
    measured (with an average in flight: the steps since the boundary
    still count towards the split) resumes the same trajectory."""
    workers, steps = 4, 40
    config = AutoLoCoConfig(
        method="diloco", h_base=8, pacing="budget", worker_speeds=[1, 1, 1, 0.5], **schedule
    )
    straight, _ = paced(config, workers, steps)
    first, draws = paced(config, workers, steps, until=until)
    assert first.engine.in_flight is not None or not schedule
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = runner(config, workers, steps)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    for _ in range(until, steps):
        resumed.train_paced(draws)
    assert [r.worker_steps for r in resumed.engine.records] == [
        r.worker_steps for r in straight.engine.records
    ]
    assert torch.equal(resumed.engine.outer.params, straight.engine.outer.params)


def test_an_unmeasured_pacer_splits_equally_and_keeps_the_share_of_an_idle_worker() -> None:
    pacer = BudgetPacer(3, [0, 1, 2], straggler_fraction=0.5, straggler_intervals=1)
    assert [pacer.steps_due(k) for k in range(3)] == [[1, 1, 1]] * 3
    pacer.observe([4, 2, 0], [4.0, 4.0, 0.0], ["a", "b", "c"])
    assert pacer.shares == [1_000_000, 500_000, 1_000_000]


def test_with_two_workers_both_are_named_when_their_tokens_per_step_differ() -> None:
    """The median in log space of two workers is their
    geometric mean: neither is trusted over the other."""
    config = AutoLoCoConfig(method="diloco", h_base=1, pacing="budget")
    _, engine = linear_engine(config, 2)
    both = (
        re.escape(f"{worker_label(0, 0, HOST)}: 10 tokens in 1 steps")
        + ".*; "
        + re.escape(worker_label(1, 1, HOST))
    )
    with pytest.raises(InconsistentCounts, match=both + ": 400 tokens in 1 steps"):
        engine.after_optimizer_step(tokens=[10, 400], losses=[1.0] * 2, lr=1.0, steps=[1, 1])
    _, engine = linear_engine(config, 2)
    # within 4x: padding
    engine.after_optimizer_step(tokens=[10, 30], losses=[1.0] * 2, lr=1.0, steps=[1, 1])


@pytest.mark.parametrize(
    "new_speeds", [[1, 1, 0.5], [1, 0.5, 1, 1]], ids=["3-workers", "4-workers-reordered"]
)
def test_a_membership_change_measures_every_speed_afresh(tmp_path, new_speeds) -> None:
    """Elastic resume from a boundary snapshot (docs/algorithm.md#boundary-snapshots): no per-worker
    state crosses it, so the first interval after it runs in lockstep and the next ones split by the
    speeds the new workers show."""
    from autoloco_hf.sync.snapshot import latest_snapshot

    h, steps = 8, 48
    old_config = AutoLoCoConfig(
        method="diloco", h_base=h, pacing="budget", worker_speeds=[1, 1, 1, 0.5]
    )
    run = LocalWorkers(
        old_config,
        make_model(),
        SimulatedCommunicator(4),
        adamw,
        scheduler_factory=cosine(steps, 0),
        total_steps=steps,
        snapshot_dir=str(tmp_path),
    )
    draws = Draws(4)
    for _ in range(20):
        run.train_paced(draws)
    assert run.engine.records[-1].worker_steps == [9, 9, 9, 4]
    run.close()
    snapshot = latest_snapshot(str(tmp_path), old_config)
    assert snapshot.step == 16
    config = AutoLoCoConfig(method="diloco", h_base=h, pacing="budget", worker_speeds=new_speeds)
    workers = len(new_speeds)
    resumed = runner(config, workers, steps)
    resumed.resume_from_snapshot(snapshot)
    draws = Draws(workers)
    for _ in range(snapshot.step, steps):
        resumed.train_paced(draws)
    after = [
        r.worker_steps for r in resumed.engine.records[len(snapshot.engine_state["records"]) :]
    ]
    expected = resumed.engine.pacer.split(h)
    assert after[0] == [h] * workers, "the first interval after the change is unmeasured: lockstep"
    assert after[1:] == [expected] * (len(after) - 1) and expected != [h] * workers
    assert expected == [min(expected) if s < 1 else max(expected) for s in new_speeds]
