"""Overlapped synchronization (docs/algorithm.md#overlap):
delayed merge and eager update behind the next interval."""

from __future__ import annotations

import io
import math
import os
import time

import pytest
import torch
from _dist import run_gloo
from toy import TIMING_FIELDS

from autoloco_hf import AutoLoCoConfig, ConfigError
from autoloco_hf.algorithm.policies import AutoLoCoPolicy, IntervalOutcome
from autoloco_hf.algorithm.rules.decisions import Assessment
from autoloco_hf.algorithm.schedule import FunctionSchedule
from autoloco_hf.sync.communicators import ProcessGroupCommunicator, SimulatedCommunicator
from autoloco_hf.sync.engine.engine import BlockingSchedule
from autoloco_hf.sync.schedules.factory import make_engine
from autoloco_hf.sync.schedules.overlap import DelayedSchedule, EagerSchedule
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

STEPS, WARMUP = 40, 4


def config(**overrides) -> AutoLoCoConfig:
    fields = {"method": "autoloco", "h_base": 4, **overrides}
    # its horizon grid; with a rule, its range and the rule of these trajectories
    if fields["method"] == "autoloco":
        fields.setdefault("q_h", 2)
        if fields.get("adaptive_horizon", True):
            fields.setdefault("h_max", 8)
            fields.setdefault("controller", "paper")
    return AutoLoCoConfig(**fields)


def records_of(runner: LocalWorkers) -> list[dict]:
    return [
        {k: v for k, v in r.__dict__.items() if k not in TIMING_FIELDS}
        for r in runner.engine.records
    ]


def runner_for(
    cfg: AutoLoCoConfig, communicator, seed: int = 0, steps: int = STEPS, on_record=None
) -> LocalWorkers:
    return LocalWorkers(
        cfg,
        make_model(seed=seed),
        communicator,
        adamw,
        scheduler_factory=cosine(steps, WARMUP),
        total_steps=steps,
        warmup_steps=WARMUP,
        on_record=on_record,
    )


def train(runner: LocalWorkers, first: int, last: int, workers: tuple[int, ...]) -> None:
    for step in range(first, last):
        runner.train_step([batch_for(w, step, padded=True) for w in workers])


def simulated(
    cfg: AutoLoCoConfig, workers: int = 2, steps: int = STEPS, on_record=None
) -> LocalWorkers:
    runner = runner_for(cfg, SimulatedCommunicator(workers), steps=steps, on_record=on_record)
    train(runner, 0, steps, tuple(range(workers)))
    return runner


