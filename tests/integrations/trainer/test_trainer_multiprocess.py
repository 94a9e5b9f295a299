"""Trainer + AutoLoCoCallback in real processes (gloo, CPU) on a tiny Llama built from a config:
ranks forked with torchrun's environment (``launch.forked_ranks``), and torchrun itself where it
restarts a killed worker."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from launch import forked_ranks, torchrun
from toy import TIMING_FIELDS

from autoloco_hf.sync import communicators

pytestmark = pytest.mark.slow

STEPS = 12
# the communicator modules, one file per implementation: a collective they issue is the outer sync's
COMMUNICATOR_FILES = tuple(p.name for p in Path(communicators.__file__).parent.glob("*.py"))


def from_communicators(where: str) -> bool:
    """Whether a collective logged at ``where``
    ("file.py:function") was issued by a communicator."""
    return where.split(":")[0] in COMMUNICATOR_FILES


def sync_steps(result) -> list[int]:
    return [i + 1 for i, synced in enumerate(result["synced"]) if synced]


def model_sized(result, collectives=None) -> list[tuple]:
    collectives = result["collectives"] if collectives is None else collectives
    return [c for c in collectives if c[1] >= result["model_bytes"] // 2]


def deterministic_records(records) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


@pytest.fixture(scope="module")
def diloco(tmp_path_factory):
    out = tmp_path_factory.mktemp("diloco")
    spec = {
        "output_dir": str(out),
        "steps": STEPS,
        "record_batches": True,
        "max_grad_norm": 0.0,
        "autoloco": {"method": "diloco", "h_base": 4},
    }
    return forked_ranks("trainer_worker.py", spec, nproc=2)


@pytest.fixture(scope="module")
def autoloco(tmp_path_factory):
    """AutoLoCo with gradient accumulation 2: a full run, and
    the same run with a worker killed, then restarted.

    Restart = resume: under ``torchrun --max-restarts 1`` rank 1 dies at step 12
    (mid-interval, after the checkpoint at step 10); torchrun restarts both workers, and the
    script's ``trainer.train(resume_from_checkpoint=last_complete_checkpoint(output_dir))``
    resumes from checkpoint-10.
    """
    base = {
        "steps": 24,
        "accum": 2,
        "batch": 2,
        "save_steps": 10,
        "logging_steps": 5,
        "autoloco": {
            "method": "autoloco",
            "controller": "paper",
            "h_base": 4,
            "q_h": 1,
            "h_max": 6,
        },
    }
    full_dir, split_dir = tmp_path_factory.mktemp("full"), tmp_path_factory.mktemp("split")
    full = forked_ranks("trainer_worker.py", {**base, "output_dir": str(full_dir)}, nproc=2)
    resumed = torchrun(
        "trainer_worker.py",
        {
            **base,
            "output_dir": str(split_dir),
            "resume_last": True,
            "kill": {"rank": 1, "step": 12},
        },
        nproc=2,
        max_restarts=1,
    )
    return {"full": full, "resumed": resumed, "full_dir": full_dir, "split_dir": split_dir}


def check_sync_pattern(results):
    r0, r1 = results
    syncs = sync_steps(r0)
    assert syncs == sync_steps(r1) and syncs, "both workers synchronize at the same steps"
    assert syncs[-1] == len(r0["fingerprints"]), "the last step closes the last interval"
    for step, (a, b, synced) in enumerate(
        zip(r0["fingerprints"], r1["fingerprints"], r0["synced"]), start=1
    ):
        # a mid-interval save step shows theta_t on every rank
        if synced or r0["showing"][step - 1]:
            assert a == b, f"replicas must be identical right after the sync at step {step}"
        elif step > 1:  # step 1 runs at learning rate 0 (linear warm-up starts at 0)
            assert a != b, (
                f"replicas must differ between syncs (step {step}): gradients were averaged?"
            )
    for p0, p1 in zip(r0["params"], r1["params"]):
        assert torch.equal(p0, p1)


def check_no_gradient_traffic(result, steps):
    syncs = result["totals"]["syncs"]
    big = model_sized(result)
    assert len(big) == syncs, f"model-sized collectives {big} != {syncs} syncs"
    assert all(from_communicators(where) for _, _, _, where in big), big
    # a collective issued during step s+1 is logged with step s
    sync_at = {s - 1 for s in sync_steps(result)}
    between = [c for c in result["collectives"] if c[2] not in sync_at and c[1] > 1024]
    assert not between, f"collectives with data between syncs: {between}"
    hook = result["hook"]
    assert hook["group_bytes"] == 0, "no gradient byte may be reduced with single-rank workers"
    assert hook["buckets"] >= steps and hook["local_bytes"] >= steps * result["model_bytes"], hook
    assert (
        result["ddp_forward_sync_buffers"] is False
        and result["ddp_find_unused_parameters"] is False
    )
    assert result["ddp_comm_hooks"] == ["_keep_local_gradients"]


def test_diloco_two_processes_sync_pattern(diloco):
    check_sync_pattern(diloco)
    assert sync_steps(diloco[0]) == [4, 8, 12]
    assert [r["h_step"] for r in diloco[0]["records"]] == [4, 4, 4]


def test_diloco_zero_per_step_gradient_traffic(diloco):
    for result in diloco:
        check_no_gradient_traffic(result, STEPS)


def test_trainer_path_equals_simulated_engine(diloco):
    """Same batches, seeds, optimizer and schedule: LocalWorkers
    + SimulatedCommunicator(2) gives the same bits."""
    from trainer_worker import simulated_twin

    from autoloco_hf import AutoLoCoConfig

    workers = simulated_twin(AutoLoCoConfig(method="diloco", h_base=4), STEPS)
    for step in range(STEPS):
        workers.train_step([diloco[0]["batches"][step], diloco[1]["batches"][step]])
    for worker, result in zip(workers.models, diloco):
        for p_sim, p_trainer in zip(worker.parameters(), result["params"]):
            assert torch.equal(p_sim, p_trainer)
    sim = deterministic_records([r.__dict__ for r in workers.engine.records])
    trainer = deterministic_records(diloco[0]["records"])
    for a, b in zip(sim, trainer):
        for key in ("start_step", "h_step", "tokens", "drift_energy", "coherence", "mu", "eta"):
            assert a[key] == b[key], key
        assert a["mean_loss"] == pytest.approx(b["mean_loss"], rel=1e-6)


def test_autoloco_gradient_accumulation_counts_optimizer_steps(autoloco):
    full = autoloco["full"]
    check_sync_pattern(full)
    records = full[0]["records"]
    assert sum(r["h_step"] for r in records) == 24
    assert sync_steps(full[0]) == [r["start_step"] + r["h_step"] for r in records]
    assert records[0]["h_step"] == 4 and records[0]["start_step"] == 0
    assert full[0]["forwards"] == 24 * 2, "two micro-batches per optimizer step were counted"
    for result in full:
        check_no_gradient_traffic(result, 24)
        assert result["global_step"] == 24


def test_autoloco_token_counts_exclude_padding(autoloco):
    full = autoloco["full"]
    records = full[0]["records"]
    # every example is right-padded to 16 positions with 6..16 real tokens (PaddedTokens)
    for r in records:
        positions = r["h_step"] * 2 * 2 * 2  # steps x accumulation x batch x workers
        assert 6 * positions <= r["tokens"] < 16 * positions
    assert full[0]["totals"]["tokens"] == sum(r["tokens"] for r in records)


def test_autoloco_logs_and_jsonl(autoloco):
    full = autoloco["full"]
    losses = {h["step"] for h in full[0]["log_history"] if "loss" in h}
    assert set(sync_steps(full[0])) & {5, 10, 15, 20}, "a sync falls on a logging step"
    assert {5, 10, 15, 20} <= losses, "the Trainer's own logging survives a sync at a logging step"
    logged = [h for h in full[0]["log_history"] if "autoloco/H_step" in h]
    assert len(logged) == full[0]["totals"]["syncs"]
    for key in (
        "autoloco/H_tok",
        "autoloco/rho",
        "autoloco/mu_t",
        "autoloco/eta_t",
        "autoloco/D_t",
        "autoloco/C_t",
        "autoloco/assessment",
        "autoloco/syncs",
        "autoloco/payload_bytes",
        "autoloco/wire_bytes",
    ):
        assert key in logged[-1]
    assert logged[-1]["autoloco/syncs"] == full[0]["totals"]["syncs"]
    with open(os.path.join(autoloco["full_dir"], "autoloco_intervals.jsonl")) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    assert deterministic_records(lines) == deterministic_records(full[0]["records"])


def test_report_on_a_trainer_output_dir(autoloco, tmp_path, capsys):
    """`autoloco report OUTPUT_DIR` on the Trainer's own
    folder: tables, and plots of H, D_t/C_t, mu/eta, bytes."""
    from autoloco_hf.cli import main

    full = autoloco["full"]
    assert main(["report", str(autoloco["full_dir"]), "--out", str(tmp_path / "report")]) == 0
    table = capsys.readouterr().out
    syncs = full[0]["totals"]["syncs"]
    row = next(
        line for line in table.splitlines() if line.startswith(f"| {autoloco['full_dir'].name} |")
    )
    # syncs, payload, train loss over the last 2%
    assert f"| {syncs:,} |" in row and "nan" not in row
    for name in (
        "loss_vs_step.png",
        "loss_vs_bytes.png",
        "horizon.png",
        "outer_mu_eta.png",
        "drift_coherence.png",
    ):
        assert (tmp_path / "report" / name).stat().st_size > 1000, name
    # the logged steps, at the Trainer's logging_steps; the
    # resumed run keeps those before its checkpoint
    for folder in ("full_dir", "split_dir"):
        with open(os.path.join(autoloco[folder], "autoloco_steps.jsonl")) as f:
            assert [json.loads(line)["step"] for line in f] == [5, 10, 15, 20], folder


def test_resume_mid_interval_continues_the_same_trajectory(autoloco):
    full, resumed = autoloco["full"], autoloco["resumed"]
    records = full[0]["records"]
    assert any(r["start_step"] < 10 < r["start_step"] + r["h_step"] for r in records), (
        "step 10 is mid-interval"
    )
    assert full[0]["showing"][9] and full[1]["showing"][9], "the save at step 10 showed theta_t"
    checkpoint = autoloco["split_dir"] / "checkpoint-10" / "autoloco"
    assert sorted(os.listdir(checkpoint)) == ["rank0.safetensors", "rank1.safetensors"]
    for a, b in zip(full, resumed):
        assert b["global_step"] == 24
        for p_full, p_resumed in zip(a["params"], b["params"]):
            assert torch.equal(p_full, p_resumed)
        assert deterministic_records(b["records"]) == deterministic_records(a["records"])
        assert b["fingerprints"] == a["fingerprints"][10:], "every step after the resume matches"
    # one resume line, on the main process; start-up notices
    # once, not per rank (log_level / log_level_replica)
    main, replica = resumed[0]["log_lines"], resumed[1]["log_lines"]
    current = next(r for r in records if r["start_step"] < 10 < r["start_step"] + r["h_step"])
    done = sum(r["start_step"] + r["h_step"] <= 10 for r in records)
    assert [line for line in main if line.startswith("AutoLoCo: resumed")] == [
        f"AutoLoCo: resumed step 10 from {autoloco['split_dir']}/checkpoint-10: {done} syncs done, "
        f"H {current['h_step']} (steps "
        f"{current['start_step'] + 1}-{current['start_step'] + current['h_step']})"
    ]
    assert any("average_tokens_across_devices=False" in line for line in main) and replica == []
    with open(os.path.join(autoloco["split_dir"], "autoloco_intervals.jsonl")) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    assert deterministic_records(lines) == deterministic_records(records)


def test_mid_interval_checkpoint_model_is_the_synchronized_model(autoloco):
    """checkpoint-10's model file is theta_t (what the workers
    agreed on); each rank's replica is in its state."""
    from safetensors.torch import load_file

    from autoloco_hf import AutoLoCoConfig
    from autoloco_hf.integrations.runtime import state_path
    from autoloco_hf.state.checkpoint import read_state
    from autoloco_hf.toy.llama import tiny_llama
    from autoloco_hf.toy.padded import LLAMA

    checkpoint = str(autoloco["split_dir"] / "checkpoint-10")
    saved = load_file(os.path.join(checkpoint, "model.safetensors"))
    weights = [saved[name] for name, _ in tiny_llama(**LLAMA, seed=0).named_parameters()]
    config = AutoLoCoConfig(method="autoloco", controller="paper", h_base=4, q_h=1, h_max=6)
    replicas = []
    for rank in range(2):
        _, state = read_state(
            state_path(checkpoint, rank), config=config, world_size=2, ranks_per_worker=1, rank=rank
        )
        theta = state["engine"]["outer"]["params"]
        assert torch.equal(torch.cat([w.reshape(-1).float() for w in weights]), theta), (
            f"rank {rank}: model != theta_t"
        )
        replicas.append(torch.cat([p.reshape(-1) for p in state["params"]]))
    assert not torch.equal(replicas[0], replicas[1]), "mid-interval the ranks' replicas differ"
    assert not torch.equal(replicas[0], theta)


