"""``fp32`` and ``bf16``: the buffer itself, or a cast with round-to-nearest-even
(docs/algorithm.md#wire-codecs)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from autoloco_hf.wire.formats.base import WireFormat


class CastFormat(WireFormat):
    """Every element cast to ``dtype``; FP32 travels as the input itself when no buffer is given."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtypes = (dtype,)

    def numels(self, numel: int, block_size: int) -> tuple[int, ...]:
        return (numel,)

    def encode(self, x: torch.Tensor, wire: Sequence[torch.Tensor], block_size: int) -> None:
        wire[0].copy_(x)  # bf16: round to nearest even, like .to()

    def decode(self, wire: Sequence[torch.Tensor], out: torch.Tensor, block_size: int) -> None:
        out.copy_(wire[0])

    def encode_whole(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        return [x.to(self.dtypes[0])]  # fp32: no copy

    def decode_whole(self, wire: Sequence[torch.Tensor]) -> torch.Tensor | None:
        return wire[0].to(torch.float32)  # fp32: no copy
