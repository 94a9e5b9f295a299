"""Top-k sparsification of a blockwise wire (``topk_fraction``, docs/algorithm.md §7.1).

Every block of ``L`` elements (up to ``block_size``; a block never spans two
tensors) keeps its ``k = ceil(topk_fraction * L)`` entries of largest magnitude,
ties to the lower offset (a stable sort). The kept values of a piece travel in
the inner format (``int8``, ``int4``, ``fp4`` or ``int2``) with one scale per
block, as a dense piece whose blocks are the ``k`` kept values of each block, in
offset order; their offsets in the block travel as 16-bit integers (two bytes,
little-endian order of the host). Decoding writes the kept values at their
offsets and zeros elsewhere.

Wire tensors of a piece: the inner format's, then ``uint8`` offsets (2 per kept entry).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from autoloco_hf.sync.accounting import INDEX_BYTES, topk_keep, topk_kept
from autoloco_hf.sync.formats.base import WireFormat, blocked


class TopKFormat(WireFormat):
    """The ``k`` largest entries of every block, their values in ``inner``, their offsets in 16 bits."""

    def __init__(self, inner: WireFormat, fraction: float) -> None:
        self.inner = inner
        self.fraction = fraction
        self.dtypes = (*inner.dtypes, torch.uint8)

    def numels(self, numel: int, block_size: int) -> tuple[int, ...]:
        kept = topk_kept(numel, block_size, self.fraction)
        return (*self.inner.numels(kept, self._inner_block(block_size, numel)), INDEX_BYTES * kept)

    def _inner_block(self, block_size: int, numel: int) -> int:
        """The inner format's block: the kept entries of one full block (or of the only, partial one)."""
        return max(topk_keep(min(block_size, numel), self.fraction), 1)

    def encode(self, x: torch.Tensor, wire: Sequence[torch.Tensor], block_size: int) -> None:
        *inner_wire, offsets = wire
        kept = torch.empty(offsets.numel() // INDEX_BYTES, dtype=torch.float32, device=x.device)
        index = offsets.view(torch.int16)
        pos = 0
        for xv in blocked(x, block_size):
            k = topk_keep(xv.shape[1], self.fraction)
            order = torch.sort(xv.abs(), dim=1, descending=True, stable=True).indices[:, :k]
            order = torch.sort(order, dim=1).values
            size = xv.shape[0] * k
            kept[pos : pos + size].view(-1, k).copy_(torch.gather(xv, 1, order))
            index[pos : pos + size].view(-1, k).copy_(order)  # offsets >= 2**15 wrap to negative int16
            pos += size
        self.inner.encode(kept, inner_wire, self._inner_block(block_size, x.numel()))

    def decode(self, wire: Sequence[torch.Tensor], out: torch.Tensor, block_size: int) -> None:
        *inner_wire, offsets = wire
        kept = torch.empty(offsets.numel() // INDEX_BYTES, dtype=torch.float32, device=out.device)
        self.inner.decode(inner_wire, kept, self._inner_block(block_size, out.numel()))
        index = offsets.view(torch.int16).to(torch.int64).bitwise_and_(0xFFFF)
        out.zero_()
        pos = 0
        for ov in blocked(out, block_size):
            k = topk_keep(ov.shape[1], self.fraction)
            size = ov.shape[0] * k
            ov.scatter_(1, index[pos : pos + size].view(-1, k), kept[pos : pos + size].view(-1, k))
            pos += size
