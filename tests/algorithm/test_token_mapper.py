"""Token mapper: token-equivalent horizons to executable steps (docs/algorithm.md#token-mapper)."""

from __future__ import annotations

import statistics

import pytest
import torch

from autoloco_hf.algorithm.token_mapper import (
    TokenMapper,
    count_non_padding_tokens,
    round_to_multiple,
)


@pytest.mark.parametrize(
    "value, multiple, expected",
    [
        (500, 50, 500),
        (524.9, 50, 500),
        (525, 50, 550),  # ties toward the larger multiple (docs/algorithm.md#phases)
        (575, 50, 600),
        (25, 10, 30),
        (14.999, 10, 10),
        (15, 10, 20),
        (3, 10, 10),  # at least q_H
        (0, 10, 10),
        (-40, 10, 10),
    ],
)
def test_round_to_multiple(value: float, multiple: int, expected: int) -> None:
    """docs/algorithm.md#token-mapper: nearest multiple of
    q_H, ties toward the larger, at least q_H."""
    assert round_to_multiple(value, multiple) == expected


def calibrated(
    counts=(1000, 1000, 1000), h_base: int = 10, q_h: int = 1, beta: float = 0.9
) -> TokenMapper:
    m = TokenMapper(h_base=h_base, q_h=q_h, beta=beta)
    for c in counts:
        m.observe(global_tokens=c, h_step=h_base, calibrates=True)
    return m


def test_identity_before_calibration() -> None:
    """docs/algorithm.md#token-mapper: before M_base and n_hat exist, H_step = H_tok."""
    m = TokenMapper(h_base=100, q_h=10)
    assert [m.map(h) for h in (100, 110, 150)] == [100, 110, 150]
    for tokens in (800, 500):  # the density halves, but only two calibration intervals so far
        m.observe(global_tokens=tokens * 100, h_step=100, calibrates=True)
        assert m.base_tokens is None
        assert [m.map(h) for h in (100, 110, 150)] == [100, 110, 150]


def test_base_tokens_is_median_of_first_three_recipe_intervals() -> None:
    """docs/algorithm.md#token-mapper: M_base = median(M_1, M_2,
    M_3) of recipe-horizon intervals; later ones do not count."""
    m = TokenMapper(h_base=10, q_h=1)
    m.observe(global_tokens=9999, h_step=12, calibrates=False)  # not at the recipe horizon
    for c in (3000, 1000, 1200):
        m.observe(global_tokens=c, h_step=10, calibrates=True)
    assert m.base_tokens == 1200.0  # the median, not the mean (1733)
    m.observe(global_tokens=50_000, h_step=10, calibrates=True)
    assert m.base_tokens == 1200.0
    assert m.base_counts == [3000, 1000, 1200]


def test_tokens_per_step_ema() -> None:
    """docs/algorithm.md#token-mapper: n_hat initialised from
    the first interval, then n <- 0.9 n + 0.1 M_t / H_t."""
    m = TokenMapper(h_base=10, q_h=1)
    m.observe(global_tokens=1000, h_step=10, calibrates=True)
    assert m.tokens_per_step == pytest.approx(100.0)
    m.observe(global_tokens=3000, h_step=20, calibrates=False)
    assert m.tokens_per_step == pytest.approx(0.9 * 100 + 0.1 * 150)
    m.observe(global_tokens=500, h_step=10, calibrates=True)
    assert m.tokens_per_step == pytest.approx(0.9 * (0.9 * 100 + 0.1 * 150) + 0.1 * 50)


def test_mapping_formula() -> None:
    """docs/algorithm.md#token-mapper: H_step = round_q(H_tok
    * (M_base / H_base) / n_hat), at least q_H."""
    m = TokenMapper(h_base=100, q_h=10)
    counts = [51_200, 48_000, 50_000]
    for c in counts:
        m.observe(global_tokens=c, h_step=100, calibrates=True)
    n_hat = 512.0
    for c in counts[1:]:
        n_hat = 0.9 * n_hat + 0.1 * c / 100
    m_base = statistics.median(counts)
    for h_tok in (100, 110, 120, 150):
        expected = max(10, 10 * round(h_tok * (m_base / 100) / n_hat / 10 + 1e-12))
        assert m.map(h_tok) == expected
    # far denser data: the token budget of H_tok = 10 fits in less than q_H steps
    m.observe(global_tokens=10**9, h_step=100, calibrates=False)
    assert m.map(10) == 10


@pytest.mark.parametrize("h_tok", [100, 110, 120, 130, 140, 150])
def test_identity_at_constant_density(h_tok: int) -> None:
    m = calibrated(counts=(4096 * 100,) * 3, h_base=100, q_h=10)
    for _ in range(20):
        m.observe(global_tokens=4096 * 137, h_step=137, calibrates=False)
    assert m.map(h_tok) == h_tok


