"""Streaming fragments: the flat model in ``F`` contiguous pieces, each synchronized at its own step
(docs/algorithm.md#fragments).

Pure layout and timing rules; :class:`~autoloco_hf.sync.schedules.streaming.FragmentSchedule`
runs the engine's stages on them.

Example::

    >>> [f.span for f in split_fragments([512, 256, 16, 512, 32], 2)]
    [(0, 768), (768, 1328)]
    >>> [fragment_event_offset(f, 2, 10, last_round=False) for f in range(2)]
    [5, 10]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Fragment", "fragment_event_offset", "on_local_tensors", "split_fragments"]


@dataclass(frozen=True)
class Fragment:
    """Parameters ``first..last-1`` of the model, i.e.
    elements ``span = (start, end)`` of the flat buffer."""

    index: int
    first: int
    last: int
    span: tuple[int, int]

    @property
    def numel(self) -> int:
        return self.span[1] - self.span[0]


def split_fragments(sizes: Sequence[int], fragments: int) -> tuple[Fragment, ...]:
    """``fragments`` contiguous, non-empty pieces of the
    parameters of ``sizes`` elements, balanced by bytes.

    The largest fragment (the largest sync event) is as small as whole tensors
    allow; among such layouts, cut ``k`` lies at the boundary nearest to ``k / F``
    of the elements (the lower one on a tie). Every element costs the same on the
    wire (one flat FP32, BF16 or INT8 buffer), so elements are bytes.
    """
    n = len(sizes)
    if fragments > n:
        raise ValueError(
            f"fragments={fragments} but the model has {n} parameter tensors: use fragments <= {n} "
            "(a fragment holds whole tensors)"
        )
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    total = prefix[-1]
    cap = _smallest_largest_fragment(prefix, fragments)
    need = _fragments_needed(prefix, cap)
    cuts = [0]
    for k in range(1, fragments):
        target, left = k * total / fragments, fragments - k
        candidates = [
            j
            for j in range(cuts[-1] + 1, n - left + 1)
            if prefix[j] - prefix[cuts[-1]] <= cap and need[j] <= left
        ]
        cuts.append(min(candidates, key=lambda j: (abs(prefix[j] - target), j)))
    cuts.append(n)
    return tuple(
        Fragment(f, first, last, (prefix[first], prefix[last]))
        for f, (first, last) in enumerate(zip(cuts, cuts[1:]))
    )


def on_local_tensors(
    fragments: Sequence[Fragment], local_sizes: Sequence[int]
) -> tuple[Fragment, ...]:
    """The same tensors' fragments over this rank's local
    shards of them (an FSDP2 worker rank's flat buffer).

    The cuts are chosen on the whole tensors (:func:`split_fragments` of
    the worker's sizes), so every rank of a worker syncs the same
    tensors at the same step; a rank's piece of a fragment may be empty.
    """
    prefix = [0]
    for size in local_sizes:
        prefix.append(prefix[-1] + size)
    return tuple(
        Fragment(f.index, f.first, f.last, (prefix[f.first], prefix[f.last])) for f in fragments
    )


def _fragments_needed(prefix: Sequence[int], cap: int) -> list[int]:
    """``need[j]``: the fewest fragments of at most ``cap``
    elements that hold tensors ``j..n-1`` (greedy is optimal)."""
    n = len(prefix) - 1
    need = [0] * (n + 1)
    end = n
    for j in range(n - 1, -1, -1):  # end: the furthest boundary one fragment from j reaches
        while prefix[end] - prefix[j] > cap:
            end -= 1
        need[j] = 1 + need[end]
    return need


def _smallest_largest_fragment(prefix: Sequence[int], fragments: int) -> int:
    """The smallest cap on a fragment's elements with which
    ``fragments`` fragments hold every tensor."""
    low = max(b - a for a, b in zip(prefix, prefix[1:]))
    high = prefix[-1]
    while low < high:
        mid = (low + high) // 2
        if _fragments_needed(prefix, mid)[0] <= fragments:
            high = mid
        else:
            low = mid + 1
    return low


def fragment_event_offset(fragment: int, fragments: int, h_step: int, last_round: bool) -> int:
    """Steps after an interval's start at which ``fragment``
    is synchronized: ``ceil((f + 1) H / F)``.

    The last fragment syncs at the boundary (``H``); in the budget's last interval
    every fragment does, so that the run ends on one model.
    """
    if last_round:
        return h_step
    return -(-(fragment + 1) * h_step // fragments)
