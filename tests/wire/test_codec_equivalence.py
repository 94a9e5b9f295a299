"""The grouped, buffer-reusing codec is bit-identical to the original one-pass implementation.

``_reference_encode`` / ``_reference_decode`` are the codec as it was before it
worked in cache-sized groups of blocks (full-size temporaries, one vectorized pass
over all blocks); every case compares codes, scales and decoded values bit for bit,
with and without persistent ``out`` buffers, on sizes that span several groups.
"""

from __future__ import annotations

import pytest
import torch

from autoloco_hf.wire.codec import WireCodec
from autoloco_hf.wire.formats.int8 import CHUNK_ELEMENTS, QMAX, SCALE_MAX, SCALE_MIN


def _reference_blocked(x: torch.Tensor, block_size: int) -> list[torch.Tensor]:
    numel = x.numel()
    full = numel // block_size * block_size
    views = [x[:full].view(-1, block_size)] if full else []
    if numel > full:
        views.append(x[full:].view(1, -1))
    return views


def _reference_encode_piece(
    x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, block_size: int
) -> None:
    row = 0
    for xb, vb in zip(_reference_blocked(x, block_size), _reference_blocked(values, block_size)):
        amax = torch.maximum(xb.amax(dim=1), xb.amin(dim=1).neg())
        scale = (amax / QMAX).masked_fill_(amax == 0, 1.0)
        scale = torch.nan_to_num(scale, nan=SCALE_MAX).clamp_(SCALE_MIN, SCALE_MAX)
        q = xb / scale[:, None]
        q.round_()
        q.nan_to_num_(nan=0.0).clamp_(-QMAX, QMAX)
        vb.copy_(q)
        scales[row : row + scale.numel()] = scale
        row += scale.numel()


def _reference_decode_piece(
    values: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, block_size: int
) -> None:
    out.copy_(values)
    row = 0
    for ob in _reference_blocked(out, block_size):
        ob.mul_(scales[row : row + ob.shape[0], None])
        row += ob.shape[0]


def _reference_int8(
    codec: WireCodec, x: torch.Tensor, start: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    values = torch.empty(x.numel(), dtype=torch.int8)
    scales = torch.empty(codec.num_blocks(start, x.numel()), dtype=torch.float32)
    decoded = torch.empty(x.numel(), dtype=torch.float32)
    row = 0
    for off, n in codec.pieces(start, x.numel()):
        nb = -(-n // codec.block_size)
        _reference_encode_piece(
            x[off : off + n], values[off : off + n], scales[row : row + nb], codec.block_size
        )
        _reference_decode_piece(
            values[off : off + n], scales[row : row + nb], decoded[off : off + n], codec.block_size
        )
        row += nb
    return values, scales, decoded


def _edge_case_input(numel: int, seed: int) -> torch.Tensor:
    """Random values at mixed magnitudes plus zero, -0, tie,
    subnormal, huge and non-finite stretches."""
    gen = torch.Generator().manual_seed(seed)
    x = (
        torch.randn(numel, generator=gen)
        * 10.0 ** torch.randint(-30, 30, (numel,), generator=gen).float()
    )
    specials = torch.tensor(
        [
            0.0,
            -0.0,
            float("nan"),
            float("inf"),
            -float("inf"),
            torch.finfo(torch.float32).max,
            -torch.finfo(torch.float32).max,
            1e-40,
            -1e-45,
            2.5,
            -0.5,
            127.5,
        ]
    )
    # specials in the first third only: later groups of
    # blocks take the encoder's all-finite fast path
    idx = torch.randint(0, max(1, numel // 3), (max(1, numel // 150),), generator=gen)
    x[idx] = specials[torch.randint(0, len(specials), idx.shape, generator=gen)]
    if numel > 100:  # whole stretches of zeros and of subnormals (all-zero blocks, clamped scales)
        x[numel // 3 : numel // 3 + 70] = 0.0
        x[numel // 2 : numel // 2 + 70] = 1e-41
    return x


@pytest.mark.parametrize(
    "segments, block_size",
    [
        ([1], 4096),
        ([5, 0, 3], 1),
        ([4096 * 3 + 17, 1000, 7], 4096),
        ([CHUNK_ELEMENTS * 2 + 12_345, 3], 4096),  # several groups plus a partial block
        ([CHUNK_ELEMENTS + 5, 999], 7),  # odd block size: groups of many tiny blocks
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_bit_identical_to_reference(
    segments: list[int], block_size: int, threads: int
) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        codec = WireCodec("int8", segments, block_size)
        for seed in range(2):
            x = _edge_case_input(codec.numel, seed)
            for start, end in codec.partition(3):  # owner parts cut segments at arbitrary offsets
                part = x[start:end]
                ref_values, ref_scales, ref_decoded = _reference_int8(codec, part, start)
                values, scales = codec.encode(part, start)
                assert torch.equal(values, ref_values) and torch.equal(scales, ref_scales)
                decoded = codec.decode([values, scales], start, end - start)
                # -0 and +0 too
                assert torch.equal(decoded.view(torch.int32), ref_decoded.view(torch.int32))
                wire = codec.empty_wire(start, end - start)
                out = torch.full((end - start,), 3.0)
                assert codec.encode(part, start, out=wire) is wire
                assert torch.equal(wire[0], ref_values) and torch.equal(wire[1], ref_scales)
                assert codec.decode(wire, start, end - start, out=out) is out
                assert torch.equal(out.view(torch.int32), ref_decoded.view(torch.int32))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("wire_dtype", ["fp32", "bf16"])
def test_cast_wires_with_out_buffers_equal_plain_casts(wire_dtype: str) -> None:
    codec = WireCodec(wire_dtype, [CHUNK_ELEMENTS + 3, 11])
    x = _edge_case_input(codec.numel, 0)
    wire = codec.empty_wire(5, codec.numel - 5)
    codec.encode(x[5:], 5, out=wire)
    dtype = torch.float32 if wire_dtype == "fp32" else torch.bfloat16
    assert torch.equal(
        wire[0].view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
        x[5:].to(dtype).view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
    )
    out = torch.empty(codec.numel - 5)
    codec.decode(wire, 5, codec.numel - 5, out=out)
    assert torch.equal(out.view(torch.int32), x[5:].to(dtype).float().view(torch.int32))


def test_out_buffers_are_validated() -> None:
    codec = WireCodec("int8", [100])
    with pytest.raises(ValueError, match="do not match"):
        codec.encode(torch.zeros(100), 0, out=codec.empty_wire(0, 99))
    with pytest.raises(ValueError, match="out must be a float32 tensor of shape"):
        codec.decode(codec.encode(torch.zeros(100), 0), 0, 100, out=torch.empty(99))
