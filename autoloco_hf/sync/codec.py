"""Pseudo-gradient wire codecs: FP32, BF16 and INT8 blockwise (docs/algorithm.md §7, paper Appendix G.1).

The outer synchronization ships pseudo-gradients (``theta_t - theta_t^i``) between
workers. This module owns everything about how such a flat FP32 buffer looks on the
wire and the reference arithmetic of the owner-reduce aggregation, so that the
single-process simulation (docs/algorithm.md §8.4) and the torch.distributed path produce
bit-identical results by calling the same functions.

INT8 format (docs/algorithm.md §7). Each tensor is split into contiguous blocks of up to
``block_size`` (default 4,096) elements; a block carries one FP32 scale
``max|x| / 127`` and int8 codes ``q = clip(round_half_to_even(x / scale), -127, 127)``;
decoding is ``q * scale`` in FP32. Scale edge cases:

* all-zero block: scale 1 (docs/algorithm.md §7), so its codes are 0 and it decodes to exact zeros;
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

import bisect
from collections.abc import Sequence

import torch

from autoloco_hf.config import WIRE_DTYPES, WireDtype
from autoloco_hf.sync.accounting import DEFAULT_BLOCK_SIZE, num_int8_blocks

QMAX = 127
SCALE_MIN = float.fromhex("0x1p-126")  # smallest normal FP32, see module docstring
SCALE_MAX = float.fromhex("0x1.020406p+121")  # largest FP32 s with 127 * s finite
CHUNK_ELEMENTS = 1 << 18  # per thread: 1 MB of FP32, the size of a core's L2 cache


def _check_block_size(block_size: int) -> None:
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")


def _blocked(x: torch.Tensor, block_size: int) -> list[torch.Tensor]:
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


def _chunk_rows(block_size: int) -> int:
    """Blocks processed per pass: about ``CHUNK_ELEMENTS`` elements (times the intra-op threads).

    The encoder makes five passes over each chunk (min/max, divide, round, clamp,
    cast); a chunk of ~1 MB FP32 per thread stays in the core's cache, so only the
    first pass reads main memory, and it is large enough for torch's intra-op
    thread pool (grain 32,768 elements) to split it across threads.
    """
    return max(1, CHUNK_ELEMENTS * torch.get_num_threads() // block_size)


def _encode_into(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, block_size: int) -> None:
    """Encode the 1-D FP32 chunk ``x`` into preallocated ``values``/``scales`` (docs/algorithm.md §7).

    Works in cache-sized groups of blocks through one small scratch buffer: the
    fresh full-size FP32 temporaries of a naive version cost more (first-touch page
    faults) than the arithmetic. Element by element the operations are the same, so
    the output does not depend on the grouping.
    """
    row = 0
    step = _chunk_rows(block_size)
    scratch: torch.Tensor | None = None
    for xv, vv in zip(_blocked(x, block_size), _blocked(values, block_size)):
        for lo in range(0, xv.shape[0], step):
            xb, vb = xv[lo : lo + step], vv[lo : lo + step]
            # max(amax, -amin) avoids materializing |x|; two row reductions are several
            # times faster than torch.aminmax(dim=1), abs().amax() or an inf-norm on CPU. Both propagate NaN.
            amax = torch.maximum(xb.amax(dim=1), xb.amin(dim=1).neg())
            scale = (amax / QMAX).masked_fill_(amax == 0, 1.0)
            # NaN/inf max -> SCALE_MAX (defined behaviour for non-finite input, module docstring).
            scale = torch.nan_to_num(scale, nan=SCALE_MAX).clamp_(SCALE_MIN, SCALE_MAX)
            if scratch is None or scratch.numel() < xb.numel():
                scratch = torch.empty(min(step, xv.shape[0]) * xv.shape[1], dtype=torch.float32, device=x.device)
            q = scratch[: xb.numel()].view_as(xb)
            torch.div(xb, scale[:, None], out=q)
            q.round_()  # half to even
            # Only a non-finite or saturated (SCALE_MAX) block can leave [-127, 127] or hold NaN: finite
            # amax <= 127 * SCALE_MAX gives |x / scale| <= 127 (1 + 2**-23) before rounding. Skipping the
            # two passes for ordinary groups leaves the output unchanged.
            if not (bool(amax.isfinite().all()) and bool((scale < SCALE_MAX).all())):
                q.nan_to_num_(nan=0.0).clamp_(-QMAX, QMAX)  # casting NaN to int8 is undefined behaviour
            vb.copy_(q)
            scales[row : row + scale.numel()] = scale
            row += scale.numel()


def _decode_into(values: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, block_size: int) -> None:
    """Decode ``q * scale`` in FP32 into the preallocated 1-D ``out`` (docs/algorithm.md §7), a cache-sized group at a time."""
    row = 0
    step = _chunk_rows(block_size)
    for vv, ov in zip(_blocked(values, block_size), _blocked(out, block_size)):
        for lo in range(0, ov.shape[0], step):
            ob = ov[lo : lo + step]
            ob.copy_(vv[lo : lo + step])
            ob.mul_(scales[row : row + ob.shape[0], None])
            row += ob.shape[0]


def balanced_parts(numel: int, num_parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` parts of ``range(numel)``; sizes differ by at most 1, the first ones larger."""
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    base, extra = divmod(numel, num_parts)
    parts, start = [], 0
    for i in range(num_parts):
        end = start + base + (1 if i < extra else 0)
        parts.append((start, end))
        start = end
    return parts


