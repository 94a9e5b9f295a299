"""``int4``, ``fp4`` and ``int2``: codes on a grid of levels times an FP32 scale per block
(docs/algorithm.md#low-bit-wires).

A grid is a sorted list of non-negative *magnitudes* ``l_0 < ... < l_{M-1}``
(``M = 2**(bits-1)``); a code is a sign bit above a magnitude index, so the
signed grid is symmetric. Per block of up to ``block_size`` elements:

    scale = max|x| / l_{M-1}        (1 for an all-zero block),
                                    clamped to [2**-126, largest s with l_{M-1} * s finite]
    m     = |x| / scale             (FP32)
    index = #{ j : mid_j < m }      with mid_j = (l_j + l_{j+1}) / 2:
                                    the nearest level, ties toward zero
    code  = index | (x < 0) << (bits - 1)
    x'    = (-1)**sign * l_index * scale   (FP32)

Codes are packed ``8 / bits`` to a byte, the first element in the lowest bits,
per piece (the last byte of a piece padded with zero codes). A block whose
``max|x|`` is NaN or inf gets the upper scale; NaN encodes as code 0, ``+-inf``
as the largest level. The error per element of finite input is at most
``scale * max_j (l_{j+1} - l_j) / 2`` (plus FP32 roundings of ``|x| / scale``).

The kernel does not search the grid: every midpoint is a multiple of
``1 / D`` for a power of two ``D`` (``D * m`` is exact), so
``#{mid_j < m} = table[ceil(D * m)]`` (``ceil(D * m) <= D * l_{M-1} + 1`` for
finite input) with an integer table; for a grid of step 1 (``int4``) it is
``clamp(ceil(m - mid_0), 0, M - 1)`` and for a single midpoint (``int2``)
``[m > mid_0]``: no lookup is needed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from autoloco_hf.wire.accounting import num_int8_blocks, packed_bytes
from autoloco_hf.wire.formats.base import WireFormat, blocked, true_divide
from autoloco_hf.wire.formats.int8 import SCALE_MIN, chunk_rows


def _largest_finite_scale(top: float) -> float:
    """The largest FP32 ``s`` with ``top * s`` finite (the upper scale clamp)."""
    s = torch.tensor(torch.finfo(torch.float32).max / top, dtype=torch.float32)
    while not bool(torch.isfinite(s * top)):
        s = torch.nextafter(s, torch.zeros_like(s))
    return float(s)


@dataclass(frozen=True)
class Grid:
    """The non-negative magnitudes of a symmetric grid of ``2**bits - 1`` or ``2**bits`` levels."""

    bits: int
    magnitudes: tuple[float, ...]
    denominator: int  # a power of two D with every midpoint a multiple of 1 / D
    midpoints: tuple[float, ...] = field(init=False)

    def __post_init__(self) -> None:
        if len(self.magnitudes) != 2 ** (self.bits - 1) or 8 % self.bits:
            raise ValueError(f"a {self.bits}-bit grid needs {2 ** (self.bits - 1)} magnitudes")
        mids = tuple((a + b) / 2 for a, b in zip(self.magnitudes, self.magnitudes[1:]))
        if any((m * self.denominator) % 1 for m in mids):
            raise ValueError(f"midpoints {mids} are not multiples of 1/{self.denominator}")
        object.__setattr__(self, "midpoints", mids)

    @property
    def top(self) -> float:
        return self.magnitudes[-1]

    @property
    def unit_step(self) -> bool:
        """Levels one apart: the index is a ceiling, no table."""
        return all(b - a == 1 for a, b in zip(self.magnitudes, self.magnitudes[1:]))

    def signed_levels(self) -> list[float]:
        """The value of each code ``0 .. 2**bits - 1`` (sign bit above the magnitude index)."""
        half = len(self.magnitudes)
        return [
            (-1.0 if code >= half else 1.0) * self.magnitudes[code % half]
            for code in range(2**self.bits)
        ]


INT4_GRID = Grid(4, (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0), denominator=2)
FP4_E2M1_GRID = Grid(4, (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0), denominator=4)
INT2_GRID = Grid(2, (0.5, 1.5), denominator=1)


def grid_codes(
    xb: torch.Tensor, *, midpoints: tuple[float, ...], top: float, scale_max: float, sign_bit: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 codes and FP32 scales of the full blocks ``xb`` (rows), by the module's definition.

    The body of the compiled kernel (``codec_kernel="compiled"``): ``#{mid_j < m}`` as a sum of
    comparisons, which a compiler fuses into one pass; the eager path's
    ``ceil`` and table lookups give the same index (NaN: no comparison
    holds, 0; inf: all hold, the top level), so the bytes are the same.
    """
    amax = torch.maximum(xb.amax(dim=1), xb.amin(dim=1).neg())
    scale = torch.where(amax == 0, torch.ones_like(amax), true_divide(amax, top))
    scale = torch.where(torch.isnan(scale), torch.full_like(scale, scale_max), scale).clamp(
        SCALE_MIN, scale_max
    )
    m = (xb / scale[:, None]).abs()
    # counted in FP32 (small integers, exact): int8 arithmetic
    # does not vectorize in the generated CPU code (30x slower)
    index = (m > midpoints[0]).to(torch.float32)
    for mid in midpoints[1:]:
        index = index + (m > mid).to(torch.float32)
    return (index + (xb < 0).to(torch.float32) * sign_bit).to(torch.int8), scale