def params_of(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# ------------------------------------------------------------------ config
def test_config_defaults_to_blocking_and_validates_overlap():
    assert config().overlap == "none"
    with pytest.raises(ConfigError, match="overlap='sometimes'"):
        config(overlap="sometimes")
    with pytest.raises(ConfigError, match="overlap_steps=4 .*use overlap_steps < 4"):
        config(overlap="delayed", overlap_steps=4)  # h_min = h_base = 4
    # up to h_min - 1 with the token mapper on
    assert config(overlap="delayed", overlap_steps=3).map_tokens
    # the README's slow-link config
    readme = AutoLoCoConfig(method="autoloco", h_base=10, overlap="delayed")
    assert (readme.overlap_steps, readme.q_h, readme.map_tokens) == (1, 1, True)
    with pytest.raises(ConfigError, match="overlap_mix=1.0"):
        config(overlap="delayed", overlap_mix=1.0)
    with pytest.raises(ConfigError, match="DDP"):
        AutoLoCoConfig(method="ddp", overlap="eager")
    # docs/algorithm.md#error-feedback
    assert config(overlap="eager", wire_dtype="int8", error_feedback=True).error_feedback
    # sharded outer state overlaps too
    assert config(overlap="eager", ranks_per_worker=2).hierarchical_sync
    assert AutoLoCoConfig.from_dict(config(overlap="eager").to_dict()).overlap == "eager"


# ------------------------------------------------------------ equivalences
@pytest.mark.parametrize(
    "overlap, schedule",
    [("none", BlockingSchedule), ("delayed", DelayedSchedule), ("eager", EagerSchedule)],
)
def test_make_engine_picks_the_schedule_of_the_overlap_mode(overlap, schedule):
    engine = runner_for(config(overlap=overlap), SimulatedCommunicator(2)).engine
    assert type(engine.sync) is schedule and not engine.averages_gradients


@pytest.mark.parametrize("controller", ["paper", "descent"])
def test_delayed_without_delay_or_mixing_is_the_blocking_run_bit_for_bit(controller):
    blocking = simulated(config(controller=controller))
    delayed = simulated(
        config(overlap="delayed", overlap_steps=0, overlap_mix=0.0, controller=controller)
    )
    assert len(blocking.engine.records) >= 4
    for w in range(2):
        for p, q in zip(blocking.models[w].parameters(), delayed.models[w].parameters()):
            assert torch.equal(p, q)
    assert records_of(blocking) == records_of(delayed)


def test_eager_with_one_worker_is_the_blocking_run():
    # one worker: its fresh pseudo-gradient is the average,
    # so the eager start point is theta_{t+1}, bit for bit
    cfg = dict(method="diloco", h_base=4)
    blocking = simulated(AutoLoCoConfig(**cfg), workers=1)
    eager = simulated(AutoLoCoConfig(**cfg, overlap="eager"), workers=1)
    assert [r.start_step for r in eager.engine.records] == [
        r.start_step for r in blocking.engine.records
    ]
    for p, q in zip(blocking.models[0].parameters(), eager.models[0].parameters()):
        assert torch.equal(p, q)
    assert not torch.equal(params_of(make_model(0))[0], params_of(eager.models[0])[0])


def test_eager_update_follows_the_documented_equations():
    # docs/algorithm.md#eager-update with Nesterov (lr 0.7, momentum 0.9): y_{t+1}^i = step(theta_t,
    # m_t, Delta_t^i / N), theta_t = all averages up to t-1
    cfg = AutoLoCoConfig(method="diloco", h_base=2, overlap="eager")
    torch.manual_seed(0)
    models = [torch.nn.Linear(3, 2) for _ in range(2)]
    engine = make_engine(
        cfg, models, FunctionSchedule(lambda s: 1e-2, 8), SimulatedCommunicator(2), total_steps=8
    )

    def flat(m):
        return torch.cat([p.detach().reshape(-1) for p in m.parameters()])

    lr, mu = 0.7, 0.9

    def interval(first: int) -> None:
        for k in (first, first + 1):
            with torch.no_grad():
                for i, m in enumerate(models):
                    for p in m.parameters():
                        p.add_(0.01 * (i + 1) * (k + 1))
            engine.after_optimizer_step([1, 1], [0.0, 0.0])

    theta0 = flat(models[0])
    x0 = [flat(m) for m in models]
    interval(0)  # boundary 2: nothing to apply yet; y_1^i = step(theta_0, 0, Delta_0^i / 2)

    def net(first):
        return [0.01 * (i + 1) * (2 * first + 3) for i in range(2)]  # what steps first, first+1 add

    delta0 = [theta0 - (x + d) for x, d in zip(x0, net(0))]
    for model, d in zip(models, delta0):
        g = d / 2
        torch.testing.assert_close(flat(model), theta0 - lr * (g + mu * g))
    # theta moves only with complete averages
    assert torch.equal(engine.outer.params.detach(), theta0)
    y1 = [flat(m) for m in models]
    interval(2)  # boundary 4: theta_1 from the mean of Delta_0; Delta_1^i = y_1^i - x^i
    mean0 = (delta0[0] + delta0[1]) / 2
    theta1 = theta0 - lr * (mean0 + mu * mean0)
    torch.testing.assert_close(engine.outer.params.detach(), theta1)
    delta1 = [y - (y + d) for y, d in zip(y1, net(2))]
    for model, d1 in zip(models, delta1):
        g = d1 / 2
        torch.testing.assert_close(flat(model), theta1 - lr * (g + mu * (mu * mean0 + g)))
    assert len(engine.records) == 1 and engine.records[0].start_step == 0


@pytest.mark.parametrize("overlap", ["delayed", "eager"])
def test_overlapped_runs_end_on_one_model_and_apply_every_interval(overlap):
    runner = simulated(config(overlap=overlap))
    records = runner.engine.records
    assert records[-1].start_step + records[-1].h_step == STEPS
    assert [r.start_step for r in records[1:]] == [r.start_step + r.h_step for r in records[:-1]]
    for p, q in zip(runner.models[0].parameters(), runner.models[1].parameters()):
        assert torch.equal(p, q)
    assert runner.engine.in_flight is None


def test_delayed_merge_mixes_the_running_replica_with_the_outer_result():
    cfg = AutoLoCoConfig(
        method="diloco", h_base=4, overlap="delayed", overlap_steps=2, overlap_mix=0.25
    )
    torch.manual_seed(0)
    models = [torch.nn.Linear(3, 2) for _ in range(2)]
    engine = make_engine(
        cfg, models, FunctionSchedule(lambda s: 1e-2, 12), SimulatedCommunicator(2), total_steps=12
    )

    def flat(m):
        return torch.cat([p.detach().reshape(-1) for p in m.parameters()])

    theta0 = flat(models[0])

    # stands in for an inner optimizer step, different on each worker
    def local_update(k: int) -> None:
        with torch.no_grad():
            for i, m in enumerate(models):
                for p in m.parameters():
                    p.add_(0.01 * (i + 1) * (k + 1))

    for k in range(4):
        local_update(k)
        assert engine.after_optimizer_step([1, 1], [0.0, 0.0]) is None
    at_boundary = [flat(m) for m in models]
    assert (
        engine.in_flight is not None
        and engine.in_flight.due_step == 6
        and engine.current_interval is None
    )
    for k in (4, 5):
        local_update(k)
        running = [flat(m) for m in models]
        record = engine.after_optimizer_step([1, 1], [0.0, 0.0])
    assert record is not None and record.start_step == 0 and engine.in_flight is None
    g = torch.stack([theta0 - x for x in at_boundary]).mean(0)
    theta1 = theta0 - 0.7 * (g + 0.9 * g)  # first Nesterov step: the momentum buffer is g
    torch.testing.assert_close(engine.outer.params.detach(), theta1)
    for model, x in zip(models, running):
        torch.testing.assert_close(flat(model), 0.25 * x + 0.75 * theta1)
    # the running interval got its length at the merge
    assert engine.current_interval.start_step == 4


# ---------------------------------------------------------------- controller lag
def test_a_finite_interval_run_at_a_replaced_horizon_is_stale_and_not_fed_to_the_controller():
    cfg = config(h_base=4, q_h=2, h_max=8)
    policy = AutoLoCoPolicy(cfg, FunctionSchedule(lambda s: 1e-2, 100), 100, warmup_steps=0)
    interval = policy.next_interval(0)
    policy.rule.state.h_tok = interval.h_tok + cfg.q_h  # a decision since this interval was planned
    before = policy.rule.state_dict()
    outcome = IntervalOutcome(
        interval,
        32,
        drift_energy=1.0,
        coherence=2.0,
        lr_mass=0.04,
        mean_loss=1.0,
        pseudo_grad_finite=True,
    )
    decision = policy.complete(outcome, next_start=8)
    assert (
        decision.assessment == Assessment.STALE and decision.next_h_tok == interval.h_tok + cfg.q_h
    )
    assert policy.rule.state_dict() == before
    # not lagged, or non-finite: the controller sees it
    assert policy.complete(outcome).assessment != Assessment.STALE
    nan = IntervalOutcome(
        interval, 32, math.nan, math.nan, 0.04, math.nan, pseudo_grad_finite=False
    )
    assert policy.complete(nan, next_start=8).assessment == Assessment.INVALID


def test_eager_autoloco_decides_one_interval_late():
    runner = simulated(config(overlap="eager"), steps=70)
    records = runner.engine.records
    # the record of interval t is written at the end of t+1
    # and names the interval its decision set: t+2
    for r, after_next in zip(records, records[2:]):
        assert (r.next_h_tok, r.next_h_step) == (after_next.h_tok, after_next.h_step)
    assert len({r.h_step for r in records}) > 1, "the lagged controller should still adapt"


# ------------------------------------------------------------------- resume
@pytest.mark.parametrize("overlap", ["delayed", "eager"])
# FP32; the all-gather's
@pytest.mark.parametrize("wire", [{}, {"wire_dtype": "int4", "error_feedback": True}])
def test_resume_in_the_middle_of_an_overlapped_collective(overlap, wire):
    cfg = config(h_base=8, q_h=4, h_max=12, overlap=overlap, overlap_steps=3, **wire)
    workers = (0, 1)
    full = runner_for(cfg, SimulatedCommunicator(2, wire_dtype=cfg.wire_dtype))
    cut = None
    for step in range(STEPS):
        full.train_step([batch_for(w, step, padded=True) for w in workers])
        flight = full.engine.in_flight
        if (
            cut is None
            and step >= 12
            and flight is not None
            and full.step < (flight.due_step if overlap == "delayed" else STEPS)
        ):
            if full.engine.step > flight.closed.interval.start_step + flight.closed.interval.h_step:
                cut = full.step
    assert cut is not None

    first = runner_for(cfg, SimulatedCommunicator(2, wire_dtype=cfg.wire_dtype))
    train(first, 0, cut, workers)
    assert first.engine.in_flight is not None
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = runner_for(cfg, SimulatedCommunicator(2, wire_dtype=cfg.wire_dtype), seed=1)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    train(resumed, cut, STEPS, workers)
    for w in workers:
        for p, q in zip(full.models[w].parameters(), resumed.models[w].parameters()):
            assert torch.equal(p, q)
    assert records_of(full) == records_of(resumed)


def test_resume_refuses_a_checkpoint_of_another_overlap_mode():
    first = runner_for(config(overlap="eager"), SimulatedCommunicator(2))
    other = runner_for(config(overlap="delayed"), SimulatedCommunicator(2))
    with pytest.raises(
        ValueError,
        match="config.overlap='eager' when the checkpoint was written, this "
        "run has overlap='delayed'",
    ):
        other.load_state_dict(first.state_dict())
    with pytest.raises(
        ValueError, match="config.overlap='eager' when .* this run has overlap='none'"
    ):
        runner_for(config(), SimulatedCommunicator(2)).load_state_dict(first.state_dict())


# ------------------------------------------------- simulation == gloo processes
def _run_case(rank: int, overlap: str, wire: str, controller: str) -> dict:
    outer_after_each_step = []
    runner = runner_for(
        config(overlap=overlap, wire_dtype=wire, controller=controller),
        ProcessGroupCommunicator(wire_dtype=wire),
        seed=rank,
        on_record=lambda r: outer_after_each_step.append(
            (
                runner.engine.outer.params.detach().clone(),
                runner.engine.outer.momentum_buffer.clone(),
            )
        ),
    )
    train(runner, 0, STEPS, (rank,))
    return {
        "params": params_of(runner.models[0]),
        "records": records_of(runner),
        "outer": outer_after_each_step,
    }


# the paper's rule, and the default rule (descent: guarded
# with the delayed overlap, unguarded with the eager one)
GLOO_CASES = [(o, w, "paper") for o in ("delayed", "eager") for w in ("fp32", "int8")] + [
    ("delayed", "fp32", "descent"),
    ("eager", "fp32", "descent"),
]


def _process_worker(rank: int, world_size: int) -> dict:
    """Every case, one after the other, in one pair of
    processes: their start-up is paid once, not per case."""
    return {case: _run_case(rank, *case) for case in GLOO_CASES}


@pytest.fixture(scope="module")
def gloo_runs() -> list[dict]:
    return run_gloo(_process_worker, 2, timeout=600)


@pytest.mark.parametrize(("overlap", "wire", "controller"), GLOO_CASES)
def test_two_gloo_processes_equal_two_simulated_workers(gloo_runs, overlap, wire, controller):
    outer_sim = []
    cfg = config(overlap=overlap, wire_dtype=wire, controller=controller)
    sim = runner_for(
        cfg,
        SimulatedCommunicator(2, wire_dtype=wire),
        on_record=lambda r: outer_sim.append(
            (sim.engine.outer.params.detach().clone(), sim.engine.outer.momentum_buffer.clone())
        ),
    )
    train(sim, 0, STEPS, (0, 1))
    results = [run[(overlap, wire, controller)] for run in gloo_runs]
    sim_records = records_of(sim)

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "wire_bytes"} for r in rows]

    for rank, result in enumerate(results):
        for p, q in zip(result["params"], sim.models[rank].parameters()):
            assert torch.equal(p, q), f"rank {rank} parameters differ from simulated worker {rank}"
        assert strip(result["records"]) == strip(sim_records)
        # outer parameters and momentum identical across workers after every applied step
        assert len(result["outer"]) == len(outer_sim) >= 4
        for (theta, momentum), (theta_sim, momentum_sim) in zip(result["outer"], outer_sim):
            assert torch.equal(theta, theta_sim) and torch.equal(momentum, momentum_sim)


