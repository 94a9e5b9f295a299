"""Token-equivalent horizons to executable steps (docs/algorithm.md#token-mapper).

The controller reasons in token-equivalent horizons ``H_tok`` (steps at the
base token density). With padded batches a step consumes a varying number of
real tokens, so the mapper converts ``H_tok`` into the number of steps that
consumes the same token budget at the observed density.

Example::

    >>> m = TokenMapper(h_base=10, q_h=2, beta=0.5)
    >>> for _ in range(3):
    ...     m.observe(global_tokens=1000, h_step=10, calibrates=True)
    >>> m.map(10)                      # constant density: identity
    10
    >>> m.observe(global_tokens=500, h_step=10, calibrates=False)
    >>> m.map(10)                      # fewer tokens per step -> more steps
    14
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def round_to_multiple(value: float, multiple: int) -> int:
    """Nearest multiple of ``multiple``, ties toward the larger one, at least ``multiple``
    (docs/algorithm.md#token-mapper, #phases)."""
    return max(multiple, multiple * math.floor(value / multiple + 0.5))


def _is_tensor(value: Any) -> bool:
    # duck-typed: this module never imports torch
    return hasattr(value, "numel") and hasattr(value, "dim")


def count_non_padding_tokens(batch: Any, args: tuple = ()) -> Any:
    """Non-padding input tokens of a batch or of one forward call's ``(kwargs, args)``
    (docs/algorithm.md#token-mapper).

    A 2-D ``attention_mask`` is summed; without one every ``input_ids``
    position counts (also a tensor passed positionally), else every position of
    ``inputs_embeds``; ``None`` when the call has none of them. Labels that mask
    prompt tokens do not matter: the paper counts input tokens. A tensor mask
    gives a 0-d tensor on its device (``int()`` it when a number is needed):
    converting here would force a host-device synchronization on every forward
    of the Trainer's hooks. Plain nested lists are counted too.
    """
    get = batch.get if hasattr(batch, "get") else (lambda key: None)
    mask = get("attention_mask")
    if _is_tensor(mask):
        if mask.dim() == 2:
            return mask.sum()
    elif mask is not None:
        return sum(sum(row) for row in mask)
    ids = get("input_ids")
    if ids is None and args and _is_tensor(args[0]):
        ids = args[0]
    if _is_tensor(ids):
        return ids.numel()
    if ids is not None:
        return sum(len(row) for row in ids)
    embeds = get("inputs_embeds")
    if _is_tensor(embeds):
        return embeds.shape[:-1].numel()
    return None


class TokenMapper:
    """docs/algorithm.md#token-mapper mapper:
    ``H_step = round_q(H_tok * (M_base / H_base) / n_hat)``.

    Args:
        h_base: recipe horizon in steps.
        q_h: granularity of executable horizons.
        calibration_intervals: recipe-horizon intervals whose median global
            token count is ``M_base`` (3).
        beta: EMA factor of the tokens-per-step estimate ``n_hat`` (0.9).
        enabled: ``False`` makes the mapper the identity (DiLoCo special case).
    """

    def __init__(
        self,
        h_base: int,
        q_h: int,
        calibration_intervals: int = 3,
        beta: float = 0.9,
        enabled: bool = True,
    ) -> None:
        self.h_base = h_base
        self.q_h = q_h
        self.calibration_intervals = calibration_intervals
        self.beta = beta
        self.enabled = enabled
        self.base_counts: list[int] = []
        self.tokens_per_step: float | None = None  # n_hat

    @property
    def base_tokens(self) -> float | None:
        """``M_base``, once the calibration intervals are complete."""
        if len(self.base_counts) < self.calibration_intervals:
            return None
        return float(statistics.median(self.base_counts))

    @property
    def ready(self) -> bool:
        return self.enabled and self.base_tokens is not None and bool(self.tokens_per_step)

    def observe(self, global_tokens: int, h_step: int, calibrates: bool) -> None:
        """Record a completed interval: its exact global non-padding token count and length.

        ``calibrates``: the interval may count toward ``M_base`` (the paper: a full interval at the
        recipe horizon; the descent rule, which starts at ``h_max``: any full interval), scaled to
        ``h_base`` steps. An interval without a single token (all padding) says nothing about the
        token density: it is not recorded, so it can neither make ``M_base`` zero (every horizon
        would map to ``q_h``) nor pull ``n_hat``.
        """
        if h_step <= 0 or global_tokens <= 0:
            return
        if calibrates and len(self.base_counts) < self.calibration_intervals:
            # exact at h_step == h_base
            self.base_counts.append(round(int(global_tokens) * self.h_base / h_step))
        density = global_tokens / h_step
        if self.tokens_per_step is None:
            self.tokens_per_step = density
        else:
            self.tokens_per_step = self.beta * self.tokens_per_step + (1.0 - self.beta) * density

    def map(self, h_tok: int) -> int:
        """Executable steps for a token-equivalent horizon; ``h_tok`` itself until calibrated."""
        if not self.ready:
            return h_tok
        assert self.base_tokens is not None and self.tokens_per_step is not None
        return round_to_multiple(
            h_tok * (self.base_tokens / self.h_base) / self.tokens_per_step, self.q_h
        )

    def rescale_workers(self, old_workers: int, new_workers: int) -> None:
        """Another number of workers from here on: the global token counts scale with it.

        ``M_base`` and ``n_hat`` are global (all workers') token counts; both are
        scaled by ``new / old``, so that the same per-worker token density maps a
        horizon to the same steps, and the EMA then follows the new rate as
        intervals are observed (docs/algorithm.md#boundary-snapshots).
        """
        factor = new_workers / old_workers
        self.base_counts = [int(round(c * factor)) for c in self.base_counts]
        if self.tokens_per_step is not None:
            self.tokens_per_step *= factor

    def state_dict(self) -> dict[str, Any]:
        return {"base_counts": list(self.base_counts), "tokens_per_step": self.tokens_per_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base_counts = [int(c) for c in state["base_counts"]]
        self.tokens_per_step = state["tokens_per_step"]