def test_worker_groups_four_processes(tmp_path):
    """4 ranks = 2 workers of 2 ranks: inner DDP keeps a worker's ranks identical, workers differ
    between syncs, each rank syncs half of the model."""
    spec = {
        "output_dir": str(tmp_path),
        "steps": 8,
        "batch": 2,
        "autoloco": {"method": "diloco", "h_base": 4, "ranks_per_worker": 2},
    }
    results = forked_ranks("trainer_worker.py", spec, nproc=4, timeout=400)
    fp = [r["fingerprints"] for r in results]
    synced = results[0]["synced"]
    assert sync_steps(results[0]) == [4, 8]
    for step in range(8):
        assert fp[0][step] == fp[1][step] and fp[2][step] == fp[3][step], (
            f"inner DDP diverged at step {step + 1}"
        )
        if synced[step]:
            assert fp[0][step] == fp[2][step]
        elif step > 0:
            assert fp[0][step] != fp[2][step], (
                f"workers must differ between syncs (step {step + 1})"
            )
    for r in results:
        assert r["ddp_comm_hooks"] == ["_average_in_worker_group"]
        assert r["hook"]["local_bytes"] == 0 and r["hook"]["group_bytes"] >= 8 * r["model_bytes"]
        outer = [c for c in model_sized(r) if from_communicators(c[3])]
        inner = [c for c in model_sized(r) if c[3].startswith("ddp_hooks.py")]
        # hierarchical sync (the default): per sync, this rank's half of the model across workers,
        # then the worker's all-gather of the updated halves
        assert r["totals"]["syncs"] == 2
        assert sorted(c[0] for c in outer) == ["all_gather_single"] * 2 + ["all_reduce"] * 2
        half = -(-r["model_bytes"] // 8) * 4  # the larger of the two shards, in FP32 bytes
        assert all(c[1] <= half for c in outer if c[0] == "all_reduce")
        assert len(inner) >= 8, "one inner-group gradient all-reduce per step"
        assert len(model_sized(r)) == len(outer) + len(inner)


def test_worker_groups_checkpoint_mid_interval_and_resume(tmp_path):
    """Hierarchical sync holds half of theta_t per rank: a mid-interval checkpoint gathers the
    worker's halves into the model file, and a resume from it (4 new processes) ends on the
    uninterrupted run's parameters."""
    import shutil

    from safetensors.torch import load_file

    from autoloco_hf import AutoLoCoConfig
    from autoloco_hf.integrations.runtime import state_path
    from autoloco_hf.state.checkpoint import read_state
    from autoloco_hf.toy.llama import tiny_llama
    from autoloco_hf.toy.padded import LLAMA

    fields = {
        "method": "autoloco",
        "controller": "paper",
        "h_base": 4,
        "q_h": 1,
        "h_max": 6,
        "ranks_per_worker": 2,
    }
    base = {"steps": 8, "batch": 2, "save_steps": 6, "autoloco": fields}
    full = forked_ranks(
        "trainer_worker.py", {**base, "output_dir": str(tmp_path / "full")}, nproc=4, timeout=400
    )
    checkpoint = tmp_path / "full" / "checkpoint-6"
    saved = load_file(str(checkpoint / "model.safetensors"))
    weights = torch.cat(
        [
            saved[name].reshape(-1).float()
            for name, _ in tiny_llama(**LLAMA, seed=0).named_parameters()
        ]
    )
    config = AutoLoCoConfig(**fields)
    halves = []
    for rank in range(4):
        _, state = read_state(
            state_path(str(checkpoint), rank),
            config=config,
            world_size=4,
            ranks_per_worker=2,
            rank=rank,
        )
        halves.append(state["engine"]["outer"]["params"])
    assert halves[0].numel() < weights.numel(), "each rank holds a shard of theta_t"
    assert torch.equal(torch.cat(halves[:2]), weights), (
        "the model file is the worker's gathered theta_t"
    )
    assert torch.equal(torch.cat(halves[2:]), weights), "both workers hold the same theta_t"

    shutil.copytree(checkpoint, tmp_path / "split" / checkpoint.name)
    resumed = forked_ranks(
        "trainer_worker.py",
        {**base, "output_dir": str(tmp_path / "split"), "resume_last": True},
        nproc=4,
        timeout=400,
    )
    for a, b in zip(full, resumed):
        assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"]))


def test_ddp_method_keeps_normal_ddp(tmp_path):
    """method="ddp": no hook, gradients all-reduced every
    step (replicas identical), the engine counts each one."""
    spec = {
        "output_dir": str(tmp_path),
        "steps": 6,
        "batch": 2,
        "autoloco": {"method": "ddp", "h_base": 4},
    }
    r0, r1 = forked_ranks("trainer_worker.py", spec, nproc=2)
    assert r0["ddp_comm_hooks"] == [] and r0["hook"] is None
    assert r0["fingerprints"] == r1["fingerprints"]
    assert len(set(r0["fingerprints"])) == 6, "the model trains"
    assert r0["totals"]["steps"] == 6 and r0["totals"]["syncs"] == 6 and r0["records"] == []
    assert r0["totals"]["payload_bytes"] == 6 * r0["model_bytes"]  # FP32 gradients every step


def test_int8_wire_through_the_trainer(tmp_path):
    """AutoLoCo with the INT8 codec (docs/algorithm.md#wire-codecs): owner-reduce all_to_all at
    syncs only, ~1/4 of the FP32 payload."""
    spec = {
        "output_dir": str(tmp_path),
        "steps": 8,
        "batch": 2,
        "autoloco": {
            "method": "autoloco",
            "controller": "paper",
            "h_base": 4,
            "wire_dtype": "int8",
        },
    }
    r0, r1 = forked_ranks("trainer_worker.py", spec, nproc=2)
    assert sync_steps(r0) == [4, 8] and r0["fingerprints"][-1] == r1["fingerprints"][-1]
    for r in (r0, r1):
        data = [c for c in r["collectives"] if c[1] > 1024]
        assert {c[0] for c in data} == {"all_to_all_single"} and {c[2] + 1 for c in data} == {4, 8}
        assert r["totals"]["payload_bytes"] < 0.3 * 2 * r["model_bytes"]