def _start_before_the_peer(rank: int, world_size: int, wire: str, started: str) -> float:
    """Rank 1 joins the collective only after rank 0's
    ``start_average`` has returned (a blocking one never would)."""
    comm = ProcessGroupCommunicator(timeout_s=20, wire_dtype=wire)
    flat = torch.full((1000,), float(rank + 1))
    if rank == 1:
        deadline = time.monotonic() + 20
        while not os.path.exists(started) and time.monotonic() < deadline:
            time.sleep(0.01)
    pending = comm.start_average([flat], [torch.tensor([float(rank)])], [1000])
    # the caller reuses its buffer at once: the average must be of the values passed
    flat.fill_(99.0)
    if rank == 0:
        open(started, "w").close()
    result = pending.wait()
    assert result.scalar_sums.tolist() == [1.0]
    return float(result.mean.mean())


@pytest.mark.parametrize("wire", ["fp32", "bf16", "int8"])
def test_start_average_returns_before_the_peers_have_joined(wire, tmp_path):
    means = run_gloo(_start_before_the_peer, 2, wire, str(tmp_path / "started"), timeout=120)
    assert means == [1.5, 1.5]


@pytest.mark.parametrize("overlap", ["delayed", "eager"])
def test_overlapped_runs_stop_after_too_many_invalid_intervals(overlap):
    """The record stage is shared: an overlapped run reports invalid intervals and stops like a
    blocking one (docs/algorithm.md#interval-assessment)."""
    from autoloco_hf.sync.engine.engine import TooManyInvalidIntervals

    cfg = AutoLoCoConfig(method="diloco", h_base=2, overlap=overlap, max_consecutive_invalid=2)
    models = [torch.nn.Linear(3, 1) for _ in range(2)]
    engine = make_engine(
        cfg, models, FunctionSchedule(lambda s: 1e-2, 20), SimulatedCommunicator(2), total_steps=20
    )
    with pytest.raises(TooManyInvalidIntervals, match="2 such intervals in a row"):
        for _ in range(20):
            engine.after_optimizer_step([1, 1], [math.nan, 0.0])
    assert [r.outer_step_applied for r in engine.records] == [False, False]


