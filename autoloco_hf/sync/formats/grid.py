"""``int4``, ``fp4`` and ``int2``: codes on a grid of levels times an FP32 scale per block (docs/algorithm.md §7.1).

A grid is a sorted list of non-negative *magnitudes* ``l_0 < ... < l_{M-1}``
(``M = 2**(bits-1)``); a code is a sign bit above a magnitude index, so the
signed grid is symmetric. Per block of up to ``block_size`` elements:

    scale = max|x| / l_{M-1}        (1 for an all-zero block), clamped to [2**-126, largest s with l_{M-1} * s finite]
    m     = |x| / scale             (FP32)
    index = #{ j : mid_j < m }      with mid_j = (l_j + l_{j+1}) / 2: the nearest level, ties toward zero
    code  = index | (x < 0) << (bits - 1)
    x'    = (-1)**sign * l_index * scale   (FP32)

Codes are packed ``8 / bits`` to a byte, the first element in the lowest bits,
per piece (the last byte of a piece padded with zero codes). A block whose
``max|x|`` is NaN or inf gets the upper scale; NaN encodes as code 0, ``+-inf``
as the largest level. The error per element of finite input is at most
``scale * max_j (l_{j+1} - l_j) / 2`` (plus FP32 roundings of ``|x| / scale``).

The kernel does not search the grid: every midpoint is a multiple of
``1 / D`` for a power of two ``D`` (``D * m`` is exact), so
``#{mid_j < m} = table[clamp(ceil(D * m) - 1, 0, D * l_{M-1})]`` with an integer
table; for a grid of step 1 (``int4``, ``int2``) the table is
``clamp(ceil(m - mid_0), 0, M - 1)`` and no lookup is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from autoloco_hf.sync.accounting import num_int8_blocks, packed_bytes
from autoloco_hf.sync.formats.base import WireFormat, blocked
from autoloco_hf.sync.formats.int8 import SCALE_MIN, chunk_rows


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
        return [(-1.0 if code >= half else 1.0) * self.magnitudes[code % half] for code in range(2**self.bits)]


INT4_GRID = Grid(4, (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0), denominator=2)
FP4_E2M1_GRID = Grid(4, (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0), denominator=4)
INT2_GRID = Grid(2, (0.5, 1.5), denominator=1)


class GridFormat(WireFormat):
    """``[uint8 packed codes (bits per element), fp32 scales (one per block)]`` on ``grid``."""

    dtypes = (torch.uint8, torch.float32)

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.per_byte = 8 // grid.bits
        self.scale_max = _largest_finite_scale(grid.top)
        # code of each multiple of 1 / D (minus one) below the top: #{mid_j < m}
        d = grid.denominator
        self._index_table = torch.tensor(
            [sum(1 for mid in grid.midpoints if mid * d <= c) for c in range(int(grid.top * d) + 1)],
            dtype=torch.uint8,
        )
        levels = torch.tensor(grid.signed_levels(), dtype=torch.float32)
        byte = torch.arange(256)
        mask = (1 << grid.bits) - 1
        # decoded levels of the codes in each byte value: (256, per_byte)
        self._byte_levels = torch.stack(
            [levels[(byte >> (grid.bits * j)) & mask] for j in range(self.per_byte)], dim=1
        ).contiguous()

    def numels(self, numel: int, block_size: int) -> tuple[int, ...]:
        return (packed_bytes(numel, self.grid.bits), num_int8_blocks(numel, block_size))

    def encode(self, x: torch.Tensor, wire: Sequence[torch.Tensor], block_size: int) -> None:
        packed, scales = wire
        n = x.numel()
        codes = torch.zeros(packed.numel() * self.per_byte, dtype=torch.uint8, device=x.device)
        self._codes_into(x, codes[:n], scales, block_size)
        lanes = codes.view(-1, self.per_byte)
        packed.copy_(lanes[:, 0])
        for j in range(1, self.per_byte):
            packed.bitwise_or_(lanes[:, j].bitwise_left_shift(self.grid.bits * j))

    def _codes_into(self, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, block_size: int) -> None:
        """Unpacked codes of ``x``, a cache-sized group of blocks at a time (the result does not depend on the grouping)."""
        grid = self.grid
        sign_bit = 1 << (grid.bits - 1)
        row, step = 0, chunk_rows(block_size)
        for xv, cv in zip(blocked(x, block_size), blocked(codes, block_size)):
            for lo in range(0, xv.shape[0], step):
                xb, cb = xv[lo : lo + step], cv[lo : lo + step]
                amax = torch.maximum(xb.amax(dim=1), xb.amin(dim=1).neg())
                scale = (amax / grid.top).masked_fill_(amax == 0, 1.0)
                scale = torch.nan_to_num(scale, nan=self.scale_max).clamp_(SCALE_MIN, self.scale_max)
                m = torch.div(xb, scale[:, None])
                negative = xb < 0
                m.abs_()
                finite = bool(amax.isfinite().all()) and bool((scale < self.scale_max).all())
                if grid.unit_step:  # index = clamp(ceil(m - mid_0), 0, M - 1)
                    m.sub_(grid.midpoints[0]).ceil_()
                    if not finite:
                        m.nan_to_num_(nan=0.0)
                    cb.copy_(m.clamp_(0, len(grid.magnitudes) - 1))
                else:  # index = table[clamp(ceil(D * m) - 1, 0, D * top)]
                    m.mul_(grid.denominator).ceil_().sub_(1)
                    if not finite:
                        m.nan_to_num_(nan=0.0)
                    position = m.clamp_(0, grid.top * grid.denominator).to(torch.int32)
                    cb.copy_(torch.index_select(self._index_table.to(x.device), 0, position.view(-1)).view_as(cb))
                cb.add_(negative.to(torch.uint8).mul_(sign_bit))
                scales[row : row + scale.numel()] = scale
                row += scale.numel()

    def decode(self, wire: Sequence[torch.Tensor], out: torch.Tensor, block_size: int) -> None:
        packed, scales = wire
        n = out.numel()
        table = self._byte_levels.to(out.device)
        levels = torch.index_select(table, 0, packed.to(torch.int32)).view(-1)
        out.copy_(levels[:n])
        row = 0
        for ov in blocked(out, block_size):
            ov.mul_(scales[row : row + ov.shape[0], None])
            row += ov.shape[0]