def test_lower_density_means_more_steps() -> None:
    """docs/algorithm.md#token-mapper: with fewer real tokens
    per step the same token budget takes more steps."""
    m = calibrated(counts=(1000 * 100,) * 3, h_base=100, q_h=10)
    assert m.map(100) == 100
    previous = 100
    for _ in range(10):
        m.observe(global_tokens=500 * 100, h_step=100, calibrates=True)
        h = m.map(100)
        assert h >= previous
        previous = h
    assert previous > 100
    n_hat = m.tokens_per_step
    assert previous == round_to_multiple(100 * 1000 / n_hat, 10)
    # denser data -> fewer steps
    for _ in range(40):
        m.observe(global_tokens=2000 * 100, h_step=100, calibrates=True)
    assert m.map(100) < 100


def test_disabled_mapper_is_identity() -> None:
    m = TokenMapper(h_base=100, q_h=10, enabled=False)
    for c in (1000, 1000, 1000, 10, 10):
        m.observe(global_tokens=c, h_step=100, calibrates=True)
    assert m.map(130) == 130


def test_state_dict_round_trip() -> None:
    m = calibrated(counts=(1000, 1100, 900))
    m.observe(global_tokens=700, h_step=10, calibrates=False)
    other = TokenMapper(h_base=10, q_h=1)
    other.load_state_dict(m.state_dict())
    assert other.base_tokens == m.base_tokens and other.tokens_per_step == m.tokens_per_step
    assert [other.map(h) for h in range(5, 20)] == [m.map(h) for h in range(5, 20)]


# ------------------------------------------------------------ counting
def test_count_uses_attention_mask() -> None:
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
    }
    assert count_non_padding_tokens(batch) == 5


def test_count_without_attention_mask_counts_every_position() -> None:
    assert count_non_padding_tokens({"input_ids": torch.zeros(3, 7, dtype=torch.long)}) == 21


def test_count_ignores_label_masking() -> None:
    """docs/algorithm.md#token-mapper: prompt tokens masked in the
    labels (-100) still count: the paper counts input tokens."""
    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 4, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 0]]),
        "labels": torch.tensor([[-100, -100, 3, 4, -100]]),
    }
    assert count_non_padding_tokens(batch) == 4
    del batch["attention_mask"]
    assert count_non_padding_tokens(batch) == 5


def test_count_batch_encoding() -> None:
    from transformers import BatchEncoding

    enc = BatchEncoding(
        {
            "input_ids": torch.ones(2, 3, dtype=torch.long),
            "attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
        }
    )
    assert count_non_padding_tokens(enc) == 3


def test_count_non_padding_tokens_accepts_plain_lists():
    from autoloco_hf.algorithm.token_mapper import count_non_padding_tokens

    assert (
        count_non_padding_tokens(
            {"input_ids": [[1, 2, 3], [4, 5, 0]], "attention_mask": [[1, 1, 1], [1, 1, 0]]}
        )
        == 5
    )
    assert count_non_padding_tokens({"input_ids": [[1, 2, 3], [4, 5]]}) == 5


def test_count_forward_call_stays_on_device_and_falls_back() -> None:
    """The Trainer hooks call it with a forward's (kwargs,
    args): a mask sum stays a tensor (no host sync)."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    counted = count_non_padding_tokens({"attention_mask": mask})
    assert isinstance(counted, torch.Tensor) and int(counted) == 3
    # positional input_ids
    assert count_non_padding_tokens({}, (torch.zeros(2, 5, dtype=torch.long),)) == 10
    assert count_non_padding_tokens({"inputs_embeds": torch.zeros(2, 4, 8)}) == 8
    four_d = torch.ones(2, 1, 3, 3)  # a 4-D attention mask is not a padding mask: count input_ids
    assert count_non_padding_tokens({"attention_mask": four_d, "input_ids": torch.zeros(2, 3)}) == 6
    assert count_non_padding_tokens({"labels": torch.zeros(2, 3)}) is None


def test_another_number_of_workers_keeps_the_per_worker_mapping() -> None:
    """docs/algorithm.md#boundary-snapshots: global counts scale with N'/N; the same per-worker
    density maps to the same steps."""
    # 2 workers, 100 tokens per step at the recipe horizon
    m = calibrated(counts=(1000, 1000, 1000))
    for _ in range(60):  # sparser batches: 60 tokens per step
        m.observe(global_tokens=600, h_step=10, calibrates=False)
    before = m.map(10)
    assert before == 17
    m.rescale_workers(2, 3)
    assert m.base_counts == [1500, 1500, 1500] and m.tokens_per_step == pytest.approx(90, rel=1e-2)
    assert m.map(10) == before
    for _ in range(30):  # 3 workers at the same per-worker density: the mapping stays
        m.observe(global_tokens=900, h_step=10, calibrates=False)
        assert m.map(10) == before
