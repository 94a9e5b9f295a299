"""ControlMessage packing and the per-worker agreement check
(docs/algorithm.md#interval-statistics, #phases)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.control import (
    ControlMessage,
    ControlRound,
    WorkerDisagreement,
    config_fingerprint,
)

FINGERPRINT = config_fingerprint(AutoLoCoConfig(method="diloco", h_base=4))


def message(**kw) -> ControlMessage:
    values = dict(
        sq_norm=2.5,
        tokens=96.0,
        loss_sum=3.25,
        loss_count=4.0,
        nonfinite=0.0,
        step=12.0,
        interval_index=2.0,
        start_step=8.0,
        h_step=4.0,
        h_tok=4.0,
        config_fingerprint=FINGERPRINT,
    )
    return ControlMessage(**{**values, **kw})


def test_pack_unpack_roundtrip_in_field_order() -> None:
    m = message()
    packed = m.pack()
    assert packed.dtype == torch.float64 and packed.numel() == ControlMessage.WIDTH
    assert packed.tolist() == [getattr(m, f.name) for f in dataclasses.fields(m)]
    assert ControlMessage.unpack(packed) == m
    with pytest.raises(
        ValueError, match=f"has {ControlMessage.WIDTH} values, got {ControlMessage.WIDTH - 1}"
    ):
        ControlMessage.unpack(packed[:-1])


def test_round_sums_summed_fields_and_keeps_agreed_ones() -> None:
    messages = [message(tokens=10.0), message(tokens=20.0), message(tokens=30.0)]
    result = SimulatedCommunicator(3).average(
        [torch.zeros(2)] * 3, [m.pack() for m in messages], [2]
    )
    control = ControlRound.from_rows(result.scalar_sums, result.scalar_rows)
    control.check_agreement()
    assert control.workers == tuple(messages)
    assert control.totals.tokens == 60.0 and control.totals.loss_count == 12.0
    assert (control.totals.start_step, control.totals.h_step) == (8.0, 4.0)  # not summed
    assert control.ranges("tokens") == (10.0, 30.0)


def test_disagreeing_interval_raises_naming_the_field_and_each_value() -> None:
    rows = torch.stack([message().pack(), message(h_step=6.0).pack()])
    control = ControlRound.from_rows(rows.sum(0), rows)
    with pytest.raises(WorkerDisagreement, match=r"h_step: worker 0=4, worker 1=6\)") as err:
        control.check_agreement()
    assert "start_step" not in str(err.value)


@pytest.mark.parametrize("field, value", [("step", 11.0), ("interval_index", 3.0), ("h_tok", 5.0)])
def test_every_decision_field_is_agreed(field: str, value: float) -> None:
    """Step, interval index and horizons decided at the
    previous boundary must match on every worker."""
    rows = torch.stack([message().pack(), message().pack(), message(**{field: value}).pack()])
    with pytest.raises(
        WorkerDisagreement, match=rf"{field}: rank 0=.*, rank 1=.*, rank 7={value:g}\)"
    ):
        ControlRound.from_rows(rows.sum(0), rows).check_agreement(["rank 0", "rank 1", "rank 7"])


def test_config_fingerprint_tells_configs_apart_and_shows_in_hex() -> None:
    same = config_fingerprint(
        AutoLoCoConfig(method="diloco", h_base=4, sync_timeout_s=30, outer_on_cpu=True)
    )
    other = config_fingerprint(AutoLoCoConfig(method="diloco", h_base=4, outer_lr=0.5))
    assert same == FINGERPRINT != other, (
        "local settings are not part of the fingerprint; outer_lr is"
    )
    assert other == int(other) < 2**52, "exact in a float64"
    rows = torch.stack([message().pack(), message(config_fingerprint=other).pack()])
    with pytest.raises(
        WorkerDisagreement,
        match=rf"config_fingerprint: worker 0={int(FINGERPRINT):013x}, "
        rf"worker 1={int(other):013x}\)",
    ):
        ControlRound.from_rows(rows.sum(0), rows).check_agreement()


def test_a_round_stores_and_restores_its_totals_and_every_workers_message() -> None:
    """A checkpoint keeps the round as it was (its totals are not summed again from the rows)."""
    workers = (message(tokens=3.0, loss_sum=1.5), message(tokens=5.0, loss_sum=2.5))
    # not the sum of the rows: stored as it was
    totals = dataclasses.replace(workers[0], tokens=99.0)
    round_ = ControlRound(totals, workers)
    state = round_.state_dict()
    assert set(state) == {"totals", "rows"} and state["rows"].shape == (2, state["totals"].numel())
    assert ControlRound.from_state(state) == round_
