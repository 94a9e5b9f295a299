"""``int8``: blockwise INT8 codes with an FP32 scale per
block (docs/algorithm.md#wire-codecs, paper Appendix G.1).

Each tensor is split into contiguous blocks of up to
``block_size`` (default 4,096) elements; a block carries one FP32 scale
``max|x| / 127`` and int8 codes ``q = clip(round_half_to_even(x / scale), -127, 127)``;
decoding is ``q * scale`` in FP32. Scale edge cases:

* all-zero block: scale 1 (docs/algorithm.md#wire-codecs), so
  its codes are 0 and it decodes to exact zeros;
* scale is clamped to ``[SCALE_MIN, SCALE_MAX]``:
  ``SCALE_MIN`` is the smallest *normal* FP32 (2**-126). A subnormal scale would be
  flushed to 0 by flush-to-zero/denormals-are-zero arithmetic (common on GPUs) and
  turn ``x / scale`` into inf/NaN. With the clamp, ``q * SCALE_MIN`` is 0 or normal,
  and a block with ``max|x| < 127 * 2**-126`` (~1.5e-36) loses at most
  ``2**-127`` (~5.9e-39) per element, still within ``scale / 2``.
  ``SCALE_MAX`` is the largest FP32 ``s`` with ``127 * s`` finite. The naive
  ``finfo.max / 127`` rounds *up* and ``127 * (finfo.max / 127)`` overflows to inf,
  so a block holding ``finfo.max`` would decode to inf; with the clamp its codes
  saturate at 127 and it decodes to ``127 * SCALE_MAX`` (``finfo.max * (1 - 6e-8)``),
  an error far below ``scale / 2``. Values such as 1e30 are unaffected by either clamp.

Error bound for finite input (tested): ``|x - decode(encode(x))| <= scale * (1/2 + 2**-16)``
per element, where ``2**-16`` covers the two FP32 roundings (of ``x / scale`` and of
``q * scale``, each at most ``128 * 2**-24`` relative to the scale).

Non-finite input (the engine checks pseudo-gradients for finiteness before
encoding and skips the outer step, so this only needs to be defined): a block
whose ``max|x|`` is NaN or inf gets scale ``SCALE_MAX``; inside it NaN encodes as 0,
+-inf as +-127 and finite values as their (mostly zero) codes at that scale. The
decoded output is therefore always finite; the codec never raises on it. The
``bf16`` wire keeps NaN/inf as they are, like any cast, and rounds finite
``|x| >= 2**128 * (1 - 2**-9)`` (~3.39e38, above the bf16 maximum) to inf.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from autoloco_hf.wire.accounting import num_int8_blocks
from autoloco_hf.wire.formats.base import WireFormat, blocked, true_divide

QMAX = 127
SCALE_MIN = float.fromhex("0x1p-126")  # smallest normal FP32, see module docstring
SCALE_MAX = float.fromhex("0x1.020406p+121")  # largest FP32 s with 127 * s finite
_ROUND_MAGIC = 1.5 * 2**23  # adding it rounds |q| < 2**22 to an integer, half to even
CHUNK_ELEMENTS = 1 << 18  # per thread: 1 MB of FP32, the size of a core's L2 cache


def chunk_rows(block_size: int) -> int:
    """Blocks processed per pass: about ``CHUNK_ELEMENTS`` elements (times the intra-op threads).

    The encoders make several passes over each chunk (min/max, divide, round,
    cast); a chunk of ~1 MB FP32 per thread stays in the core's cache, so only the
    first pass reads main memory, and it is large enough for torch's intra-op
    thread pool (grain 32,768 elements) to split it across threads.
    """
    return max(1, CHUNK_ELEMENTS * torch.get_num_threads() // block_size)


def _encode_into(
    x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, block_size: int
) -> None:
    """Encode the 1-D FP32 chunk ``x`` into preallocated ``values``/``scales``
    (docs/algorithm.md#wire-codecs).

    Works in cache-sized groups of blocks through one small scratch buffer: the
    fresh full-size FP32 temporaries of a naive version cost more (first-touch page
    faults) than the arithmetic. Element by element the operations are the same, so
    the output does not depend on the grouping.
    """
    row = 0
    step = chunk_rows(block_size)
    scratch: torch.Tensor | None = None
    for xv, vv in zip(blocked(x, block_size), blocked(values, block_size)):
        for lo in range(0, xv.shape[0], step):
            xb, vb = xv[lo : lo + step], vv[lo : lo + step]
            # max(amax, -amin) avoids materializing |x|; two row reductions are several
            # times faster than torch.aminmax(dim=1), abs().amax()
            # or an inf-norm on CPU. Both propagate NaN.
            amax = torch.maximum(xb.amax(dim=1), xb.amin(dim=1).neg())
            scale = true_divide(amax, QMAX).masked_fill_(amax == 0, 1.0)
            # NaN/inf max -> SCALE_MAX (defined behaviour for non-finite input, module docstring).
            scale = torch.nan_to_num(scale, nan=SCALE_MAX).clamp_(SCALE_MIN, SCALE_MAX)
            if scratch is None or scratch.numel() < xb.numel():
                scratch = torch.empty(
                    min(step, xv.shape[0]) * xv.shape[1], dtype=torch.float32, device=x.device
                )
            q = scratch[: xb.numel()].view_as(xb)
            torch.div(xb, scale[:, None], out=q)
            # Only a non-finite or saturated (SCALE_MAX) block can leave [-127, 127] or hold NaN:
            # finite amax <= 127 * SCALE_MAX gives |x / scale| <= 127 (1 + 2**-23). (NaN or inf amax
            # got SCALE_MAX above.) Skipping the two passes for ordinary groups leaves the output
            # unchanged; clamping before rounding equals clamping after, the bounds being integers.
            if not bool((scale < SCALE_MAX).all()):
                # casting NaN to int8 is undefined behaviour
                q.nan_to_num_(nan=0.0).clamp_(-QMAX, QMAX)
            # Round half to even by the FP32 addition itself: for |q| < 2**22, q + 1.5 * 2**23 holds
            # round(q) in its low mantissa bits, so the int32 view's low byte is the int8 code.
            q.add_(_ROUND_MAGIC)
            vb.copy_(q.view(torch.int32))  # the int32 -> int8 cast keeps the low byte
            scales[row : row + scale.numel()] = scale
            row += scale.numel()


def _decode_into(
    values: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, block_size: int
) -> None:
    """Decode ``q * scale`` in FP32 into the preallocated 1-D ``out``
    (docs/algorithm.md#wire-codecs), a cache-sized group at a time."""
    row = 0
    step = chunk_rows(block_size)
    for vv, ov in zip(blocked(values, block_size), blocked(out, block_size)):
        for lo in range(0, ov.shape[0], step):
            ob = ov[lo : lo + step]
            ob.copy_(vv[lo : lo + step])
            ob.mul_(scales[row : row + ob.shape[0], None])
            row += ob.shape[0]


class Int8Format(WireFormat):
    """``[int8 codes (one per element), fp32 scales (one per block)]``."""

    dtypes = (torch.int8, torch.float32)

    def numels(self, numel: int, block_size: int) -> tuple[int, ...]:
        return (numel, num_int8_blocks(numel, block_size))

    def encode(self, x: torch.Tensor, wire: Sequence[torch.Tensor], block_size: int) -> None:
        _encode_into(x, wire[0], wire[1], block_size)

    def decode(self, wire: Sequence[torch.Tensor], out: torch.Tensor, block_size: int) -> None:
        _decode_into(wire[0], wire[1], out, block_size)
