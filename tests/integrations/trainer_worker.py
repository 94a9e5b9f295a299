"""One rank of a Trainer + AutoLoCoCallback run on a tiny
Llama (launched by torchrun from the tests).

Usage: ``torchrun --nproc_per_node N tests/integrations/trainer_worker.py SPEC.json``. The
spec (JSON) sets method, h_base, steps, gradient accumulation, seeds, worker
groups, checkpointing, and where to write ``result_rank{r}.pt``:

* ``fingerprints``: per optimizer step, a float64 fingerprint of this rank's
  parameters taken after the AutoLoCo callback ran (after a sync: theta_{t+1});
* ``synced``: whether that step closed an interval; ``showing``: whether the
  model held theta_t then because the Trainer was about to save a checkpoint;
* ``collectives``: every ``torch.distributed`` collective called during
  training (name, bytes, step), so tests can prove that only syncs carry
  model-sized data; ``hook``: the DDP comm hook's own counters;
* ``params``: the final parameters; ``totals`` / ``records``: the engine's.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import logging
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

# ----------------------------------------------------------------
# collective counter (before anything imports dist)
COLLECTIVES: list[tuple[str, int, int, str]] = []
PHASE = {"train": False, "step": 0}
_NAMES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "all_to_all",
    "reduce",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "barrier",
)


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    return 0


def _wrap(name, fn):
    @functools.wraps(fn)
    def counted(*args, **kwargs):
        if PHASE["train"]:
            size = max([_nbytes(a) for a in args] + [_nbytes(v) for v in kwargs.values()] + [0])
            caller = traceback.extract_stack(limit=2)[0]  # the direct caller of the collective
            where = f"{os.path.basename(caller.filename)}:{caller.name}"
            COLLECTIVES.append((name, size, PHASE["step"], where))
        return fn(*args, **kwargs)

    return counted


for _name in _NAMES:
    for _mod in (dist, dist.distributed_c10d):
        if hasattr(_mod, _name):
            setattr(_mod, _name, _wrap(_name, getattr(_mod, _name)))

torch.set_num_threads(1)

from fault_injection import fault_callbacks  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig  # noqa: E402
from autoloco_hf.integrations.trainer.resume import last_complete_checkpoint  # noqa: E402
from autoloco_hf.toy.llama import tiny_llama  # noqa: E402
from autoloco_hf.toy.padded import LLAMA, PaddedTokens  # noqa: E402


def simulated_twin(config: AutoLoCoConfig, steps: int):
    """``LocalWorkers`` with 2 simulated workers set up as this script's Trainer is by default.

    The Trainer's default optimizer (``optim="adamw_torch_fused"``,
    weight decay 0.0), lr 3e-3, cosine schedule with 2 warm-up steps:
    fed the batches each rank consumed, it must give the Trainer's bits.
    """
    from transformers import get_cosine_schedule_with_warmup

    from autoloco_hf.sync.communicators import SimulatedCommunicator
    from autoloco_hf.sync.workers.local_workers import LocalWorkers

    torch.set_num_threads(1)
    return LocalWorkers(
        config,
        tiny_llama(**LLAMA, seed=0),
        SimulatedCommunicator(2),
        optimizer_factory=lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.0, fused=True),
        scheduler_factory=lambda opt: get_cosine_schedule_with_warmup(opt, 2, steps),
        total_steps=steps,
        warmup_steps=2,
    )


def fingerprint(model: torch.nn.Module) -> float:
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    w = torch.linspace(-1.0, 1.0, flat.numel(), dtype=torch.float64)
    return float(torch.dot(flat, w))


class Probe(TrainerCallback):
    """Test-only: fingerprints after every step (after
    AutoLoCo), phase flags, optional interruption."""

    def __init__(
        self,
        autoloco: AutoLoCoCallback,
        stop_at: int | None,
        record_batches: bool = False,
        kill_at: int | None = None,
    ) -> None:
        self.autoloco = autoloco
        self.record_batches = record_batches
        self.stop_at = stop_at
        self.kill_at = kill_at
        self.fingerprints: list[float] = []
        self.synced: list[bool] = []
        # the model holds theta_t for a checkpoint being written at this step
        self.showing: list[bool] = []
        self.batches: list = []
        self.lrs: list[float] = []
        self.begin: dict = {}
        self._syncs = 0
        self.sleep = 0.0

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        PHASE["train"] = True
        PHASE["step"] = state.global_step
        engine = self.autoloco.engine
        self.begin = {  # right after AutoLoCo's on_train_begin (a resume included)
            "step": state.global_step,
            "params": [p.detach().clone() for p in model.parameters()],
            "optimizer_state": len(optimizer.state_dict()["state"]),
            "boundary_state": copy.deepcopy(engine.boundary_state())
            if engine.outer is not None
            else None,
        }
        # one line per rank and launch
        with open(os.path.join(args.output_dir, "attempts.jsonl"), "a") as f:
            rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
            f.write(json.dumps({"rank": rank, "world": world, "step": state.global_step}) + "\n")
        if self.record_batches:
            model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        if module.training:
            self.batches.append(
                {k: kwargs[k].detach().clone() for k in ("input_ids", "attention_mask", "labels")}
            )

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        time.sleep(self.sleep)  # a slower rank: inside the step AutoLoCo times (pacing="budget")

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.lrs.append(optimizer.param_groups[0]["lr"])

    def on_step_end(self, args, state, control, model=None, **kwargs):
        engine = self.autoloco.engine
        syncs = engine.totals.syncs
        self.synced.append(syncs != self._syncs)
        self.showing.append(self.autoloco.runtime.shows_global_parameters)
        self._syncs = syncs
        self.fingerprints.append(fingerprint(model))
        PHASE["step"] = state.global_step
        if self.stop_at is not None and state.global_step >= self.stop_at:
            control.should_training_stop = True
        if self.kill_at is not None and state.global_step == self.kill_at:
            os._exit(17)  # a worker dies mid-interval (no cleanup, like a crash or SIGKILL)

    def on_train_end(self, args, state, control, **kwargs):
        PHASE["train"] = False


class Lines(logging.Handler):
    """Test-only: the autoloco_hf log lines this rank lets
    through (its level is the callback's to set)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    lines = Lines()
    logging.getLogger("autoloco_hf").addHandler(lines)
    rank = int(os.environ.get("RANK", "0"))
    steps, accum, batch = spec["steps"], spec.get("accum", 1), spec.get("batch", 4)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = tiny_llama(**LLAMA, seed=spec.get("model_seed", 0))
    data = PaddedTokens(steps * accum * batch * world, seed=spec.get("data_seed", 1))
    # "autoloco_rank": per-rank overrides, to force workers to disagree (a misconfigured launch)
    config = AutoLoCoConfig(
        **{**spec["autoloco"], **spec.get("autoloco_rank", {}).get(str(rank), {})}
    )
    callback = AutoLoCoCallback(config)
    # "kill": {"rank": r, "step": s} makes rank r die at step s on the launcher's first attempt
    kill = spec.get("kill")
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    kill_at = kill["step"] if kill and first_attempt and kill["rank"] == rank else None
    probe = Probe(callback, spec.get("stop_at"), spec.get("record_batches", False), kill_at)
    probe.sleep = spec.get("sleep", {}).get(str(rank), 0.0)  # "sleep": {rank: seconds per step}
    args = TrainingArguments(
        output_dir=spec["output_dir"],
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accum,
        max_steps=steps,
        learning_rate=spec.get("lr", 3e-3),
        lr_scheduler_type=spec.get("scheduler", "cosine"),
        warmup_steps=spec.get("warmup", 2),
        max_grad_norm=spec.get("max_grad_norm", 1.0),
        logging_steps=spec.get("logging_steps", 1000),
        eval_strategy="steps" if spec.get("eval_steps") else "no",
        eval_steps=spec.get("eval_steps"),
        save_strategy="steps" if spec.get("save_steps") else "no",
        save_steps=spec.get("save_steps") or 500,
        report_to=[],
        use_cpu=True,
        seed=spec.get("seed", 42),
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    before, after = fault_callbacks(spec, rank, callback)
    eval_data = PaddedTokens(8 * world, seed=7) if spec.get("eval_steps") else None
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data,
        eval_dataset=eval_data,
        callbacks=[*before, callback, probe, *after],
    )
    # "resume_from": a folder or True; "resume_last": what a restartable script
    # does (fresh start, else resume) "resume_point": the same with boundary
    # snapshots (AutoLoCoConfig.snapshot_dir), any number of processes
    if spec.get("resume_point"):
        resume = callback.resume_point()
    elif spec.get("resume_last"):
        resume = last_complete_checkpoint(spec["output_dir"])
    else:
        resume = spec.get("resume_from")
    trainer.train(resume_from_checkpoint=resume)
    runtime = callback.runtime
    hook = runtime.gradient_traffic
    result = {
        "rank": rank,
        "world": world,
        "fingerprints": probe.fingerprints,
        "synced": probe.synced,
        "showing": probe.showing,
        "collectives": COLLECTIVES,
        "hook": None
        if hook is None
        else {
            "buckets": hook.buckets,
            "local_bytes": hook.local_bytes,
            "group_bytes": hook.group_bytes,
        },
        "model_bytes": sum(p.numel() * 4 for p in model.parameters()),
        "params": [p.detach().clone() for p in trainer.model.parameters()],
        "totals": runtime.engine.totals.as_dict(),
        "records": [r.__dict__.copy() for r in runtime.engine.records],
        "log_history": trainer.state.log_history,
        "global_step": trainer.state.global_step,
        "optimizer_steps": len(probe.lrs),
        "forwards": runtime.meter.forwards,
        "batches": probe.batches,
        "lrs": probe.lrs,
        "begin": probe.begin,
        "ddp_forward_sync_buffers": getattr(runtime.ddp, "forward_sync_buffers", None),
        "ddp_find_unused_parameters": getattr(runtime.ddp, "find_unused_parameters", None),
        # the hooks DDP's reducer calls instead of its built-in gradient all-reduce
        "ddp_comm_hooks": [hook.__name__ for hook, _ in getattr(runtime.ddp, "_comm_hooks", [])],
        "snapshots": after[0].snapshots if after else None,
        "log_lines": lines.lines,
    }
    torch.save(result, os.path.join(spec["output_dir"], f"result_rank{rank}.pt"))


def exit_after_a_clean_run() -> None:
    """Leave without interpreter finalization once the rank's
    result is saved (as tests/_dist.py does).

    A C++ thread still joinable when static objects are destroyed at exit aborts
    the process (SIGABRT) after a successful run, which torchrun reports as a
    failed rank (seen once in a full-suite run on a loaded machine, rank 1 of
    test_int8_wire_through_the_trainer, after training had finished).
    """
    if dist.is_initialized():
        # nobody leaves while a peer is still in a collective; bounded, as a peer may have failed
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
        except RuntimeError:
            pass  # that peer's own exit status reports it
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
    exit_after_a_clean_run()
