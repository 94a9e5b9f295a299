"""Offline text, a locally trained tokenizer, and the batches and losses of a causal LM on it.

Everything here works on a machine with nothing downloaded: the text is
Python's own ``pydoc_data.topics`` (English prose about the language, on
every Python installation), and the tokenizer is a byte-level BPE trained on
it in well under a second. The demo, the benchmarks and the recipes' smoke
tests share these builders, so a smoke test trains on the text the README shows.

Example::

    >>> tok = train_tokenizer(corpus_text()[:20_000], vocab_size=300)
    >>> tok.decode(tok("hello world")["input_ids"])
    'hello world'
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>", "<|user|>", "<|assistant|>", "<|system|>")

# A chat template whose assistant turns are wrapped in generation markers, which
# TRL needs for assistant-only loss (`assistant_only_loss=True`).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>' }}{% generation %}"
    "{{ message['content'] }}{{ eos_token }}{% endgeneration %}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>' }}{{ message['content'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def corpus_text() -> str:
    """The English prose of ``pydoc_data.topics`` (~465k characters), in a fixed order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key].strip() for key in sorted(topics))


def corpus_documents() -> list[str]:
    """``pydoc_data.topics`` as separate documents (one per help topic), in a fixed order."""
    from pydoc_data.topics import topics

    return [topics[key].strip() for key in sorted(topics) if topics[key].strip()]


def train_tokenizer(text: str, vocab_size: int = 1024) -> Any:
    """A byte-level BPE trained on ``text``, wrapped as
    ``PreTrainedTokenizerFast`` with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    chunk = 10_000
    tokenizer.train_from_iterator(
        (text[i : i + chunk] for i in range(0, len(text), chunk)), trainer=trainer
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


@dataclass
class TokenSplits:
    """Token ids of a corpus, split into training and held-out validation text."""

    train: torch.Tensor
    val: torch.Tensor


def split_tokens(tokenizer: Any, documents: list[str], val_fraction: float = 0.05) -> TokenSplits:
    """Tokenize ``documents``; hold out whole documents,
    spread evenly, for ``val_fraction`` of the tokens.

    Holding out whole documents (not the tail of one stream) keeps validation
    text unseen by training while covering the corpus evenly.
    """
    train_ids: list[int] = []
    val_ids: list[int] = []
    eos = tokenizer.eos_token_id
    for doc in documents:
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"] + [eos]
        seen = len(train_ids) + len(val_ids) + len(ids)
        (val_ids if len(val_ids) < val_fraction * seen else train_ids).extend(ids)
    return TokenSplits(
        torch.tensor(train_ids, dtype=torch.long), torch.tensor(val_ids, dtype=torch.long)
    )


class WindowSampler:
    """Random fixed-length windows of a token stream, one independent seeded stream per worker.

    Batches depend only on ``(seed, worker, step)``, so every method of a
    comparison trains on exactly the same data in the same order.
    """

    def __init__(
        self, tokens: torch.Tensor, seq_len: int, batch_size: int, num_workers: int, seed: int = 0
    ) -> None:
        if tokens.numel() <= seq_len + 1:
            raise ValueError(f"{tokens.numel()} tokens are too few for windows of {seq_len}")
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.generators = [
            torch.Generator().manual_seed(seed * 1_000_003 + w) for w in range(num_workers)
        ]

    def next_batches(self) -> list[dict[str, torch.Tensor]]:
        """One batch per worker (``input_ids`` and ``labels``; the model shifts labels itself)."""
        high = self.tokens.numel() - self.seq_len
        batches = []
        for generator in self.generators:
            starts = torch.randint(0, high, (self.batch_size,), generator=generator)
            ids = torch.stack([self.tokens[s : s + self.seq_len] for s in starts.tolist()])
            batches.append({"input_ids": ids, "labels": ids})
        return batches


class DisjointWindowSampler:
    """Non-overlapping windows of a token stream, each used at most once: no token is ever repeated.

    The stream is cut into ``seq_len`` windows, shuffled once by ``seed``;
    worker ``w`` at step ``s`` takes the ``batch_size`` windows at position
    ``(s * num_workers + w) * batch_size``. Batches depend only on
    ``(seed, num_workers, worker, step)``, so methods compared at one worker
    count see the same data in the same order, as in pretraining on a corpus
    larger than the budget.
    """

    def __init__(
        self, tokens: torch.Tensor, seq_len: int, batch_size: int, num_workers: int, seed: int = 0
    ) -> None:
        self.windows = tokens[: (tokens.numel() // seq_len) * seq_len].view(-1, seq_len)
        self.order = torch.randperm(
            self.windows.shape[0], generator=torch.Generator().manual_seed(seed)
        )
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.position = 0

    def capacity_steps(self) -> int:
        """Steps this stream can feed before a window would repeat."""
        return self.windows.shape[0] // (self.batch_size * self.num_workers)

    def next_batches(self) -> list[dict[str, torch.Tensor]]:
        """One batch per worker (``input_ids`` and
        ``labels``); raises once the stream is used up."""
        need = self.batch_size * self.num_workers
        if self.position + need > self.order.numel():
            raise RuntimeError(
                f"corpus exhausted after {self.position // need} steps ({self.windows.shape[0]} "
                "windows): use fewer --steps/--workers or a larger corpus"
            )
        picked = self.windows[self.order[self.position : self.position + need]]
        self.position += need
        return [
            {"input_ids": ids, "labels": ids}
            for ids in picked.view(self.num_workers, self.batch_size, -1).unbind(0)
        ]


def eval_windows(
    tokens: torch.Tensor, seq_len: int, batch_size: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Consecutive non-overlapping windows covering
    ``tokens`` (deterministic validation batches)."""
    n = (tokens.numel() // seq_len) * seq_len
    windows = tokens[:n].view(-1, seq_len)
    for i in range(0, windows.shape[0], batch_size):
        chunk = windows[i : i + batch_size]
        yield {"input_ids": chunk, "labels": chunk}


@torch.no_grad()
def loss_sums(
    model: torch.nn.Module, batches: Iterator[dict[str, torch.Tensor]]
) -> tuple[float, int]:
    """Summed causal-LM loss and number of predicted tokens
    (labels != -100) over ``batches``, in eval mode.

    Sums, not a mean, so that shards evaluated on different ranks combine exactly.
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        predicted = int((batch["labels"][:, 1:] != -100).sum())
        total += float(model(**batch).loss) * predicted
        count += predicted
    model.train(was_training)
    return total, count


def mean_loss(model: torch.nn.Module, batches: Iterator[dict[str, torch.Tensor]]) -> float:
    """Token-weighted mean causal-LM loss of ``model`` over ``batches``."""
    total, count = loss_sums(model, batches)
    return total / max(count, 1)
