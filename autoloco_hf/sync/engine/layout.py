"""Where this rank's part of the flat model lies: its shard, the fragments, their wire sizes.

Fixed once the models and the communicator are known, so the engine, the
aggregation and the schedules read one value instead of recomputing ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from autoloco_hf.config import AutoLoCoConfig, WireDtype
from autoloco_hf.sync.engine.fragments import Fragment, on_local_tensors, split_fragments
from autoloco_hf.sync.outer import OuterOptimizer
from autoloco_hf.wire.accounting import payload_bytes
from autoloco_hf.wire.codec import ErrorFeedback, WireCodec

if TYPE_CHECKING:
    from autoloco_hf.sync.communicators.base import Communicator

__all__ = ["SyncLayout", "build_outer_state"]


@dataclass(frozen=True)
class SyncLayout:
    """The flat model as this rank syncs it (docs/algorithm.md#worker-groups, #fragments).

    ``shard``: the ``[start, end)`` range whose outer state this rank owns (all
    of the model unless the worker's ranks each own a shard). ``fragments``: the
    streaming fragments (one, the whole model, when ``fragments=1``), cut at whole
    tensors of the worker's model. ``fragment_pieces``: this rank's part of each
    fragment in flat-model coordinates, possibly empty (then only the control
    message travels, docs/algorithm.md#fragment-layout).
    """

    segment_sizes: list[int]
    shard: tuple[int, int]
    shard_segment_sizes: list[int]
    fragments: list[Fragment]
    fragment_pieces: list[tuple[int, int]]
    fragment_segment_sizes: list[list[int]]
    fragment_payload_bytes: list[int]

    @property
    def payload_bytes(self) -> int:
        """Bytes of one interval, per worker (every fragment's)."""
        return sum(self.fragment_payload_bytes)

    @classmethod
    def of(
        cls, config: AutoLoCoConfig, comm: Communicator, segment_sizes: Sequence[int]
    ) -> SyncLayout:  # fmt: skip
        """The layout of a worker whose parameter tensors have ``segment_sizes`` elements."""
        sizes = list(segment_sizes)
        numel = sum(sizes)
        start, end = shard = comm.shard_range(numel)

        def pieces(lo: int, hi: int) -> list[int]:
            return [n for _, n in WireCodec(WireDtype.FP32, sizes).pieces(lo, hi - lo)]

        # an FSDP2 rank's tensors are its local shards of the worker's tensors
        tensor_sizes = comm.worker_tensor_sizes(sizes) if config.fragments > 1 else sizes
        fragments = on_local_tensors(split_fragments(tensor_sizes, config.fragments), sizes)
        spans = [f.span for f in fragments]
        fragment_pieces = [(min(max(s, start), end), max(min(e, end), start)) for s, e in spans]
        wire = (comm.wire_dtype, comm.block_size, comm.topk_fraction)
        fragment_payload_bytes = [payload_bytes(1, f.numel, *wire) for f in fragments]
        return cls(
            sizes,
            shard,
            pieces(start, end),
            fragments,
            fragment_pieces,
            [pieces(lo, hi) for lo, hi in fragment_pieces],
            fragment_payload_bytes,
        )


def build_outer_state(
    config: AutoLoCoConfig,
    layout: SyncLayout,
    worker_params: Sequence[Sequence[torch.nn.Parameter]],
) -> tuple[OuterOptimizer, list[ErrorFeedback]]:
    """``theta_0`` and the momentum of the range this rank owns, and the error-feedback residuals.

    One FP32 residual per local worker (each fragment owns its part), carried to
    the next sync (docs/algorithm.md#error-feedback); none without error feedback.
    """
    numel = sum(layout.segment_sizes)
    start = layout.shard[0]
    spans = [(lo - start, hi - start) for lo, hi in layout.fragment_pieces]
    outer = OuterOptimizer(
        worker_params[0],
        lr=config.outer_lr,
        momentum=config.outer_momentum,
        device="cpu" if config.outer_on_cpu else None,
        shard=None if layout.shard == (0, numel) else layout.shard,
        spans=spans if config.fragments > 1 else None,
    )
    residuals = len(worker_params) if config.error_feedback else 0
    error_feedback = [ErrorFeedback(outer.numel, outer.device) for _ in range(residuals)]
    return outer, error_feedback
