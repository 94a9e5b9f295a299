"""The tiny Llama: a ``LlamaForCausalLM`` built from a config
(no download), initialized from a seed.

Every tiny Llama of the demo, the benchmarks and the tests comes from :func:`tiny_llama`; the
callers differ only in the sizes and token ids they pass.
"""

from __future__ import annotations

from typing import Any

import torch


def tiny_llama(
    vocab_size: int,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    seed: int = 0,
    *,
    num_key_value_heads: int | None = None,
    tie_word_embeddings: bool = True,
    pad_token_id: int | None = None,
    bos_token_id: int | None = 1,
    eos_token_id: int | None = 2,
) -> Any:
    """A ``LlamaForCausalLM`` built from a config (no download), initialized from ``seed``.

    ``intermediate_size`` defaults to ``4 * hidden_size`` and ``num_key_value_heads`` to
    ``num_heads``; the token ids default to ``LlamaConfig``'s.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_key_value_heads or num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)
