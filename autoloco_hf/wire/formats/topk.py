"""Top-k sparsification of a blockwise wire (``topk_fraction``, docs/algorithm.md#low-bit-wires).

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

from autoloco_hf.wire.accounting import INDEX_BYTES, topk_keep, topk_kept
from autoloco_hf.wire.formats.base import WireFormat, blocked
from autoloco_hf.wire.formats.int8 import chunk_rows


class TopKFormat(WireFormat):
    """The ``k`` largest entries of every block, their values
    in ``inner``, their offsets in 16 bits."""

    def __init__(self, inner: WireFormat, fraction: float) -> None:
        self.inner = inner
        self.fraction = fraction
        self.dtypes = (*inner.dtypes, torch.uint8)

    def numels(self, numel: int, block_size: int) -> tuple[int, ...]:
        kept = topk_kept(numel, block_size, self.fraction)
        return (*self.inner.numels(kept, self._inner_block(block_size, numel)), INDEX_BYTES * kept)

    def _inner_block(self, block_size: int, numel: int) -> int:
        """The inner format's block: the kept entries of one
        full block (or of the only, partial one)."""
        return max(topk_keep(min(block_size, numel), self.fraction), 1)

    def encode(self, x: torch.Tensor, wire: Sequence[torch.Tensor], block_size: int) -> None:
        *inner_wire, offsets = wire
        kept = torch.empty(offsets.numel() // INDEX_BYTES, dtype=torch.float32, device=x.device)
        index = offsets.view(torch.int16)
        pos, step = 0, chunk_rows(block_size)
        magnitude = torch.empty(
            min(x.numel(), step * block_size), dtype=torch.float32, device=x.device
        )
        for xv in blocked(x, block_size):
            k = topk_keep(xv.shape[1], self.fraction)
            for lo in range(0, xv.shape[0], step):  # a cache-sized group of blocks at a time
                xb = xv[lo : lo + step]
                order = _kept_offsets(torch.abs(xb, out=magnitude[: xb.numel()].view_as(xb)), k)
                size = xb.shape[0] * k
                kept[pos : pos + size].view(-1, k).copy_(torch.gather(xb, 1, order))
                # offsets >= 2**15 wrap to negative int16
                index[pos : pos + size].view(-1, k).copy_(order)
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


def _kept_offsets(magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """Offsets, ascending, of the ``k`` largest entries of each
    row, ties to the lower offset (a stable sort's choice).

    ``torch.topk`` (a selection, not a sort) gives each row's k-th largest magnitude
    ``t``; where exactly ``k`` entries are ``>= t`` they are the stable sort's
    choice whatever the tie order inside ``topk``. Rows with ties across ``t`` (or
    NaN) take the stable sort, so the result is the reference's in every case.
    """
    threshold = torch.topk(magnitude, k, dim=1, sorted=False).values.amin(dim=1, keepdim=True)
    row, offset = (magnitude >= threshold).nonzero().unbind(1)
    clean = torch.bincount(row, minlength=magnitude.shape[0]) == k
    if bool(clean.all()):
        return offset.view(-1, k)
    order = torch.empty(magnitude.shape[0], k, dtype=torch.int64, device=magnitude.device)
    order[clean] = offset[clean[row]].view(-1, k)
    by_size = torch.sort(magnitude[~clean], dim=1, descending=True, stable=True).indices[:, :k]
    order[~clean] = torch.sort(by_size, dim=1).values
    return order
