"""Budget pacing under the Trainer (docs/algorithm.md#pacing-under-the-trainer): ranks of unequal
speed, real processes (gloo; forked with torchrun's environment, ``launch.forked_ranks``, and
torchrun itself where it restarts a crashed rank)."""

from __future__ import annotations

import os

import pytest
import torch
from launch import forked_ranks, torchrun
from transformers import TrainingArguments
from transformers.trainer_callback import TrainerControl, TrainerState

from autoloco_hf.errors import AutoLoCoConfigurationError
from autoloco_hf.integrations.trainer.pacing import BudgetTrainerSteps
from autoloco_hf.sync.pacing import set_schedule_step

STEPS = 12
BUDGET = {"method": "diloco", "h_base": 4, "pacing": "budget"}


def args(tmp_path, **overrides) -> TrainingArguments:
    fields = dict(
        output_dir=str(tmp_path), max_steps=STEPS, report_to=[], use_cpu=True, logging_steps=5
    )
    return TrainingArguments(**{**fields, **overrides})


# ------------------------------------------------------------------
# one process: refusals and the cadence
@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"max_steps": -1}, "max_steps"),
        ({"logging_strategy": "epoch"}, "logging_strategy"),
        ({"save_strategy": "epoch"}, "save_strategy"),
        ({"include_num_input_tokens_seen": "all"}, "include_num_input_tokens_seen"),
    ],
)
def test_settings_budget_pacing_cannot_honour_are_refused(tmp_path, overrides, field):
    with pytest.raises(
        AutoLoCoConfigurationError, match=f"TrainingArguments.{field}=.*pacing='budget'"
    ):
        BudgetTrainerSteps(args(tmp_path, **overrides), workers=2)


def test_the_trainer_sizes_its_epochs_for_the_fastest_rank(tmp_path):
    training_args = args(tmp_path)
    budget = BudgetTrainerSteps(training_args, workers=4)
    assert budget.run_steps == STEPS and training_args.max_steps == 4 * STEPS


def cadence_run(tmp_path, boundaries: list[int], **overrides) -> list[dict]:
    """Feed ``after_step`` a rank's steps of the run (a
    boundary at each of ``boundaries``); the flags it set."""
    training_args = args(
        tmp_path,
        save_strategy="steps",
        save_steps=6,
        eval_strategy="steps",
        eval_steps=4,
        **overrides,
    )
    budget = BudgetTrainerSteps(training_args, workers=2)
    state = TrainerState()
    state.max_steps = STEPS
    state.compute_steps(training_args, STEPS)
    flags, run_step = [], 0
    for step in range(1, STEPS + 1):
        control = TrainerControl()
        state.global_step = run_step + 1  # the Trainer's own increment, which after_step replaces
        run_step = step
        budget.after_step(training_args, state, control, run_step, synced=step in boundaries)
        assert state.global_step == run_step
        flags.append(
            {k: getattr(control, k) for k in ("should_log", "should_evaluate", "should_save")}
        )
        flags[-1]["stop"] = control.should_training_stop
    return flags


def test_logs_evaluations_and_saves_happen_at_boundaries_only(tmp_path):
    flags = cadence_run(tmp_path, boundaries=[3, 7, 9, 12])
    at = {name: [i + 1 for i, f in enumerate(flags) if f[name]] for name in flags[0]}
    assert at["should_log"] == [7, 12]  # logging_steps 5: 5 falls in (3, 7], 10 in (9, 12]
    # eval_steps 4: 4 in (3, 7], 8 in (7, 9], the run's end
    assert at["should_evaluate"] == [7, 9, 12]
    assert at["should_save"] == [7, 12]  # save_steps 6: 6 in (3, 7], 12 and the end
    assert at["stop"] == [12]


def test_the_run_stops_at_its_budget_not_at_the_ranks_step_count(tmp_path):
    training_args = args(tmp_path)
    budget = BudgetTrainerSteps(training_args, workers=2)
    state, control = TrainerState(), TrainerControl()
    state.max_steps = STEPS
    state.compute_steps(training_args, STEPS)
    state.global_step = STEPS  # a fast rank's Trainer reached max_steps by its own count ...
    control.should_training_stop = True  # ... and DefaultFlowCallback stopped it
    budget.after_step(training_args, state, control, run_step=STEPS - 3, synced=False)
    assert not control.should_training_stop and state.global_step == STEPS - 3


def test_the_schedule_follows_the_runs_step():
    from transformers import get_cosine_schedule_with_warmup

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    scheduler = get_cosine_schedule_with_warmup(optimizer, 2, STEPS)
    reference = get_cosine_schedule_with_warmup(
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3), 2, STEPS
    )
    expected = []
    for _ in range(STEPS):
        expected.append(reference.get_last_lr()[0])
        reference.optimizer.step()
        reference.step()
    for step in (5, 1, 9):
        set_schedule_step(scheduler, step)
        assert optimizer.param_groups[0]["lr"] == expected[step] == scheduler.get_last_lr()[0]


