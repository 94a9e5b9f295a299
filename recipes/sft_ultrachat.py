"""The paper's SFT recipe: Llama-3.1-8B on UltraChat-200k with TRL's ``SFTTrainer`` and
``AutoLoCoCallback``.

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

Workers of ``R`` GPUs each, FP32 master weights sharded by FSDP2 over each
worker's GPUs (``ranks_per_worker = R`` and an FSDP2 accelerate config: the
recipe shards every worker over its own ranks before building the trainer):

    accelerate launch --config_file recipes/accelerate/1node_8gpu_fsdp2.yaml \\
        recipes/sft_ultrachat.py --config recipes/configs/sft_autoloco_fsdp2.yaml \\
        --autoloco ranks_per_worker=4

Every ``SFTConfig`` / ``TrainingArguments`` field is a flag and a YAML key
(``--report_to wandb``, ``--optim adamw_torch_fused``, ``--save_total_limit 3``),
as is every ``AutoLoCoConfig`` field with an ``autoloco_`` prefix. Every
download can be replaced by a local path: ``--model-name-or-path``,
``--tokenizer``, ``--train-files`` / ``--test-files`` (JSON Lines, JSON or
Parquet with a ``messages`` list). The run folder (``output_dir/run_name``) is
the callback's (``autoloco_summary.json``, extended with the test NLL, which
``autoloco report`` shows as its validation loss; ``autoloco_steps.jsonl``;
``autoloco_intervals.jsonl``) and ends with the final synchronized model and
tokenizer, ready for ``autoloco eval``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe_config import (  # noqa: E402
    check_at_least,
    check_data_files,
    check_local_path,
    load_data_files,
    parse_settings,
    setting,
    usage_error,
)

from autoloco_hf import AutoLoCoConfig  # noqa: E402
from autoloco_hf.config import ConfigError, Method, WireDtype  # noqa: E402
from autoloco_hf.integrations.trainer.arguments import AutoLoCoArguments  # noqa: E402

ROLES = ("system", "user", "assistant")


@dataclass
class SFTSettings:
    """The recipe's own knobs; the Trainer's are ``SFTConfig`` fields (:data:`TRAINER_DEFAULTS`),
    the engine's ``autoloco_*``."""

    method: Method = setting(
        Method.AUTOLOCO, "how workers synchronize (the paper: diloco, autoloco)"
    )
    int8: bool = setting(
        False, "INT8 blockwise pseudo-gradient communication (docs/algorithm.md#wire-codecs)"
    )
    model_name_or_path: str = setting(
        "meta-llama/Llama-3.1-8B", "hub id or local folder of the model"
    )
    tokenizer: str | None = setting(None, "hub id or local folder; default: the model's")
    chat_template: str | None = setting(
        None, "a .jinja file; default: the tokenizer's, else TRL's Llama 3 training template"
    )
    model_dtype: Literal["bfloat16", "float16", "float32"] = setting(
        "bfloat16", "weights in memory on GPU (an 8B model in FP32 with AdamW does not fit one GPU)"
    )
    dataset: str = setting("HuggingFaceH4/ultrachat_200k", "hub dataset")
    train_split: str = setting("train_sft", "hub split to train on")
    test_split: str = setting("test_sft", "hub split of the test NLL")
    train_files: list[str] | None = setting(
        None, "local JSON Lines / JSON / Parquet files with a `messages` column instead of the hub"
    )
    test_files: list[str] | None = setting(None, "local test files (same formats)")
    global_batch_size: int = setting(
        32, "conversations per optimizer step, all workers together (sets gradient accumulation)"
    )
    test_conversations: int = setting(1_000, "valid test conversations for the test NLL")
    eval_batch_size: int = setting(8, "test NLL batch size")
    resume: bool = setting(
        False, "continue from the last checkpoint in output_dir/run_name when there is one"
    )


def _checkpointing_field() -> str:
    """transformers >= 5.2x calls it ``activation_checkpointing``
    (``gradient_checkpointing`` is its deprecated alias)."""
    from trl import SFTConfig

    names = {f.name for f in dataclasses.fields(SFTConfig)}
    return (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )


def trainer_defaults() -> dict[str, Any]:
    """The paper's ``SFTConfig`` values where they differ
    from TRL's defaults; YAML and flags override them."""
    cuda = torch.cuda.is_available()
    return dict(
        output_dir="runs/sft",
        run_name="sft_autoloco",
        per_device_train_batch_size=2,  # the rest of the global batch is gradient accumulation
        max_length=2_048,
        num_train_epochs=1.0,
        learning_rate=2e-5,
        lr_scheduler_type="cosine",
        warmup_steps=0.01,  # a float below 1 is a ratio of the training steps
        weight_decay=0.0,
        bf16=cuda,  # CPU runs in FP32
        use_cpu=not cuda,
        **{_checkpointing_field(): cuda},  # on CPU it only costs time
        packing=False,
        padding_free=False,
        assistant_only_loss=True,
        logging_steps=1,
        save_strategy="no",
        seed=42,
        # a per-step gather otherwise; each worker normalizes by its own tokens
        average_tokens_across_devices=False,
    )


def autoloco_config(s: SFTSettings, a: AutoLoCoArguments) -> AutoLoCoConfig:
    """The SFT preset (H_base 100, q_H 10, H_max 150, normalization
    on for AutoLoCo) plus the ``autoloco_*`` overrides."""
    overrides = {
        "method": s.method,
        **({"wire_dtype": WireDtype.INT8} if s.int8 else {}),
        **a.overrides(),
    }
    config = AutoLoCoConfig.for_recipe("sft", **overrides)
    # a typed --autoloco_* flag that does nothing under the method is refused
    config.check_given(a.overrides())
    return config


def parse_args(argv: Sequence[str] | None = None) -> tuple[SFTSettings, Any, AutoLoCoArguments]:
    """(recipe settings, ``SFTConfig``, engine arguments)
    from defaults, ``--config`` YAML and flags."""
    from trl import SFTConfig

    settings, args, autoloco = parse_settings(
        (SFTSettings, SFTConfig, AutoLoCoArguments),
        argv,
        __doc__.split("\n\n")[0],
        defaults=trainer_defaults(),
    )
    try:
        autoloco_config(settings, autoloco)
    except ConfigError as err:
        usage_error(str(err))
    check_inputs(settings)
    return settings, args, autoloco


def check_inputs(s: SFTSettings) -> None:
    """Every path and count, before anything loads: a bad one is
    one line and exit code 2, not a traceback after training."""
    check_local_path(s.model_name_or_path, "--model-name-or-path", "config.json")
    check_local_path(s.tokenizer, "--tokenizer")
    if s.chat_template and not os.path.isfile(s.chat_template):
        usage_error(f"--chat-template {s.chat_template}: no such file; pass a .jinja chat template")
    check_at_least(s, 1, "global_batch_size", "test_conversations", "eval_batch_size")
    if s.train_files and not s.test_files:
        usage_error(
            f"--train-files {' '.join(s.train_files)} is local but --test-files is not given: the "
            f"test NLL after training would download {s.dataset} ({s.test_split}); pass "
            "--test-files FILE (JSON Lines or Parquet with 'messages')"
        )
    for option, files in (("--train-files", s.train_files), ("--test-files", s.test_files)):
        if files:
            check_data_files(files, option, "messages", " (a list of {'role', 'content'} turns)")


def valid_conversation(messages: Any) -> bool:
    """Known roles, non-empty text, user and assistant
    alternating after an optional system turn, >= 1 reply."""
    if not isinstance(messages, list) or not messages:
        return False
    for m in messages:
        if (
            not isinstance(m, dict)
            or m.get("role") not in ROLES
            or not isinstance(m.get("content"), str)
            or not m["content"].strip()
        ):
            return False
    turns = messages[1:] if messages[0]["role"] == "system" else messages
    expected = ["user", "assistant"] * len(turns)
    return (
        bool(turns)
        and [m["role"] for m in turns] == expected[: len(turns)]
        and any(m["role"] == "assistant" for m in turns)
    )


