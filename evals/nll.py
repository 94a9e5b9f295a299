"""Validation NLL: token-averaged negative log-likelihood of a checkpoint.

Two sets, as in the paper: plain documents (C4-style, every token after the
first is a target) and chat conversations where only assistant tokens are
targets. The average is over all target tokens of the set (sum of NLL / count
of targets), not a mean of per-document means.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .data_files import check_files

C4_DEFAULT = ("allenai/c4", "en", "validation")
CHAT_DEFAULT = ("HuggingFaceH4/ultrachat_200k", None, "test_sft")


@dataclass
class NLLResult:
    """Summed NLL and target count, so sets can be merged before averaging."""

    nll_sum: float
    tokens: int
    examples: int

    @property
    def nll(self) -> float:
        return self.nll_sum / self.tokens


def read_records(
    local: Path | None, hub: tuple[str, str | None, str], limit: int, option: str, column: str
) -> list[dict]:
    """First ``limit`` records of a local file (checked: see
    :func:`~autoloco_evals.data_files.check_files`), else of the hub dataset (streamed)."""
    if local is not None:
        return check_files([local], option, [column], "", limit)
    import datasets

    name, config, split = hub
    stream = datasets.load_dataset(name, config, split=split, streaming=True)
    return list(islice(stream, limit))


def document_example(tokenizer, text: str, max_length: int) -> tuple[list[int], list[bool]]:
    """Token ids of one document and its target mask (all tokens but the first)."""
    ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
    return ids, [False] + [True] * (len(ids) - 1)


def chat_example(
    tokenizer, messages: Sequence[dict], max_length: int
) -> tuple[list[int], list[bool]]:
    """Token ids of one rendered conversation and its assistant-only target mask.

    Each assistant span runs from the end of the rendered prefix with a
    generation prompt to the end of the rendered prefix including that reply,
    so it covers the reply and the template's end-of-turn tokens. This works
    for any chat template, with or without ``{% generation %}`` markers.
    """

    def encode(msgs: Sequence[dict], add_generation_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(
            list(msgs), tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    ids = encode(messages, False)
    mask = [False] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = encode(messages[:i], True)
        end = len(encode(messages[: i + 1], False))
        if ids[: len(prefix)] != prefix:
            raise ValueError(
                "chat template does not render conversations prefix by prefix; "
                "cannot mask assistant turns"
            )
        mask[len(prefix) : end] = [True] * (end - len(prefix))
    return ids[:max_length], mask[:max_length]


@torch.no_grad()
def masked_nll(
    model, examples: Iterable[tuple[list[int], list[bool]]], batch_size: int = 8, desc: str = "nll"
) -> NLLResult:
    """Sum of next-token NLL over masked target positions, batched with right padding."""
    examples = [e for e in examples if any(e[1][1:])]
    device = next(model.parameters()).device
    nll_sum, tokens = 0.0, 0
    for start in tqdm(range(0, len(examples), batch_size), desc=desc, unit="batch"):
        batch = examples[start : start + batch_size]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.zeros(len(batch), width, dtype=torch.long)
        attention = torch.zeros(len(batch), width, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for row, (ids, mask) in enumerate(batch):
            n = len(ids)
            input_ids[row, :n] = torch.tensor(ids)
            attention[row, :n] = 1
            target = torch.tensor(ids)
            target[~torch.tensor(mask)] = -100
            labels[row, :n] = target
        logits = model(
            input_ids=input_ids.to(device), attention_mask=attention.to(device)
        ).logits.float()
        shifted = labels[:, 1:].to(device)
        nll_sum += F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)),
            shifted.reshape(-1),
            ignore_index=-100,
            reduction="sum",
        ).item()
        tokens += int((shifted != -100).sum())
    return NLLResult(nll_sum, tokens, len(examples))


def evaluate_nll(
    model,
    tokenizer,
    *,
    c4_path: Path | None = None,
    chat_path: Path | None = None,
    num_documents: int = 4096,
    num_conversations: int = 1000,
    max_length: int = 2048,
    batch_size: int = 8,
) -> dict[str, float]:
    """NLL on documents and on chat assistant tokens; local JSONL overrides the hub.

    A tokenizer without a chat template (a pretrained base model) gets the
    document NLL only, with a warning.
    """
    docs = read_records(c4_path, C4_DEFAULT, num_documents, "--c4-path", "text")
    doc_result = masked_nll(
        model,
        (document_example(tokenizer, d["text"], max_length) for d in docs),
        batch_size,
        "nll c4",
    )
    result = {"nll_c4": doc_result.nll, "nll_c4_tokens": doc_result.tokens}
    if tokenizer.chat_template is None:
        warnings.warn("tokenizer has no chat template: chat NLL not computed", stacklevel=2)
        return result
    chats = read_records(chat_path, CHAT_DEFAULT, num_conversations, "--chat-path", "messages")
    chat_result = masked_nll(
        model,
        (chat_example(tokenizer, c["messages"], max_length) for c in chats),
        batch_size,
        "nll chat",
    )
    return {**result, "nll_chat": chat_result.nll, "nll_chat_tokens": chat_result.tokens}
