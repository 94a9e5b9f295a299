"""A tiny language model and deterministic per-worker data, for the engine's tests and benchmarks.

Plain torch (no transformers import) so spawned processes start fast. A batch depends only on
``(worker, step)``, so every run and every process sees the same data.
"""

from __future__ import annotations

import torch

VOCAB, SEQ, BATCH = 32, 12, 4


class ToyLM(torch.nn.Module):
    """Embedding -> MLP -> vocabulary logits;
    ``forward(**batch).loss`` like a transformers model."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, hidden)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.Tanh())
        self.head = torch.nn.Linear(hidden, VOCAB)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.mlp(self.embed(input_ids)))
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        return type("Output", (), {"loss": loss, "logits": logits})()


def make_model(seed: int = 0) -> ToyLM:
    torch.manual_seed(seed)
    return ToyLM()


def batch_for(worker: int, step: int, padded: bool = False) -> dict:
    """The batch of ``worker`` at ``step``: same on every run and in every process."""
    g = torch.Generator().manual_seed(1000 * worker + step)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    input_ids[:, 1::2] = (input_ids[:, 0::2] + 1) % VOCAB  # a learnable pattern
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    if padded:  # token density changes over time (docs/algorithm.md#token-mapper)
        keep = 4 + (step // 7 + worker) % (SEQ - 4)
        mask[:, keep:] = 0
    labels = input_ids.masked_fill(mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-2, weight_decay=0.0)


def cosine(total_steps: int, warmup_steps: int):
    """``transformers``' cosine-with-warm-up schedule, written as a LambdaLR factory."""
    from autoloco_hf.algorithm.schedule import warmup_cosine

    schedule = warmup_cosine(1.0, warmup_steps, total_steps)
    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.lr_at)
