"""The 4-bit and 2-bit wires divide ``max|x| / top`` as one
IEEE division (``true_divide``), bytes unchanged on CPU.

CUDA divides by a Python number as a product with its reciprocal, which can be one ulp off; the grid
codecs now divide by a 0-dim tensor like INT8. On the CPU both are the same kernel, so the encoded
bytes must equal the ones recorded before the change (commit 1bcdf92, ``amax / grid.top``).
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from autoloco_hf.wire.codec import WireCodec

# SHA-256 (first 16 hex digits) of [packed codes, scales] of
# sample() in blocks of 64, recorded at 1bcdf92
RECORDED = {
    "int4": ["1543756bdc25b6ab", "857af4e9d7dabea8"],
    "fp4": ["806b2d4a6cf1f29b", "40d45061e307ddd6"],
    "int2": ["d1cdd51a08ea7fcc", "1a5f82970277d4e2"],
}


def sample() -> torch.Tensor:
    """60 decades of magnitudes (many blocks whose quotient
    by the top level rounds), zeros and edge values."""
    g = torch.Generator().manual_seed(52)
    x = torch.randn(200_003, generator=g) * torch.logspace(-30, 30, 200_003)
    x[1000:1064] = 0.0
    x[5000], x[6000], x[7000] = float("inf"), float("nan"), 3.0e38
    x[8000:8064] = 1e-38
    return x


@pytest.mark.parametrize("wire", sorted(RECORDED))
def test_grid_wire_bytes_on_cpu_equal_the_recorded_ones(wire):
    codec = WireCodec(wire, [100_000, 100_003], 64)
    wires = codec.encode(sample(), 0)
    assert [hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16] for w in wires] == RECORDED[wire]