# ------------------------------------------------------------------ two processes at unequal speeds
@pytest.fixture(scope="module")
def virtual(tmp_path_factory):
    """Rank 1 at half speed on the virtual clock: deterministic
    shares, so the simulation can be matched bit for bit."""
    out = tmp_path_factory.mktemp("virtual")
    spec = {
        "output_dir": str(out),
        "steps": STEPS,
        "record_batches": True,
        "max_grad_norm": 0.0,
        "autoloco": {**BUDGET, "worker_speeds": [1.0, 0.5]},
    }
    return forked_ranks("trainer_worker.py", spec, nproc=2)


@pytest.mark.slow
def test_virtual_speeds_split_the_interval_by_speed(virtual):
    r0, r1 = virtual
    steps = [r["worker_steps"] for r in r0["records"]]
    assert steps[0] == [4, 4], "the first interval runs in lockstep (no speed measured yet)"
    # each worker's floor of its share of the 8 inner steps: floor(8 * 2/3) = 5, floor(8 * 1/3) = 2
    assert all(s == [5, 2] for s in steps[1:]), steps
    assert r0["optimizer_steps"] == 4 + 5 + 5 and r1["optimizer_steps"] == 4 + 2 + 2
    assert r0["global_step"] == r1["global_step"] == STEPS, (
        "the Trainer counts the run's steps on every rank"
    )
    for a, b in zip(r0["params"], r1["params"]):
        assert torch.equal(a, b), "both ranks end with the synchronized model"


@pytest.mark.slow
def test_trainer_path_equals_the_simulated_engine_at_unequal_speeds(virtual):
    """The same batches, in each rank's order:
    ``LocalWorkers.train_paced`` gives the Trainer's bits."""
    from trainer_worker import simulated_twin

    from autoloco_hf import AutoLoCoConfig

    workers = simulated_twin(AutoLoCoConfig(**BUDGET, worker_speeds=[1.0, 0.5]), STEPS)
    batches = [iter(result["batches"]) for result in virtual]
    for _ in range(STEPS):
        workers.train_paced(lambda worker: next(batches[worker]))
    for worker, result in zip(workers.models, virtual):
        for p_sim, p_trainer in zip(worker.parameters(), result["params"]):
            assert torch.equal(p_sim, p_trainer)
    for sim, trainer in zip(workers.engine.records, virtual[0]["records"]):
        for key in (
            "start_step",
            "h_step",
            "tokens",
            "worker_steps",
            "worker_tokens",
            "drift_energy",
            "mu",
            "eta",
        ):
            assert getattr(sim, key) == trainer[key], key


@pytest.mark.slow
@pytest.mark.parametrize(
    "schedule",
    [
        {"overlap": "delayed", "overlap_steps": 1},
        {"fragments": 2, "overlap": "delayed", "overlap_steps": 1},
    ],
    ids=["delayed", "fragments-delayed"],
)
def test_overlapped_and_streaming_schedules_under_the_trainer_equal_the_simulated_engine(
    tmp_path, schedule
):
    """A merge lands one step after the boundary, where rank 1's share may be no step: it logs and
    saves there with rank 0 (no hang), and the Trainer's bits are still the simulation's."""
    from trainer_worker import simulated_twin

    from autoloco_hf import AutoLoCoConfig

    config = {**BUDGET, "worker_speeds": [1.0, 0.5], **schedule}
    spec = {
        "output_dir": str(tmp_path),
        "steps": STEPS,
        "logging_steps": 2,
        "save_steps": 6,
        "record_batches": True,
        "max_grad_norm": 0.0,
        "autoloco": config,
    }
    results = forked_ranks("trainer_worker.py", spec, nproc=2)
    workers = simulated_twin(AutoLoCoConfig(**config), STEPS)
    batches = [iter(result["batches"]) for result in results]
    for _ in range(STEPS):
        workers.train_paced(lambda worker: next(batches[worker]))
    assert [r.worker_steps for r in workers.engine.records][2:] == [[5, 2]] * (
        len(workers.engine.records) - 2
    )
    for worker, result in zip(workers.models, results):
        for p_sim, p_trainer in zip(worker.parameters(), result["params"]):
            assert torch.equal(p_sim, p_trainer)
    assert [r["worker_steps"] for r in results[0]["records"]] == [
        r.worker_steps for r in workers.engine.records
    ]
    # overlap_steps after each boundary
    merged = {r["start_step"] + r["h_step"] + 1 for r in results[0]["records"]}
    logged = {entry["step"] for entry in results[0]["log_history"] if "loss" in entry}
    assert logged and logged <= merged | {STEPS}
    saved = sorted(
        int(name.split("-")[1]) for name in os.listdir(tmp_path) if name.startswith("checkpoint-")
    )
    assert saved and set(saved) <= merged | {STEPS}


