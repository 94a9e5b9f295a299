"""Pseudo-gradient wire codec: a flat buffer in any wire format, and the owner-reduce arithmetic
(docs/algorithm.md#wire-codecs).

The outer synchronization ships pseudo-gradients (``theta_t - theta_t^i``) between
workers. This module owns everything about how such a flat FP32 buffer looks on the
wire and the reference arithmetic of the owner-reduce aggregation, so that the
single-process simulation (docs/algorithm.md#simulation) and the torch.distributed path produce
bit-identical results by calling the same functions. The formats themselves
(``fp32``, ``bf16``, ``int8``, ``int4``, ``fp4``, ``int2``, top-k) live in
:mod:`autoloco_hf.wire.formats`, one strategy object each, found by name.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from autoloco_hf.config import MAX_TOPK_BLOCK, CodecKernel, WireDtype
from autoloco_hf.wire.accounting import DEFAULT_BLOCK_SIZE, num_int8_blocks, piece_wire_bytes
from autoloco_hf.wire.formats import wire_format
from autoloco_hf.wire.formats.base import true_divide


def _check_block_size(block_size: int, topk_fraction: float | None) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(
            f"block_size={block_size!r} is not a positive integer: use an int >= 1 (default 4096)"
        )
    if topk_fraction is not None and block_size > MAX_TOPK_BLOCK:
        raise ValueError(
            f"block_size={block_size} with topk_fraction: offsets in a block are 16-bit, use "
            f"block_size <= {MAX_TOPK_BLOCK}"
        )


def balanced_parts(numel: int, num_parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` parts of ``range(numel)``;
    sizes differ by at most 1, the first ones larger."""
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
    """Encodes a flat FP32 buffer made of several tensor segments for one wire format
    (docs/algorithm.md#wire-codecs).

    The flat buffer is the concatenation of the model's tensors (``segment_sizes``
    in order). Slices of it are encoded independently, piece by piece (``segment ∩
    slice``), each piece by the format found by name (:func:`wire_format`): a block
    of a blockwise wire starts at the piece start and never mixes two tensors (whose
    magnitudes can differ by orders of magnitude), and the layout of a slice depends
    only on ``(start, numel)``, which both the sender and the receiver know.

    Wire tensors per slice: the format's (``fp32`` -> ``[fp32]``, the input itself
    without ``out``; ``bf16`` -> ``[bf16]``; ``int8`` -> ``[int8 codes, fp32 scales]``;
    ``int4`` / ``fp4`` / ``int2`` -> ``[uint8 packed codes, fp32 scales]``; top-k adds
    ``[uint8 offsets]``), each the concatenation of the slice's pieces.
    """

    def __init__(
        self,
        wire_dtype: str,
        segment_sizes: Sequence[int],
        block_size: int = DEFAULT_BLOCK_SIZE,
        topk_fraction: float | None = None,
        kernel: CodecKernel = CodecKernel.EAGER,
    ):
        self.format = wire_format(wire_dtype, topk_fraction, kernel)
        _check_block_size(block_size, topk_fraction)
        sizes = [int(s) for s in segment_sizes]
        if any(s < 0 for s in sizes):
            raise ValueError("segment sizes must be non-negative")
        self.wire_dtype = WireDtype(wire_dtype)
        self.topk_fraction = topk_fraction
        self.block_size = block_size
        self.segment_sizes = tuple(sizes)
        self._offsets = [0]
        for s in sizes:
            self._offsets.append(self._offsets[-1] + s)
        self.numel = self._offsets[-1]

    def partition(self, num_parts: int) -> list[tuple[int, int]]:
        """Contiguous ``[start, end)`` owner parts
        (docs/algorithm.md#wire-codecs aggregation); sizes differ by at most 1.

        The first ``numel % num_parts`` parts get one extra element; parts may be
        empty when ``num_parts > numel``.
        """
        return balanced_parts(self.numel, num_parts)

    def pieces(self, start: int, numel: int) -> list[tuple[int, int]]:
        """``(offset within the slice, length)`` of each non-empty
        ``segment ∩ [start, start+numel)``."""
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
        """Scales a blockwise wire carries for the slice: per piece
        ``ceil(length / block_size)``."""
        return sum(num_int8_blocks(n, self.block_size) for _, n in self.pieces(start, numel))

    def wire_bytes(self, start: int, numel: int) -> int:
        """Exact bytes of :meth:`encode`'s output for the
        slice (docs/algorithm.md#accounting accounting)."""
        return sum(
            piece_wire_bytes(n, self.wire_dtype, self.block_size, self.topk_fraction)
            for _, n in self.pieces(start, numel)
        )

    def _layout(self, start: int, numel: int) -> list[tuple[int, int, list[tuple[int, int]]]]:
        """Per piece: its offset and length in the slice and
        ``(offset, length)`` in each wire tensor."""
        at = [0] * len(self.format.dtypes)
        layout = []
        for off, n in self.pieces(start, numel):
            counts = self.format.numels(n, self.block_size)
            layout.append((off, n, list(zip(at, counts))))
            at = [a + c for a, c in zip(at, counts)]
        return layout

    def empty_wire(
        self, start: int, numel: int, device: torch.device | str | None = None
    ) -> list[torch.Tensor]:
        """Uninitialized receive buffers shaped like :meth:`encode`'s output for the slice."""
        totals = [0] * len(self.format.dtypes)
        for _, n in self.pieces(start, numel):
            totals = [t + c for t, c in zip(totals, self.format.numels(n, self.block_size))]
        return [torch.empty(t, dtype=d, device=device) for t, d in zip(totals, self.format.dtypes)]

    def encode(
        self, flat_part: torch.Tensor, start: int, out: list[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """Wire tensors for the slice ``[start, start + numel)`` of the flat buffer.

        ``out`` (shaped like :meth:`empty_wire`) receives them instead of fresh
        tensors: callers that sync repeatedly keep persistent wire buffers, since
        first-touch page faults of large fresh tensors cost more than the codec.
        Without ``out``, ``fp32`` returns the input itself (no copy).
        """
        if flat_part.dim() != 1 or flat_part.dtype != torch.float32:
            raise ValueError(
                f"expected a 1-D float32 tensor, got {flat_part.dtype} {tuple(flat_part.shape)}"
            )
        numel = flat_part.numel()
        self._check_slice(start, numel)
        flat_part = flat_part.contiguous()
        if out is None:
            whole = self.format.encode_whole(flat_part)
            if whole is not None:
                return whole
            out = self.empty_wire(start, numel, flat_part.device)
        else:
            self._check_wire(out, start, numel)
        for off, n, spans in self._layout(start, numel):
            self.format.encode(
                flat_part[off : off + n],
                [w[a : a + c] for w, (a, c) in zip(out, spans)],
                self.block_size,
            )
        return out

    def decode(
        self, wire: list[torch.Tensor], start: int, numel: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """FP32 slice from its wire tensors, written into ``out`` when given.

        Without ``out``, ``fp32`` returns ``wire[0]`` itself (no copy).
        """
        self._check_wire(wire, start, numel)
        if out is not None and (out.dtype != torch.float32 or out.shape != (numel,)):
            raise ValueError(
                f"out must be a float32 tensor of shape ({numel},), got "
                f"{out.dtype} {tuple(out.shape)}"
            )
        if out is None:
            whole = self.format.decode_whole(wire)
            if whole is not None:
                return whole
            out = torch.empty(numel, dtype=torch.float32, device=wire[0].device)
        for off, n, spans in self._layout(start, numel):
            self.format.decode(
                [w[a : a + c] for w, (a, c) in zip(wire, spans)],
                out[off : off + n],
                self.block_size,
            )
        return out

    def _check_wire(self, wire: Sequence[torch.Tensor], start: int, numel: int) -> None:
        expected = self.empty_wire(start, numel, "meta")
        if len(wire) != len(expected) or any(
            w.dtype != e.dtype or w.shape != e.shape for w, e in zip(wire, expected)
        ):
            raise ValueError(
                f"wire tensors {[(w.dtype, tuple(w.shape)) for w in wire]} do not match "
                f"{[(e.dtype, tuple(e.shape)) for e in expected]} for slice ({start}, {numel})"
            )

    def roundtrip(self, flat_part: torch.Tensor, start: int) -> torch.Tensor:
        """What a receiver reconstructs from this slice: ``decode(encode(...))``."""
        return self.decode(self.encode(flat_part, start), start, flat_part.numel())

    def _check_slice(self, start: int, numel: int) -> None:
        if start < 0 or numel < 0 or start + numel > self.numel:
            raise ValueError(
                f"slice ({start}, {numel}) outside the flat buffer of {self.numel} elements"
            )


def mean_in_worker_order(decoded_contributions: Sequence[torch.Tensor]) -> torch.Tensor:
    """FP32 mean with the one fixed op order both aggregation paths use
    (docs/algorithm.md#wire-codecs, #simulation).

    ``total = c0.clone(); total += c1; ...; total /= N``: FP32 addition is not
    associative, so fixing the order is what makes the simulated and the
    distributed results bit-identical.
    """
    if not decoded_contributions:
        raise ValueError("need at least one contribution")
    total = decoded_contributions[0].to(torch.float32, copy=True)
    for c in decoded_contributions[1:]:
        total += c
    true_divide(total, len(decoded_contributions), out=total)
    return total


def owner_reduce_part(
    codec: WireCodec, decoded_contributions: Sequence[torch.Tensor], start: int
) -> list[torch.Tensor]:
    """Owner's step for its part: mean of the decoded
    contributions (worker order 0..N-1), encoded once.

    The returned wire tensors are what the owner sends to every worker, itself
    included (docs/algorithm.md#wire-codecs: all workers receive the identical decoded mean).
    """
    return codec.encode(mean_in_worker_order(decoded_contributions), start)


def owner_reduce_mean(codec: WireCodec, contributions: Sequence[torch.Tensor]) -> torch.Tensor:
    """Paper aggregation (Appendix G.1, docs/algorithm.md#wire-codecs) simulated in one process.

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


def gathered_mean(codec: WireCodec, contributions: Sequence[torch.Tensor]) -> torch.Tensor:
    """The all-gather aggregation of an overlapped lossy average
    (docs/algorithm.md#overlap), simulated in one process.

    Every worker sends its whole contribution encoded as it would send it to the owners
    (:func:`roundtrip_as_sent`: the same parts, so error feedback subtracts exactly what
    was sent) and every worker decodes all ``N`` buffers and averages them in worker
    order (:func:`mean_in_worker_order`). No mean is encoded again: one rounding fewer
    than :func:`owner_reduce_mean`, hence other bits.
    """
    n = len(contributions)
    return mean_in_worker_order([roundtrip_as_sent(codec, c, n) for c in contributions])


class ErrorFeedback:
    """Error feedback for a lossy wire (docs/algorithm.md#error-feedback;
    off by default, not in the paper).

    One instance per worker keeps the FP32 residual of what its encoding dropped
    and adds it to the next contribution, for every lossy format alike::

        compensated = ef.apply(codec, delta, N)   # delta + residual; residual <- compensated - sent
        # contribute `compensated` to the aggregation

    ``offset``: ``delta`` covers ``residual[offset : offset + delta.numel()]`` only
    (a streaming fragment, docs/algorithm.md#fragments): each fragment owns its own,
    disjoint part of the one buffer.

    Memory cost: one FP32 copy of the model (of this rank's shard) per worker,
    allocated on construction; it belongs in checkpoints (docs/algorithm.md#state) via
    :meth:`state_dict`.
    """

    def __init__(self, numel: int, device: torch.device | str | None = None):
        self.residual = torch.zeros(numel, dtype=torch.float32, device=device)

    def apply(
        self, codec: WireCodec, delta: torch.Tensor, num_parts: int, offset: int = 0
    ) -> torch.Tensor:
        """``delta + residual`` (a new tensor; ``delta`` is
        left unchanged), keeping what its encoding drops.

        The sent value is the contribution as the ``num_parts`` owners decode it
        (:func:`roundtrip_as_sent`); call it only with a finite ``delta``.
        """
        residual = self.residual[offset : offset + delta.numel()]
        compensated = delta + residual
        torch.sub(compensated, roundtrip_as_sent(codec, compensated, num_parts), out=residual)
        return compensated

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"residual": self.residual.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        residual = state["residual"]
        if residual.shape != self.residual.shape:
            raise ValueError(
                f"residual of shape {tuple(residual.shape)}, expected {tuple(self.residual.shape)}"
            )
        self.residual.copy_(residual)
