"""Wire formats found by name (docs/algorithm.md#wire-codecs):
one strategy object per :class:`WireDtype`.

``wire_format(name, topk_fraction)`` returns the format of ``wire_dtype=name``,
sparsified by :class:`TopKFormat` when ``topk_fraction`` is set (blockwise wires only).
"""

from __future__ import annotations

import torch

from autoloco_hf.config import BLOCKWISE_WIRES, WIRE_DTYPES, CodecKernel, WireDtype
from autoloco_hf.wire.formats.base import WireFormat
from autoloco_hf.wire.formats.cast import CastFormat
from autoloco_hf.wire.formats.grid import FP4_E2M1_GRID, INT2_GRID, INT4_GRID, GridFormat
from autoloco_hf.wire.formats.int8 import Int8Format
from autoloco_hf.wire.formats.topk import TopKFormat

FORMATS: dict[WireDtype, WireFormat] = {
    WireDtype.FP32: CastFormat(torch.float32),
    WireDtype.BF16: CastFormat(torch.bfloat16),
    WireDtype.INT8: Int8Format(),
    WireDtype.INT4: GridFormat(INT4_GRID),
    WireDtype.FP4: GridFormat(FP4_E2M1_GRID),
    WireDtype.INT2: GridFormat(INT2_GRID),
}


# the grid wires with codec_kernel="compiled": built on first
# use (each compiles its kernel at its first encode)
_COMPILED: dict[WireDtype, GridFormat] = {}


def wire_format(
    wire_dtype: str, topk_fraction: float | None = None, kernel: CodecKernel = CodecKernel.EAGER
) -> WireFormat:
    """The format called ``wire_dtype``, top-k sparsified when ``topk_fraction`` is set; one clear
    line on a bad name or fraction.

    ``kernel``: how a grid wire (int4, fp4, int2) computes its codes; the other wires have one way.
    """
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(
            f"wire_dtype={wire_dtype!r} is not a wire format: use one of {', '.join(WIRE_DTYPES)}"
        )
    dense = FORMATS[WireDtype(wire_dtype)]
    if CodecKernel(kernel) == CodecKernel.COMPILED and isinstance(dense, GridFormat):
        dense = _COMPILED.setdefault(WireDtype(wire_dtype), GridFormat(dense.grid, compiled=True))
    if topk_fraction is None:
        return dense
    if not 0.0 < topk_fraction <= 1.0:
        raise ValueError(
            f"topk_fraction={topk_fraction!r} is outside (0, 1]: keep a "
            "fraction 0 < f <= 1, or None"
        )
    if not WireDtype(wire_dtype).blockwise:
        raise ValueError(
            f"topk_fraction={topk_fraction!r} with wire_dtype={wire_dtype!r}: top-k values travel "
            f"in a blockwise wire, use one of {', '.join(BLOCKWISE_WIRES)}"
        )
    return TopKFormat(dense, topk_fraction)
