"""The paper's C4 pretraining recipe: DDP, DiLoCo, AutoLoCo, QSR, Linear Interval and the ablations.

LLaMA-style ~215M model, C4 ``en`` streamed with ``datasets``, documents
truncated or padded to 1,024 tokens without packing, batch 128 per worker,
8 workers (4 for the ablation), 50k steps, AdamW with a 1,000-step warm-up
then cosine decay, validation on 4,096 C4 validation documents.

Two modes, one training loop (:class:`~autoloco_hf.sync.workers.local_workers.LocalWorkers`):

* ``simulated`` (the paper's main results): all ``--workers`` replicas in one
  process on one device, averaged by ``SimulatedCommunicator``;
* ``multiprocess``: one worker per process under ``torchrun`` / ``accelerate
  launch --multi_gpu``, averaged by ``ProcessGroupCommunicator`` (gloo on
  CPU, NCCL on GPU). ``auto`` picks it when ``WORLD_SIZE > 1``.

Worker ``w`` of ``N`` reads ``datasets.distributed.split_dataset_by_node(stream,
w, N)`` in both modes, so the two modes see the same data.

    python recipes/pretrain_c4.py --config recipes/configs/c4_autoloco.yaml
    torchrun --nproc_per_node 8 recipes/pretrain_c4.py --config recipes/configs/c4_diloco.yaml \\
        --mode multiprocess
    python recipes/pretrain_c4.py --config recipes/configs/c4_autoloco.yaml \\
        --train-files c4-train.00000-of-01024.json.gz --val-files val.parquet \\
        --model-config tiny.json --tokenizer ./tok

The run folder (``output_dir/run_name``) is readable by ``autoloco report`` and
ends with the final synchronized model and its tokenizer
(``save_pretrained``), ready for ``autoloco eval output_dir/run_name``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe_config import (  # noqa: E402
    check_at_least,
    check_data_files,
    check_local_path,
    load_data_files,
    load_yaml,
    parse_settings,
    rows_per_worker,
    setting,
    usage_error,
)

from autoloco_hf import AutoLoCoConfig  # noqa: E402
from autoloco_hf.config import RECIPES, ConfigError, Method  # noqa: E402
from autoloco_hf.integrations.trainer.arguments import AutoLoCoArguments  # noqa: E402

# LLaMA-style, 214.96M parameters with a 32k vocabulary (untied embeddings).
MODEL_215M = dict(
    hidden_size=1024,
    intermediate_size=2688,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=16,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
    rms_norm_eps=1e-5,
)


@dataclass
class C4Settings:
    """Every knob of the recipe but the engine's (:class:`AutoLoCoArguments`);
    YAML files and flags override these defaults."""

    run_name: str = setting("c4_autoloco", "run folder name under output_dir")
    output_dir: str = setting("runs/c4", "where run folders go")
    method: Method = setting(Method.AUTOLOCO, "how workers synchronize")
    ablation: Literal["intervals_only", "momentum", "full", "full_normalized"] | None = setting(
        None, "a Table 7 ablation variant of AutoLoCo (AutoLoCoConfig.ablation) instead of --method"
    )
    mode: Literal["auto", "simulated", "multiprocess"] = setting(
        "auto",
        "simulated: all workers in this process; multiprocess: one per process "
        "(torchrun); auto: by WORLD_SIZE",
    )
    workers: int = setting(8, "data-parallel workers")
    steps: int = setting(50_000, "optimizer steps")
    warmup_steps: int = setting(1_000, "linear LR warm-up steps, then cosine decay")
    lr: float = setting(3e-4, "peak AdamW learning rate")
    weight_decay: float = setting(0.1, "AdamW weight decay")
    adam_beta2: float = setting(0.95, "AdamW beta2")
    max_grad_norm: float | None = setting(
        1.0, "per-worker gradient clipping before each inner step"
    )
    batch_size: int = setting(128, "documents per worker per step")
    micro_batch_size: int | None = setting(
        None, "split each worker's batch for memory (same gradient)"
    )
    seq_len: int = setting(1_024, "tokens per document after truncation or padding (no packing)")
    dataset: str = setting("allenai/c4", "hub dataset, streamed")
    dataset_config: str = setting("en", "hub dataset configuration")
    train_files: list[str] | None = setting(
        None,
        "local files instead of the hub stream: .jsonl / .json (gzipped or not), .parquet or .txt",
    )
    val_files: list[str] | None = setting(None, "local validation files (same formats)")
    text_field: str = setting("text", "the column holding the document text")
    val_docs: int = setting(4_096, "validation documents")
    eval_batch_size: int = setting(32, "validation batch size")
    tokenizer: str = setting(
        "hf-internal-testing/llama-tokenizer", "any LLaMA-style 32k tokenizer, or a local path"
    )
    model_config: str | None = setting(
        None, "JSON/YAML of LlamaConfig fields; default: the ~215M model"
    )
    bf16: bool = setting(True, "bf16 autocast on CUDA (CPU runs in FP32)")
    gradient_checkpointing: bool = setting(
        False, "recompute activations in the backward pass to save memory"
    )
    seed: int = setting(0, "seed of the initialization (the ablation configs use 42, as the paper)")
    save_every: int = setting(
        0, "steps between checkpoints in output_dir/run_name/checkpoint (0: never)"
    )
    resume: bool = setting(False, "continue from that checkpoint when it exists")


def autoloco_config(s: C4Settings, a: AutoLoCoArguments) -> AutoLoCoConfig:
    """The C4 preset (H_base 500, q_H 50, H_max 750) for the method, or an ablation variant, plus
    the ``autoloco_*`` overrides."""
    overrides = {"warmup_steps": s.warmup_steps, **a.overrides()}
    if s.ablation:
        horizon = {k: v for k, v in RECIPES["c4"].items() if k != "normalize_pseudo_grad"}
        config = AutoLoCoConfig.ablation(s.ablation, **{**horizon, **overrides})
    else:
        config = AutoLoCoConfig.for_recipe("c4", **{"method": s.method, **overrides})
    # a typed --autoloco_* flag that does nothing under the method is refused
    config.check_given(a.overrides())
    return config


def parse_args(argv: Sequence[str] | None = None) -> tuple[C4Settings, AutoLoCoArguments]:
    """Settings from defaults, ``--config`` YAML and flags; a
    bad engine setting is a usage error (exit 2)."""
    settings, autoloco = parse_settings(
        (C4Settings, AutoLoCoArguments), argv, __doc__.splitlines()[0]
    )
    try:
        autoloco_config(settings, autoloco)
    except ConfigError as err:
        usage_error(str(err))
    check_inputs(settings)
    return settings, autoloco


def launch_mode(s: C4Settings) -> str:
    """simulated or multiprocess (``auto``: multiprocess when
    ``WORLD_SIZE > 1``); one process per worker in the latter."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mode = s.mode if s.mode != "auto" else ("multiprocess" if world > 1 else "simulated")
    if mode == "multiprocess" and world != s.workers:
        usage_error(
            f"--workers {s.workers} but WORLD_SIZE={world}: one process per "
            "worker in multiprocess mode"
        )
    return mode


