"""NLL evaluator against a hand computation with plain torch on a tiny Llama."""

import pytest
import torch
from evals_scripted import build_tokenizer, fixture_rows, tiny_llama

from autoloco_evals.nll import evaluate_nll
from autoloco_evals.runner import FIXTURES_DIR


@pytest.fixture(scope="module", name="tiny_llama")
def tiny_llama_fixture():
    return tiny_llama()


def hand_nll(model, sequences):
    """sum(-log p(target)) / count(targets), one unpadded sequence at a time."""
    total, count = 0.0, 0
    for ids, mask in sequences:
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
        for t in range(1, len(ids)):
            if mask[t]:
                total -= logp[t - 1, ids[t]].item()
                count += 1
    return total / count, count


def test_nll_matches_hand_computation(tiny_llama):
    model, tokenizer = tiny_llama
    docs = [tokenizer(r["text"])["input_ids"] for r in fixture_rows("c4.jsonl")]
    expected_c4, c4_tokens = hand_nll(model, [(ids, [True] * len(ids)) for ids in docs])
    chats = []
    for row in fixture_rows("chat.jsonl"):
        # The assistant mask from transformers' own {% generation %} support: an independent path.
        enc = tokenizer.apply_chat_template(
            row["messages"], return_dict=True, return_assistant_tokens_mask=True
        )
        chats.append((enc["input_ids"], enc["assistant_masks"]))
    expected_chat, chat_tokens = hand_nll(model, chats)
    assert 0 < chat_tokens < sum(len(ids) for ids, _ in chats)  # the mask really drops user turns

    # Batch size 2 over sequences of different lengths: padding must not leak into the sums.
    got = evaluate_nll(
        model,
        tokenizer,
        c4_path=FIXTURES_DIR / "c4.jsonl",
        chat_path=FIXTURES_DIR / "chat.jsonl",
        batch_size=2,
    )
    assert got["nll_c4_tokens"] == c4_tokens
    assert got["nll_chat_tokens"] == chat_tokens
    assert got["nll_c4"] == pytest.approx(expected_c4, rel=1e-5)
    assert got["nll_chat"] == pytest.approx(expected_chat, rel=1e-5)


def test_nll_limits_examples(tiny_llama):
    model, tokenizer = tiny_llama
    got = evaluate_nll(
        model,
        tokenizer,
        c4_path=FIXTURES_DIR / "c4.jsonl",
        chat_path=FIXTURES_DIR / "chat.jsonl",
        num_documents=1,
        num_conversations=1,
    )
    first_doc = tokenizer(fixture_rows("c4.jsonl")[0]["text"])["input_ids"]
    assert got["nll_c4_tokens"] == len(first_doc) - 1


def test_base_model_without_chat_template_gets_document_nll_only(tiny_llama):
    model, _ = tiny_llama
    base_tokenizer = build_tokenizer(chat=False)
    with pytest.warns(UserWarning, match="no chat template"):
        got = evaluate_nll(model, base_tokenizer, c4_path=FIXTURES_DIR / "c4.jsonl", chat_path=None)
    assert set(got) == {"nll_c4", "nll_c4_tokens"}
