"""The paper's SFT recipe: Llama-3.1-8B on UltraChat-200k with TRL's ``SFTTrainer`` and ``AutoLoCoCallback``.

Global batch 32 conversations, max length 2,048, one epoch, assistant-only
loss, dynamic padding without packing. Conversations that are invalid (bad
roles, empty turns, no assistant reply) or keep no assistant token after
truncation are filtered out before training. Methods: DiLoCo (H = 100, outer
momentum 0.9) and AutoLoCo with pseudo-gradient normalization
(``AutoLoCoConfig.for_recipe("sft")``), optionally with INT8 communication
(``--int8 true``). After training, rank 0 reports the test NLL on the
assistant tokens of the first 1,000 valid ``test_sft`` conversations.

One process per worker (the callback's multi-process mode):

    accelerate launch --config_file recipes/accelerate/1node_8gpu.yaml \\
        recipes/sft_ultrachat.py --config recipes/configs/sft_autoloco.yaml

Every download can be replaced by a local path: ``--model-name-or-path``,
``--tokenizer``, ``--train-files`` / ``--test-files`` (JSONL with a
``messages`` list). The run folder (``output_dir/run_name``) is readable by
``autoloco report``; the test NLL appears as its validation loss.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe_config import parse_settings  # noqa: E402

from autoloco_hf import AutoLoCoConfig  # noqa: E402
from autoloco_hf.config import WireDtype  # noqa: E402

ROLES = ("system", "user", "assistant")


@dataclass
class SFTSettings:
    """Every knob of the recipe; YAML files under ``recipes/configs/`` and flags override these defaults."""

    run_name: str = "sft_autoloco"
    output_dir: str = "runs/sft"
    method: str = "autoloco"  # diloco, autoloco (ddp, qsr, linear also run)
    int8: bool = False  # INT8 blockwise pseudo-gradient communication (spec 7)
    model_name_or_path: str = "meta-llama/Llama-3.1-8B"
    tokenizer: Optional[str] = None  # default: the model's
    chat_template: Optional[str] = None  # a .jinja file; default: the tokenizer's, else TRL's Llama 3 training template
    model_dtype: str = "bfloat16"  # weights in memory on GPU (an 8B model in FP32 with AdamW does not fit one GPU)
    dataset: str = "HuggingFaceH4/ultrachat_200k"
    train_split: str = "train_sft"
    test_split: str = "test_sft"
    train_files: Optional[list] = None  # local JSONL with a `messages` column instead of the hub dataset
    test_files: Optional[list] = None
    global_batch_size: int = 32  # conversations per optimizer step, all workers together
    per_device_batch_size: int = 2  # the rest is gradient accumulation (2 with 8 workers, 1 with 16)
    max_length: int = 2_048
    num_epochs: float = 1.0
    max_steps: int = -1  # > 0 stops early (smoke tests)
    lr: float = 2e-5
    warmup_ratio: float = 0.01
    lr_scheduler: str = "cosine"
    weight_decay: float = 0.0
    bf16: bool = True  # on CUDA; CPU runs in FP32
    gradient_checkpointing: bool = True  # on CUDA; off on CPU, where it only costs time
    test_conversations: int = 1_000
    eval_batch_size: int = 8
    logging_steps: int = 1
    num_proc: Optional[int] = None
    seed: int = 42
    save_steps: int = 0  # Trainer checkpoints (with the AutoLoCo state of every rank) every N steps; 0: none
    resume: bool = False  # continue from the last checkpoint in output_dir/run_name when there is one
    autoloco: dict = field(default_factory=dict)  # AutoLoCoConfig overrides


def autoloco_config(s: SFTSettings) -> AutoLoCoConfig:
    """The SFT preset (H_base 100, q_H 10, H_max 150, normalization on for AutoLoCo) plus overrides."""
    overrides = dict(s.autoloco)
    if s.int8:
        overrides["wire_dtype"] = WireDtype.INT8
    return AutoLoCoConfig.for_recipe("sft", method=s.method, **overrides)


def valid_conversation(messages: Any) -> bool:
    """Known roles, non-empty text, user and assistant alternating after an optional system turn, >= 1 reply."""
    if not isinstance(messages, list) or not messages:
        return False
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str) or not m["content"].strip():
            return False
    turns = messages[1:] if messages[0]["role"] == "system" else messages
    expected = ["user", "assistant"] * len(turns)
    return bool(turns) and [m["role"] for m in turns] == expected[: len(turns)] and any(m["role"] == "assistant" for m in turns)


def has_assistant_target(tokenizer: Any, messages: list, max_length: int) -> bool:
    """Whether an assistant token survives truncation to ``max_length`` (the same masking as the test NLL)."""
    from autoloco_evals.nll import chat_example

    _, mask = chat_example(tokenizer, messages, max_length)
    return any(mask[1:])


def conversations(s: SFTSettings, split: str, tokenizer: Any, limit: Optional[int] = None) -> Any:
    """The ``messages`` of ``split`` (train or test) after filtering; ``limit`` keeps the first ones."""
    from datasets import load_dataset

    files = s.train_files if split == "train" else s.test_files
    if files:
        ds = load_dataset("json", data_files=list(files), split="train")
    else:
        ds = load_dataset(s.dataset, split=s.train_split if split == "train" else s.test_split)
    ds = ds.select_columns(["messages"])
    ds = ds.filter(lambda ex: valid_conversation(ex["messages"]), num_proc=s.num_proc)
    if limit is not None:
        ds = ds.select(range(min(limit * 2, len(ds))))  # headroom for the truncation filter
    ds = ds.filter(lambda ex: has_assistant_target(tokenizer, ex["messages"], s.max_length), num_proc=s.num_proc)
    return ds.select(range(min(limit, len(ds)))) if limit is not None else ds


def load_tokenizer(s: SFTSettings) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(s.tokenizer or s.model_name_or_path)
    if s.chat_template:
        with open(s.chat_template) as f:
            tokenizer.chat_template = f.read()
    elif not tokenizer.chat_template:  # a base model: Llama 3's chat format with generation markers
        from importlib.resources import files

        tokenizer.chat_template = (files("trl") / "chat_templates" / "llama3_training.jinja").read_text()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def train(s: SFTSettings) -> dict[str, Any]:
    """Run the recipe; returns the run summary on the main process, else an empty dict."""
    from transformers import AutoModelForCausalLM, TrainerCallback
    from transformers.trainer_utils import get_last_checkpoint
    from trl import SFTConfig, SFTTrainer

    from autoloco_evals.nll import chat_example, masked_nll
    from autoloco_hf import AutoLoCoCallback
    from autoloco_hf.cli.report import RunWriter

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if s.global_batch_size % (s.per_device_batch_size * world):
        raise SystemExit(f"global batch {s.global_batch_size} is not a multiple of {s.per_device_batch_size} x {world} workers")
    cuda = torch.cuda.is_available()
    config = autoloco_config(s)
    tokenizer = load_tokenizer(s)
    run_dir = os.path.join(s.output_dir, s.run_name)
    train_set = conversations(s, "train", tokenizer)
    dtype = getattr(torch, s.model_dtype) if cuda else torch.float32
    model = AutoModelForCausalLM.from_pretrained(s.model_name_or_path, dtype=dtype)
    callback = AutoLoCoCallback(config, records_filename="intervals.jsonl")
    main_process = int(os.environ.get("RANK", "0")) == 0
    last = get_last_checkpoint(run_dir) if s.resume and os.path.isdir(run_dir) else None
    resume_step = int(last.rsplit("-", 1)[1]) if last else 0
    writer = RunWriter(run_dir, s.run_name, resume_step=resume_step) if main_process else None
    started = time.perf_counter()

    class StepLog(TrainerCallback):
        """Per-step loss with the run's cumulative syncs and bytes, for `autoloco report`."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if writer is not None and logs and "loss" in logs and callback.engine is not None:
                writer.log_step(state.global_step, float(logs["loss"]), float(logs.get("learning_rate", 0.0)),
                                callback.engine.totals, time.perf_counter() - started)

    args = SFTConfig(
        output_dir=run_dir,
        per_device_train_batch_size=s.per_device_batch_size,
        gradient_accumulation_steps=s.global_batch_size // (s.per_device_batch_size * world),
        num_train_epochs=s.num_epochs,
        max_steps=s.max_steps,
        learning_rate=s.lr,
        lr_scheduler_type=s.lr_scheduler,
        warmup_steps=s.warmup_ratio,  # a float below 1 is a ratio of the training steps
        weight_decay=s.weight_decay,
        bf16=s.bf16 and cuda,
        activation_checkpointing=s.gradient_checkpointing and cuda,  # transformers 5 name of gradient checkpointing
        use_cpu=not cuda,
        max_length=s.max_length,
        packing=False,
        padding_free=False,
        assistant_only_loss=True,
        logging_steps=s.logging_steps,
        save_strategy="steps" if s.save_steps else "no",
        save_steps=s.save_steps or 500,
        save_total_limit=2,  # an 8B checkpoint with every rank's AutoLoCo state is large
        report_to="none",
        seed=s.seed,
        dataset_num_proc=s.num_proc,
        average_tokens_across_devices=False,  # a per-step gather otherwise; each worker normalizes by its own tokens
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=train_set, processing_class=tokenizer,
                         callbacks=[callback, StepLog()])
    trainer.train(resume_from_checkpoint=last)
    wall = time.perf_counter() - started
    if writer is None:
        return {}
    test_set = conversations(s, "test", tokenizer, limit=s.test_conversations)
    trainer.model.eval()
    nll = masked_nll(trainer.model, (chat_example(tokenizer, ex["messages"], s.max_length) for ex in test_set),
                     s.eval_batch_size, "test nll")
    return writer.finish(callback.engine.totals, config.to_dict(), wall, val_loss=nll.nll, test_nll=nll.nll,
                         test_tokens=nll.tokens, test_conversations=nll.examples, train_conversations=len(train_set),
                         workers=world, resumed_from_step=resume_step, settings=dataclasses.asdict(s))


def main(argv: Optional[Sequence[str]] = None) -> int:
    settings = parse_settings(SFTSettings, argv, __doc__.splitlines()[0])
    summary = train(settings)
    if summary:
        print(json.dumps({"run": settings.run_name, "syncs": summary["totals"]["syncs"],
                          "payload_bytes": summary["totals"]["payload_bytes"], "test_nll": summary["test_nll"],
                          "train_conversations": summary["train_conversations"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