@pytest.mark.slow
def test_worker_groups_of_two_ranks_take_their_workers_share_together(tmp_path):
    """4 ranks = 2 workers of 2 ranks (hierarchical sync), worker 1 at half
    speed: both ranks of a worker take its share (inner DDP keeps them
    identical at every step) and all four end on the synchronized model."""
    spec = {
        "output_dir": str(tmp_path),
        "steps": STEPS,
        "autoloco": {**BUDGET, "worker_speeds": [1.0, 0.5], "ranks_per_worker": 2},
    }
    results = forked_ranks("trainer_worker.py", spec, nproc=4, timeout=400)
    assert [r["worker_steps"] for r in results[0]["records"]] == [[4, 4], [5, 2], [5, 2]]
    assert [r["optimizer_steps"] for r in results] == [14, 14, 8, 8]
    assert results[0]["fingerprints"] == results[1]["fingerprints"], "worker 0's ranks diverged"
    assert results[2]["fingerprints"] == results[3]["fingerprints"], "worker 1's ranks diverged"
    for result in results[1:]:
        for a, b in zip(results[0]["params"], result["params"]):
            assert torch.equal(a, b)


@pytest.mark.slow
def test_a_slow_rank_takes_fewer_steps_and_logs_and_saves_at_boundaries(tmp_path):
    """A real slow rank (sleeps 60 ms a step, several times a
    step's compute): measured, not simulated."""
    spec = {
        "output_dir": str(tmp_path),
        "steps": 16,
        "logging_steps": 5,
        "save_steps": 6,
        "eval_steps": 8,
        "sleep": {"1": 0.06},
        "autoloco": {**BUDGET},
    }
    r0, r1 = forked_ranks("trainer_worker.py", spec, nproc=2)
    later = [r["worker_steps"] for r in r0["records"][1:]]
    assert later and all(fast > slow for fast, slow in later), later
    assert r0["optimizer_steps"] > r1["optimizer_steps"]
    for a, b in zip(r0["params"], r1["params"]):
        assert torch.equal(a, b)
    boundaries = {r["start_step"] + r["h_step"] for r in r0["records"]}
    logged = {entry["step"] for entry in r0["log_history"] if "loss" in entry}
    evaluated = {entry["step"] for entry in r0["log_history"] if "eval_loss" in entry}
    assert logged and logged <= boundaries and evaluated and evaluated <= boundaries
    saved = sorted(
        int(name.split("-")[1]) for name in os.listdir(tmp_path) if name.startswith("checkpoint-")
    )
    assert saved and set(saved) <= boundaries and saved[-1] == 16
    per_worker = [entry for entry in r0["log_history"] if "autoloco/worker1_tokens" in entry]
    assert per_worker and all(entry["autoloco/worker0_tokens"] > 0 for entry in per_worker)
    # `autoloco report` on the Trainer's folder: each worker's tokens, named by rank and host
    from autoloco_hf.cli import main

    assert main(["report", str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    tokens = [sum(r["worker_tokens"][w] for r in r0["records"]) for w in (0, 1)]
    for worker, count in enumerate(tokens):
        row = next(
            line
            for line in report.splitlines()
            if line.startswith(f"| worker {worker} (rank {worker}, host ")
        )
        assert f"{count:,}" in row, row


@pytest.mark.slow
def test_resume_after_a_crash_goes_on_from_the_boundary_checkpoint(virtual, tmp_path):
    """Rank 0 dies mid-interval (run step 10) after the
    boundary checkpoint at 8; torchrun restarts both ranks.

    The resumed run starts from that boundary's model and measured shares (the intervals after it
    split the steps as before, [5, 2]) and ends with both ranks holding the same synchronized model.
    The data position is the Trainer's (docs/algorithm.md#pacing-under-the-trainer), so the
    parameters are not those of the uninterrupted run.
    """
    from trainer_worker import fingerprint

    spec = {
        "steps": STEPS,
        "save_steps": 8,
        "max_grad_norm": 0.0,
        "resume_last": True,
        "kill": {"rank": 0, "step": 10},
        "output_dir": str(tmp_path),
        "autoloco": {**BUDGET, "worker_speeds": [1.0, 0.5]},
    }
    r0, r1 = torchrun("trainer_worker.py", spec, nproc=2, max_restarts=1)
    assert r0["begin"]["step"] == r1["begin"]["step"] == 8
    synced_at = [i for i, synced in enumerate(virtual[0]["synced"]) if synced]
    model = torch.nn.Module()
    model.params = torch.nn.ParameterList(r0["begin"]["params"])
    assert fingerprint(model) == virtual[0]["fingerprints"][synced_at[1]], (
        "theta at the boundary of step 8"
    )
    # the records before the crash come back with the checkpoint; the last interval splits by the
    # shares measured before it, as in the uninterrupted run
    assert [r["worker_steps"] for r in r0["records"]] == [
        r["worker_steps"] for r in virtual[0]["records"]
    ]
    assert r0["global_step"] == r1["global_step"] == STEPS
    for a, b in zip(r0["params"], r1["params"]):
        assert torch.equal(a, b)