class WireCodec:
    """Encodes a flat FP32 buffer made of several tensor segments for one wire dtype (docs/algorithm.md §7).

    The flat buffer is the concatenation of the model's tensors (``segment_sizes``
    in order). Slices of it are encoded independently; for ``int8`` the blocks are
    laid out per piece ``segment ∩ slice``, starting at the piece start, so a block
    never mixes two tensors (whose magnitudes can differ by orders of magnitude) and
    the layout of a slice depends only on ``(start, numel)``, which both the sender
    and the receiver know.

    Wire tensors per slice: ``fp32`` -> ``[fp32]`` (the input itself, no copy),
    ``bf16`` -> ``[bf16]`` (round to nearest even), ``int8`` -> ``[int8 codes, fp32 scales]``.
    """

    def __init__(self, wire_dtype: str, segment_sizes: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE):
        if wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype must be one of {WIRE_DTYPES}, got {wire_dtype!r}")
        _check_block_size(block_size)
        wire_dtype = WireDtype(wire_dtype)
        sizes = [int(s) for s in segment_sizes]
        if any(s < 0 for s in sizes):
            raise ValueError("segment sizes must be non-negative")
        self.wire_dtype = wire_dtype
        self.block_size = block_size
        self.segment_sizes = tuple(sizes)
        self._offsets = [0]
        for s in sizes:
            self._offsets.append(self._offsets[-1] + s)
        self.numel = self._offsets[-1]

    def partition(self, num_parts: int) -> list[tuple[int, int]]:
        """Contiguous ``[start, end)`` owner parts (docs/algorithm.md §7 aggregation); sizes differ by at most 1.

        The first ``numel % num_parts`` parts get one extra element; parts may be
        empty when ``num_parts > numel``.
        """
        return balanced_parts(self.numel, num_parts)

    def pieces(self, start: int, numel: int) -> list[tuple[int, int]]:
        """``(offset within the slice, length)`` of each non-empty ``segment ∩ [start, start+numel)``."""
        self._check_slice(start, numel)
        end = start + numel
        out = []
        seg = bisect.bisect_right(self._offsets, start) - 1
        while seg < len(self.segment_sizes) and self._offsets[seg] < end:
            lo = max(self._offsets[seg], start)
            hi = min(self._offsets[seg + 1], end)
            if hi > lo:
                out.append((lo - start, hi - lo))
            seg += 1
        return out

    def num_blocks(self, start: int, numel: int) -> int:
        """INT8 scales carried by the slice: per piece ``ceil(length / block_size)``."""
        return sum(num_int8_blocks(n, self.block_size) for _, n in self.pieces(start, numel))

    def wire_bytes(self, start: int, numel: int) -> int:
        """Exact bytes of :meth:`encode`'s output for the slice (docs/algorithm.md §8.1 accounting)."""
        self._check_slice(start, numel)
        if self.wire_dtype == WireDtype.FP32:
            return 4 * numel
        if self.wire_dtype == WireDtype.BF16:
            return 2 * numel
        return numel + 4 * self.num_blocks(start, numel)

    def empty_wire(self, start: int, numel: int, device: torch.device | str | None = None) -> list[torch.Tensor]:
        """Uninitialized receive buffers shaped like :meth:`encode`'s output for the slice."""
        self._check_slice(start, numel)
        if self.wire_dtype == WireDtype.FP32:
            return [torch.empty(numel, dtype=torch.float32, device=device)]
        if self.wire_dtype == WireDtype.BF16:
            return [torch.empty(numel, dtype=torch.bfloat16, device=device)]
        return [
            torch.empty(numel, dtype=torch.int8, device=device),
            torch.empty(self.num_blocks(start, numel), dtype=torch.float32, device=device),
        ]

    def encode(self, flat_part: torch.Tensor, start: int, out: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Wire tensors for the slice ``[start, start + numel)`` of the flat buffer.

        ``out`` (shaped like :meth:`empty_wire`) receives them instead of fresh
        tensors: callers that sync repeatedly keep persistent wire buffers, since
        first-touch page faults of large fresh tensors cost more than the codec.
        Without ``out``, ``fp32`` returns the input itself (no copy).
        """
        if flat_part.dim() != 1 or flat_part.dtype != torch.float32:
            raise ValueError(f"expected a 1-D float32 tensor, got {flat_part.dtype} {tuple(flat_part.shape)}")
        numel = flat_part.numel()
        self._check_slice(start, numel)
        flat_part = flat_part.contiguous()
        if out is None:
            if self.wire_dtype == WireDtype.FP32:
                return [flat_part]
            if self.wire_dtype == WireDtype.BF16:
                return [flat_part.to(torch.bfloat16)]
            out = self.empty_wire(start, numel, flat_part.device)
        else:
            self._check_wire(out, start, numel)
        if self.wire_dtype != WireDtype.INT8:
            out[0].copy_(flat_part)  # bf16: round to nearest even, like .to()
            return out
        values, scales = out
        row = 0
        for off, n in self.pieces(start, numel):
            nb = num_int8_blocks(n, self.block_size)
            _encode_into(flat_part[off : off + n], values[off : off + n], scales[row : row + nb], self.block_size)
            row += nb
        return out

    def decode(self, wire: list[torch.Tensor], start: int, numel: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """FP32 slice from its wire tensors, written into ``out`` when given.

        Without ``out``, ``fp32`` returns ``wire[0]`` itself (no copy).
        """
        self._check_wire(wire, start, numel)
        if out is not None and (out.dtype != torch.float32 or out.shape != (numel,)):
            raise ValueError(f"out must be a float32 tensor of shape ({numel},), got {out.dtype} {tuple(out.shape)}")
        if self.wire_dtype != WireDtype.INT8:
            if out is None:
                return wire[0] if self.wire_dtype == WireDtype.FP32 else wire[0].to(torch.float32)
            return out.copy_(wire[0])
        values, scales = wire
        if out is None:
            out = torch.empty(numel, dtype=torch.float32, device=values.device)
        row = 0
        for off, n in self.pieces(start, numel):
            nb = num_int8_blocks(n, self.block_size)
            _decode_into(values[off : off + n], scales[row : row + nb], out[off : off + n], self.block_size)
            row += nb
        return out

    def _check_wire(self, wire: Sequence[torch.Tensor], start: int, numel: int) -> None:
        expected = self.empty_wire(start, numel, "meta")
        if len(wire) != len(expected) or any(w.dtype != e.dtype or w.shape != e.shape for w, e in zip(wire, expected)):
            raise ValueError(
                f"wire tensors {[(w.dtype, tuple(w.shape)) for w in wire]} do not match "
                f"{[(e.dtype, tuple(e.shape)) for e in expected]} for slice ({start}, {numel})"
            )

    def roundtrip(self, flat_part: torch.Tensor, start: int) -> torch.Tensor:
        """What a receiver reconstructs from this slice: ``decode(encode(...))``."""
        return self.decode(self.encode(flat_part, start), start, flat_part.numel())

    def _check_slice(self, start: int, numel: int) -> None:
        if start < 0 or numel < 0 or start + numel > self.numel:
            raise ValueError(f"slice ({start}, {numel}) outside the flat buffer of {self.numel} elements")


def mean_in_worker_order(decoded_contributions: Sequence[torch.Tensor]) -> torch.Tensor:
    """FP32 mean with the one fixed op order both aggregation paths use (docs/algorithm.md §7, 8.4).

    ``total = c0.clone(); total += c1; ...; total /= N``: FP32 addition is not
    associative, so fixing the order is what makes the simulated and the
    distributed results bit-identical.
    """
    if not decoded_contributions:
        raise ValueError("need at least one contribution")
    total = decoded_contributions[0].to(torch.float32, copy=True)
    for c in decoded_contributions[1:]:
        total += c
    total /= len(decoded_contributions)
    return total


def owner_reduce_part(
    codec: WireCodec, decoded_contributions: Sequence[torch.Tensor], start: int
) -> list[torch.Tensor]:
    """Owner's step for its part: mean of the decoded contributions (worker order 0..N-1), encoded once.

    The returned wire tensors are what the owner sends to every worker, itself
    included (docs/algorithm.md §7: all workers receive the identical decoded mean).
    """
    return codec.encode(mean_in_worker_order(decoded_contributions), start)


def owner_reduce_mean(codec: WireCodec, contributions: Sequence[torch.Tensor]) -> torch.Tensor:
    """Paper aggregation (Appendix G.1, docs/algorithm.md §7) simulated in one process.

    The flat buffer is split into N owner parts (``codec.partition(N)``); for each
    part every worker's contribution is encoded and decoded (the owner's own too),
    the decoded contributions are averaged by :func:`mean_in_worker_order`, the
    mean is encoded once and decoded. Returns the decoded mean, identical on
    every worker.
    """
    n = len(contributions)
    if n == 0:
        raise ValueError("need at least one contribution")
    for c in contributions:
        if c.shape != (codec.numel,):
            raise ValueError(f"contribution of shape {tuple(c.shape)}, expected ({codec.numel},)")
    out = torch.empty(codec.numel, dtype=torch.float32, device=contributions[0].device)
    for start, end in codec.partition(n):
        decoded = [codec.roundtrip(c[start:end], start) for c in contributions]
        out[start:end] = codec.decode(owner_reduce_part(codec, decoded, start), start, end - start)
    return out


def roundtrip_as_sent(codec: WireCodec, flat: torch.Tensor, num_parts: int) -> torch.Tensor:
    """A worker's whole contribution as the owners decode it (owner parts of ``codec.partition``).

    The INT8 block layout depends on the slice, so this, not ``codec.roundtrip(flat, 0)``,
    is the "sent" value error feedback must subtract.
    """
    out = torch.empty(codec.numel, dtype=torch.float32, device=flat.device)
    for start, end in codec.partition(num_parts):
        out[start:end] = codec.roundtrip(flat[start:end], start)
    return out


class ErrorFeedback:
    """Optional error feedback for the lossy wire (docs/algorithm.md §7 extension; off by default).

    One instance per worker keeps the FP32 residual of what its encoding dropped
    and adds it to the next contribution::

        compensated = ef.compensate(delta)
        sent = roundtrip_as_sent(codec, compensated, N)
        ef.update(sent, compensated)       # residual = compensated - sent
        # contribute `compensated` to the aggregation

    Memory cost: one FP32 copy of the model per worker (4 bytes per parameter),
    allocated on construction; it belongs in checkpoints (docs/algorithm.md §8.2) via
    :meth:`state_dict`.
    """

    def __init__(self, numel: int, device: torch.device | str | None = None):
        self.residual = torch.zeros(numel, dtype=torch.float32, device=device)

    def compensate(self, delta: torch.Tensor) -> torch.Tensor:
        """``delta + residual`` (a new tensor; ``delta`` is left unchanged)."""
        return delta + self.residual

    def update(self, sent_decoded: torch.Tensor, compensated: torch.Tensor) -> None:
        """Keep what the wire lost: ``residual = compensated - sent_decoded``."""
        torch.sub(compensated, sent_decoded, out=self.residual)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"residual": self.residual.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        residual = state["residual"]
        if residual.shape != self.residual.shape:
            raise ValueError(f"residual of shape {tuple(residual.shape)}, expected {tuple(self.residual.shape)}")
        self.residual.copy_(residual)