def has_assistant_target(tokenizer: Any, messages: list, max_length: int) -> bool:
    """Whether an assistant token survives truncation to
    ``max_length`` (the same masking as the test NLL)."""
    from autoloco_evals.nll import chat_example

    _, mask = chat_example(tokenizer, messages, max_length)
    return any(mask[1:])


def conversations(
    s: SFTSettings, args: Any, split: str, tokenizer: Any, limit: int | None = None
) -> Any:
    """The ``messages`` of ``split`` (train or test) after
    filtering; ``limit`` keeps the first ones."""
    from datasets import load_dataset

    files = s.train_files if split == "train" else s.test_files
    if files:
        ds = load_data_files(files, "--train-files" if split == "train" else "--test-files")
    else:
        ds = load_dataset(s.dataset, split=s.train_split if split == "train" else s.test_split)
    ds = ds.select_columns(["messages"])
    ds = ds.filter(lambda ex: valid_conversation(ex["messages"]), num_proc=args.dataset_num_proc)
    if limit is not None:
        ds = ds.select(range(min(limit * 2, len(ds))))  # headroom for the truncation filter
    ds = ds.filter(
        lambda ex: has_assistant_target(tokenizer, ex["messages"], args.max_length),
        num_proc=args.dataset_num_proc,
    )
    return ds.select(range(min(limit, len(ds)))) if limit is not None else ds


def load_tokenizer(s: SFTSettings) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(s.tokenizer or s.model_name_or_path)
    if s.chat_template:
        with open(s.chat_template) as f:
            tokenizer.chat_template = f.read()
    elif not tokenizer.chat_template:  # a base model: Llama 3's chat format with generation markers
        from importlib.resources import files

        tokenizer.chat_template = (
            files("trl") / "chat_templates" / "llama3_training.jinja"
        ).read_text()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def fsdp2_requested(args: Any) -> bool:
    """FSDP2 asked for by ``--fsdp`` (``fsdp_config`` version
    2, transformers' default) or an accelerate FSDP config."""
    if args.fsdp:
        return int((getattr(args, "fsdp_plugin_args", None) or {}).get("fsdp_version", 1)) == 2
    return (
        os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        and os.environ.get("FSDP_VERSION") == "2"
    )


def check_fsdp2_workers_setup(s: SFTSettings, config: AutoLoCoConfig, cuda: bool) -> None:
    """Usage errors, before anything is loaded, for a run
    whose workers the recipe shards with FSDP2."""
    r = config.ranks_per_worker
    if s.model_dtype != "float32":
        usage_error(
            f"--model-dtype {s.model_dtype}: FSDP2 workers keep FP32 master weights (bf16 is the "
            "compute dtype when --bf16 is on); pass --model-dtype float32 "
            "(recipes/configs/sft_autoloco_fsdp2.yaml sets it)"
        )
    if os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "false").lower() == "true":
        usage_error(
            "fsdp_cpu_ram_efficient_loading: true in the accelerate config loads the weights on "
            "local rank 0 only, but the recipe shards each worker itself from every rank's copy: "
            "set it to false (recipes/accelerate/*_fsdp2.yaml)"
        )
    if not cuda:
        usage_error(
            f"--autoloco ranks_per_worker={r} with FSDP2 needs GPUs: accelerate enables FSDP on "
            "GPU devices only (on CPU the Trainer would wrap the sharded model in DDP); drop FSDP "
            f"(--fsdp / the accelerate config) to train each worker of {r} CPU "
            "processes with DDP inside it"
        )


def shard_workers(model: Any, config: AutoLoCoConfig, bf16: bool, device_type: str = "cuda") -> Any:
    """Shard the FP32 model over each worker's GPUs (FSDP2, every decoder layer then the root;
    docs/algorithm.md#worker-groups).

    Accelerate's FSDP2 plugin would shard over all ranks, one worker; it
    keeps a model sharded already. The master weights, gradients and AdamW
    states stay FP32; with ``bf16`` the layers are gathered in bf16.
    """
    from autoloco_hf.integrations.groups import shard_worker

    dtype = torch.bfloat16 if bf16 else None
    return shard_worker(model, config.ranks_per_worker, device_type, compute_dtype=dtype)