def check_inputs(s: C4Settings) -> None:
    """Every path and count, before anything loads: a bad one
    is one line and exit code 2, not a traceback mid-run."""
    check_at_least(
        s,
        1,
        "workers",
        "steps",
        "batch_size",
        "micro_batch_size",
        "seq_len",
        "val_docs",
        "eval_batch_size",
    )
    check_at_least(s, 0, "save_every")
    if not 0 <= s.warmup_steps < s.steps:
        usage_error(f"--warmup-steps {s.warmup_steps}: pass 0 <= warm-up < --steps ({s.steps})")
    launch_mode(s)
    check_local_path(s.tokenizer, "--tokenizer")
    if s.model_config:
        load_yaml(s.model_config, "--model-config")
    if s.train_files and not s.val_files:
        usage_error(
            f"--train-files {' '.join(s.train_files)} is local but --val-files is not given: "
            f"validation after training would stream {s.dataset} ({s.dataset_config}, "
            "validation); pass --val-files FILE"
        )
    if s.val_files:
        check_data_files(s.val_files, "--val-files", s.text_field, ", or set --text-field")
    if s.train_files:
        rows = check_data_files(
            s.train_files, "--train-files", s.text_field, ", or set --text-field"
        )
        check_enough_rows(s, rows)


def check_enough_rows(s: C4Settings, file_rows: list[int]) -> None:
    """Local training data lasts ``--steps`` batches on every
    worker (one row a document, no packing, no second epoch)."""
    shares = rows_per_worker(file_rows, s.workers)
    steps = min(-(-share // s.batch_size) for share in shares)  # a last short batch is still a step
    if steps < s.steps:
        usage_error(
            f"--train-files {' '.join(s.train_files)}: the training data runs out at step "
            f"{steps + 1} of {s.steps} ({sum(file_rows)} rows over {s.workers} workers, "
            f"{min(shares)} on the one with fewest, --batch-size {s.batch_size} each step); add "
            "data, or lower --steps, --batch-size or --workers"
        )


def build_model(s: C4Settings, vocab_size: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = dict(MODEL_215M)
    if s.model_config:
        fields = load_yaml(s.model_config, "--model-config")  # JSON is YAML
    fields.setdefault("vocab_size", vocab_size)
    torch.manual_seed(s.seed)
    model = LlamaForCausalLM(LlamaConfig(**fields))
    if s.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def worker_dataset(s: C4Settings, split: str, worker: int, num_workers: int) -> Any:
    """Worker ``worker``'s share of the C4 (or local) ``split``:
    a streaming dataset whose position can be saved."""
    from datasets import load_dataset
    from datasets.distributed import split_dataset_by_node

    files = s.train_files if split == "train" else s.val_files
    if files:  # the real C4 shards are gzipped JSON Lines (.json.gz)
        stream = load_data_files(
            files, "--train-files" if split == "train" else "--val-files", streaming=True
        )
    else:
        stream = load_dataset(s.dataset, s.dataset_config, split=split, streaming=True)
    return split_dataset_by_node(stream, rank=worker, world_size=num_workers)


def texts(dataset: Any, field: str) -> Iterator[str]:
    for example in dataset:
        yield example[field]


def collate(tokenizer: Any, texts: Sequence[str], seq_len: int) -> dict[str, torch.Tensor]:
    """Truncate or pad each document to ``seq_len`` (no
    packing); padding is masked out of the loss."""
    enc = tokenizer(
        list(texts), truncation=True, max_length=seq_len, padding="max_length", return_tensors="pt"
    )
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": enc["attention_mask"],
        "labels": labels,
    }


def batches(
    tokenizer: Any, texts: Iterator[str], batch_size: int, seq_len: int, device: torch.device
) -> Iterator[dict]:
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == batch_size:
            yield {k: v.to(device) for k, v in collate(tokenizer, chunk, seq_len).items()}
            chunk = []
    if chunk:
        yield {k: v.to(device) for k, v in collate(tokenizer, chunk, seq_len).items()}


class Launch:
    """Where this process stands: simulated (all workers here) or one worker of a process group."""

    def __init__(self, s: C4Settings) -> None:
        self.mode = launch_mode(s)
        self.distributed = self.mode == "multiprocess"
        if self.distributed:
            import torch.distributed as dist

            cuda = torch.cuda.is_available()
            if cuda:
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if cuda else "gloo")
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self.worker_ids = [self.rank]
        else:
            self.rank, self.world_size = 0, 1
            self.worker_ids = list(range(s.workers))
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )

    def communicator(self, config: AutoLoCoConfig) -> Any:
        from autoloco_hf.sync.communicators import make_communicator

        return make_communicator(config, self.distributed, simulated_workers=len(self.worker_ids))

    def sum(self, values: list[float]) -> list[float]:
        """Sum small float vectors over processes (validation shards)."""
        if not self.distributed:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()


