"""GPU readiness: one command that exercises every CUDA path of autoloco-hf (docs/gpu.md).

    # on a GPU: every check, a few minutes
    python benchmarks/testbeds/gpu_check.py --out gpu_check.json
    # on CPU: every step at tiny sizes
    python benchmarks/testbeds/gpu_check.py --cpu-dry-run --out /tmp/r.json

Checks, in order (each one passes, fails or is skipped with a reason):

* ``environment``: torch, CUDA, the device and its bf16 support;
* ``codec_bit_identity``: BF16, INT8, INT4, FP4 and INT2 wire tensors, decoded values,
  the owner-reduce mean and the overlapped all-gather's mean (N = 3 and 4) computed on
  the device are bit-identical to the CPU codec on the same input;
* ``codec_throughput``: encode+decode GB/s of FP32 input next to the device's
  copy bandwidth (same convention: FP32 bytes in per second);
* ``simulated_workers``: a tiny Llama, 4 simulated workers (2 in the dry run), bf16 autocast,
  DiLoCo, AutoLoCo and AutoLoCo with the INT8 wire on the device and on CPU:
  same horizon trajectory, training losses within ``LOSS_RTOL``;
* ``trainer_callback``: ``Trainer`` + ``AutoLoCoCallback`` in one process on the
  device (bf16 on CUDA);
* ``sft_recipe``: ``recipes/sft_ultrachat.py`` smoke with a tiny model and
  local conversations (bf16 on CUDA);
* ``outer_state``: the engine over a one-rank process group (NCCL on CUDA,
  gloo on CPU, as the recipes launch it), FP32 and INT8 wires, outer state on
  the device vs ``outer_on_cpu``: peak device memory and sync time of each;
* ``fsdp2_workers``: workers sharded by FSDP2 (``fully_shard``) over their own
  GPUs, NCCL, against single-GPU workers on the same data: same horizons,
  ``D_t`` / ``C_t`` within ``FSDP_RTOL``, bytes and outer state per rank 1/R.
  Layouts by GPU count (one rank per GPU): 4+ GPUs 2 workers x 2; 2-3 GPUs
  1 worker x 2 and 2 workers x 1; 1 GPU skipped with the reason. The dry run
  runs 1 worker x 2 over gloo;
* ``trainer_fsdp2``: ``Trainer`` + ``AutoLoCoCallback`` with accelerate's FSDP2
  plugin (``TrainingArguments(fsdp=True, fsdp_config={"version": 2})``; several
  workers are sharded per worker by ``shard_worker`` first) against the same
  launch under DDP: same horizons, ``D_t`` / ``C_t`` and parameters within
  tolerance. One GPU: 1 worker x 1 (the plugin's own sharding); 2-3 GPUs: 1 x 2
  and 2 x 1; 4+: 2 x 2. Accelerate has no FSDP on CPU, so the dry run checks
  that the callback refuses the sharded model and the DDP reference trains, and
  reports a skip.

``--cpu-dry-run`` runs the same code with the CPU as "the device" (every
comparison then compares CPU with CPU) and skips only what needs CUDA (peak
device memory, accelerate's FSDP), so CI keeps the script from rotting. The
exit status is 1 if any check failed, 2 on a usage error, else 0. The JSON report holds every
number; the table is its summary.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# bf16 autocast on CUDA vs CPU: mean training loss over the last quarter of the steps
LOSS_RTOL = 0.02
TIME_BUDGET_S = 480  # the whole GPU run must fit in 8 minutes


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


class Skip(Exception):
    """Raised by a check that cannot run in this mode; the message is the reason."""


@dataclass
class CheckResult:
    name: str
    status: Status
    seconds: float
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sizes:
    """Problem sizes: realistic on a GPU, tiny in the dry run (CI: well under a minute)."""

    codec_numel: int  # elements of the throughput buffer
    codec_repeats: int
    sim_workers: int
    identity_scale: int  # multiplies the segment sizes of the bit-identity input
    sim_steps: int
    sim_h_base: int
    trainer_steps: int
    sft_steps: int
    memory_params: int  # parameters of the model whose outer state is measured
    trainer_fsdp_steps: int


GPU_SIZES = Sizes(
    codec_numel=64 << 20,
    codec_repeats=10,
    sim_workers=4,
    identity_scale=16,
    sim_steps=160,
    sim_h_base=5,
    trainer_steps=40,
    sft_steps=8,
    memory_params=64 << 20,
    trainer_fsdp_steps=16,
)
DRY_RUN_SIZES = Sizes(
    codec_numel=1 << 16,
    codec_repeats=2,
    sim_workers=2,
    identity_scale=1,
    sim_steps=12,
    sim_h_base=2,
    trainer_steps=8,
    sft_steps=4,
    memory_params=1 << 14,
    trainer_fsdp_steps=6,
)


@dataclass
class Context:
    device: Any  # torch.device under test: cuda, or cpu in the dry run
    dry_run: bool
    sizes: Sizes
    workdir: str

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


# ----------------------------------------------------------------- helpers
def synchronize(device: Any) -> None:
    """Wait for the device's queued kernels: CUDA runs asynchronously, so timings need it."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: Any, repeats: int) -> float:
    """Median wall time of ``fn`` after one warm-up, synchronizing the device around each run."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bit_mismatches(a: Any, b: Any) -> int:
    """Elements whose bit patterns differ (NaN == NaN when
    the bits agree); -1 on a dtype or shape mismatch."""
    import torch

    a, b = a.detach().cpu(), b.detach().cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return -1
    as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}
    if a.dtype in as_int:
        a, b = a.view(as_int[a.dtype]), b.view(as_int[b.dtype])
    return int((a != b).sum())


def check_llama(vocab: int, seed: int) -> Any:
    """The checks' tiny Llama: hidden 64, 2 layers, 4 heads, padding id 0."""
    from autoloco_hf.toy.llama import tiny_llama

    return tiny_llama(
        vocab,
        64,
        2,
        4,
        128,
        max_position_embeddings=64,
        seed=seed,
        tie_word_embeddings=False,
        pad_token_id=0,
    )