def train(s: SFTSettings, args: Any, a: AutoLoCoArguments) -> dict[str, Any]:
    """Run the recipe; returns the run summary on the main process, else an empty dict."""
    from transformers import AutoModelForCausalLM
    from transformers.trainer_utils import get_last_checkpoint
    from trl import SFTTrainer

    from autoloco_evals.nll import chat_example, masked_nll
    from autoloco_hf import AutoLoCoCallback
    from autoloco_hf.state.run_folder import extend_trainer_summary

    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_step = args.per_device_train_batch_size * world
    if s.global_batch_size % per_step:
        usage_error(
            f"--global_batch_size {s.global_batch_size} is not a multiple of "
            f"--per_device_train_batch_size {args.per_device_train_batch_size} x {world} "
            "workers: change one of them"
        )
    args.gradient_accumulation_steps = s.global_batch_size // per_step
    run_name = args.run_name
    # one folder per run, as in the C4 recipe
    run_dir = args.output_dir = os.path.join(args.output_dir, run_name)
    cuda = torch.cuda.is_available()
    config = autoloco_config(s, a)
    sharded = fsdp2_requested(args) and config.ranks_per_worker > 1
    if sharded:
        check_fsdp2_workers_setup(s, config, cuda)
    tokenizer = load_tokenizer(s)
    train_set = conversations(s, args, "train", tokenizer)
    main_process = int(os.environ.get("RANK", "0")) == 0
    # before training: a test set that cannot load must not cost a training run
    test_set = (
        conversations(s, args, "test", tokenizer, limit=s.test_conversations)
        if main_process or sharded
        else None
    )
    dtype = getattr(torch, s.model_dtype) if cuda else torch.float32
    model = AutoModelForCausalLM.from_pretrained(s.model_name_or_path, dtype=dtype)
    if sharded:
        # initializes the process group and this rank's GPU before the worker mesh is built
        _ = args.device
        model = shard_workers(model, config, args.bf16)
    # its run files (autoloco_*) are the run's: the summary below extends them
    callback = AutoLoCoCallback(config)
    last = get_last_checkpoint(run_dir) if s.resume and os.path.isdir(run_dir) else None
    resume_step = int(last.rsplit("-", 1)[1]) if last else 0
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=train_set,
        processing_class=tokenizer,
        callbacks=[callback],
    )
    trainer.train(resume_from_checkpoint=last)
    # The budget ends on a sync: the model is the synchronized
    # one. save_model writes it (and the tokenizer) once.
    trainer.save_model(run_dir)
    if not main_process and not sharded:
        return {}
    # a sharded model runs its forward on all of its worker's
    # ranks together: every rank computes the test NLL
    trainer.model.eval()
    nll = masked_nll(
        trainer.model,
        (chat_example(tokenizer, ex["messages"], args.max_length) for ex in test_set),
        s.eval_batch_size,
        "test nll",
    )
    if not main_process:
        return {}
    return extend_trainer_summary(
        run_dir,
        val_loss=nll.nll,
        test_nll=nll.nll,
        test_tokens=nll.tokens,
        test_conversations=nll.examples,
        train_conversations=len(train_set),
        workers=world // config.ranks_per_worker,
        resumed_from_step=resume_step,
        settings={**dataclasses.asdict(s), **a.overrides(), "trainer": args.to_dict()},
    )


def main(argv: Sequence[str] | None = None) -> int:
    settings, args, autoloco = parse_args(argv)
    run_name = args.run_name
    summary = train(settings, args, autoloco)
    if summary:
        print(
            json.dumps(
                {
                    "run": run_name,
                    "syncs": summary["totals"]["syncs"],
                    "payload_bytes": summary["totals"]["payload_bytes"],
                    "test_nll": summary["test_nll"],
                    "train_conversations": summary["train_conversations"],
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