def _as_lanes(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``x`` reinterpreted as ``dtype`` (several elements per lane),
    or ``None`` where its offset or length does not allow it."""
    ratio = torch.empty((), dtype=dtype).element_size() // x.element_size()
    if x.numel() % ratio or x.storage_offset() % ratio:
        return None
    return x.view(dtype)


class GridFormat(WireFormat):
    """``[uint8 packed codes (bits per element), fp32 scales (one per block)]`` on ``grid``.

    Encoding is eager torch in few passes over a cache-sized group: the magnitude
    index by arithmetic (``ceil``), the sign bit added in FP32 from ``sign(x)``, one
    FP32 -> int8 cast (vectorized, unlike FP32 -> uint8); the codes are packed by
    shifts on 16- or 32-bit lanes. Decoding gathers all the levels of a byte at
    once from a 256-entry table whose rows are one 8- or 16-byte lane.
    """

    dtypes = (torch.uint8, torch.float32)

    def __init__(self, grid: Grid, compiled: bool = False) -> None:
        self.grid = grid
        self.compiled = compiled
        self._kernel: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
        self.per_byte = 8 // grid.bits
        self.scale_max = _largest_finite_scale(grid.top)
        d = grid.denominator
        self._positions = int(grid.top * d) + 2  # ceil(D * m) for m in [0, top * (1 + 2**-22)]
        # code of each signed position p + positions * (x <
        # 0), p = ceil(D * m): #{mid_j < m} | sign bit
        index = [sum(1 for mid in grid.midpoints if mid * d < c) for c in range(self._positions)]
        sign_bit = 1 << (grid.bits - 1)
        self._code_table = torch.tensor(index + [i | sign_bit for i in index], dtype=torch.int8)
        levels = torch.tensor(grid.signed_levels(), dtype=torch.float32)
        byte = torch.arange(256)
        mask = (1 << grid.bits) - 1
        # decoded levels of the codes in each byte value, one row a lane of per_byte floats
        self._lane_dtype = torch.int64 if self.per_byte == 2 else torch.complex128
        self._byte_levels = (
            torch.stack(
                [levels[(byte >> (grid.bits * j)) & mask] for j in range(self.per_byte)], dim=1
            )
            .contiguous()
            .view(self._lane_dtype)
            .view(-1)
        )

    def numels(self, numel: int, block_size: int) -> tuple[int, ...]:
        return (packed_bytes(numel, self.grid.bits), num_int8_blocks(numel, block_size))

    def _group(self, block_size: int) -> int:
        """Elements per cache-sized group: whole blocks, and
        whole bytes of codes (a multiple of ``per_byte``)."""
        rows = -(-chunk_rows(block_size) // self.per_byte) * self.per_byte
        return rows * block_size

    def encode(self, x: torch.Tensor, wire: Sequence[torch.Tensor], block_size: int) -> None:
        """Codes of a cache-sized group, packed into their
        bytes before the next group (one pass over memory)."""
        packed, scales = wire
        n, per_byte, group = x.numel(), self.per_byte, self._group(block_size)
        size = min(group, -(-n // per_byte) * per_byte)
        m_buf = torch.empty(size, dtype=torch.float32, device=x.device)
        sign_buf = torch.empty(size, dtype=torch.float32, device=x.device)
        pos_buf = torch.empty(
            0 if self.grid.unit_step else size, dtype=torch.int32, device=x.device
        )
        codes = torch.empty(size, dtype=torch.int8, device=x.device)
        lane_dtype = torch.int16 if per_byte == 2 else torch.int32
        shifted = torch.empty(size // per_byte, dtype=lane_dtype, device=x.device)
        table = self._code_table.to(x.device)
        row = 0
        for lo in range(0, n, group):
            xg = x[lo : lo + group]
            padded = -(-xg.numel() // per_byte) * per_byte
            for xb, cb in zip(blocked(xg, block_size), blocked(codes[: xg.numel()], block_size)):
                if self.compiled and xb.shape[1] == block_size:
                    kernel_codes, scale = self._compiled_kernel()(xb)
                    cb.copy_(kernel_codes)
                else:
                    scale = self._codes(xb, cb, m_buf, sign_buf, pos_buf, table)
                scales[row : row + scale.numel()] = scale
                row += scale.numel()
            codes[xg.numel() : padded] = 0
            # little-endian lanes: code j of a byte sits in
            # bits 8j of the lane; shift it down to bits * j
            lane, tmp = codes[:padded].view(lane_dtype), shifted[: padded // per_byte]
            if per_byte == 2:
                lane.bitwise_or_(torch.bitwise_right_shift(lane, 4, out=tmp))
            else:
                lane.bitwise_or_(torch.bitwise_right_shift(lane, 6, out=tmp))
                lane.bitwise_or_(torch.bitwise_right_shift(lane, 12, out=tmp))
            # keeps the low byte
            packed[lo // per_byte : (lo + padded) // per_byte].view(torch.int8).copy_(lane)

    def _compiled_kernel(self) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """:func:`grid_codes` of this grid compiled once (any
        number of rows: the row count is dynamic)."""
        if self._kernel is None:
            codes = functools.partial(
                grid_codes,
                midpoints=self.grid.midpoints,
                top=self.grid.top,
                scale_max=self.scale_max,
                sign_bit=1 << (self.grid.bits - 1),
            )
            compiled = torch.compile(codes, dynamic=False)

            def kernel(xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                torch._dynamo.maybe_mark_dynamic(xb, 0)  # one kernel for every group's row count
                return compiled(xb)

            self._kernel = kernel
        return self._kernel

    def _codes(
        self,
        xb: torch.Tensor,
        cb: torch.Tensor,
        m_buf: torch.Tensor,
        sign_buf: torch.Tensor,
        pos_buf: torch.Tensor,
        table: torch.Tensor,
    ) -> torch.Tensor:
        """Write the int8 codes of the blocks ``xb`` (rows) into ``cb``; return their scales."""
        grid = self.grid
        amax = torch.maximum(xb.amax(dim=1), xb.amin(dim=1).neg())
        # a 0-dim tensor divisor: CUDA would multiply by the
        # reciprocal of a Python number (INT8's reason)
        scale = true_divide(amax, grid.top).masked_fill_(amax == 0, 1.0)
        scale = torch.nan_to_num(scale, nan=self.scale_max).clamp_(SCALE_MIN, self.scale_max)
        m = torch.div(xb, scale[:, None], out=m_buf[: xb.numel()].view_as(xb))
        m.abs_()
        negative = torch.lt(xb, 0, out=sign_buf[: xb.numel()].view_as(xb))  # 1.0 / 0.0 in FP32
        # Only a non-finite or saturated group (its scale clamped to the
        # upper scale) can exceed the top level or hold NaN (finite amax
        # gives m <= top * (1 + 2**-22)); ordinary groups skip those passes.
        finite = bool((scale < self.scale_max).all())
        # (int2) index = [m > mid_0]; NaN gives 0 and inf 1, as clamped below
        if len(grid.midpoints) == 1:
            cb.copy_(m.gt_(grid.midpoints[0]).add_(negative, alpha=1 << (grid.bits - 1)))
        elif grid.unit_step:  # index = clamp(ceil(m - mid_0), 0, M - 1)
            m.sub_(grid.midpoints[0]).ceil_()
            if not finite:
                m.nan_to_num_(nan=0.0).clamp_(0, len(grid.magnitudes) - 1)
            # small integers: the FP32 -> int8 cast is exact
            cb.copy_(m.add_(negative, alpha=1 << (grid.bits - 1)))
        else:  # code = table[ceil(D * m) + positions * (x < 0)]
            m.mul_(grid.denominator).ceil_()
            if not finite:
                m.nan_to_num_(nan=0.0).clamp_(0, self._positions - 1)
            m.add_(negative, alpha=self._positions)
            position = pos_buf[: xb.numel()]
            position.copy_(m.view(-1))
            torch.index_select(table, 0, position, out=cb.view(-1))
        return scale

    def decode(self, wire: Sequence[torch.Tensor], out: torch.Tensor, block_size: int) -> None:
        """A cache-sized group at a time: gather the levels of its bytes, then scale its blocks."""
        packed, scales = wire
        n, per_byte, group = out.numel(), self.per_byte, self._group(block_size)
        table = self._byte_levels.to(out.device)
        size = min(group, -(-n // per_byte) * per_byte)
        index = torch.empty(size // per_byte, dtype=torch.int32, device=out.device)
        levels = torch.empty(size // per_byte, dtype=self._lane_dtype, device=out.device)
        row = 0
        for lo in range(0, n, group):
            og = out[lo : lo + group]
            nbytes = -(-og.numel() // per_byte)
            idx = index[:nbytes]
            idx.copy_(packed[lo // per_byte : lo // per_byte + nbytes])
            lanes = _as_lanes(og, self._lane_dtype)
            # an offset or a length that is not whole lanes: through the scratch lanes
            if lanes is None:
                torch.index_select(table, 0, idx, out=levels[:nbytes])
                og.copy_(levels[:nbytes].view(torch.float32)[: og.numel()])
            else:
                torch.index_select(table, 0, idx, out=lanes)
            for ov in blocked(og, block_size):
                ov.mul_(scales[row : row + ov.shape[0], None])
                row += ov.shape[0]