def padded_batches(count: int, batch: int, seq: int, vocab: int, seed: int) -> list[dict[str, Any]]:
    """Right-padded sequences with a learnable pattern;
    lengths vary, so the token mapper sees real padding."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=gen)
        starts = torch.randint(3, vocab, (batch,), generator=gen)
        positions = torch.arange(seq)
        ids = (starts[:, None] + positions[None, :]) % (vocab - 3) + 3
        mask = (positions[None, :] < lengths[:, None]).long()
        ids = ids * mask  # pad id 0
        labels = ids.masked_fill(mask == 0, -100)
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


# ------------------------------------------------------------------ checks
def check_environment(ctx: Context) -> tuple[Status, str, dict[str, Any]]:
    import torch

    details: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "device": str(ctx.device),
    }
    try:
        import transformers

        details["transformers"] = transformers.__version__
    except ImportError:
        details["transformers"] = None
    if not ctx.cuda:
        return Status.PASS, f"CPU dry run, torch {torch.__version__}", details
    props = torch.cuda.get_device_properties(ctx.device)
    details.update(
        name=props.name,
        capability=f"{props.major}.{props.minor}",
        memory_gib=round(props.total_memory / 2**30, 1),
        multiprocessors=props.multi_processor_count,
        bf16_supported=torch.cuda.is_bf16_supported(),
    )
    if not details["bf16_supported"]:
        return (
            Status.FAIL,
            f"{props.name} has no bf16 support: the recipes' bf16 autocast cannot run",
            details,
        )
    return (
        Status.PASS,
        f"{props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}",
        details,
    )


LOSSY_IDENTITY_WIRES = ("int8", "int4", "fp4", "int2")  # every blockwise wire


def identity_input(scale: int) -> tuple[Any, list[int]]:
    """A flat FP32 buffer over tensors of awkward sizes, with the codec's edge cases in it."""
    import torch

    sizes = [4096 * scale + 1, 1, 123 * scale + 7, 4096 * 3 * scale, 10_000 * scale + 3]
    gen = torch.Generator().manual_seed(0)
    pieces = [torch.randn(n, generator=gen) * 10.0 ** (i * 3 - 6) for i, n in enumerate(sizes)]
    flat = torch.cat(pieces)
    start = sizes[0] + sizes[1] + sizes[2]  # edge cases at the start of a 4096-aligned segment
    flat[start : start + 4096] = 0.0  # an all-zero block: scale 1
    # subnormal-range values: scale clamp
    flat[start + 4096 : start + 4196] = 1e-38 * torch.randn(100, generator=gen)
    # near the FP32 maximum: upper scale clamp, and bf16 overflow to inf
    flat[start + 8192] = 3.0e38
    flat[start + 8193] = -3.0e38
    return flat, sizes


def check_codec_bit_identity(ctx: Context) -> tuple[Status, str, dict[str, Any]]:
    import torch

    from autoloco_hf.wire.codec import WireCodec, gathered_mean, owner_reduce_mean

    flat, sizes = identity_input(ctx.sizes.identity_scale)
    # defined non-finite behaviour of the blockwise wires (NaN a zero code, inf the largest)
    non_finite = flat.clone()
    non_finite[-5:] = torch.tensor([math.nan, math.inf, -math.inf, 1.0, -1.0])
    gen = torch.Generator().manual_seed(1)
    # finite contributions: an overflow to inf could make
    # NaN, whose bit pattern differs between CPU and CUDA
    contributions = [
        (flat * (1.0 + 0.1 * k)).clamp(-3e38, 3e38) + torch.randn(flat.numel(), generator=gen)
        for k in range(4)
    ]
    details: dict[str, Any] = {"elements": flat.numel(), "segments": sizes}
    bad = []
    for wire, x in (("bf16", flat), *((w, non_finite) for w in LOSSY_IDENTITY_WIRES)):
        codec = WireCodec(wire, sizes)
        cpu_wire, dev_wire = codec.encode(x, 0), codec.encode(x.to(ctx.device), 0)
        counts = {
            f"wire{k}": bit_mismatches(c, d) for k, (c, d) in enumerate(zip(cpu_wire, dev_wire))
        }
        counts["decoded"] = bit_mismatches(
            codec.decode(cpu_wire, 0, x.numel()), codec.decode(dev_wire, 0, x.numel())
        )
        for n in (3, 4):  # N = 3: the mean divides by a non-power of two
            cpu_mean = owner_reduce_mean(codec, contributions[:n])
            dev_mean = owner_reduce_mean(codec, [c.to(ctx.device) for c in contributions[:n]])
            counts[f"owner_mean_n{n}"] = bit_mismatches(cpu_mean, dev_mean)
            dev_gathered = gathered_mean(codec, [c.to(ctx.device) for c in contributions[:n]])
            counts[f"gathered_mean_n{n}"] = bit_mismatches(
                gathered_mean(codec, contributions[:n]), dev_gathered
            )
        details[wire] = counts
        bad += [f"{wire}.{k}={v}" for k, v in counts.items() if v != 0]
    if bad:
        return Status.FAIL, "device differs from CPU: " + ", ".join(bad), details
    return (
        Status.PASS,
        f"bf16, {', '.join(LOSSY_IDENTITY_WIRES)} bit-identical on {flat.numel():,} elements "
        "(wire, decode, owner and gathered mean N=3,4)",
        details,
    )


def check_codec_throughput(ctx: Context) -> tuple[Status, str, dict[str, Any]]:
    import torch

    from autoloco_hf.wire.codec import WireCodec

    numel, repeats = ctx.sizes.codec_numel, ctx.sizes.codec_repeats
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0)).to(ctx.device)
    gigabytes = 4 * numel / 1e9  # FP32 bytes in, for every number below
    target = torch.empty_like(x)
    copy_gbs = gigabytes / median_seconds(lambda: target.copy_(x), ctx.device, repeats)
    details: dict[str, Any] = {
        "elements": numel,
        "repeats": repeats,
        "copy_gb_per_s": round(copy_gbs, 2),
        "convention": "FP32 bytes processed per second (a copy reads and "
        "writes: x2 for bus traffic)",
    }
    parts = [f"copy {copy_gbs:.1f} GB/s"]
    for wire in ("bf16", "int8"):
        codec = WireCodec(wire, [numel])
        encoded = codec.encode(x, 0)
        encode_s = median_seconds(lambda c=codec: c.encode(x, 0), ctx.device, repeats)
        decode_s = median_seconds(
            lambda c=codec, e=encoded: c.decode(e, 0, numel), ctx.device, repeats
        )
        both_s = median_seconds(lambda c=codec: c.roundtrip(x, 0), ctx.device, repeats)
        details[wire] = {
            "encode_gb_per_s": round(gigabytes / encode_s, 2),
            "decode_gb_per_s": round(gigabytes / decode_s, 2),
            "encode_decode_gb_per_s": round(gigabytes / both_s, 2),
            "fraction_of_copy": round(gigabytes / both_s / copy_gbs, 4),
            "wire_bytes_per_fp32_byte": codec.wire_bytes(0, numel) / (4 * numel),
        }
        parts.append(f"{wire} enc+dec {gigabytes / both_s:.1f} GB/s")
    return Status.PASS, ", ".join(parts), details


