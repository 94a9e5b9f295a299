"""Tiny local models for the evaluation tests: nothing comes from the hub.

`ScriptedLM` is a real transformers causal LM (HF `generate`, lm-eval's HFLM)
whose greedy output is fixed in advance: each scripted reply is one added
token of the tokenizer, chosen from the prompt by a key the prompt contains,
then end-of-turn. The benchmark pipelines parse these real generations.
"""

from __future__ import annotations

import json

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationMixin,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)
from transformers.modeling_outputs import CausalLMOutputWithPast

from autoloco_evals.runner import FIXTURES_DIR
from autoloco_hf.toy.llama import tiny_llama as build

# ChatML with generation markers, so tests can get the assistant mask from transformers itself.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>\n"
    "{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)


def fixture_rows(name: str) -> list[dict]:
    return [
        json.loads(line) for line in (FIXTURES_DIR / name).read_text().splitlines() if line.strip()
    ]


def build_tokenizer(replies: list[str] = (), chat: bool = True) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on the fixtures in well under a
    second; replies become single tokens."""
    corpus = [p.read_text() for p in sorted(FIXTURES_DIR.rglob("*.jsonl"))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=special,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|pad|>"
    )
    fast.add_tokens(sorted(set(replies)))
    fast.chat_template = CHAT_TEMPLATE if chat else None
    return fast


class ScriptedConfig(PretrainedConfig):
    model_type = "autoloco_scripted"

    def __init__(self, vocab_size: int = 1000, max_position_embeddings: int = 32768, **kwargs):
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.num_hidden_layers = 1  # generate() sizes its (unused) KV cache from it
        super().__init__(**kwargs)


class ScriptedLM(PreTrainedModel, GenerationMixin):
    """Greedy output = the reply whose key occurs last in the prompt, then EOS."""

    config_class = ScriptedConfig

    def __init__(
        self, config: ScriptedConfig, tokenizer=None, script: dict[str, str] | None = None
    ):
        super().__init__(config)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the model a device and dtype
        self.tokenizer = tokenizer
        self.keys = {
            key: tokenizer.convert_tokens_to_ids(reply) for key, reply in (script or {}).items()
        }
        self.reply_ids = set(self.keys.values())
        self.post_init()

    def forward(self, input_ids, **kwargs):
        logits = torch.zeros(*input_ids.shape, self.config.vocab_size)
        for row, ids in enumerate(input_ids.tolist()):
            # Whether or not generate() passes the whole sequence, a reply token ends the turn.
            if ids[-1] in self.reply_ids:
                nxt = self.config.eos_token_id
            else:
                text = self.tokenizer.decode(ids)
                where = {key: text.rfind(key) for key in self.keys}
                key = max(where, key=where.get, default=None)
                nxt = (
                    self.keys[key]
                    if key is not None and where[key] >= 0
                    else self.config.eos_token_id
                )
            logits[row, -1, nxt] = 100.0
        return CausalLMOutputWithPast(logits=logits)


def scripted_model(
    script: dict[str, str], chat: bool = True
) -> tuple[ScriptedLM, PreTrainedTokenizerFast]:
    """A model that answers a prompt containing ``key`` with ``script[key]``."""
    tokenizer = build_tokenizer(list(script.values()), chat=chat)
    config = ScriptedConfig(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return ScriptedLM(config, tokenizer, script).eval(), tokenizer


def tiny_llama() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A randomly initialised 2-layer Llama with the fixture tokenizer (chat template included)."""
    tokenizer = build_tokenizer()
    model = build(
        len(tokenizer),
        32,
        2,
        4,
        64,
        max_position_embeddings=512,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return model.eval(), tokenizer
