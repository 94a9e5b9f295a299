"""The 4-bit, 2-bit and top-k wires (docs/algorithm.md#low-bit-wires)
against plain references, bit for bit.

The references below search the grid (``torch.bucketize`` over the midpoints),
pack codes with Python integers and pick top-k entries with a stable sort per
block: none of the kernel's shortcuts (ceilings, index tables, byte tables,
cache-sized groups). Every case compares the packed codes, scales, offsets and
decoded values as bit patterns.
"""

from __future__ import annotations

import math

import pytest
import torch

from autoloco_hf.wire.codec import ErrorFeedback, WireCodec, roundtrip_as_sent
from autoloco_hf.wire.formats.grid import FP4_E2M1_GRID, INT2_GRID, INT4_GRID, Grid
from autoloco_hf.wire.formats.int8 import CHUNK_ELEMENTS, SCALE_MIN

GRIDS = {"int4": INT4_GRID, "fp4": FP4_E2M1_GRID, "int2": INT2_GRID}
LOSSY = ["bf16", "int8", "int4", "fp4", "int2"]


def _scale_max(top: float) -> float:
    s = torch.tensor(torch.finfo(torch.float32).max / top, dtype=torch.float32)
    while not torch.isfinite(s * top):
        s = torch.nextafter(s, torch.zeros_like(s))
    return float(s)


def _reference_block(x: torch.Tensor, grid: Grid) -> tuple[torch.Tensor, float, torch.Tensor]:
    """Codes, scale and decoded values of one block, by searching the grid."""
    amax = float(x.abs().max()) if x.numel() else 0.0
    top = grid.magnitudes[-1]
    scale = 1.0 if amax == 0 else float(torch.tensor(amax, dtype=torch.float32) / top)
    if math.isnan(scale):
        scale = _scale_max(top)
    scale = min(max(scale, SCALE_MIN), _scale_max(top))
    m = (x / torch.tensor(scale, dtype=torch.float32)).abs()
    index = torch.bucketize(m, torch.tensor(grid.midpoints, dtype=torch.float32), right=False)
    index = torch.where(m.isnan(), 0, index)
    codes = index + (1 << (grid.bits - 1)) * (x < 0).long()
    signed = torch.tensor(grid.signed_levels(), dtype=torch.float32)
    decoded = signed[codes] * torch.tensor(scale, dtype=torch.float32)
    return codes, scale, decoded


