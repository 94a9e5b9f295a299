"""One rank of TRL SFTTrainer + AutoLoCoCallback on a tiny chat dataset built here
(assistant_only_loss=True)."""

from __future__ import annotations

import json
import os
import sys

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

# installs the collective counter
from trainer_worker import COLLECTIVES, Probe, exit_after_a_clean_run, fingerprint
from transformers import PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer  # noqa: E402

from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig  # noqa: E402
from autoloco_hf.toy.llama import tiny_llama

CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<s>assistant: {% generation %}{{ "
    "m['content'] }}</s>{% endgeneration %}\n"
    "{% else %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
WORDS = "the a cat dog sat ran on under mat log red blue big small quickly slowly and then".split()


def chats(n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):

        def sentence(lo, hi):
            k = int(torch.randint(lo, hi, (1,), generator=g))
            return " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (k,), generator=g))

        out.append(
            {
                "messages": [
                    {"role": "user", "content": sentence(2, 10)},
                    {"role": "assistant", "content": sentence(2, 14)},
                ]
            }
        )
    return out


def chat_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=["<pad>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main(spec_path: str) -> None:
    spec = json.load(open(spec_path))
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    data = chats(96, seed=5)
    tokenizer = chat_tokenizer(
        [m["content"] for c in data for m in c["messages"]] + ["user: assistant:"]
    )
    model = tiny_llama(
        len(tokenizer),
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        seed=0,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    callback = AutoLoCoCallback(AutoLoCoConfig(**spec["autoloco"]))
    probe = Probe(callback, None, record_batches=True)
    args = SFTConfig(
        output_dir=spec["output_dir"],
        max_steps=spec["steps"],
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        warmup_steps=1,
        assistant_only_loss=True,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to=[],
        logging_steps=2,
        max_length=64,
        packing=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=7,
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(data),
        processing_class=tokenizer,
        callbacks=[callback, probe],
    )
    trainer.train()
    engine = callback.engine
    result = {
        "rank": rank,
        "records": [r.__dict__.copy() for r in engine.records],
        "totals": engine.totals.as_dict(),
        "fingerprints": probe.fingerprints,
        "synced": probe.synced,
        "collectives": COLLECTIVES,
        "model_bytes": sum(p.numel() * 4 for p in model.parameters()),
        "mask_tokens": sum(int(b["attention_mask"].sum()) for b in probe.batches),
        "positions": sum(b["input_ids"].numel() for b in probe.batches),
        "loss_positions": sum(int(b["labels"].ne(-100).sum()) for b in probe.batches),
        "log_history": trainer.state.log_history,
        "final": fingerprint(trainer.model),
    }
    torch.save(result, os.path.join(spec["output_dir"], f"result_rank{rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
    exit_after_a_clean_run()
