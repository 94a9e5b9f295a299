"""Right-padded token data with a learnable pattern, and the
tiny Llama the Trainer workers train on it.

The sequences' lengths vary, so the padding is real: the token counts the engine weighs by differ
from worker to worker. Build the model with ``tiny_llama(**LLAMA, seed=seed)``.
"""

from __future__ import annotations

import torch

VOCAB, SEQ, PAD = 96, 16, 0
# the tiny Llama of this data, as the arguments of autoloco_hf.toy.llama.tiny_llama
LLAMA = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    pad_token_id=PAD,
)


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