def run_simulated(
    method: str, wire: str, device: Any, sizes: Sizes, model: Any, batches: list, workers: int
) -> dict[str, Any]:
    """Train ``workers`` simulated replicas with bf16 autocast
    on ``device``; return the trajectory and losses."""
    import torch
    from transformers import get_cosine_schedule_with_warmup

    from autoloco_hf import AutoLoCoConfig, LocalWorkers, SimulatedCommunicator

    warmup = max(1, sizes.sim_steps // 20)
    config = AutoLoCoConfig(
        method=method, h_base=sizes.sim_h_base, warmup_steps=warmup, wire_dtype=wire
    )

    def loss_fn(replica: Any, batch: dict[str, Any]) -> Any:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            return replica(**batch).loss

    local = LocalWorkers(
        config,
        copy.deepcopy(model).to(device),
        SimulatedCommunicator(
            workers, wire_dtype=config.wire_dtype, block_size=config.int8_block_size
        ),
        optimizer_factory=lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01),
        total_steps=sizes.sim_steps,
        scheduler_factory=lambda opt: get_cosine_schedule_with_warmup(opt, warmup, sizes.sim_steps),
        loss_fn=loss_fn,
        warmup_steps=warmup,
    )
    losses = []
    for step in range(sizes.sim_steps):
        group = batches[step * workers : (step + 1) * workers]
        local.train_step([{k: v.to(device) for k, v in b.items()} for b in group])
        losses.append(sum(local.last_losses) / len(local.last_losses))
    records = local.engine.records
    tail = losses[-max(1, len(losses) // 4) :]
    return {
        "h_step": [r.h_step for r in records],
        "decisions": [str(r.decision) for r in records],
        "tail_loss": sum(tail) / len(tail),
        "interval_losses": [r.mean_loss for r in records],
        "syncs": local.engine.totals.syncs,
        "params": torch.cat(
            [p.detach().float().reshape(-1).cpu() for p in local.models[0].parameters()]
        ),
    }


def check_simulated_workers(ctx: Context) -> tuple[Status, str, dict[str, Any]]:
    import torch

    workers, vocab = ctx.sizes.sim_workers, 128
    model = check_llama(vocab, seed=0)
    batches = padded_batches(ctx.sizes.sim_steps * workers, batch=8, seq=32, vocab=vocab, seed=1)
    details: dict[str, Any] = {
        "workers": workers,
        "steps": ctx.sizes.sim_steps,
        "h_base": ctx.sizes.sim_h_base,
        "autocast": "bf16",
        "loss_rtol": LOSS_RTOL,
    }
    problems, parts = [], []
    for method, wire in (("diloco", "fp32"), ("autoloco", "fp32"), ("autoloco", "int8")):
        name = f"{method}_{wire}"
        dev = run_simulated(method, wire, ctx.device, ctx.sizes, model, batches, workers)
        ref = run_simulated(method, wire, torch.device("cpu"), ctx.sizes, model, batches, workers)
        rel = abs(dev["tail_loss"] - ref["tail_loss"]) / abs(ref["tail_loss"])
        distance = float((dev["params"] - ref["params"]).norm() / ref["params"].norm())
        same = dev["h_step"] == ref["h_step"]
        details[name] = {
            "same_trajectory": same,
            "device_h_step": dev["h_step"],
            "cpu_h_step": ref["h_step"],
            "device_decisions": dev["decisions"],
            "cpu_decisions": ref["decisions"],
            "device_tail_loss": dev["tail_loss"],
            "cpu_tail_loss": ref["tail_loss"],
            "tail_loss_rel_diff": rel,
            "param_rel_distance": distance,
            "syncs": dev["syncs"],
        }
        if not same:
            first = next(
                i
                for i, (a, b) in enumerate(zip(dev["h_step"] + [None], ref["h_step"] + [None]))
                if a != b
            )
            problems.append(f"{name}: trajectory differs from interval {first}")
        if not math.isfinite(rel) or rel > LOSS_RTOL:
            problems.append(
                f"{name}: tail loss {dev['tail_loss']:.4f} vs CPU {ref['tail_loss']:.4f}"
            )
        parts.append(f"{name} {dev['syncs']} syncs, loss diff {rel:.2%}")
    if problems:
        return Status.FAIL, "; ".join(problems), details
    return Status.PASS, "same trajectories; " + ", ".join(parts), details


def check_trainer_callback(ctx: Context) -> tuple[Status, str, dict[str, Any]]:
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig

    vocab, steps = 128, ctx.sizes.trainer_steps
    data = [
        {k: v[0] for k, v in b.items()}
        for b in padded_batches(steps * 8, batch=1, seq=32, vocab=vocab, seed=2)
    ]
    config = AutoLoCoConfig(method="autoloco", controller="paper", h_base=2, q_h=1, h_max=3)
    callback = AutoLoCoCallback(config)
    out = os.path.join(ctx.workdir, "trainer")
    args = TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=2e-3,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        bf16=ctx.cuda,
        use_cpu=not ctx.cuda,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=check_llama(vocab, seed=0), args=args, train_dataset=data, callbacks=[callback]
    )
    # the losses are in the report; keep the output a table
    for noisy in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(noisy)
    trainer.train()
    engine = callback.engine
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    model_device = next(trainer.model.parameters()).device.type
    outer = getattr(engine, "outer", None)
    details = {
        "steps": steps,
        "syncs": engine.totals.syncs,
        "h_step": [r.h_step for r in engine.records],
        "losses": losses,
        "model_device": model_device,
        "outer_device": str(getattr(outer, "device", "unknown")),
        "bf16": ctx.cuda,
        "records_written": os.path.exists(os.path.join(out, "autoloco_intervals.jsonl")),
    }
    problems = []
    if model_device != ctx.device.type:
        problems.append(f"model ran on {model_device}, expected {ctx.device.type}")
    if engine.totals.syncs < steps // config.h_max:
        problems.append(f"{engine.totals.syncs} syncs in {steps} steps (h_max {config.h_max})")
    if not losses or not all(math.isfinite(v) for v in losses):
        problems.append(f"losses {losses[-3:]}")
    if not details["records_written"]:
        problems.append("no autoloco_intervals.jsonl")
    if problems:
        return Status.FAIL, "; ".join(problems), details
    return (
        Status.PASS,
        f"{engine.totals.syncs} syncs in {steps} steps on {model_device}, "
        f"last loss {losses[-1]:.3f}",
        details,
    )


def sft_inputs(root: str) -> tuple[str, str, str]:
    """A tiny Llama saved like a hub checkpoint with a
    tokenizer trained here, and train/test chat JSONL."""
    from autoloco_hf.toy.llama import tiny_llama
    from autoloco_hf.toy.text import corpus_documents, corpus_text, train_tokenizer

    tokenizer = train_tokenizer(corpus_text()[:60_000], vocab_size=320)
    model = tiny_llama(len(tokenizer), 32, 2, 2, max_position_embeddings=128)
    model_dir = os.path.join(root, "model")
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    docs = corpus_documents()
    paths = []
    for name, offset, count in (("train.jsonl", 0, 24), ("test.jsonl", 40, 6)):
        path = os.path.join(root, name)
        with open(path, "w") as f:
            for i in range(offset, offset + count):
                messages = [
                    {"role": "user", "content": f"Explain part {i} of the Python docs."},
                    {"role": "assistant", "content": docs[i][:200]},
                ]
                f.write(json.dumps({"messages": messages}) + "\n")
        paths.append(path)
    return model_dir, paths[0], paths[1]


def check_sft_recipe(ctx: Context) -> tuple[Status, str, dict[str, Any]]:
    import torch

    root = os.path.join(ctx.workdir, "sft")
    model_dir, train, test = sft_inputs(root)
    spec = importlib.util.spec_from_file_location(
        "sft_ultrachat", os.path.join(REPO, "recipes", "sft_ultrachat.py")
    )
    recipe = importlib.util.module_from_spec(spec)
    # dataclasses look their module up while the recipe is being imported
    sys.modules[spec.name] = recipe
    spec.loader.exec_module(recipe)
    config = "sft_autoloco_int8.yaml"  # INT8 wire, normalization and the outer state in host memory
    argv = [
        "--config",
        os.path.join(REPO, "recipes", "configs", config),
        "--output-dir",
        os.path.join(root, "runs"),
        "--model-name-or-path",
        model_dir,
        "--train-files",
        train,
        "--test-files",
        test,
        "--global-batch-size",
        "4",
        "--per-device-train-batch-size",
        "2",
        "--max-length",
        "64",
        "--max-steps",
        str(ctx.sizes.sft_steps),
        "--learning-rate",
        "1e-3",
        "--dataset-num-proc",
        "1",
        "--eval-batch-size",
        "4",
        "--autoloco",
        "h_base=2",
        "--autoloco",
        "q_h=1",
        "--autoloco",
        "h_max=3",
    ]
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    status = recipe.main(argv)
    run_dir = os.path.join(root, "runs", config.removesuffix(".yaml"))
    # the callback's, extended by the recipe
    with open(os.path.join(run_dir, "autoloco_summary.json")) as f:
        summary = json.load(f)
    details = {
        "exit_status": status,
        "syncs": summary["totals"]["syncs"],
        "test_nll": summary["test_nll"],
        "wire_dtype": summary["config"]["wire_dtype"],
        "outer_on_cpu": summary["config"]["outer_on_cpu"],
        "peak_device_mib": round(torch.cuda.max_memory_allocated(ctx.device) / 2**20, 1)
        if ctx.cuda
        else None,
    }
    problems = []
    if status != 0:
        problems.append(f"exit status {status}")
    if details["syncs"] < 2:
        problems.append(f"{details['syncs']} syncs")
    if not 0 < details["test_nll"] < 20:
        problems.append(f"test NLL {details['test_nll']}")
    if ctx.cuda and not details["peak_device_mib"]:
        problems.append("nothing was allocated on the GPU: the recipe did not run on CUDA")
    if problems:
        return Status.FAIL, "; ".join(problems), details
    return Status.PASS, f"{details['syncs']} syncs, test NLL {details['test_nll']:.3f}", details


def check_outer_state(ctx: Context) -> tuple[Status, str, dict[str, Any]]:
    import torch
    import torch.distributed as dist

    backend = "nccl" if ctx.cuda else "gloo"  # what the recipes initialize
    if ctx.cuda:
        torch.cuda.set_device(ctx.device)
    dist.init_process_group(
        backend, init_method=f"file://{os.path.join(ctx.workdir, 'pg_store')}", rank=0, world_size=1
    )
    width = 4096
    layers = max(1, ctx.sizes.memory_params // (width * width)) if ctx.cuda else 1
    details: dict[str, Any] = {"backend": backend, "world_size": 1}
    problems, parts = [], []
    try:
        for wire in ("fp32", "int8"):
            for on_cpu in (False, True):
                name = f"{wire}_{'outer_on_cpu' if on_cpu else 'outer_on_device'}"
                try:
                    details[name] = measure_outer_state(
                        ctx, wire, on_cpu, layers, width if ctx.cuda else 128
                    )
                except Exception as err:  # keep measuring the other combinations
                    details[name] = {"error": f"{type(err).__name__}: {err}"}
                    problems.append(
                        f"{name}: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
                    )
    finally:
        dist.destroy_process_group()
    for wire in ("fp32", "int8"):
        on_device, on_cpu = details[f"{wire}_outer_on_device"], details[f"{wire}_outer_on_cpu"]
        if "error" in on_device or "error" in on_cpu:
            continue
        if ctx.cuda:
            saved = on_device["peak_extra_mib"] - on_cpu["peak_extra_mib"]
            details[f"{wire}_saved_mib"] = round(saved, 1)
            if saved <= 0:
                problems.append(
                    f"{wire}: outer_on_cpu did not lower peak device memory ({saved:.1f} MiB)"
                )
            parts.append(
                f"{wire}: offload saves {saved:.0f} MiB, sync {on_device['sync_ms']:.1f} vs "
                f"{on_cpu['sync_ms']:.1f} ms"
            )
        else:
            parts.append(
                f"{wire}: sync {on_device['sync_ms']:.1f} vs {on_cpu['sync_ms']:.1f} ms "
                "(peak memory: CUDA only)"
            )
    if problems:
        return Status.FAIL, "; ".join(problems), details
    return Status.PASS, "; ".join(parts), details


def measure_outer_state(
    ctx: Context, wire: str, on_cpu: bool, layers: int, width: int
) -> dict[str, Any]:
    """Peak device memory the engine adds to a model, and its
    sync time, for one outer-state placement."""
    import torch

    from autoloco_hf import AutoLoCoConfig, ProcessGroupCommunicator, make_engine
    from autoloco_hf.algorithm.schedule import FunctionSchedule

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]
    ).to(ctx.device)
    config = AutoLoCoConfig(method="diloco", h_base=1, wire_dtype=wire, outer_on_cpu=on_cpu)
    synchronize(ctx.device)
    if ctx.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)
    before = torch.cuda.memory_allocated(ctx.device) if ctx.cuda else 0
    comm = ProcessGroupCommunicator(wire_dtype=config.wire_dtype, block_size=config.int8_block_size)
    steps = 3
    engine = make_engine(
        config, [model], FunctionSchedule(lambda s: 1e-3, steps), comm, total_steps=steps
    )
    wall = []
    # one sync per step (h_base = 1); the first one warms the kernels and buffers up
    for _ in range(steps):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p), alpha=1e-3)
        synchronize(ctx.device)
        start = time.perf_counter()
        engine.after_optimizer_step(tokens=[1], losses=[1.0])
        # the outer step and the write-back may still be queued when the engine returns
        synchronize(ctx.device)
        wall.append(time.perf_counter() - start)
    outer = getattr(engine, "outer", None)
    result = {
        "params": sum(p.numel() for p in model.parameters()),
        "outer_device": str(getattr(outer, "device", "unknown")),
        "sync_ms": round(1e3 * statistics.median(wall[1:]), 2),
        "engine_sync_ms": round(
            1e3 * statistics.median(r.sync_seconds for r in engine.records[1:]), 2
        ),
        "syncs": engine.totals.syncs,
    }
    if ctx.cuda:
        result["peak_extra_mib"] = round(
            (torch.cuda.max_memory_allocated(ctx.device) - before) / 2**20, 1
        )
        expected = "cpu" if on_cpu else ctx.device.type
        if not result["outer_device"].startswith(expected):
            raise RuntimeError(f"outer state on {result['outer_device']}, expected {expected}")
    del engine, model
    return result