def _pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``sum_j code_j * 2**(bits * j)`` over each group of ``8 / bits`` codes, zero-padded."""
    per = 8 // bits
    padded = torch.cat([codes, codes.new_zeros(-codes.numel() % per)]).view(-1, per)
    return (padded * torch.tensor([2 ** (bits * j) for j in range(per)])).sum(dim=1)


def _reference_dense(
    codec: WireCodec, x: torch.Tensor, start: int, grid: Grid, block: int | None = None
):
    """Packed bytes, scales and decoded slice, piece by piece and block by block."""
    block = block or codec.block_size
    packed, scales, decoded = [torch.zeros(0, dtype=torch.long)], [], torch.empty_like(x)
    for off, n in codec.pieces(start, x.numel()):
        piece_codes = []
        for b in range(off, off + n, block):
            codes, scale, dec = _reference_block(x[b : min(b + block, off + n)], grid)
            piece_codes.append(codes)
            scales.append(scale)
            decoded[b : b + codes.numel()] = dec
        packed.append(_pack(torch.cat(piece_codes), grid.bits))
    return torch.cat(packed).to(torch.uint8), torch.tensor(scales, dtype=torch.float32), decoded


def _edge_input(numel: int, seed: int, grid: Grid) -> torch.Tensor:
    """Normal values, blocks of mixed magnitudes, exact ties
    on the grid's midpoints, zeros, -0.0 and tiny values."""
    g = torch.Generator().manual_seed(seed)
    x = (
        torch.randn(numel, generator=g)
        * 10.0 ** torch.randint(-30, 30, (numel,), generator=g).float() ** 0
    )
    x[: numel // 3] *= 10.0 ** torch.randint(-20, 20, (1,), generator=g).item()
    ties = torch.tensor([grid.magnitudes[-1], *grid.midpoints, *(-m for m in grid.midpoints)])
    # a block whose max is the top level: scale 1, m exactly on the midpoints
    x[40 : 40 + ties.numel()] = ties
    x[40 + ties.numel() : 64] = 0.0
    x[64:80] = 0.0  # an all-zero stretch
    x[81] = -0.0
    # denormals: the lower scale clamp
    x[90:96] = torch.tensor([1e-40, -1e-39, 3e-45, 0.0, 1e-38, -1e-38])
    return x


SEGMENTS = [[1500], [37, 16, 300, 1, 999], [7, 7, 7, 234]]


# codec_kernel: the compiled kernel must give the reference's bytes too
KERNELS = ["eager", "compiled"]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("wire", list(GRIDS))
@pytest.mark.parametrize("segments", SEGMENTS, ids=lambda s: f"{len(s)}seg")
@pytest.mark.parametrize("block_size,threads", [(16, 1), (33, 2), (4096, 1)])
def test_dense_grid_wire_bit_identical_to_reference(
    wire, segments, block_size, threads, kernel
) -> None:
    grid = GRIDS[wire]
    codec = WireCodec(wire, segments, block_size=block_size, kernel=kernel)
    x = _edge_input(codec.numel, seed=block_size, grid=grid)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for start, end in [(0, codec.numel), (3, codec.numel - 5), *codec.partition(3)]:
            packed, scales = codec.encode(x[start:end], start)
            ref_packed, ref_scales, ref_decoded = _reference_dense(codec, x[start:end], start, grid)
            assert torch.equal(packed, ref_packed)
            assert torch.equal(scales.view(torch.int32), ref_scales.view(torch.int32))
            decoded = codec.decode([packed, scales], start, end - start)
            assert torch.equal(decoded.view(torch.int32), ref_decoded.view(torch.int32))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("wire", list(GRIDS))
def test_dense_grid_wire_spans_several_cache_groups(wire, kernel) -> None:
    """A piece longer than one group of blocks (the kernel's grouping must not change the codes)."""
    codec = WireCodec(wire, [2 * CHUNK_ELEMENTS + 100], block_size=4096, kernel=kernel)
    x = torch.randn(codec.numel, generator=torch.Generator().manual_seed(1))
    x[5 * 4096 : 6 * 4096] *= 1e6
    packed, scales = codec.encode(x, 0)
    ref_packed, ref_scales, ref_decoded = _reference_dense(codec, x, 0, GRIDS[wire])
    assert torch.equal(packed, ref_packed) and torch.equal(scales, ref_scales)
    assert torch.equal(
        codec.decode([packed, scales], 0, codec.numel).view(torch.int32),
        ref_decoded.view(torch.int32),
    )


@pytest.mark.parametrize("wire", list(GRIDS))
def test_grid_error_is_at_most_half_the_widest_gap_times_the_scale(wire) -> None:
    grid = GRIDS[wire]
    half_gap = max(b - a for a, b in zip(grid.magnitudes, grid.magnitudes[1:])) / 2
    codec = WireCodec(wire, [4096 * 3 + 17], block_size=4096)
    x = torch.randn(codec.numel, generator=torch.Generator().manual_seed(2)) * 1e-3
    packed, scales = codec.encode(x, 0)
    per_element = torch.repeat_interleave(scales, torch.tensor([4096, 4096, 4096, 17]))
    err = (codec.decode([packed, scales], 0, codec.numel) - x).abs()
    assert (err <= per_element * half_gap * (1 + 2.0**-16)).all()
    # the bound is not vacuous
    assert float(err.max()) > 0.5 * float((per_element * half_gap).min())


def test_fp4_decodes_to_the_e2m1_values() -> None:
    codec = WireCodec("fp4", [16], block_size=16)
    x = torch.tensor(
        [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0, 0.74]
    )
    assert codec.roundtrip(x, 0).tolist() == [*x[:15].tolist(), 0.5]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("wire", list(GRIDS))
def test_non_finite_input_is_defined_and_decodes_finite(wire, kernel) -> None:
    codec = WireCodec(wire, [8], block_size=4, kernel=kernel)
    x = torch.tensor([math.nan, 1.0, math.inf, -2.0, 1.0, 2.0, 3.0, -math.inf])
    decoded = codec.roundtrip(x, 0)
    # the same for both kernels
    assert torch.equal(decoded, WireCodec(wire, [8], block_size=4).roundtrip(x, 0))
    assert torch.isfinite(decoded).all()
    # NaN: code 0, the smallest positive level (0 except for int2) at the upper scale
    assert decoded[0] == torch.tensor(
        GRIDS[wire].magnitudes[0] * _scale_max(GRIDS[wire].top), dtype=torch.float32
    )
    assert decoded[2] > 0 and decoded[7] < 0


def _reference_topk(
    codec: WireCodec, x: torch.Tensor, start: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets (as int64) and decoded slice: stable sort per
    block, kept values through the dense reference."""
    offsets, decoded = [], torch.zeros_like(x)
    grid = GRIDS.get(str(codec.wire_dtype))
    for off, n in codec.pieces(start, x.numel()):
        kept_values, kept_at = [], []
        for b in range(off, off + n, codec.block_size):
            block = x[b : min(b + codec.block_size, off + n)]
            k = math.ceil(codec.topk_fraction * block.numel())
            chosen = sorted(
                torch.sort(block.abs(), descending=True, stable=True).indices[:k].tolist()
            )
            offsets += chosen
            kept_values.append(block[chosen])
            kept_at += [b + c for c in chosen]
        values = torch.cat(kept_values)
        inner_block = math.ceil(codec.topk_fraction * min(codec.block_size, n))
        inner = WireCodec(str(codec.wire_dtype), [values.numel()], block_size=inner_block)
        if grid is not None:
            _, _, dec = _reference_dense(inner, values, 0, grid)
        else:
            # int8: its kernel is checked against its reference elsewhere
            dec = inner.roundtrip(values, 0)
        decoded[kept_at] = dec
    return torch.tensor(offsets, dtype=torch.int64), decoded


@pytest.mark.parametrize("wire", ["int8", "int4", "fp4", "int2"])
@pytest.mark.parametrize("fraction,block_size", [(0.02, 64), (0.3, 64), (1.0, 64), (0.02, 40_000)])
def test_topk_wire_bit_identical_to_reference(wire, fraction, block_size) -> None:
    codec = WireCodec(wire, [50_000, 7, 300, 1], block_size=block_size, topk_fraction=fraction)
    x = torch.randn(codec.numel, generator=torch.Generator().manual_seed(3))
    x[100:200] = 0.0  # ties: the lower offsets win
    x[300:310] = 1.5
    for start, end in [(0, codec.numel), *codec.partition(3)]:
        wire_tensors = codec.encode(x[start:end], start)
        offsets, decoded = _reference_topk(codec, x[start:end], start)
        got_offsets = wire_tensors[-1].view(torch.int16).to(torch.int64) & 0xFFFF
        assert torch.equal(got_offsets, offsets)
        got = codec.decode(wire_tensors, start, end - start)
        assert torch.equal(got.view(torch.int32), decoded.view(torch.int32))


def test_topk_keeps_the_largest_entries_of_every_block_and_zeros_the_rest() -> None:
    # k = 2 of 5, 1 of the 1-element tail
    codec = WireCodec("int4", [10, 6], block_size=5, topk_fraction=0.4)
    x = torch.tensor(
        [1.0, -9.0, 2.0, 8.0, 0.5, 3.0, 0.0, -4.0, 0.1, 0.2, 7.0, 1.0, 1.0, 1.0, 2.0, 5.0]
    )
    sent = codec.roundtrip(x, 0)
    assert (sent != 0).tolist() == [
        *[False, True, False, True, False],
        *[True, False, True, False, False],
        *[True, False, False, False, True],
        True,
    ]


@pytest.mark.parametrize("wire,topk", [(w, None) for w in LOSSY] + [("int2", 0.1), ("int4", 0.1)])
def test_error_feedback_sends_everything_eventually(wire, topk) -> None:
    """What the wire drops stays in the residual: sent total + residual
    = rounds * delta, and the sent total tracks it; without feedback
    the small entries (or the unsent ones) are lost every round."""
    codec = WireCodec(wire, [64], block_size=32, topk_fraction=topk)
    g = torch.Generator().manual_seed(4)
    delta = torch.randn(64, generator=g) * 0.1
    delta[0], delta[32] = 100.0, -50.0
    ef, rounds = ErrorFeedback(64), 200
    sent_total = torch.zeros(64)
    for _ in range(rounds):
        compensated = ef.apply(codec, delta, 2)
        sent_total += roundtrip_as_sent(codec, compensated, 2)
    assert torch.allclose(sent_total + ef.residual, delta * rounds, rtol=1e-4, atol=1e-2)
    plain = roundtrip_as_sent(codec, delta, 2) * rounds
    with_feedback = float((sent_total - delta * rounds).abs().max())
    assert with_feedback < 0.25 * float((plain - delta * rounds).abs().max())


@pytest.mark.parametrize("wire", list(GRIDS))
def test_error_feedback_keeps_what_three_owners_decode_on_an_uneven_partition(wire) -> None:
    """The residual is the contribution minus what was sent:
    each owner's part encoded from its own start.

    100 elements over 3 workers are parts of 34, 33 and 33, none a whole number of 16-element
    blocks, so the whole-buffer roundtrip (blocks from element 0) is not what was sent.
    """
    codec = WireCodec(wire, [100], block_size=16)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(100, generator=g) * torch.logspace(-3, 1, 100)
    ef = ErrorFeedback(100)
    for _ in range(2):  # the second round sends x plus the first round's residual
        compensated = x + ef.residual
        sent = torch.cat(
            [
                _reference_dense(codec, compensated[a:b], a, GRIDS[wire])[2]
                for a, b in ((0, 34), (34, 67), (67, 100))
            ]
        )
        assert not torch.equal(sent, _reference_dense(codec, compensated, 0, GRIDS[wire])[2])
        assert torch.equal(ef.apply(codec, x, 3), compensated)
        assert torch.equal(ef.residual, compensated - sent)


def test_error_feedback_offset_touches_only_its_fragments_part() -> None:
    codec = WireCodec("int2", [10], block_size=10)
    ef = ErrorFeedback(30)
    ef.apply(codec, torch.linspace(-1, 1, 10), 1, offset=10)
    assert (
        ef.residual[:10].eq(0).all()
        and ef.residual[20:].eq(0).all()
        and ef.residual[10:20].ne(0).any()
    )


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            dict(wire_dtype="int3"),
            "wire_dtype='int3' is not a wire format: use one of fp32, bf16, int8, int4, fp4, int2",
        ),
        (dict(wire_dtype="int2", topk_fraction=0.0), r"topk_fraction=0.0 is outside \(0, 1\]"),
        (dict(wire_dtype="int2", topk_fraction=1.5), r"topk_fraction=1.5 is outside \(0, 1\]"),
        (dict(wire_dtype="fp32", topk_fraction=0.1), "top-k values travel in a blockwise wire"),
        (dict(wire_dtype="int4", block_size=0), "block_size=0 is not a positive integer"),
        (dict(wire_dtype="int4", block_size=2.0), "block_size=2.0 is not a positive integer"),
        (
            dict(wire_dtype="int4", block_size=70_000, topk_fraction=0.1),
            "offsets in a block are 16-bit",
        ),
    ],
)
def test_bad_wire_options_fail_at_construction_in_one_line(kwargs, message) -> None:
    from autoloco_hf.sync.communicators import SimulatedCommunicator

    with pytest.raises(ValueError, match=message) as err:
        SimulatedCommunicator(2, **kwargs)
    assert "\n" not in str(err.value)