def validate(s: C4Settings, launch: Launch, model: torch.nn.Module, tokenizer: Any) -> float:
    """Token-weighted loss on the first ``val_docs``
    validation documents (sharded over processes)."""
    import itertools

    from autoloco_hf.toy.text import loss_sums

    total, count = 0.0, 0
    for shard in launch.worker_ids:  # one validation shard per worker, as for training data
        docs = itertools.islice(
            texts(worker_dataset(s, "validation", shard, s.workers), s.text_field),
            -(-s.val_docs // s.workers),
        )
        with _autocast(s, launch):
            t, c = loss_sums(
                model, batches(tokenizer, docs, s.eval_batch_size, s.seq_len, launch.device)
            )
        total, count = total + t, count + c
    total, count = launch.sum([total, float(count)])
    return total / max(count, 1.0)


def accumulated_loss(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], micro_batch_size: int | None
) -> torch.Tensor:
    """The batch's token-weighted mean loss, computed in
    micro-batches; returns the last part's graph.

    Earlier micro-batches are back-propagated here; the returned tensor has the
    full batch's loss as its value but only the last micro-batch's graph, so the
    caller's single ``backward()`` completes exactly the full-batch gradient.
    """
    size = micro_batch_size or batch["input_ids"].shape[0]
    parts = [
        dict(zip(batch, values)) for values in zip(*(torch.split(v, size) for v in batch.values()))
    ]
    targets = [int((p["labels"][:, 1:] != -100).sum()) for p in parts]
    total = max(sum(targets), 1)
    done = torch.zeros((), device=batch["input_ids"].device)
    for part, n in zip(parts[:-1], targets):
        loss = model(**part).loss * (n / total)
        loss.backward()
        done += loss.detach()
    return model(**parts[-1]).loss * (targets[-1] / total) + done


def _autocast(s: C4Settings, launch: Launch) -> Any:
    enabled = s.bf16 and launch.device.type == "cuda"
    return torch.autocast(device_type=launch.device.type, dtype=torch.bfloat16, enabled=enabled)


