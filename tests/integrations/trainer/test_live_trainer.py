"""The Trainer on live membership (docs/reliability.md, "Live membership under the Trainer").

Real processes, each a ``Trainer`` + ``AutoLoCoCallback`` on a tiny Llama, gloo, and a
``TCPStore`` hosted by this test process. Three start; one dies mid-interval; the two survivors
leave ``train()`` with ``PeerLostError``, form a new round in process and call ``train()``
again from the last boundary on the new process group (accelerate's world size follows it,
AdamW keeps its moments, the LR schedule is the source's); a fourth process joins at a later
boundary, gets the outer state from a live peer, and every member ends on the same model.
"""

from __future__ import annotations

import datetime
import os
import time

import pytest
import torch.distributed as dist
from _dist import free_port, process_context
from testbeds.live_testbed import collect, wait_round
from testbeds.live_trainer_worker import run
from transformers import get_cosine_schedule_with_warmup

STEPS, H = 28, 4


def spawn(ctx, out: str, port: int, name: str, first_world: int, **options):
    process = ctx.Process(target=run, args=(name, port, out, first_world, STEPS, H), kwargs=options)
    process.start()
    return process


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    out, port = str(tmp_path_factory.mktemp("live_trainer")), free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=60))
    ctx = process_context()
    deadline = time.monotonic() + 300
    # the survivors meet w2's loss at their next collective, seconds apart on a loaded machine
    # (CI): a closer waits up to settle_s for the other
    late = {"settle_s": 5.0}
    first = [spawn(ctx, out, port, f"w{i}", 3, wait_for_joiner_at=(16,), **late) for i in range(2)]
    first.append(spawn(ctx, out, port, "w2", 3, die_at=10, **late))
    wait_round(store, 1, deadline)  # the survivors reformed after w2's death
    joiner = spawn(ctx, out, port, "w3", 0, **late)
    processes = [*first, joiner]
    seen = collect(processes, out, ("w0", "w1", "w3"), deadline)
    return {"seen": seen, "exitcodes": [p.exitcode for p in processes]}


def lr_at(step: int) -> float:
    """The Trainer's schedule (cosine, 2 warm-up steps, peak 3e-3) after ``step`` steps."""
    import torch

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=3e-3)
    scheduler = get_cosine_schedule_with_warmup(optimizer, 2, STEPS)
    for _ in range(step):
        optimizer.step()
        scheduler.step()
    return scheduler.get_last_lr()[0]


def test_the_survivors_train_on_in_process_from_the_last_boundary(outcome) -> None:
    seen = outcome["seen"]
    assert outcome["exitcodes"] == [0, 0, 1, 0]
    for name in ("w0", "w1"):
        start, after_fault = seen[name]["begins"][:2]
        assert (start["round"], start["world"], start["step"]) == (0, 3, 0)
        assert after_fault["round"] == 1 and sorted(after_fault["members"]) == ["w0", "w1"]
        # accelerate follows the new group
        assert after_fault["world"] == after_fault["accelerate_world"] == 2
        assert after_fault["step"] == 8  # the last boundary before the fault: steps 9-12 are redone
        # the same process: no restart
        assert after_fault["pid"] == start["pid"] == seen[name]["pid"]
        assert after_fault["adam_step"] >= 11  # its own AdamW moments go on (not a fresh optimizer)
        # the schedule at the boundary
        assert after_fault["lr"] == pytest.approx(lr_at(8), rel=1e-6)
        steps = seen[name]["steps"]
        # steps 9-12 trained twice (12 failed at its boundary):
        # only the interval the fault cut; the join redoes none
        assert steps == list(range(1, 13)) + list(range(9, STEPS + 1))
        assert seen[name]["global_step"] == STEPS
        (lost,) = [
            w
            for w in seen[name]["warnings"]
            if "PeerLost" in w or "synchronization at step 12" in w
        ]
        # not "restart from"
        assert "live membership goes on from step 8 in process, without a restart" in lost


def test_a_process_joins_the_trainer_run_live_and_all_end_on_one_model(outcome) -> None:
    seen = outcome["seen"]
    (joined,) = seen["w3"]["begins"]
    assert joined["round"] == 2 and sorted(joined["members"]) == ["w0", "w1", "w3"]
    assert joined["step"] in (16, 20) and joined["world"] == joined["accelerate_world"] == 3
    assert joined["adam_step"] == 0.0  # a new process: fresh moments, the outer state from a peer
    assert [b["step"] for b in seen["w0"]["begins"]][2] == joined["step"]
    assert seen["w3"]["steps"] == list(range(joined["step"] + 1, STEPS + 1))
    for name in ("w1", "w3"):
        assert seen[name]["theta"] == seen["w0"]["theta"]
        assert seen[name]["params"] == seen["w0"]["params"]


def test_a_peer_lost_in_the_trainers_loss_gather_is_survived_in_process(tmp_path) -> None:
    """w2 dies before step 6: the others fail in the Trainer's loss gather of step 6 (logging_steps
    3), not at a boundary, and go on from the boundary of step 4."""
    out, port = str(tmp_path), free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=60))
    ctx = process_context()
    late = {"settle_s": 5.0}  # as above: the survivors may meet the loss seconds apart
    processes = [
        spawn(ctx, out, port, "w0", 3, **late),
        spawn(ctx, out, port, "w1", 3, **late),
        spawn(ctx, out, port, "w2", 3, die_at=5, **late),
    ]
    seen = collect(processes, out, ("w0", "w1"), time.monotonic() + 240)
    assert [p.exitcode for p in processes] == [0, 0, 1]
    assert int(store.get("autoloco/latest")) == 1
    for name in ("w0", "w1"):
        after_fault = seen[name]["begins"][1]
        assert (after_fault["round"], after_fault["world"], after_fault["step"]) == (1, 2, 4)
        assert seen[name]["steps"] == list(range(1, 7)) + list(range(5, STEPS + 1))
        assert any(
            "the Trainer's collectives at step 6 failed" in w
            and "live membership goes on from step 4" in w
            for w in seen[name]["warnings"]
        ), seen[name]["warnings"]
    assert seen["w0"]["params"] == seen["w1"]["params"]


