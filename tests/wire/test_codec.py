"""Tests for the wire codecs and the owner-reduce aggregation
(docs/algorithm.md#wire-codecs, paper Appendix G.1).

Error bound used throughout (see autoloco_hf/wire/codec.py): per element
``|x - decode(encode(x))| <= scale * (1/2 + 2**-16)``. The ``2**-16`` slack covers
the two FP32 roundings, of ``x / scale`` (|x / scale| <= 127 (1 + 2**-24), so at most
``128 * 2**-24`` before rounding to an integer) and of ``q * scale`` (at most
``127 * 2**-24 * scale``). Errors are measured in float64 so the check itself does
not round.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import pytest
import torch
from torch.overrides import TorchFunctionMode

from autoloco_hf.config import BLOCKWISE_WIRES, WIRE_DTYPES, WireDtype
from autoloco_hf.wire.accounting import num_int8_blocks
from autoloco_hf.wire.codec import (
    ErrorFeedback,
    WireCodec,
    mean_in_worker_order,
    owner_reduce_mean,
    owner_reduce_part,
    roundtrip_as_sent,
)
from autoloco_hf.wire.formats.int8 import CHUNK_ELEMENTS, SCALE_MAX, SCALE_MIN

SLACK = 2.0**-16
FMAX = torch.finfo(torch.float32).max
BS = 4096
NUMEL = 3 * BS + 1234  # last block partial


class Int8Blocks(NamedTuple):
    """The two wire tensors of one INT8-encoded chunk."""

    values: torch.Tensor
    scales: torch.Tensor


def encode_int8(x: torch.Tensor, block_size: int = BS) -> Int8Blocks:
    """INT8 encoding of one 1-D chunk through the public
    codec (a single segment, the whole buffer)."""
    return Int8Blocks(
        *WireCodec(WireDtype.INT8, [x.numel()], block_size).encode(x.to(torch.float32), 0)
    )


def decode_int8(blocks: Int8Blocks, block_size: int = BS) -> torch.Tensor:
    numel = blocks.values.numel()
    return WireCodec(WireDtype.INT8, [numel], block_size).decode(list(blocks), 0, numel)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _per_element_scale(scales: torch.Tensor, numel: int, block_size: int) -> torch.Tensor:
    """Scale of the block each element of a single chunk belongs to."""
    sizes = [block_size] * (numel // block_size) + (
        [numel % block_size] if numel % block_size else []
    )
    return torch.repeat_interleave(scales, torch.tensor(sizes, dtype=torch.long))


def _codec_element_scale(
    codec: WireCodec, scales: torch.Tensor, start: int, numel: int
) -> torch.Tensor:
    """Scale of the block each element of a WireCodec slice belongs to."""
    parts, row = [], 0
    for _, n in codec.pieces(start, numel):
        nb = num_int8_blocks(n, codec.block_size)
        parts.append(_per_element_scale(scales[row : row + nb], n, codec.block_size))
        row += nb
    return torch.cat(parts) if parts else torch.empty(0)


def _make(kind: str, numel: int = NUMEL) -> torch.Tensor:
    g = _gen(1)
    if kind == "normal":
        return torch.randn(numel, generator=g)
    if kind == "cauchy":
        u = torch.rand(numel, generator=g, dtype=torch.float64)
        return torch.tan(math.pi * (u - 0.5)).float()
    if kind == "student_t2":
        z = torch.randn(numel, generator=g, dtype=torch.float64)
        chi2 = torch.randn(numel, 2, generator=g, dtype=torch.float64).pow(2).sum(1)
        return (z / (chi2 / 2).sqrt()).float()
    if kind == "zeros":
        return torch.zeros(numel)
    if kind == "constant":
        return torch.full((numel,), -3.7)
    if kind == "denormal":
        x = torch.randn(numel, generator=g) * 1e-40
        assert x.abs().max() < torch.finfo(torch.float32).tiny
        return x
    if kind == "huge":
        return torch.randn(numel, generator=g) * 1e30
    if kind == "mixed_huge_small":
        x = torch.randn(numel, generator=g) * 1e-3
        x[::1000] = 1e30
        x[500::1000] = -1e30
        return x
    if kind == "fp32_max":
        x = torch.randn(numel, generator=g)
        x[::777] = FMAX
        x[7::777] = -FMAX
        return x
    raise AssertionError(kind)


KINDS = [
    "normal",
    "cauchy",
    "student_t2",
    "zeros",
    "constant",
    "denormal",
    "huge",
    "mixed_huge_small",
    "fp32_max",
]


@pytest.mark.parametrize("kind", KINDS)
def test_int8_roundtrip_within_half_scale(kind: str) -> None:
    x = _make(kind)
    enc = encode_int8(x, BS)
    assert enc.values.dtype == torch.int8 and enc.values.shape == x.shape
    assert enc.scales.dtype == torch.float32 and enc.scales.numel() == 4  # 3 full + 1 partial block
    assert int(enc.values.abs().max()) <= 127
    assert (
        torch.isfinite(enc.scales).all()
        and (enc.scales >= SCALE_MIN).all()
        and (enc.scales <= SCALE_MAX).all()
    )
    dec = decode_int8(enc, BS)
    assert dec.dtype == torch.float32 and torch.isfinite(dec).all()
    err = (x.double() - dec.double()).abs()
    scale = _per_element_scale(enc.scales, x.numel(), BS).double()
    assert (err <= scale * (0.5 + SLACK)).all(), float((err / scale).max())


@pytest.mark.parametrize("kind", ["normal", "cauchy", "huge", "constant"])
def test_int8_scale_is_block_max_over_127(kind: str) -> None:
    """The block max maps to +-127 exactly, so the bound above is not trivially loose."""
    x = _make(kind)
    enc = encode_int8(x, BS)
    blocks = [x[i : i + BS] for i in range(0, x.numel(), BS)]
    expected = torch.stack([b.abs().max() / 127 for b in blocks])
    assert torch.equal(enc.scales, expected)
    for i, b in enumerate(blocks):
        q = enc.values[i * BS : i * BS + b.numel()]
        assert int(q[b.abs().argmax()].abs()) == 127


def test_zero_block_uses_scale_one_and_decodes_exact_zero() -> None:
    x = torch.randn(10, generator=_gen())
    x[4:8] = 0.0
    enc = encode_int8(x, 4)
    assert enc.scales[1].item() == 1.0
    assert torch.equal(decode_int8(enc, 4)[4:8], torch.zeros(4))


def test_ties_round_half_to_even() -> None:
    x = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -2.5, 3.5, -3.5, 126.5])
    enc = encode_int8(x, 16)
    assert enc.scales.item() == 1.0
    assert enc.values.tolist() == [127, 0, 2, 2, 0, -2, 4, -4, 126]
    assert decode_int8(enc, 16).tolist() == [127.0, 0.0, 2.0, 2.0, 0.0, -2.0, 4.0, -4.0, 126.0]
    # same ties at scale 2 (max 254): x / scale = 0.5, 1.5, 2.5, -2.5
    enc2 = encode_int8(torch.tensor([254.0, 1.0, 3.0, 5.0, -5.0]), 16)
    assert enc2.scales.item() == 2.0
    assert enc2.values.tolist() == [127, 0, 2, 2, -2]
    # scale 7 (max 889): x / 7 = 6.5, 12.5, 7.5, -6.5 exactly; this also pins the spec's
    # division, since x * (1 / 7) rounds 45.5 and 87.5 to 6.5000005 and 12.500001 (-> 7, 13)
    enc7 = encode_int8(torch.tensor([889.0, 45.5, 87.5, 52.5, -45.5]), 16)
    assert enc7.scales.item() == 7.0
    assert enc7.values.tolist() == [127, 6, 12, 8, -6]


def test_int8_is_sign_symmetric() -> None:
    x = _make("cauchy")
    a, b = encode_int8(x, BS), encode_int8(-x, BS)
    assert torch.equal(a.scales, b.scales) and torch.equal(a.values, -b.values)


def test_scale_clamp_constants() -> None:
    f32 = torch.float32
    assert SCALE_MIN == torch.finfo(f32).tiny
    top = torch.tensor(SCALE_MAX, dtype=f32)
    assert top.item() == SCALE_MAX  # exactly representable
    assert torch.isfinite(top * 127)
    assert not torch.isfinite(torch.nextafter(top, torch.tensor(math.inf)) * 127)
    # the naive clamp finfo.max / 127 would overflow on decode
    assert not torch.isfinite(torch.tensor(FMAX, dtype=f32) / 127 * 127)


def test_scale_clamping_denormal_and_huge() -> None:
    sub = torch.tensor([1e-40, -3e-41, 0.0, 5e-45])
    tiny = encode_int8(sub, 8)
    assert tiny.scales.item() == SCALE_MIN  # not the subnormal 1e-40 / 127, and not 0
    dec = decode_int8(tiny, 8)
    assert torch.isfinite(dec).all() and (dec.double() - sub.double()).abs().max() <= SCALE_MIN / 2

    big = torch.tensor([1e30, -1e30, 3e29, 1.0])
    dec = decode_int8(encode_int8(big, 8), 8)
    assert torch.isfinite(dec).all()
    assert dec[0].item() == pytest.approx(1e30, rel=1e-6) and dec[1].item() == pytest.approx(
        -1e30, rel=1e-6
    )

    edge = torch.tensor([FMAX, -FMAX, 1.0])
    enc = encode_int8(edge, 8)
    assert enc.scales.item() == SCALE_MAX and enc.values[:2].tolist() == [127, -127]
    dec = decode_int8(enc, 8)
    assert torch.isfinite(dec).all() and dec[0].item() == pytest.approx(FMAX, rel=1e-6)


def test_non_finite_input_is_defined_and_decodes_finite() -> None:
    nan, inf = math.nan, math.inf
    x = torch.tensor([nan, 1.0, 2.0, 3.0, inf, -inf, 1.0, 0.0, 5.0, -6.0, 7.0, 0.5])
    enc = encode_int8(x, 4)
    assert enc.scales[:2].tolist() == [SCALE_MAX, SCALE_MAX]
    assert enc.values[:8].tolist() == [0, 0, 0, 0, 127, -127, 0, 0]
    # a finite block next to non-finite ones is unaffected
    alone = encode_int8(x[8:], 4)
    assert torch.equal(enc.values[8:], alone.values) and torch.equal(enc.scales[2:], alone.scales)
    assert torch.isfinite(decode_int8(enc, 4)).all()


def test_encode_int8_validates_input() -> None:
    with pytest.raises(ValueError):
        encode_int8(torch.zeros(2, 2))
    with pytest.raises(ValueError):
        encode_int8(torch.zeros(4), 0)
    with pytest.raises(ValueError):
        decode_int8(Int8Blocks(torch.zeros(9, dtype=torch.int8), torch.ones(2)), 4)


def test_empty_chunk() -> None:
    enc = encode_int8(torch.empty(0))
    assert enc.values.numel() == 0 and enc.scales.numel() == 0
    assert decode_int8(enc).numel() == 0


# ---------------------------------------------------------------------------------- WireCodec


def test_blocks_never_cross_segments() -> None:
    codec = WireCodec("int8", [3, 5], block_size=4)
    x = torch.tensor([1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 40.0, 50.0])
    assert codec.num_blocks(0, 8) == 1 + 2  # ceil(3/4) + ceil(5/4), not ceil(8/4)
    values, scales = codec.encode(x, 0)
    assert torch.equal(scales, torch.tensor([3.0, 40.0, 50.0]) / 127)
    # a slice starting inside segment 0: pieces [2,3) and [3,7)
    assert codec.pieces(2, 5) == [(0, 1), (1, 4)]
    _, scales = codec.encode(x[2:7], 2)
    assert torch.equal(scales, torch.tensor([3.0, 40.0]) / 127)


def test_tiny_segment_keeps_precision_next_to_huge_segment() -> None:
    tiny = torch.linspace(-1e-3, 1e-3, 5)
    x = torch.cat([tiny, torch.full((5,), 1e3)])
    dec = WireCodec("int8", [5, 5], block_size=16).roundtrip(x, 0)
    assert (dec[:5] - tiny).abs().max() <= 1e-3 / 127 / 2 * (1 + 2 * SLACK)
    # one segment (a block mixing both) would have flushed the tiny values to 0
    merged = WireCodec("int8", [10], block_size=16).roundtrip(x, 0)
    assert torch.equal(merged[:5], torch.zeros(5))


def _random_codec(wire: str, seed: int = 0, block_size: int = 64) -> WireCodec:
    g = _gen(seed)
    sizes = torch.randint(0, 300, (17,), generator=g).tolist() + [
        1,
        block_size,
        block_size + 1,
        0,
        5 * block_size,
    ]
    return WireCodec(wire, sizes, block_size=block_size)


def test_int8_wire_matches_per_piece_reference() -> None:
    """encode() of any slice equals encode_int8 applied to each segment ∩ slice."""
    codec = _random_codec("int8")
    flat = _make("student_t2", codec.numel)
    for start, end in codec.partition(5) + [
        (0, codec.numel),
        (37, 1000),
        (codec.numel - 1, codec.numel),
    ]:
        values, scales = codec.encode(flat[start:end], start)
        pieces = codec.pieces(start, end - start)
        ref = [encode_int8(flat[start + o : start + o + n], codec.block_size) for o, n in pieces]
        assert torch.equal(values, torch.cat([r.values for r in ref]))
        assert torch.equal(scales, torch.cat([r.scales for r in ref]))
        dec = codec.decode([values, scales], start, end - start)
        assert torch.equal(dec, torch.cat([decode_int8(r, codec.block_size) for r in ref]))
        err = (dec.double() - flat[start:end].double()).abs()
        bound = _codec_element_scale(codec, scales, start, end - start).double() * (0.5 + SLACK)
        assert (err <= bound).all()


def _theory_bytes(codec: WireCodec, start: int, n: int) -> int:
    """Bytes of a slice counted from the format's description:
    packed codes (per piece), offsets, scales."""
    bits = {"fp32": 32, "bf16": 16, "int8": 8, "int4": 4, "fp4": 4, "int2": 2}[codec.wire_dtype]
    total = 0
    for _, length in codec.pieces(start, n):
        blocks = [codec.block_size] * (length // codec.block_size) + [
            length % codec.block_size
        ] * bool(length % codec.block_size)
        kept = (
            length
            if codec.topk_fraction is None
            else sum(math.ceil(codec.topk_fraction * b) for b in blocks)
        )
        offsets = 0 if codec.topk_fraction is None else 2 * kept
        scales = 4 * len(blocks) if bits <= 8 else 0
        total += math.ceil(kept * bits / 8) + offsets + scales
    return total


WIRES_AND_TOPK = [(w, None) for w in WIRE_DTYPES] + [
    (w, f) for w in BLOCKWISE_WIRES for f in (0.02, 0.3, 1.0)
]


@pytest.mark.parametrize("wire,topk", WIRES_AND_TOPK)
def test_wire_bytes_exact(wire: str, topk: float | None) -> None:
    codec = WireCodec(wire, _random_codec(wire).segment_sizes, block_size=64, topk_fraction=topk)
    flat = torch.randn(codec.numel, generator=_gen())
    for start, end in codec.partition(7) + [(0, codec.numel), (11, 12), (5, 5)]:
        n = end - start
        encoded = codec.encode(flat[start:end], start)
        actual = sum(t.numel() * t.element_size() for t in encoded)
        assert codec.wire_bytes(start, n) == actual == _theory_bytes(codec, start, n)
        shapes = [(t.dtype, t.shape) for t in codec.empty_wire(start, n)]
        assert shapes == [(t.dtype, t.shape) for t in encoded]
    if wire == "int8":
        pieces = sum(num_int8_blocks(s, codec.block_size) for s in codec.segment_sizes)
        assert codec.num_blocks(0, codec.numel) == pieces


def test_fp32_wire_is_bit_exact_identity() -> None:
    codec = WireCodec("fp32", [7, 9])
    x = torch.randn(16, generator=_gen())
    x[0], x[1], x[2], x[3] = math.nan, math.inf, -0.0, 1e-45
    (w,) = codec.encode(x, 0)
    assert w.dtype == torch.float32
    assert torch.equal(codec.roundtrip(x, 0).view(torch.int32), x.view(torch.int32))


def test_bf16_wire_rounds_to_nearest_even() -> None:
    codec = WireCodec("bf16", [4])
    # bf16 ulp at 1 is 2**-7: 1 + 2**-8 ties to 1 (even), 1 + 3 * 2**-8 ties to 1 + 2**-6 (even)
    x = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -(1 + 2**-8)])
    (w,) = codec.encode(x, 0)
    assert w.dtype == torch.bfloat16
    assert codec.roundtrip(x, 0).tolist() == [1.0, 1 + 2**-6, 1 + 2**-7, -1.0]


def test_codec_validation() -> None:
    with pytest.raises(ValueError):
        WireCodec("fp16", [4])
    with pytest.raises(ValueError):
        WireCodec("int8", [4, -1])
    codec = WireCodec("int8", [4, 4], block_size=4)
    with pytest.raises(ValueError):
        codec.encode(torch.zeros(5), 4)  # past the end
    with pytest.raises(ValueError):
        codec.encode(torch.zeros(4, dtype=torch.float64), 0)
    with pytest.raises(ValueError):
        codec.decode([torch.zeros(4, dtype=torch.int8), torch.ones(2)], 0, 4)  # 1 block expected
    with pytest.raises(ValueError):
        codec.partition(0)


@pytest.mark.parametrize("numel,n", [(10, 3), (12, 4), (3, 5), (0, 2), (1_000_003, 8)])
def test_partition_contiguous_and_balanced(numel: int, n: int) -> None:
    codec = WireCodec("int8", [numel])
    parts = codec.partition(n)
    assert len(parts) == n and parts[0][0] == 0 and parts[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    sizes = [e - s for s, e in parts]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert parts == codec.partition(n)


# -------------------------------------------------------------------------------- aggregation


def _contributions(codec: WireCodec, n: int) -> list[torch.Tensor]:
    g = _gen(3)
    scale = torch.rand(codec.numel, generator=g) * 10  # per-element magnitudes vary
    return [torch.randn(codec.numel, generator=g) * scale for _ in range(n)]


def test_owner_reduce_mean_fp32_is_plain_mean_bit_for_bit() -> None:
    codec = _random_codec("fp32")
    cs = _contributions(codec, 3)
    expected = (cs[0] + cs[1] + cs[2]) / 3
    assert torch.equal(owner_reduce_mean(codec, cs), expected)
    assert torch.equal(mean_in_worker_order(cs), expected)


@pytest.mark.parametrize("n", [1, 3, 4])
def test_owner_reduce_mean_int8_within_codec_bound(n: int) -> None:
    """|result - exact mean| <= mean_i(s_i / 2) + s_mean / 2
    (+ the 2**-16 slack each) + FP32 sum rounding.

    s_i is the scale of the block holding the element in worker i's encoding, s_mean
    the scale in the mean's re-encoding; the FP32 sum of N decoded values and the
    division by N add at most 2**-24 * sum_i |decoded_i| (bounded with 2**-23).
    """
    codec = _random_codec("int8")
    cs = _contributions(codec, n)
    result = owner_reduce_mean(codec, cs)
    exact = torch.stack([c.double() for c in cs]).mean(0)
    bound = torch.zeros(codec.numel, dtype=torch.float64)
    abs_sum = torch.zeros(codec.numel, dtype=torch.float64)
    for start, end in codec.partition(n):
        decoded = []
        for c in cs:
            _, scales = codec.encode(c[start:end], start)
            bound[start:end] += (
                _codec_element_scale(codec, scales, start, end - start).double() * (0.5 + SLACK) / n
            )
            decoded.append(codec.roundtrip(c[start:end], start))
            abs_sum[start:end] += decoded[-1].double().abs()
        _, mean_scales = owner_reduce_part(codec, decoded, start)
        bound[start:end] += _codec_element_scale(
            codec, mean_scales, start, end - start
        ).double() * (0.5 + SLACK)
    bound += abs_sum * 2.0**-23
    err = (result.double() - exact).abs()
    assert (err <= bound).all()
    assert err.max() > 0.25 * bound.max()  # lossy for real, and the bound is not vacuous


def test_owner_reduce_mean_bf16_within_bf16_rounding() -> None:
    """Each bf16 cast errs by at most 2**-8 relative (8-bit significand, round to nearest)."""
    codec = _random_codec("bf16")
    n = 4
    cs = _contributions(codec, n)
    result = owner_reduce_mean(codec, cs).double()
    exact = torch.stack([c.double() for c in cs]).mean(0)
    abs_mean = torch.stack([c.double().abs() for c in cs]).mean(0)
    bound = abs_mean * 2.0**-8 + result.abs() * 2.0**-8 + abs_mean * 2.0**-21
    err = (result - exact).abs()
    assert (err <= bound).all()
    assert not torch.equal(result, exact)


@pytest.mark.parametrize("wire", WIRE_DTYPES)
def test_owner_reduce_mean_matches_message_passing(wire: str) -> None:
    """Simulate the distributed path with the shared helpers: send, owner step, broadcast.

    Every worker must end up with exactly owner_reduce_mean's
    result (docs/algorithm.md#wire-codecs, #simulation).
    """
    codec = _random_codec(wire, seed=5)
    n = 4
    cs = _contributions(codec, n)
    parts = codec.partition(n)
    # worker i sends wire tensors of its slice `owner` to that owner
    inbox = {
        owner: [codec.encode(cs[i][s:e], s) for i in range(n)] for owner, (s, e) in enumerate(parts)
    }
    outbox = {}
    for owner, (s, e) in enumerate(parts):
        decoded = [codec.decode(w, s, e - s) for w in inbox[owner]]
        outbox[owner] = owner_reduce_part(codec, decoded, s)
    expected = owner_reduce_mean(codec, cs)
    for _worker in range(n):
        received = torch.cat([codec.decode(outbox[o], s, e - s) for o, (s, e) in enumerate(parts)])
        assert torch.equal(received, expected)


def test_owner_reduce_mean_more_workers_than_elements() -> None:
    codec = WireCodec("int8", [2, 1], block_size=4)
    cs = [torch.tensor([1.0, -2.0, 3.0]) * (i + 1) for i in range(5)]
    assert torch.allclose(owner_reduce_mean(codec, cs), torch.tensor([3.0, -6.0, 9.0]), rtol=1e-2)


# ------------------------------------------------------------------------------ vectorization


class _CountTorchCalls(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _count_calls(fn) -> tuple[int, object]:
    with _CountTorchCalls() as mode:
        out = fn()
    return mode.calls, out


def test_encode_decode_op_count_grows_with_chunks_not_blocks() -> None:
    """Vectorized over cache-sized groups of blocks: 10M elements (2,442 blocks) issue about as many
    torch calls per ``CHUNK_ELEMENTS`` group as 3 blocks do in total, never one call per block."""
    small = torch.randn(2 * BS + 5, generator=_gen())
    big = torch.randn(10_000_000, generator=_gen())
    with _threads(1):
        calls_small, enc_small = _count_calls(lambda: encode_int8(small))
        calls_big, enc_big = _count_calls(lambda: encode_int8(big))
        assert enc_small.scales.numel() == 3 and enc_big.scales.numel() == 2442
        # full blocks in groups, plus the partial last block
        groups = -(-big.numel() // CHUNK_ELEMENTS) + 1
        assert (
            0 < calls_small < calls_big <= calls_small * groups
            and calls_big < enc_big.scales.numel()
        )
        dec_small_calls, _ = _count_calls(lambda: decode_int8(enc_small))
        dec_big_calls, dec_big = _count_calls(lambda: decode_int8(enc_big))
        assert dec_big_calls <= dec_small_calls * groups and dec_big_calls < enc_big.scales.numel()
    err = (dec_big.double() - big.double()).abs()
    assert (
        err <= _per_element_scale(enc_big.scales, big.numel(), BS).double() * (0.5 + SLACK)
    ).all()


def test_wire_codec_op_count_grows_with_segments_not_blocks() -> None:
    """Per segment the op count is that of its groups of blocks: equal for equal group counts."""
    few_blocks = WireCodec("int8", [2 * BS + 1, 3 * BS + 7])
    many_blocks = WireCodec("int8", [40 * BS + 1, 30 * BS + 7])  # still one group per segment
    counts = []
    with _threads(1):
        for codec in (few_blocks, many_blocks):
            x = torch.randn(codec.numel, generator=_gen())
            counts.append(_count_calls(lambda: codec.roundtrip(x, 0))[0])
    assert 40 * BS < CHUNK_ELEMENTS and counts[0] == counts[1]


@contextlib.contextmanager
def _threads(n: int):
    """The codec's group size scales with the intra-op threads: pin them for op counting."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- error feedback


def test_error_feedback_transmits_what_quantization_drops() -> None:
    """Small entries next to a large one quantize to 0 every round; with error feedback
    the transmitted sum tracks the true sum within one round's error, without it the
    small entries are never sent."""
    codec = WireCodec("int8", [8], block_size=8)
    delta = torch.tensor([100.0, 0.1, -0.2, 0.3, 0.05, -0.05, 0.15, 0.0])
    rounds = 50
    ef = ErrorFeedback(codec.numel)
    sent_total = torch.zeros(8)
    plain_total = torch.zeros(8)
    for _ in range(rounds):
        compensated = ef.apply(codec, delta, 1)
        sent_total += roundtrip_as_sent(codec, compensated, 1)
        plain_total += codec.roundtrip(delta, 0)
    assert torch.equal(plain_total[1:], torch.zeros(7))
    assert torch.allclose(sent_total + ef.residual, delta * rounds, rtol=1e-5, atol=1e-3)
    # one round's error: scale / 2 of the compensated block
    assert (ef.residual.abs() <= 100.5 / 127).all()
    assert (sent_total[1:7] - delta[1:7] * rounds).abs().max() < 1.0

    restored = ErrorFeedback(codec.numel)
    restored.load_state_dict(ef.state_dict())
    assert torch.equal(restored.residual, ef.residual)


def test_roundtrip_as_sent_uses_owner_part_layout() -> None:
    codec = WireCodec("int8", [10], block_size=8)
    x = torch.arange(10, dtype=torch.float32) ** 3
    sent = roundtrip_as_sent(codec, x, 2)  # parts [0,5) and [5,10): scales 64/127 and 729/127
    expected = torch.cat([codec.roundtrip(x[:5], 0), codec.roundtrip(x[5:], 5)])
    assert torch.equal(sent, expected)
    assert not torch.equal(sent, codec.roundtrip(x, 0))
