"""Byte accounting of a synchronization: the paper's logical payload and the bytes really sent
(docs/algorithm.md#wire-codecs, #accounting).

The one place that knows how many bytes a wire dtype costs. Kept free of
``torch`` (the codec passes itself in) so that ``autoloco plan`` starts fast.

Example::

    >>> # codes plus an FP32 scale per block
    >>> payload_bytes(syncs=10, num_params=8192, wire_dtype="int8")
    82000
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from autoloco_hf.config import WireDtype

if TYPE_CHECKING:
    from autoloco_hf.wire.codec import WireCodec

# elements per FP32 scale of a blockwise wire (docs/algorithm.md#wire-codecs)
DEFAULT_BLOCK_SIZE = 4096
FP32_BYTES = 4
SCALE_BYTES = FP32_BYTES  # one FP32 scale per block
# one 16-bit offset in its block per kept entry of a top-k wire (docs/algorithm.md#low-bit-wires)
INDEX_BYTES = 2


def num_int8_blocks(numel: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Blocks of one contiguous chunk: full blocks plus one partial last block."""
    return -(-numel // block_size)


def packed_bytes(numel: int, bits: int) -> int:
    """Bytes of ``numel`` codes of ``bits`` bits packed together, the last byte padded."""
    return -(-numel * bits // 8)


def topk_keep(numel: int, fraction: float) -> int:
    """Entries a top-k wire keeps of one block of ``numel`` elements: ``ceil(fraction * numel)``."""
    return math.ceil(fraction * numel)


def topk_kept(numel: int, block_size: int, fraction: float) -> int:
    """Entries a top-k wire keeps of one contiguous chunk:
    per full block, plus the partial last block's."""
    full, tail = divmod(numel, block_size)
    return full * topk_keep(block_size, fraction) + topk_keep(tail, fraction)


def piece_wire_bytes(
    numel: int, wire_dtype: str, block_size: int, topk_fraction: float | None = None
) -> int:
    """Exact wire bytes of one contiguous chunk (inside one tensor) of ``numel`` elements.

    Dense: the codes packed, plus an FP32 scale per block for a blockwise wire.
    Top-k: the kept entries' codes packed, their 16-bit offsets, and a scale per block.
    """
    wire = WireDtype(wire_dtype)
    scales = SCALE_BYTES * num_int8_blocks(numel, block_size) if wire.blockwise else 0
    if topk_fraction is None:
        return packed_bytes(numel, wire.bits) + scales
    kept = topk_kept(numel, block_size, topk_fraction)
    return packed_bytes(kept, wire.bits) + INDEX_BYTES * kept + scales


def payload_bytes(
    syncs: int,
    num_params: int,
    wire_dtype: str,
    block_size: int = DEFAULT_BLOCK_SIZE,
    topk_fraction: float | None = None,
) -> int:
    """The paper's logical payload per worker of ``syncs`` full-model synchronizations.

    ``num_params`` elements at the wire dtype as one chunk (:func:`piece_wire_bytes`: for a
    blockwise wire one FP32 scale per ``block_size`` elements of the flat buffer). This is the
    number the paper and ``autoloco plan`` compare; what a
    worker really sends is :func:`wire_bytes_sent`.
    """
    return syncs * piece_wire_bytes(num_params, wire_dtype, block_size, topk_fraction)


def wire_bytes_sent(codec: WireCodec, num_workers: int, worker: int = 0) -> int:
    """Bytes ``worker`` sends to the others in one aggregation of ``codec``'s flat buffer.

    FP32 goes through a ring all-reduce: ``2 (N-1)/N`` times the buffer. Every lossy
    wire goes through owner-reduce: the worker's encoded contributions to the other
    owners, then its encoded mean part to each of the others (exact split sizes
    from :meth:`WireCodec.wire_bytes`).
    """
    n = num_workers
    if codec.wire_dtype == WireDtype.FP32:
        return (2 * (n - 1) * codec.numel * FP32_BYTES) // n
    parts = codec.partition(n)
    to_owners = sum(codec.wire_bytes(s, e - s) for j, (s, e) in enumerate(parts) if j != worker)
    s, e = parts[worker]
    return to_owners + (n - 1) * codec.wire_bytes(s, e - s)


def outer_state_bytes_per_rank(
    num_params: int, ranks_per_worker: int = 1, momentum: bool = True, error_feedback: bool = False
) -> int:
    """FP32 outer state one rank holds: ``theta_t``, the
    Nesterov momentum and the optional error-feedback residual.

    With FSDP2 workers (docs/algorithm.md#worker-groups) rank ``r`` keeps the
    state of its shard only, so the per-rank figure falls by ``ranks_per_worker``;
    FSDP2 pads each parameter's dim 0 to a multiple of ``R``, so the largest shard
    is at most one row per tensor above ``num_params / R`` (ignored here).
    """
    copies = 1 + int(momentum) + int(error_feedback)
    return copies * FP32_BYTES * -(-num_params // ranks_per_worker)
