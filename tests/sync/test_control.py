"""ControlMessage packing and the per-worker agreement check (spec 2, 5.3)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.control import ControlMessage, ControlRound, WorkerDisagreement


def message(**kw) -> ControlMessage:
    values = dict(sq_norm=2.5, tokens=96.0, loss_sum=3.25, loss_count=4.0, nonfinite=0.0, start_step=8.0, h_step=4.0)
    return ControlMessage(**{**values, **kw})


def test_pack_unpack_roundtrip_in_field_order() -> None:
    m = message()
    packed = m.pack()
    assert packed.dtype == torch.float64 and packed.numel() == ControlMessage.WIDTH
    assert packed.tolist() == [getattr(m, f.name) for f in dataclasses.fields(m)]
    assert ControlMessage.unpack(packed) == m
    with pytest.raises(ValueError, match="has 7 values, got 6"):
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


def test_disagreeing_interval_raises_naming_the_field_and_range() -> None:
    rows = torch.stack([message().pack(), message(h_step=6.0).pack()])
    control = ControlRound.from_rows(rows.sum(0), rows)
    with pytest.raises(WorkerDisagreement, match=r"h_step from 4 to 6 over 2 workers") as err:
        control.check_agreement()
    assert "start_step" not in str(err.value)