FSDP_STEPS, FSDP_WARMUP = 24, 3  # as tests/integrations/test_fsdp2_workers.py
# TF32-free FP32 on CUDA; reduction orders differ between FSDP's reduce-scatter and one batch
FSDP_RTOL = 1e-3
# FSDP2 vs DDP under the Trainer: same math, other reduction orders, 16 AdamW steps
TRAINER_FSDP_PARAM_ATOL = 2e-3
Layout = tuple[int, int]  # (workers, ranks per worker)


def worst_line(layout: str, worst: dict[str, float]) -> str:
    """One layout's largest D_t/C_t and parameter differences, for a step's one-line result."""
    return (
        f"{layout}, D_t/C_t rel diff <= {max(worst['drift_energy'], worst['coherence']):.1e}, "
        f"params <= {worst['params']:.1e}"
    )


def fsdp_layouts(devices: int) -> list[Layout]:
    """The worker layouts ``devices`` GPUs run with one rank
    each (NCCL refuses two ranks on one GPU).

    4 or more: 2 workers x 2 ranks (sharded workers synced shard by shard); 2 or 3: 1 worker x 2
    ranks (the sharding, its partial sums inside the worker) and 2 workers x 1 rank (the outer
    collective over local shards); 1: none.
    """
    if devices >= 4:
        return [(2, 2)]
    if devices >= 2:
        return [(1, 2), (2, 1)]
    return []