def train(s: C4Settings, a: AutoLoCoArguments) -> dict[str, Any]:
    """Run the recipe; returns the run summary (rank 0) or an empty dict (other ranks)."""
    from transformers import AutoTokenizer, get_cosine_schedule_with_warmup

    from autoloco_hf.state.checkpoint import read_state, write_state
    from autoloco_hf.state.run_folder import RunWriter
    from autoloco_hf.sync.workers.local_workers import LocalWorkers

    launch = Launch(s)
    config = autoloco_config(s, a)
    tokenizer = AutoTokenizer.from_pretrained(s.tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = build_model(s, len(tokenizer)).to(launch.device)
    run_dir = os.path.join(s.output_dir, s.run_name)
    checkpoint = os.path.join(run_dir, "checkpoint", f"rank{launch.rank}.safetensors")
    layout = dict(config=config, world_size=launch.world_size, ranks_per_worker=1, rank=launch.rank)
    state = read_state(checkpoint, **layout)[1] if s.resume and os.path.exists(checkpoint) else None
    start = state["step"] if state else 0
    writer = RunWriter(run_dir, s.run_name, resume_step=start) if launch.rank == 0 else None

    def loss_fn(m: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with _autocast(s, launch):
            return accumulated_loss(m, batch, s.micro_batch_size)

    workers = LocalWorkers(
        config,
        model,
        launch.communicator(config),
        optimizer_factory=lambda ps: torch.optim.AdamW(
            ps, lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, s.adam_beta2)
        ),
        scheduler_factory=lambda opt: get_cosine_schedule_with_warmup(opt, s.warmup_steps, s.steps),
        total_steps=s.steps,
        loss_fn=loss_fn,
        max_grad_norm=s.max_grad_norm,
        warmup_steps=s.warmup_steps,
        records_path=writer.intervals_path if writer else None,
    )
    del model  # LocalWorkers trains its own copies
    datasets = [worker_dataset(s, "train", w, s.workers) for w in launch.worker_ids]
    if state:
        workers.load_state_dict(state["workers"])
        for dataset, position in zip(datasets, state["data"]):
            dataset.load_state_dict(position)
    streams = [
        batches(tokenizer, texts(d, s.text_field), s.batch_size, s.seq_len, launch.device)
        for d in datasets
    ]
    bar = _progress(s, launch, start)
    started = time.perf_counter() - (state["seconds"] if state else 0.0)
    for step in range(start + 1, s.steps + 1):
        lr = float(workers.optimizers[0].param_groups[0]["lr"])
        try:
            workers.train_step([next(stream) for stream in streams])
        except StopIteration as err:
            raise SystemExit(
                f"the training data ran out at step {step} of {s.steps}: add data or lower --steps"
            ) from err
        if writer:
            # local workers' mean loss (all workers when
            # simulated, rank 0's own in multiprocess mode)
            loss = sum(workers.last_losses) / len(workers.last_losses)
            writer.log_step(step, loss, lr, workers.engine.totals, time.perf_counter() - started)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", syncs=workers.engine.totals.syncs, refresh=False)
        if s.save_every and step % s.save_every == 0 and step < s.steps:
            state = dict(
                step=step,
                seconds=time.perf_counter() - started,
                workers=workers.state_dict(),
                data=[d.state_dict() for d in datasets],
            )
            write_state(checkpoint, state, **layout, step=step)  # atomic, checksummed, no pickle
    wall = time.perf_counter() - started
    bar.close()
    val_loss = validate(s, launch, workers.models[0], tokenizer)
    if writer is None:
        return {}
    # The budget ends on a sync, so every replica holds the
    # synchronized model: keep it for `autoloco eval`.
    workers.models[0].save_pretrained(run_dir)
    tokenizer.save_pretrained(run_dir)
    params = sum(p.numel() for p in workers.models[0].parameters())
    return writer.finish(
        workers.engine.totals,
        config.to_dict(),
        wall,
        val_loss=val_loss,
        workers=s.workers,
        params=params,
        mode=launch.mode,
        resumed_from_step=start,
        settings={**dataclasses.asdict(s), **dataclasses.asdict(a)},
    )


def _progress(s: C4Settings, launch: Launch, start: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=s.steps,
        initial=start,
        desc=s.run_name,
        unit="step",
        disable=launch.rank != 0,
        mininterval=2.0,
    )


def main(argv: Sequence[str] | None = None) -> int:
    settings, autoloco = parse_args(argv)
    try:
        summary = train(settings, autoloco)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    if summary:
        keys = ("syncs", "payload_bytes")
        print(
            json.dumps(
                {
                    "run": settings.run_name,
                    **{k: summary["totals"][k] for k in keys},
                    "train_loss_last": summary["train_loss_last"],
                    "val_loss": summary["val_loss"],
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
