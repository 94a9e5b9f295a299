"""The interface of a wire format: how one contiguous piece of a tensor travels
(docs/algorithm.md#wire-codecs).

A :class:`~autoloco_hf.wire.codec.WireCodec` cuts a slice of the flat buffer into
pieces that each lie inside one tensor and hands every piece to its format, so a
block never spans two tensors. A format says how many elements each of its wire
tensors takes for a piece (:meth:`WireFormat.numels`) and encodes / decodes a piece
into / from views of those tensors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch


def true_divide(
    t: torch.Tensor, divisor: float, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``t / divisor`` rounded as one IEEE division on every device (in place with ``out=t``).

    CUDA divides by a Python number as a product with its reciprocal, which can be one ulp off the
    CPU's quotient; dividing by a 0-dim tensor on ``t``'s device keeps the true division, so a
    simulated CPU run and a GPU run agree bit for bit
    (docs/algorithm.md#simulation). On the CPU both are the same kernel.
    """
    return torch.div(t, torch.full((), divisor, dtype=t.dtype, device=t.device), out=out)


def blocked(x: torch.Tensor, block_size: int) -> list[torch.Tensor]:
    """2-D views of a 1-D chunk: (full blocks, block_size) and (1, tail) if partial.

    Views keep the work vectorized over blocks without padding copies; the only
    extra kernel launches are for the single partial block.
    """
    numel = x.numel()
    full = numel // block_size * block_size
    views = []
    if full:
        views.append(x[:full].view(-1, block_size))
    if numel > full:
        views.append(x[full:].view(1, -1))
    return views


class WireFormat(ABC):
    """One wire format, found by name in :data:`autoloco_hf.wire.formats.FORMATS`."""

    #: dtype of each wire tensor, in order
    dtypes: tuple[torch.dtype, ...]

    @abstractmethod
    def numels(self, numel: int, block_size: int) -> tuple[int, ...]:
        """Elements of each wire tensor for a piece of ``numel`` elements."""

    @abstractmethod
    def encode(self, x: torch.Tensor, wire: Sequence[torch.Tensor], block_size: int) -> None:
        """Encode the 1-D FP32 piece ``x`` into the views ``wire`` (shaped by :meth:`numels`)."""

    @abstractmethod
    def decode(self, wire: Sequence[torch.Tensor], out: torch.Tensor, block_size: int) -> None:
        """Decode the views ``wire`` of a piece into the 1-D FP32 ``out``."""

    def encode_whole(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """The wire tensors of a whole slice without buffers,
        when the format is a plain cast; else ``None``."""
        return None

    def decode_whole(self, wire: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """The FP32 slice of :meth:`encode_whole`'s wire tensors
        without a buffer; ``None`` unless a plain cast."""
        return None