def _layout_name(layout: Layout) -> str:
    return f"{layout[0]}x{layout[1]}"


def _join_ranks(fn: Callable[..., None], world: int, args: tuple) -> None:
    """Run ``fn(rank, *args)`` in ``world`` spawned processes
    and wait (a rank's exception fails the check)."""
    import torch.multiprocessing as mp

    mp.start_processes(fn, args=args, nprocs=world, start_method="spawn")


def _free_port() -> int:
    """A TCP port that was free a moment ago, for a launch's rendezvous (torchrun's MASTER_PORT)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_device(rank: int, device_type: str) -> Any:
    """This rank's device: its own GPU (NCCL), or the CPU with one thread per process (gloo)."""
    import torch

    if device_type == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    torch.set_num_threads(1)
    return torch.device("cpu")


def _leave(rank_file: str, result: dict[str, Any]) -> None:
    """Write a rank's result and exit without interpreter
    finalization (a joinable C++ thread can abort it)."""
    import torch

    torch.save(result, rank_file)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class _ToyLM:
    """Embedding -> MLP -> logits, every dim 0 even (exact
    FSDP halves); built lazily so torch loads late."""

    @staticmethod
    def build(device: Any) -> Any:
        import torch

        class ToyLM(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = torch.nn.Embedding(32, 16)
                self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh())
                self.head = torch.nn.Linear(16, 32)

            def forward(self, input_ids, labels):
                logits = self.head(self.mlp(self.embed(input_ids)))
                return torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, 32), labels[:, 1:].reshape(-1)
                )

        torch.manual_seed(0)
        return ToyLM().to(device)


def _fsdp_batch(shard: int, step: int, device: Any) -> dict[str, Any]:
    """Rank ``shard``'s batch (shard = R * worker +
    rank_in_worker) at ``step``: same on every device."""
    import torch

    g = torch.Generator().manual_seed(1000 * shard + step)
    ids = torch.randint(0, 32, (4, 12), generator=g)
    ids[:, 1::2] = (ids[:, 0::2] + 1) % 32
    return {"input_ids": ids.to(device), "labels": ids.to(device)}


