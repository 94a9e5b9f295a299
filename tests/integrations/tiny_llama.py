"""The tiny Llama and its padded token data that the torchrun worker scripts train (no side effects on import)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, SEQ, PAD = 96, 16, 0


def tiny_llama(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(cfg)


class PaddedTokens(torch.utils.data.Dataset):
    """Right-padded random sequences with a learnable pattern; lengths vary so padding is real."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(6, SEQ + 1, (1,), generator=g))
            start = int(torch.randint(3, VOCAB - SEQ, (1,), generator=g))
            ids = torch.full((SEQ,), PAD, dtype=torch.long)
            ids[:length] = torch.arange(start, start + length) % VOCAB
            mask = torch.zeros(SEQ, dtype=torch.long)
            mask[:length] = 1
            labels = ids.clone()
            labels[length:] = -100
            self.items.append({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]