def test_a_run_that_starts_alone_in_a_membership_round_has_no_per_step_gather(tmp_path) -> None:
    """A later round may have more processes: the Trainer's per-step token gather, which a
    one-process start would keep, is switched off as in any multi-process run."""
    from transformers import Trainer, TrainingArguments

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
    from autoloco_hf.integrations.elastic.membership import LiveMembership
    from autoloco_hf.toy.llama import tiny_llama
    from autoloco_hf.toy.padded import LLAMA, PaddedTokens

    store = dist.TCPStore(
        "127.0.0.1", free_port(), is_master=True, timeout=datetime.timedelta(seconds=10)
    )
    config = AutoLoCoConfig(method="diloco", h_base=H)
    model = tiny_llama(**LLAMA, seed=0)
    live = LiveMembership(store, "w0", config, model)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, max_steps=2, report_to=[])
    assert args.average_tokens_across_devices  # the Trainer's default
    Trainer(
        model=model,
        args=args,
        train_dataset=PaddedTokens(8, 0),
        callbacks=[AutoLoCoCallback(config, membership=live)],
    )
    assert not args.average_tokens_across_devices


def test_the_step_a_join_is_taken_in_at_is_saved_and_logged_as_without_the_join(tmp_path) -> None:
    """save_steps and logging_steps equal to H: every boundary is saved and logged, the join's
    included (before, MembershipChange left train() in on_step_end, before the Trainer's log and
    save of that step). The joiner is started like the members, with start(2): a process after the
    launch is taken in at the next boundary."""
    out, port = str(tmp_path), free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=60))
    ctx = process_context()
    deadline = time.monotonic() + 240
    every_boundary = {"save_steps": H, "logging_steps": H}
    members = [
        spawn(ctx, out, port, f"w{i}", 2, wait_for_joiner_at=(8,), **every_boundary)
        for i in range(2)
    ]
    wait_round(store, 0, deadline)
    # the members' command: start() takes it in later
    joiner = spawn(ctx, out, port, "w2", 2, **every_boundary)
    seen = collect([*members, joiner], out, ("w0", "w1", "w2"), deadline)
    assert [p.exitcode for p in (*members, joiner)] == [0, 0, 0]
    (joined,) = seen["w2"]["begins"]
    assert joined["round"] == 1 and joined["step"] in (8, 12)
    boundaries = list(range(H, STEPS + 1, H))
    for name in ("w0", "w1"):
        assert [b["step"] for b in seen[name]["begins"]] == [0, joined["step"]]
        assert seen[name]["saved"] == boundaries  # the join's step too, once
        assert seen[name]["logged"] == boundaries
        assert seen[name]["steps"] == list(range(1, STEPS + 1))  # a join redoes nothing
    checkpoints = sorted(
        int(d.split("-")[1]) for d in os.listdir(os.path.join(out, "w0")) if d.startswith("check")
    )
    assert checkpoints == boundaries
    assert seen["w2"]["saved"] == [s for s in boundaries if s > joined["step"]]
    assert seen["w2"]["params"] == seen["w0"]["params"]


@pytest.mark.parametrize("when", ["launch", "join"])
def test_a_process_with_other_training_arguments_is_refused_and_the_run_goes_on(
    tmp_path, when
) -> None:
    """A process whose per_device_train_batch_size differs is refused in one
    line, at the launch (the majority decides, not the order of arrival: it
    starts first) or when it joins; the others train to the end."""
    out, port = str(tmp_path), free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=60))
    ctx = process_context()
    deadline = time.monotonic() + 240
    if when == "launch":
        odd = spawn(ctx, out, port, "w2", 3, batch_size=8)
        members = [spawn(ctx, out, port, f"w{i}", 3) for i in range(2)]
    else:
        members = [spawn(ctx, out, port, f"w{i}", 2, wait_for_joiner_at=(8,)) for i in range(2)]
        wait_round(store, 0, deadline)
        # the members' command, another batch size
        odd = spawn(ctx, out, port, "w2", 2, batch_size=8)
    seen = collect([*members, odd], out, ("w0", "w1", "w2"), deadline)
    assert [p.exitcode for p in (*members, odd)] == [0, 0, 0]
    round_ = 0 if when == "launch" else 1
    assert seen["w2"]["refused"] == (
        f"w2 may not join the run (membership round {round_}): field "
        "TrainingArguments.per_device_train_batch_size=8 but the run has "
        "per_device_train_batch_size=4: start it with the run's TrainingArguments"
    )
    assert seen["w2"]["steps"] == []  # it trained nothing
    for name in ("w0", "w1"):
        assert seen[name]["steps"][-1] == STEPS
        assert sorted(seen[name]["begins"][-1]["members"]) == ["w0", "w1"]
        assert any(
            "['w2'] refused: its TrainingArguments differ" in w for w in seen[name]["warnings"]
        )
    assert seen["w1"]["params"] == seen["w0"]["params"]
