"""Local stand-ins for the recipes' downloads: a tokenizer
trained on the spot, tiny model configs, JSONL data."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    from autoloco_hf.toy.text import corpus_text, train_tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(corpus_text()[:60_000], vocab_size=320).save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="session")
def tiny_llama_config(tmp_path_factory) -> str:
    """A LlamaConfig JSON for a model of a few ten thousand parameters (vocab set by the recipe)."""
    path = tmp_path_factory.mktemp("model") / "tiny_llama.json"
    path.write_text(
        json.dumps(
            dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=2,
                max_position_embeddings=128,
                tie_word_embeddings=True,
            )
        )
    )
    return str(path)


@pytest.fixture(scope="session")
def text_files(tmp_path_factory) -> tuple[str, str]:
    """``train.jsonl`` / ``val.jsonl`` with a ``text`` field,
    cut from pydoc topics (documents of varied length)."""
    from autoloco_hf.toy.text import corpus_documents

    # some shorter than seq_len
    docs = [d[: 40 + (i * 97) % 560] for i, d in enumerate(corpus_documents())]
    root = tmp_path_factory.mktemp("c4")
    for name, part in (("train.jsonl", docs[:-40]), ("val.jsonl", docs[-40:])):
        with open(root / name, "w") as f:
            for doc in part:
                f.write(json.dumps({"text": doc}) + "\n")
    return str(root / "train.jsonl"), str(root / "val.jsonl")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared 2-core runner: intra-op
    threads only add contention (measured 5x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