def _fsdp2_rank(rank: int, layout: Layout, store: str, out_dir: str, device_type: str) -> None:
    """One rank of ``workers`` x FSDP2 over ``R`` devices: trains,
    syncs its shard, writes its records and full model."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from autoloco_hf import AutoLoCoConfig
    from autoloco_hf.algorithm.schedule import FunctionSchedule
    from autoloco_hf.integrations.groups import build_topology, worker_mesh
    from autoloco_hf.integrations.runtime import WorkerRuntime

    workers, r = layout
    device = _rank_device(rank, device_type)
    dist.init_process_group(
        "nccl" if device_type == "cuda" else "gloo",
        init_method=store,
        rank=rank,
        world_size=workers * r,
    )
    try:
        topo = build_topology(r)
        model = _ToyLM.build(device)
        mesh = worker_mesh(r, device_type)
        for module in (model.embed, model.mlp, model.head):
            fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.0)
        config = AutoLoCoConfig(
            method="autoloco", controller="paper", h_base=4, q_h=2, h_max=8, ranks_per_worker=r
        )
        runtime = WorkerRuntime(
            config,
            model,
            model,
            optimizer,
            FunctionSchedule(lambda s: 3e-2, FSDP_STEPS),
            FSDP_STEPS,
            FSDP_WARMUP,
            topology=topo,
        )
        for step in range(FSDP_STEPS):
            loss = model(**_fsdp_batch(rank, step, device))
            loss.backward()
            # the forward hooks count the input_ids
            runtime.meter.add_external(loss=float(loss.detach()))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            runtime.after_optimizer_step(3e-2)
        result = {
            "records": [rec.__dict__.copy() for rec in runtime.engine.records],
            "full": [p.full_tensor().detach().cpu() for p in model.parameters()],
            "outer_numel": runtime.engine.outer.numel,
        }
        dist.barrier()
    finally:
        dist.destroy_process_group()
    _leave(os.path.join(out_dir, f"fsdp_{_layout_name(layout)}_rank{rank}.pt"), result)


def compare_fsdp_layout(ctx: Context, layout: Layout) -> tuple[list[str], dict[str, Any]]:
    """Run ``layout`` as FSDP2 workers and compare every rank
    with single-device workers on the same data."""
    import torch

    from autoloco_hf import AutoLoCoConfig
    from autoloco_hf.algorithm.schedule import FunctionSchedule
    from autoloco_hf.sync.communicators import SimulatedCommunicator
    from autoloco_hf.sync.schedules.factory import make_engine

    workers, r = layout
    world, name = workers * r, _layout_name(layout)
    store = f"file://{os.path.join(ctx.workdir, f'fsdp_store_{name}')}"
    _join_ranks(_fsdp2_rank, world, (layout, store, ctx.workdir, ctx.device.type))
    ranks = [
        torch.load(os.path.join(ctx.workdir, f"fsdp_{name}_rank{k}.pt"), weights_only=False)
        for k in range(world)
    ]

    # reference: single-device workers, each on its FSDP counterpart's R batches concatenated
    models = [_ToyLM.build(ctx.device) for _ in range(workers)]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=3e-2, weight_decay=0.0) for m in models]
    config = AutoLoCoConfig(method="autoloco", controller="paper", h_base=4, q_h=2, h_max=8)
    engine = make_engine(
        config,
        models,
        FunctionSchedule(lambda s: 3e-2, FSDP_STEPS),
        SimulatedCommunicator(workers),
        FSDP_STEPS,
        warmup_steps=FSDP_WARMUP,
    )
    for step in range(FSDP_STEPS):
        losses = []
        for w, (model, optimizer) in enumerate(zip(models, optimizers)):
            parts = [_fsdp_batch(r * w + k, step, ctx.device) for k in range(r)]
            loss = model(**{key: torch.cat([p[key] for p in parts]) for key in parts[0]})
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        engine.after_optimizer_step(tokens=[r * 4 * 12] * workers, losses=losses, lr=3e-2)
    expected = [rec.__dict__ for rec in engine.records]
    numel = sum(p.numel() for p in models[0].parameters())
    problems, worst = [], {"drift_energy": 0.0, "coherence": 0.0, "params": 0.0}
    for rank, result in enumerate(ranks):
        got = result["records"]
        if [(g["start_step"], g["h_step"]) for g in got] != [
            (e["start_step"], e["h_step"]) for e in expected
        ]:
            problems.append(f"{name} rank {rank}: horizon trajectory differs")
            continue
        for mine, ref in zip(got, expected):
            for key in ("drift_energy", "coherence"):
                worst[key] = max(worst[key], abs(mine[key] - ref[key]) / max(abs(ref[key]), 1e-12))
            if mine["wire_bytes"] * r != ref["wire_bytes"]:
                problems.append(
                    f"{name} rank {rank}: {mine['wire_bytes']} wire bytes, "
                    f"expected {ref['wire_bytes']}/{r}"
                )
        if result["outer_numel"] != numel // r:
            problems.append(
                f"{name} rank {rank}: outer state of {result['outer_numel']} "
                f"elements, expected {numel // r}"
            )
        for p, q in zip(result["full"], models[rank // r].parameters()):
            worst["params"] = max(worst["params"], float((p - q.detach().cpu()).abs().max()))
    if max(worst["drift_energy"], worst["coherence"]) > FSDP_RTOL:
        problems.append(
            f"{name}: D_t/C_t differ by up to {max(worst['drift_energy'], worst['coherence']):.2e}"
        )
    return problems, {
        "intervals": len(expected),
        "h_step": [e["h_step"] for e in expected],
        "worst": worst,
    }


def check_fsdp2_workers(ctx: Context) -> tuple[Status, str, dict[str, Any]]:
    """FSDP2 workers (NCCL) == single-device workers on the
    same data, in every layout the GPUs allow.

    The dry run runs 1 worker x 2 ranks over gloo on CPU;
    tests/integrations/test_fsdp2_workers.py runs 2 x 2.
    """
    import torch

    devices = torch.cuda.device_count() if ctx.cuda else 2
    # the dry run: the sharding, over gloo
    layouts = fsdp_layouts(devices) if ctx.cuda else [(1, 2)]
    if not layouts:
        raise Skip(
            "FSDP2 workers over NCCL need at least 2 GPUs (one rank per GPU: NCCL refuses two "
            f"ranks on one GPU); this machine has {devices}. trainer_fsdp2 runs FSDP2 on one GPU; "
            "on CPU the 2 workers x 2 ranks equality runs over gloo in "
            "tests/integrations/test_fsdp2_workers.py"
        )
    problems, details, parts = [], {"devices": devices}, []
    for layout in layouts:
        found, info = compare_fsdp_layout(ctx, layout)
        problems += found
        details[_layout_name(layout)] = info
        worst = info["worst"]
        parts.append(
            worst_line(f"{layout[0]} worker(s) x {layout[1]}: {info['intervals']} intervals", worst)
        )
    if problems:
        return Status.FAIL, "; ".join(problems[:4]), details
    return (
        Status.PASS,
        "same horizons, bytes and outer state per rank 1/R; " + "; ".join(parts),
        details,
    )


class FsdpMode(str, Enum):
    # accelerate's FSDP2 plugin (the model sharded per worker first when there are several)
    FSDP2 = "fsdp2"
    DDP = "ddp"  # the reference: the same workers as DDP groups, same data order


def trainer_layouts(devices: int) -> list[Layout]:
    """Layouts for the Trainer's FSDP2 run: those of
    :func:`fsdp_layouts`, or one worker of one GPU."""
    return fsdp_layouts(devices) or [(1, 1)]


def trainer_fsdp2_data(steps: int, world: int) -> list[dict[str, Any]]:
    """Unpadded rows (every rank's loss averages the same
    number of tokens, as FSDP's and DDP's means assume)."""
    import torch

    g = torch.Generator().manual_seed(3)
    rows = []
    for _ in range(steps * world * 4):
        ids = torch.randint(3, 128, (32,), generator=g)
        ids[1::2] = (ids[0::2] + 1) % 125 + 3
        rows.append({"input_ids": ids, "labels": ids.clone()})
    return rows


def _trainer_run(
    mode: FsdpMode, layout: Layout, steps: int, out: str, device_type: str
) -> dict[str, Any]:
    """One Trainer + AutoLoCoCallback run of this rank;
    ``{"refused": message}`` when the callback refuses it."""
    import torch
    from torch.distributed.tensor import DTensor
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
    from autoloco_hf.errors import AutoLoCoConfigurationError
    from autoloco_hf.integrations.groups import shard_worker

    workers, r = layout
    fsdp = dict(fsdp=True, fsdp_config={"version": 2}) if mode is FsdpMode.FSDP2 else {}
    args = TrainingArguments(
        output_dir=os.path.join(out, mode.value),
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        use_cpu=device_type == "cpu",
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **fsdp,
    )
    _ = args.device  # the process group and this rank's device, before the worker mesh is built
    model = check_llama(128, seed=0)
    # several workers: each sharded over its own ranks first
    if mode is FsdpMode.FSDP2 and workers > 1:
        model = shard_worker(model, r, device_type)
    callback = AutoLoCoCallback(
        AutoLoCoConfig(
            method="autoloco", controller="paper", h_base=2, q_h=1, h_max=4, ranks_per_worker=r
        )
    )
    try:
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=trainer_fsdp2_data(steps, workers * r),
            callbacks=[callback],
        )
    except AutoLoCoConfigurationError as err:
        return {"refused": str(err)}
    for noisy in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(noisy)
    trainer.train()
    params = list(trainer.model.parameters())
    return {
        "fsdp_enabled": bool(trainer.is_fsdp_enabled),
        "sharded": all(isinstance(p, DTensor) for p in params),
        "records": [rec.__dict__.copy() for rec in callback.engine.records],
        "full": [
            (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().cpu()
            for p in params
        ],
        "outer_numel": callback.engine.outer.numel,
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "device": str(params[0].device),
        "dtype": str(params[0].dtype),
        "peak_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1)
        if device_type == "cuda"
        else None,
    }


def _trainer_fsdp2_rank(
    rank: int, mode: FsdpMode, layout: Layout, port: int, steps: int, out_dir: str, device_type: str
) -> None:
    """One rank of a Trainer launch (torchrun's environment) in ``mode``.

    Each mode gets processes of its own: accelerate leaves ``ACCELERATE_USE_FSDP=true`` in the
    environment once an FSDP plugin is used, and a later ``Accelerator`` in the same process builds
    a default plugin (FSDP1) from it.
    """
    workers, r = layout
    world = workers * r
    _rank_device(rank, device_type)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    result = _trainer_run(mode, layout, steps, out_dir, device_type)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    _leave(
        os.path.join(out_dir, f"trainer_{_layout_name(layout)}_{mode.value}_rank{rank}.pt"), result
    )


def check_trainer_fsdp2(ctx: Context) -> tuple[Status, str, dict[str, Any]]:
    """``Trainer`` + ``AutoLoCoCallback`` + accelerate's FSDP2
    plugin == the same workers as DDP under the Trainer.

    On GPUs: every layout the devices allow (one GPU: one worker of one rank, sharded by
    the plugin itself; several workers: sharded per worker by ``shard_worker`` first).
    Same horizons, ``D_t`` / ``C_t`` within ``FSDP_RTOL``, parameters within
    ``TRAINER_FSDP_PARAM_ATOL``. On CPU accelerate has no FSDP: the dry run checks that
    the callback refuses the sharded model in one line and that the DDP reference trains.
    """
    import torch

    devices = torch.cuda.device_count() if ctx.cuda else 2
    layouts = trainer_layouts(devices) if ctx.cuda else [(2, 1)]
    steps = ctx.sizes.trainer_fsdp_steps
    problems, details, parts = [], {"devices": devices, "steps": steps}, []
    for layout in layouts:
        workers, r = layout
        name = _layout_name(layout)
        for mode in FsdpMode:
            launch = (mode, layout, _free_port(), steps, ctx.workdir, ctx.device.type)
            _join_ranks(_trainer_fsdp2_rank, workers * r, launch)
        ranks = [
            {
                mode.value: torch.load(
                    os.path.join(ctx.workdir, f"trainer_{name}_{mode.value}_rank{k}.pt"),
                    weights_only=False,
                )
                for mode in FsdpMode
            }
            for k in range(workers * r)
        ]
        if not ctx.cuda:
            refusals = [res["fsdp2"].get("refused", "") for res in ranks]
            ddp_syncs = [len(res["ddp"]["records"]) for res in ranks]
            if (
                not all("accelerate did not enable FSDP" in m for m in refusals)
                or min(ddp_syncs) < 2
            ):
                return (
                    Status.FAIL,
                    f"CPU: refusals {refusals!r}, DDP reference syncs {ddp_syncs}",
                    details,
                )
            raise Skip(
                "accelerate has no FSDP on CPU (AcceleratorState sets the FSDP type for GPU-like "
                "devices only): the callback refused the sharded model in one line and the DDP "
                f"reference trained ({ddp_syncs[0]} syncs)"
            )
        worst = {"drift_energy": 0.0, "coherence": 0.0, "params": 0.0}
        for rank, res in enumerate(ranks):
            fsdp, ddp = res["fsdp2"], res["ddp"]
            if "refused" in fsdp or "refused" in ddp:
                problems.append(
                    f"{name} rank {rank}: refused: {fsdp.get('refused') or ddp.get('refused')}"
                )
                continue
            if not (fsdp["fsdp_enabled"] and fsdp["sharded"]) or fsdp["dtype"] != "torch.float32":
                problems.append(
                    f"{name} rank {rank}: FSDP2 {fsdp['fsdp_enabled']}, DTensors {fsdp['sharded']}"
                )
            a, b = fsdp["records"], ddp["records"]
            if [(x["start_step"], x["h_step"]) for x in a] != [
                (x["start_step"], x["h_step"]) for x in b
            ] or not a:
                problems.append(
                    f"{name} rank {rank}: horizons {[x['h_step'] for x in a]} vs DDP "
                    f"{[x['h_step'] for x in b]}"
                )
                continue
            for mine, ref in zip(a, b):
                for key in ("drift_energy", "coherence"):
                    worst[key] = max(
                        worst[key], abs(mine[key] - ref[key]) / max(abs(ref[key]), 1e-12)
                    )
            for p, q in zip(fsdp["full"], ddp["full"]):
                worst["params"] = max(worst["params"], float((p - q).abs().max()))
        if (
            max(worst["drift_energy"], worst["coherence"]) > FSDP_RTOL
            or worst["params"] > TRAINER_FSDP_PARAM_ATOL
        ):
            problems.append(f"{name}: worst differences {worst}")
        good = [res["fsdp2"] for res in ranks if "records" in res["fsdp2"]]
        details[name] = {
            "worst": worst,
            "h_step": [x["h_step"] for x in good[0]["records"]] if good else [],
            "outer_numel": [res["outer_numel"] for res in good],
            "peak_mib": [res["peak_mib"] for res in good],
            "losses": good[0]["losses"] if good else [],
        }
        parts.append(
            worst_line(f"{workers} worker(s) x {r}: {len(details[name]['h_step'])} syncs", worst)
        )
    if problems:
        return Status.FAIL, "; ".join(problems[:4]), details
    return Status.PASS, "Trainer FSDP2 == DDP: " + "; ".join(parts), details


CHECKS: list[tuple[str, Callable[[Context], tuple[Status, str, dict[str, Any]]]]] = [
    ("environment", check_environment),
    ("codec_bit_identity", check_codec_bit_identity),
    ("codec_throughput", check_codec_throughput),
    ("simulated_workers", check_simulated_workers),
    ("trainer_callback", check_trainer_callback),
    ("sft_recipe", check_sft_recipe),
    ("outer_state", check_outer_state),
    ("fsdp2_workers", check_fsdp2_workers),
    ("trainer_fsdp2", check_trainer_fsdp2),
]


def run_check(
    name: str, fn: Callable[[Context], tuple[Status, str, dict[str, Any]]], ctx: Context
) -> CheckResult:
    """Run one check; an exception is a failure with its
    message, :class:`Skip` a skip with its reason."""
    start = time.perf_counter()
    try:
        status, summary, details = fn(ctx)
    except Skip as reason:
        status, summary, details = Status.SKIP, str(reason), {}
    except (Exception, SystemExit) as err:  # SystemExit: the recipe's argument parser
        status, summary = (
            Status.FAIL,
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300],
        )
        details = {"traceback": traceback.format_exc()[-4000:]}
    return CheckResult(name, status, round(time.perf_counter() - start, 2), summary, details)


def print_table(results: list[CheckResult]) -> None:
    width = max(len(r.name) for r in results)
    print(f"{'check':<{width}}  status  seconds  summary")
    for r in results:
        print(f"{r.name:<{width}}  {r.status.value:<6}  {r.seconds:>7.1f}  {r.summary}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        default="gpu_check.json",
        help="where the JSON report goes (default gpu_check.json)",
    )
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="run every step on CPU at tiny sizes; CUDA-only measurements "
        "are skipped with a reason",
    )
    parser.add_argument(
        "--only", help=f"comma-separated subset of: {', '.join(name for name, _ in CHECKS)}"
    )
    args = parser.parse_args(argv)
    known = [name for name, _ in CHECKS]
    if args.only:
        unknown = sorted(set(args.only.split(",")) - set(known))
        if unknown:
            parser.error(
                f"--only {args.only!r}: unknown check(s) {unknown}; choose from {', '.join(known)}"
            )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu_dry_run:
        # before torch touches CUDA: the recipe picks CUDA when it sees one
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        import autoloco_hf  # noqa: F401
    except ImportError:  # a bare checkout on a lent GPU machine, where the project is not installed
        sys.path.insert(0, REPO)
    import torch

    if args.cpu_dry_run:
        torch.set_num_threads(1)  # tiny models on a shared CI runner: threads only add contention
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        print(
            "gpu_check: no CUDA device is visible; on a CPU machine run with --cpu-dry-run",
            file=sys.stderr,
        )
        return 2
    selected = [(n, fn) for n, fn in CHECKS if not args.only or n in args.only.split(",")]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as workdir:
        ctx = Context(
            device, args.cpu_dry_run, DRY_RUN_SIZES if args.cpu_dry_run else GPU_SIZES, workdir
        )
        results = []
        for name, fn in selected:
            results.append(run_check(name, fn, ctx))
            print(
                f"[{time.perf_counter() - started:6.1f} s] {name}: {results[-1].status.value}",
                flush=True,
            )
    total = time.perf_counter() - started
    failed = [r.name for r in results if r.status == Status.FAIL]
    report = {
        "mode": "cpu-dry-run" if args.cpu_dry_run else "gpu",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "total_seconds": round(total, 1),
        "within_time_budget": total <= TIME_BUDGET_S,
        "passed": not failed,
        "failed": failed,
        "checks": [{**asdict(r), "status": r.status.value} for r in results],
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print()
    print_table(results)
    print(
        f"\n{len(results) - len(failed)} of {len(results)} checks did not fail, {total:.0f} "
        f"s{'' if total <= TIME_BUDGET_S else f' (over the {TIME_BUDGET_S} s budget)'}; report: "
        f"{args.out}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
