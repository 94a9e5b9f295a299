"""Faults seen by the engine with simulated workers: repeated
non-finite intervals, disagreement before the payload."""

from __future__ import annotations

import logging
import re
import socket

import pytest
import torch

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.sync.communicators import SimulatedCommunicator, worker_label
from autoloco_hf.sync.control import WorkerDisagreement
from autoloco_hf.sync.engine.engine import TooManyInvalidIntervals
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

STEPS = 24
# how the messages name each worker
WORKER = [worker_label(i, i, socket.gethostname()) for i in range(2)]


def runner(**config) -> LocalWorkers:
    return LocalWorkers(
        AutoLoCoConfig(method="diloco", h_base=4, **config),
        make_model(),
        SimulatedCommunicator(2),
        adamw,
        scheduler_factory=cosine(STEPS, 0),
        total_steps=STEPS,
    )


def poison(model: torch.nn.Module) -> None:
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")


def test_consecutive_invalid_intervals_stop_the_run_with_the_outer_state_intact(caplog):
    """Worker 1 turns NaN in every interval from step 6 on: two skipped outer steps are logged with
    the worker, the third in a row stops the run; theta is still the one synchronized at step 4."""
    run = runner(max_consecutive_invalid=3)
    caplog.set_level(logging.WARNING, logger="autoloco_hf")
    theta_4 = None
    with pytest.raises(TooManyInvalidIntervals) as err:
        for step in range(STEPS):
            if step >= 5 and step % 4 == 1:
                poison(run.models[1])
            run.train_step([batch_for(w, step) for w in range(2)])
            if step + 1 == 4:
                theta_4 = run.engine.outer.params.detach().clone()
                momentum_4 = run.engine.outer.momentum_buffer.clone()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "AutoLoCo stopped at step 16: interval 3 (steps 13-16): non-finite loss or "
        f"pseudo-gradient on {WORKER[1]}, 3 such intervals in a row (max_consecutive_invalid=3)"
    )
    assert "synchronized at step 4" in message
    assert [r.outer_step_applied for r in run.engine.records] == [True, False, False, False]
    assert torch.equal(run.engine.outer.params, theta_4)
    assert torch.equal(run.engine.outer.momentum_buffer, momentum_4)
    warnings = [r.getMessage() for r in caplog.records if "outer step skipped" in r.getMessage()]
    assert len(warnings) == 2 and all(f"on {WORKER[1]};" in w for w in warnings)
    assert "(1 of max_consecutive_invalid=3 in a row)" in warnings[0]


def test_a_valid_interval_resets_the_count():
    """Invalid, valid, invalid, valid: never two in a row, so
    max_consecutive_invalid=2 never stops the run."""
    run = runner(max_consecutive_invalid=2)
    for step in range(STEPS):
        if step in (5, 13):
            poison(run.models[1])
        run.train_step([batch_for(w, step) for w in range(2)])
    assert [r.outer_step_applied for r in run.engine.records] == [
        True,
        False,
        True,
        False,
        True,
        True,
    ]


def test_disagreement_is_raised_before_the_payload_is_exchanged():
    """The agreement check runs on the control messages, before the pseudo-gradients travel (no
    mismatched collectives); the outer state does not move."""
    run = runner()
    payload_sent = []
    average = SimulatedCommunicator.average

    def tampered(self, flats, scalars, segment_sizes, wire_dtype=None, check=None):
        scalars = [scalars[0], scalars[1].clone()]
        scalars[1][-2] += 2.0  # worker 1 claims another token-equivalent horizon (h_tok)
        result = average(self, flats, scalars, segment_sizes, wire_dtype, check)
        payload_sent.append(True)
        return result

    theta_0 = run.engine.outer.params.detach().clone()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SimulatedCommunicator, "average", tampered)
        with pytest.raises(
            WorkerDisagreement, match=re.escape(f"(h_tok: {WORKER[0]}=4, {WORKER[1]}=6)")
        ):
            for step in range(4):
                run.train_step([batch_for(w, step) for w in range(2)])
    assert (
        not payload_sent
        and torch.equal(run.engine.outer.params, theta_0)
        and not run.engine.records
    )


def _silent_peer(rank: int, world_size: int, overlapped_wire: str | None) -> str:
    """Rank 1 builds its communicator (a collective) and then never joins the synchronization.

    ``overlapped_wire``: rank 0 starts an overlapped average on that
    wire and waits for it later (the FP32 all-reduce's or the INT8
    all-gather's async work handles); ``None``: the blocking average.
    """
    import time

    from autoloco_hf.sync.communicators import PeerLostError, ProcessGroupCommunicator

    comm = ProcessGroupCommunicator(timeout_s=3.0, wire_dtype=overlapped_wire or "fp32")
    if rank == 1:
        # far longer than the timeout: rank 0 must give up on its own, not see rank 1 exit
        time.sleep(12.0)
        return ""
    args = ([torch.zeros(8)], [torch.zeros(3, dtype=torch.float64)], [8])
    started = time.monotonic()
    try:
        if overlapped_wire is None:
            comm.average(*args)
        else:
            comm.start_average(*args).wait()
    except PeerLostError as err:
        return f"{time.monotonic() - started:.1f} {err.silent_ranks} {err}"
    return "no error"


@pytest.mark.slow
@pytest.mark.parametrize(
    "overlapped_wire, operation",
    [
        (None, "the synchronization's control messages"),
        ("fp32", "the overlapped synchronization"),
        # the all-gather's work handles, waited for like FP32's
        ("int8", "the overlapped synchronization"),
    ],
)
def test_a_silent_peer_is_named_after_sync_timeout_s(overlapped_wire, operation):
    """Real gloo processes: the collective gives up after sync_timeout_s (its own group's timeout,
    not the 120 s of the default group) with one line naming the rank that did not answer; an
    overlapped one when it is waited for."""
    from _dist import run_gloo

    result = run_gloo(_silent_peer, 2, overlapped_wire)[0]
    seconds, rest = result.split(" ", 1)
    # bounded by sync_timeout_s (3 s), not the default group's
    # 120 s; the upper bound leaves room for a loaded machine
    assert 2.5 <= float(seconds) < 10.0, result
    assert rest.startswith(
        f"[1] {operation} on rank 0: rank 1 did not answer within sync_timeout_s=3 ("
    ), rest
    # gloo's detail: the collective that timed out, or (overlapped: several work handles in flight)
    # one whose pair that timeout closed first
    assert (
        "Timed out waiting 3000ms" in rest or "Application timeout caused pair closure" in rest
    ), rest
    assert "\n" not in rest
