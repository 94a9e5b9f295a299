"""The named choices of the config: methods, wires, rules, schedules, and the recipes' presets."""

from __future__ import annotations

from enum import Enum
from typing import Any


class ValueEnum(str, Enum):
    """A ``str`` enum that prints as its value, so records, JSON and messages show ``"diloco"``."""

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)


class Method(ValueEnum):
    """How workers synchronize: every step (DDP) or at interval boundaries chosen by a policy."""

    DDP = "ddp"
    DILOCO = "diloco"
    AUTOLOCO = "autoloco"
    QSR = "qsr"
    LINEAR = "linear"


class WireDtype(ValueEnum):
    """Format of the pseudo-gradient on the wire."""

    FP32 = "fp32"
    BF16 = "bf16"
    INT8 = "int8"
    INT4 = "int4"  # uniform grid -7..7 times a scale per block
    # the FP4 E2M1 grid (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives) times a scale per block
    FP4 = "fp4"
    INT2 = "int2"  # uniform grid -1.5, -0.5, 0.5, 1.5 times a scale per block

    @property
    def bits(self) -> int:
        """Bits of one element's code (blockwise wires add an FP32 scale per block)."""
        return {"fp32": 32, "bf16": 16, "int8": 8, "int4": 4, "fp4": 4, "int2": 2}[self.value]

    @property
    def blockwise(self) -> bool:
        """Whether the wire carries codes and a scale per
        block (and may be sparsified by ``topk_fraction``)."""
        return self.bits <= 8


class CodecKernel(ValueEnum):
    """How the 4- and 2-bit wires compute their codes
    (docs/algorithm.md#low-bit-wires); both give the same bytes."""

    EAGER = "eager"  # eager torch ops per cache-sized group: the reference
    # one torch.compile'd kernel per group (a C++ compiler on CPU, Triton on GPU)
    COMPILED = "compiled"


GRID_WIRES = ("int4", "fp4", "int2")


class ReferenceClip(ValueEnum):
    """How the reference EMA clips a residual before the update
    (docs/algorithm.md#references-and-residuals)."""

    CENTRE = "centre"  # clip r - c around the history's robust centre c: follows drift of any speed
    # clip r around 0 (the paper's literal rule): follows drift by <= alpha * k_moderate * sigma
    ZERO = "zero"


class Controller(ValueEnum):
    """The built-in horizon rules of ``method="autoloco"`` (docs/algorithm.md#horizon-rule); more
    register by name (docs/algorithm.md#rule-plugins)."""

    # the paper's state machine: probes longer horizons from h_base, reduces on deviations
    PAPER = "paper"
    # starts at h_max and only shortens, following the coherence C_t
    # (docs/algorithm.md#descent-rule)
    DESCENT = "descent"


class Overlap(ValueEnum):
    """Whether the outer collective blocks the workers or runs behind the next inner steps
    (docs/algorithm.md#overlap)."""

    NONE = "none"  # blocking: every worker waits for the average at each boundary
    # Streaming-DiLoCo merge of the outer result overlap_steps inner steps later
    DELAYED = "delayed"
    # eager update from each worker's own fresh
    # pseudo-gradient; the average lands one interval later
    EAGER = "eager"


class Pacing(ValueEnum):
    """When an interval ends for each worker (docs/algorithm.md#pacing)."""

    LOCKSTEP = "lockstep"  # every worker takes the interval's H steps: the slowest sets the pace
    BUDGET = "budget"  # the interval's N*H steps are split by the speeds measured at the last sync


METHODS = tuple(m.value for m in Method)
WIRE_DTYPES = tuple(w.value for w in WireDtype)
LOSSY_WIRES = tuple(w.value for w in WireDtype if w != WireDtype.FP32)
BLOCKWISE_WIRES = tuple(w.value for w in WireDtype if w.blockwise)
MAX_TOPK_BLOCK = 1 << 16  # top-k offsets in a block are 16-bit (docs/algorithm.md#low-bit-wires)
OVERLAPS = tuple(o.value for o in Overlap)

# Recipe presets: the paper's two settings (docs/algorithm.md#notation, #paper-trajectory), with the
# paper's rule, so that the recipes reproduce the paper (the library's default rule is `descent`).
# Budgets are what the `plan` command previews; training code reads the budget from the trainer.
RECIPES: dict[str, dict[str, Any]] = {
    # q_h 50 and h_max 750 are the paper rule's defaults
    "c4": dict(h_base=500, controller=Controller.PAPER),
    "sft": dict(h_base=100, normalize_pseudo_grad=True, controller=Controller.PAPER),
}
RECIPE_SCHEDULES: dict[str, dict[str, Any]] = {
    "c4": dict(total_steps=50_000, warmup_steps=1_000, schedule="cosine"),
    "sft": dict(total_steps=6_490, warmup_steps=65, schedule="cosine"),
}