def test_a_mapped_interval_shorter_than_the_merge_is_stretched_past_it_and_recorded():
    """The token rate quadruples after calibration: the mapper
    maps below h_min, the delayed merge still lands inside."""

    def batch(worker: int, step: int) -> dict:
        b = batch_for(worker, step)
        if step < 24:  # sparse first: M_base is calibrated on 4 tokens per row
            b["attention_mask"][:, 4:] = 0
            b["labels"] = b["input_ids"].masked_fill(b["attention_mask"] == 0, -100)
        return b

    cfg = config(overlap="delayed", overlap_steps=3)
    runner = runner_for(cfg, SimulatedCommunicator(2), steps=60)
    for step in range(60):
        runner.train_step([batch(w, step) for w in range(2)])
    records = runner.engine.records
    stretched = [r for r in records if r.stretched]
    assert stretched, [(r.start_step, r.h_step) for r in records]
    for r in stretched:
        assert r.h_step % cfg.q_h == 0 and r.h_step > cfg.overlap_steps
        # it ran another length than its H_tok: no decision
        assert r.assessment == Assessment.TRUNCATED
    assert all(r.start_step + r.h_step == n.start_step for r, n in zip(records, records[1:]))
    assert records[-1].start_step + records[-1].h_step == 60
    assert all(
        torch.equal(p, q)
        for p, q in zip(runner.models[0].parameters(), runner.models[1].parameters())
    )
