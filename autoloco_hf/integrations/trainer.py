"""``AutoLoCoCallback``: AutoLoCo / DiLoCo / QSR / Linear Interval for any ``Trainer`` or TRL ``SFTTrainer``.

Three lines::

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[AutoLoCoCallback(AutoLoCoConfig(method="autoloco", h_base=100))])
    trainer.train()

Launch one process per worker (``torchrun --nproc_per_node N train.py`` or
``accelerate launch --multi_gpu --num_processes N train.py``). What the
callback does:

* ``on_init_end``: binds to the Trainer being built (or call
  ``callback.attach(trainer)`` after ``trainer.add_callback(callback)``), rejects configurations it does not
  support (FSDP1, DeepSpeed, DataParallel, the silent "every rank trains alone"
  launch), and switches off what would add per-step traffic:
  ``average_tokens_across_devices`` (a per-step gather; under AutoLoCo it
  would also scale every rank's loss by the world size) and DDP's
  ``find_unused_parameters`` / buffer broadcast (unless the user set them).
* ``on_train_begin``: replaces DDP's gradient all-reduce by a comm hook that
  keeps gradients local (or averages them inside a worker group), hooks the
  model's forward to count non-padding tokens and read the loss, builds the
  interval engine over the Trainer's LR scheduler, and on resume loads this
  rank's AutoLoCo state from the checkpoint.
* ``on_optimizer_step`` / ``on_step_end``: once per true optimizer step (after
  gradient accumulation) feeds the engine; at a boundary the engine averages
  pseudo-gradients, applies the outer step and writes ``theta_{t+1}`` into the
  model, and the callback appends one JSONL line to
  ``<output_dir>/autoloco_intervals.jsonl`` and logs ``autoloco/*`` through
  ``Trainer.log`` (so every ``report_to`` tracker receives every sync); the
  console only shows a one-field summary (``autoloco``: syncs, H, mu, eta,
  payload) on the Trainer's own ``logging_steps`` cadence.
* ``on_log`` / ``on_train_end``: the main process keeps
  ``<output_dir>/autoloco_steps.jsonl`` (loss, LR, syncs, bytes at each
  logged step) and writes ``<output_dir>/autoloco_summary.json``, so
  ``autoloco report <output_dir>`` works on a Trainer run. A run that stops
  before its planned last step gets a warning: its weights are a rank's local
  ones, not a synchronized model.
* when the Trainer saves: the model holds the last synchronized parameters
  ``theta_t`` while the Trainer writes the checkpoint (so evaluating, pushing or
  serving any checkpoint gives the model the workers agreed on), and
  ``on_save`` writes ``<checkpoint>/autoloco/rank{r}.pt`` on every rank: the
  engine (outer parameters, momentum, controller, token mapper, interval in
  flight, accounting) plus this rank's local replica and inner optimizer
  state, which differ between ranks mid-interval while the Trainer saves only
  rank 0's (an atomic, versioned, checksummed file: ``autoloco_hf.sync.checkpoint``).
* resume: ``trainer.train(resume_from_checkpoint=True)`` (the last checkpoint
  in ``output_dir``, e.g. after ``torchrun --max-restarts``) or a path; the
  callback loads the AutoLoCo state of the checkpoint at the restored
  ``global_step`` and checks that it matches the weights the Trainer loaded.
  Resuming with another number of processes is refused (the local replicas
  and the data order belong to the launch layout): start a new run from the
  checkpoint's model weights instead.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy

from autoloco_hf.algorithm.schedule import SchedulerPreview
from autoloco_hf.config import AutoLoCoConfig
from autoloco_hf.integrations.arguments import AutoLoCoArguments
from autoloco_hf.integrations.groups import check_worker_layout
from autoloco_hf.integrations.runtime import RECORDS_FILENAME, WorkerRuntime, fsdp2_mesh, state_path
from autoloco_hf.sync.checkpoint import peek_header
from autoloco_hf.sync.records import TRAINER_STEPS_FILENAME, TRAINER_SUMMARY_FILENAME

logger = logging.getLogger("autoloco_hf")

SUPPORTED = (
    "supported: a single process, or one process per worker (or per rank of a worker group) with "
    "DistributedDataParallel or FSDP2 (fully_shard, each worker sharded over its own ranks), on CPU (gloo) or "
    "GPU (NCCL), launched by torchrun or `accelerate launch --multi_gpu`"
)
SHARDED_ALTERNATIVE = (
    "to shard a large model use FSDP2 inside each worker: TrainingArguments(fsdp=True, "
    "fsdp_config={'fsdp_version': 2}) or accelerate's FSDP plugin with fsdp_version=2, and "
    "AutoLoCoConfig(ranks_per_worker=<ranks per worker>); with several workers, shard each over its own ranks "
    "first (autoloco_hf.integrations.groups.shard_worker, docs/hf.md)"
)


class AutoLoCoConfigurationError(RuntimeError):
    """The Trainer is set up in a way AutoLoCo cannot run correctly."""


def _env_world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def fsdp_version(accelerator: Any) -> int:
    """The FSDP version of an accelerator's FSDP plugin (1 when the plugin does not say; 0 without FSDP)."""
    plugin = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
    return int(getattr(plugin, "fsdp_version", 1) or 1) if plugin is not None else 0


def check_launch(
    world_size: int,
    distributed_type: Any = None,
    n_gpu: int = 1,
    *,
    fsdp: bool = False,
    deepspeed: bool = False,
    ranks_per_worker: int = 1,
    fsdp_version: int = 1,
) -> None:
    """Raise :class:`AutoLoCoConfigurationError` for launches AutoLoCo does not support (issue item 7).

    FSDP is accepted in version 2 (``fully_shard``: the engine syncs each rank's local shards, docs/algorithm.md §8.3);
    FSDP1 and DeepSpeed ZeRO are refused with the supported alternatives named.
    """
    env_world = _env_world_size()
    if env_world > 1 and world_size == 1:
        raise AutoLoCoConfigurationError(
            f"WORLD_SIZE={env_world} in the environment but the accelerator sees a world size of 1: every "
            "rank would train alone on the same data with no error. On CPU pass `use_cpu=True` to "
            "TrainingArguments (or `Accelerator(cpu=True)`) and launch with `torchrun --nproc_per_node N` or "
            "`accelerate launch --multi_gpu --num_processes N` (`accelerate launch --cpu` starts ONE process)."
        )
    dtype = str(getattr(distributed_type, "value", distributed_type) or "").upper()
    if deepspeed or "DEEPSPEED" in dtype:
        raise AutoLoCoConfigurationError(
            f"AutoLoCo does not support DeepSpeed (ZeRO) yet; {SHARDED_ALTERNATIVE}; {SUPPORTED}."
        )
    if (fsdp or "FSDP" in dtype) and fsdp_version != 2:
        raise AutoLoCoConfigurationError(
            f"AutoLoCo does not support FSDP version {fsdp_version} (FSDP1 flat "
            f"parameters); {SHARDED_ALTERNATIVE}; {SUPPORTED}."
        )
    if any(name in dtype for name in ("XLA", "MEGATRON")):
        raise AutoLoCoConfigurationError(f"AutoLoCo does not support distributed type {dtype} yet; {SUPPORTED}.")
    if n_gpu > 1:
        raise AutoLoCoConfigurationError(
            f"one process drives {n_gpu} GPUs (torch.nn.DataParallel); {SUPPORTED}. "
            "Launch one process per GPU with torchrun."
        )
    try:
        check_worker_layout(world_size, ranks_per_worker)
    except ValueError as err:
        raise AutoLoCoConfigurationError(str(err)) from err


def check_fsdp2_workers(model: torch.nn.Module, world_size: int, ranks_per_worker: int) -> None:
    """Whether accelerate's FSDP2 plugin leaves every worker sharded over its own ranks (docs/algorithm.md §8.3).

    The plugin shards an unsharded model over the whole world (one worker of every rank) and keeps a model
    whose root module is already ``fully_shard``-ed (``accelerate.utils.fsdp_utils.fsdp2_prepare_model``).
    Several workers therefore need the model sharded over each worker's mesh before the Trainer is built; a
    model sharded only in parts would get its remaining modules sharded over the world, on a second mesh.
    """
    from torch.distributed.fsdp import FSDPModule

    example = (
        f"autoloco_hf.integrations.groups.shard_worker(model, {ranks_per_worker}, device_type) (fully_shard of "
        "every block, then of the root, over worker_mesh(R, device_type))"
    )
    if fsdp2_mesh(model) is None:
        if ranks_per_worker != world_size:
            raise AutoLoCoConfigurationError(
                f"FSDP2 with ranks_per_worker={ranks_per_worker} and {world_size} processes: accelerate's FSDP "
                "plugin would shard the model over all ranks (one worker). Shard each worker over its own ranks "
                f"before building the Trainer: {example}, or set "
                f"ranks_per_worker={world_size} for a single sharded worker"
            )
    elif not isinstance(model, FSDPModule):
        raise AutoLoCoConfigurationError(
            f"the model's root module ({type(model).__name__}) is not sharded with fully_shard while some of its "
            "modules are: accelerate's FSDP2 plugin would shard the rest over all ranks, on a second mesh. "
            f"Finish the sharding before building the Trainer: {example}"
        )


def check_presharded_without_fsdp(model: torch.nn.Module, world_size: int, distributed_type: Any) -> None:
    """Refuse a ``fully_shard``-ed model in a Trainer whose accelerator did not enable FSDP.

    Accelerate then wraps the model in DDP (``Accelerator.prepare_model``), which cannot hold DTensor parameters
    (on CPU it fails in DDP's start-up broadcast with "c10d.broadcast_.default does not have a sharding
    strategy registered"). Accelerate enables FSDP for GPU-like devices only (``AcceleratorState``: the FSDP
    distributed type is set for the ``MULTI_GPU``-like types, never ``MULTI_CPU``).
    """
    if world_size > 1 and fsdp2_mesh(model) is not None:
        dtype = getattr(distributed_type, "value", distributed_type)
        raise AutoLoCoConfigurationError(
            f"the model is sharded with fully_shard but accelerate did not enable FSDP (distributed type {dtype}): "
            "it would wrap the sharded model in DDP, which fails. Enable accelerate's FSDP2 plugin: "
            "TrainingArguments(fsdp=True, fsdp_config={'fsdp_version': 2}) or an accelerate config with "
            "distributed_type: FSDP and fsdp_version: 2. Accelerate has FSDP on GPUs only; on CPU use a plain "
            "loop with AutoLoCoAccelerate and keep the sharded model out of accelerator.prepare"
        )


def _as_config(config: Any) -> AutoLoCoConfig:
    """A config, a dict of its fields or parsed :class:`AutoLoCoArguments`; anything else fails now, in one line."""
    if config is None:
        if _built_from_the_class_by_the_trainer():
            raise TypeError(
                "callbacks=[AutoLoCoCallback] passes the class, which would silently run the defaults: "
                "pass an instance, callbacks=[AutoLoCoCallback(AutoLoCoConfig(...))]"
            )
        return AutoLoCoConfig()
    if isinstance(config, AutoLoCoConfig):
        return config
    if isinstance(config, dict):
        return AutoLoCoConfig.from_dict(config)
    if isinstance(config, AutoLoCoArguments):
        return config.to_config()
    raise TypeError(
        f"AutoLoCoCallback(config={config!r}): expected an AutoLoCoConfig or a dict of its fields, got "
        f"{type(config).__name__}; e.g. AutoLoCoCallback(AutoLoCoConfig(method='diloco', h_base=100))"
    )


def _sync_summary(metrics: dict[str, float]) -> str:
    """The latest sync in one short console field: ``syncs 12 | H 20 | mu 0.70 | eta 0.70 | 1.5 MiB``."""
    return (
        f"syncs {metrics['autoloco/syncs']:.0f} | H {metrics['autoloco/H_step']:.0f} | "
        f"mu {metrics['autoloco/mu_t']:.2f} | eta {metrics['autoloco/eta_t']:.2f} | "
        f"{metrics['autoloco/payload_bytes'] / 2**20:,.1f} MiB"
    )


def _quiet_console(printer_on_log: Any) -> Any:
    """Wrap a console callback's ``on_log`` so per-sync ``autoloco/*``-only logs (for the trackers) are not printed."""

    def on_log(args, state, control, logs=None, **kwargs):
        if logs and all(
            key.startswith("autoloco/") or key in ("epoch", "step") for key in logs
        ):  # Trainer.log adds epoch
            return None
        return printer_on_log(args, state, control, logs=logs, **kwargs)

    return on_log


# ---------------------------------------------------------------- Trainer internals we rely on
# Everything here reads Trainer behaviour that is not part of the callback contract. It is kept to these
# three functions; tests/integrations/test_trainer_single_process.py::test_trainer_internals_still_hold and
# tests/integrations/test_callback_input.py::test_the_class_instead_of_an_instance_is_refused fail loudly when a
# transformers upgrade changes any of them.


def _built_from_the_class_by_the_trainer() -> bool:
    """Whether ``Trainer(callbacks=[AutoLoCoCallback])`` is instantiating the class itself (no config given).

    ``CallbackHandler.add_callback`` calls ``callback()`` on a class; its frame is two levels above
    :func:`_as_config`'s caller (``AutoLoCoCallback.__init__``).
    """
    caller = sys._getframe(3)
    return caller.f_code.co_name == "add_callback" and isinstance(caller.f_locals.get("callback"), type)


def _trainer_being_built(callback: AutoLoCoCallback, max_depth: int = 8) -> Trainer | None:
    """The Trainer whose ``__init__`` is firing ``on_init_end`` with ``callback`` registered, or ``None``.

    The callback contract hands callbacks no Trainer, but AutoLoCo must adjust the Trainer's accelerator
    (DDP kwargs) before ``train()`` wraps the model, and needs ``model_wrapped`` and ``Trainer.log`` later.
    ``Trainer.__init__`` calls ``callback_handler.on_init_end`` itself, so its frame is a few levels up;
    ``callback.attach(trainer)`` is the explicit alternative when this lookup fails.
    """
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            break
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer) and callback in getattr(candidate.callback_handler, "callbacks", ()):
            return candidate
        frame = frame.f_back
    return None


def checkpoint_dir(args: Any, state: Any) -> str:
    """The folder ``Trainer._save_checkpoint`` writes at ``state.global_step`` (and ``get_last_checkpoint`` finds).

    ``<output_dir>/checkpoint-<global_step>``: hyperparameter-search trials write elsewhere and are refused.
    """
    if getattr(state, "trial_name", None):
        raise AutoLoCoConfigurationError(
            "AutoLoCo does not support hyperparameter search (trial "
            f"{state.trial_name!r}): run each configuration as its own job"
        )
    return os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-*`` in ``output_dir`` that holds the Trainer's state and every rank's AutoLoCo state.

    For scripts restarted by ``torchrun --max-restarts`` (or an equivalent launcher):
    ``trainer.train(resume_from_checkpoint=last_complete_checkpoint(args.output_dir))`` starts fresh on the first
    attempt and resumes after a restart. Unlike ``get_last_checkpoint`` it skips a folder a killed worker left
    half-written (no ``trainer_state.json``, a missing or short ``autoloco/rank{r}.pt``); checksums are verified
    when the state is loaded.
    """
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for name in os.listdir(output_dir):
        prefix, _, step = name.partition("-")
        if prefix == PREFIX_CHECKPOINT_DIR and step.isdigit() and os.path.isdir(os.path.join(output_dir, name)):
            steps.append(int(step))
    for step in sorted(steps, reverse=True):
        folder = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if not os.path.isfile(os.path.join(folder, TRAINER_STATE_NAME)):
            continue
        first = peek_header(state_path(folder, 0))
        if first is None or first.step != step:
            continue
        if all(peek_header(state_path(folder, rank)) is not None for rank in range(1, first.world_size)):
            return folder
    return None


class AutoLoCoCallback(TrainerCallback):
    """Turns ``Trainer`` / ``SFTTrainer`` data-parallel training into AutoLoCo (or DiLoCo, QSR, Linear Interval).

    Args:
        config: the :class:`AutoLoCoConfig`, a dict of its fields, or parsed
            :class:`~autoloco_hf.integrations.arguments.AutoLoCoArguments` (default: AutoLoCo with its defaults).
        records_filename: per-interval JSONL, written in ``args.output_dir`` by the main process.
        log_metrics: send ``autoloco/*`` to the ``report_to`` trackers at every synchronization (the
            console shows a short summary on the Trainer's ``logging_steps`` cadence either way).
        resume_from_checkpoint: checkpoint folder with AutoLoCo state; by default the one given to
            ``trainer.train(resume_from_checkpoint=...)``.
        manage_ddp_kwargs: switch off DDP's ``find_unused_parameters`` and buffer broadcast when the
            user did not set them (each adds a small collective per step).

    Attributes after ``on_train_begin``: ``runtime`` (:class:`WorkerRuntime`), ``engine``
    (:class:`~autoloco_hf.sync.engine.IntervalEngine`; ``engine.totals`` holds syncs and bytes).
    """

    def __init__(
        self,
        config: AutoLoCoConfig | dict | AutoLoCoArguments | None = None,
        records_filename: str = RECORDS_FILENAME,
        log_metrics: bool = True,
        resume_from_checkpoint: str | None = None,
        manage_ddp_kwargs: bool = True,
    ) -> None:
        self.config = _as_config(config)
        self.records_filename = records_filename
        self.log_metrics = log_metrics
        self.resume_from_checkpoint = resume_from_checkpoint
        self.manage_ddp_kwargs = manage_ddp_kwargs
        self.trainer: Trainer | None = None
        self.runtime: WorkerRuntime | None = None
        self._lr: float | None = None
        self._checked = False
        self._last_sync: dict[str, float] = {}
        self._started = time.perf_counter()

    # ------------------------------------------------------------ wiring
    @property
    def engine(self):
        return self.runtime.engine if self.runtime is not None else None

    def attach(self, trainer: Trainer) -> AutoLoCoCallback:
        """Bind to ``trainer`` explicitly (automatic when the Trainer calls the callback), and check it."""
        self.trainer = trainer
        if not self._checked:
            self._check_and_prepare(trainer)
        return self

    def _trainer(self) -> Trainer:
        if self.trainer is None:
            raise AutoLoCoConfigurationError(
                "AutoLoCoCallback has no Trainer: it binds itself when passed as `Trainer(callbacks=[...])`; "
                "after `trainer.add_callback(callback)` call `callback.attach(trainer)` before train()"
            )
        return self.trainer

    def _check_and_prepare(self, trainer: Trainer) -> None:
        args, accelerator = trainer.args, trainer.accelerator
        fsdp_enabled = bool(getattr(trainer, "is_fsdp_enabled", False))
        check_launch(
            accelerator.num_processes,
            accelerator.distributed_type,
            args.n_gpu,
            fsdp=fsdp_enabled,
            deepspeed=bool(getattr(trainer, "is_deepspeed_enabled", False)),
            ranks_per_worker=self.config.ranks_per_worker,
            fsdp_version=fsdp_version(accelerator),
        )
        if fsdp_enabled:
            check_fsdp2_workers(trainer.model, accelerator.num_processes, self.config.ranks_per_worker)
        else:
            check_presharded_without_fsdp(trainer.model, accelerator.num_processes, accelerator.distributed_type)
            if getattr(args, "fsdp", None) and accelerator.num_processes > 1:
                # accelerate enables FSDP for GPU-like devices only; on CPU the model is wrapped in DDP instead
                logger.warning(
                    "AutoLoCo: TrainingArguments(fsdp=%r) is set but accelerate did not enable FSDP on this "
                    "device (%s): every rank holds the whole model and trains as DDP",
                    args.fsdp,
                    accelerator.distributed_type,
                )
        if getattr(args, "parallelism_config", None) is not None:
            raise AutoLoCoConfigurationError(
                f"AutoLoCo does not support ParallelismConfig (TP/CP/SP) yet; {SUPPORTED}."
            )
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, (ProgressCallback, PrinterCallback)):
                callback.on_log = _quiet_console(callback.on_log)
        if self.config.is_interval_method and accelerator.num_processes > 1:
            if args.average_tokens_across_devices:
                # A per-step gather of token counts, and the Trainer then multiplies every rank's loss by the
                # world size, which DDP's averaging would undo but AutoLoCo's local gradients would not.
                logger.warning(
                    "AutoLoCo: setting average_tokens_across_devices=False (no per-step gather; "
                    "each worker's loss is normalized by its own tokens)"
                )
                args.average_tokens_across_devices = False
            handler = getattr(accelerator, "ddp_handler", None)
            if self.manage_ddp_kwargs:
                from accelerate.utils import DistributedDataParallelKwargs

                if handler is None:
                    handler = DistributedDataParallelKwargs()
                    accelerator.ddp_handler = handler
                if args.ddp_find_unused_parameters is None:
                    handler.find_unused_parameters = False  # else: one small all-reduce per backward
            if args.ddp_find_unused_parameters:
                logger.warning(
                    "AutoLoCo: ddp_find_unused_parameters=True adds one small all-reduce of the "
                    "used-parameter map per backward (no gradient traffic)"
                )
            if args.include_num_input_tokens_seen not in ("no", False, None):
                logger.warning("AutoLoCo: include_num_input_tokens_seen gathers token counts every step")
        self._checked = True

    # ------------------------------------------------------------ events
    def on_init_end(self, args, state, control, **kwargs):
        if self.trainer is None:
            trainer = _trainer_being_built(self)
            if trainer is not None:
                self.attach(trainer)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        trainer = self._trainer()
        self._start_run_log(args, state)
        if self.runtime is not None:  # a second train() call on the same trainer
            self.runtime.close()
            self.runtime = None
        max_steps = state.max_steps
        warmup = self.config.warmup_steps if self.config.warmup_steps is not None else args.get_warmup_steps(max_steps)
        inner_optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        self.runtime = WorkerRuntime(
            self.config,
            trainer.model,
            trainer.model_wrapped,
            inner_optimizer,
            SchedulerPreview(trainer.lr_scheduler, max_steps),
            max_steps,
            warmup,
            records_path=os.path.join(args.output_dir, self.records_filename),
            is_main_process=state.is_world_process_zero,
        )
        if state.global_step > 0:
            self._resume(args, state)

    def _resume_candidates(self, args, state) -> list[str]:
        """Where the checkpoint the Trainer resumed from is, most explicit first.

        ``trainer.train(resume_from_checkpoint=True)`` resumes ``get_last_checkpoint(args.output_dir)``, the
        folder ``checkpoint_dir`` names for the restored ``global_step``; a path given to ``train()`` is
        not visible to callbacks: pass it as ``AutoLoCoCallback(resume_from_checkpoint=...)`` or
        ``TrainingArguments(resume_from_checkpoint=...)`` when it is not under ``output_dir``.
        """
        candidates = [
            self.resume_from_checkpoint,
            getattr(args, "resume_from_checkpoint", None),
            checkpoint_dir(args, state),
        ]
        return [c for c in candidates if isinstance(c, str) and os.path.isdir(c)]

    def _resume(self, args, state) -> None:
        runtime = self.runtime
        assert runtime is not None
        candidates = self._resume_candidates(args, state)
        if not candidates:
            raise FileNotFoundError(
                f"the Trainer resumes at step {state.global_step} but {checkpoint_dir(args, state)} does not exist: "
                "pass the checkpoint folder as AutoLoCoCallback(resume_from_checkpoint=...)"
            )
        resume = candidates[0]
        # The Trainer loaded the checkpoint's model file, which holds theta_t (see on_save); keep it to check
        # that the AutoLoCo state is from the same checkpoint.
        loaded = [p.detach().to("cpu", copy=True) for p in runtime.trainable.params]
        path = runtime.load(resume)
        if runtime.step != state.global_step:
            raise RuntimeError(
                f"{path}: field step={runtime.step} but the Trainer resumes at step {state.global_step}: pass "
                "the checkpoint the Trainer resumes from as AutoLoCoCallback(resume_from_checkpoint=...)"
            )
        if not all(torch.equal(a, b.cpu()) for a, b in zip(loaded, runtime.global_parameters())):
            raise RuntimeError(
                f"{path}: the synchronized parameters in the AutoLoCo state differ from the model weights the "
                f"Trainer loaded: the Trainer resumed from another checkpoint than {resume}; pass that one as "
                "AutoLoCoCallback(resume_from_checkpoint=...)"
            )
        logger.info("AutoLoCo: resumed step %d from %s", state.global_step, resume)

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        # after optimizer.step(), before lr_scheduler.step(): the learning rate this step used
        trainer = self.trainer
        skipped = bool(trainer is not None and trainer.accelerator.optimizer_step_was_skipped)
        inner = getattr(optimizer, "optimizer", optimizer)
        self._lr = 0.0 if skipped else float(inner.param_groups[0]["lr"])

    def on_step_end(self, args, state, control, **kwargs):
        runtime = self.runtime
        if runtime is None:
            return
        if runtime.step >= runtime.total_steps:
            return
        record = runtime.after_optimizer_step(self._lr)
        self._lr = None
        if record is not None and self.trainer is not None:
            metrics = runtime.pop_metrics()
            self._last_sync = metrics or self._last_sync
            if metrics and self.log_metrics:
                # Trainer.log (the base method: no subclass side effects such as TRL's metric flush) ends in
                # on_log, which clears control.should_log: keep the Trainer's own logging decision for this step.
                # The console callbacks skip these autoloco/*-only logs (_quiet_console); the trackers get them.
                should_log = control.should_log
                Trainer.log(self.trainer, metrics)
                control.should_log = self.trainer.control.should_log = should_log
        if control.should_save:  # decided by DefaultFlowCallback, which runs before user callbacks
            runtime.show_global_parameters()

    # A checkpoint's model file must be the model the workers agreed on: from the moment the Trainer decides to
    # save until on_save, the model holds theta_t and this rank's replica waits in host memory. An evaluation
    # run in the same step (eval_steps == save_steps) therefore evaluates theta_t too; with save_strategy="best"
    # the decision comes after the evaluation, which saw rank 0's replica.
    def on_step_begin(self, args, state, control, **kwargs):
        if self.runtime is not None:  # save_strategy="best" evaluated theta_t but found no new best
            self.runtime.restore_local_parameters()

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.runtime is not None and control.should_save:
            self.runtime.show_global_parameters()

    def on_evaluate(self, args, state, control, **kwargs):
        # save_strategy="best" decides to save after this event
        if self.runtime is not None and args.save_strategy == SaveStrategy.BEST:
            self.runtime.show_global_parameters()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or self.runtime is None:
            return
        if self._last_sync:  # the console's view of the sync (later callbacks: progress bar / printer)
            logs["autoloco"] = _sync_summary(self._last_sync)
        if state.is_world_process_zero:
            totals = self.engine.totals
            row = dict(
                step=state.global_step,
                loss=float(logs["loss"]),
                lr=float(logs.get("learning_rate", 0.0)),
                syncs=totals.syncs,
                payload_bytes=totals.payload_bytes,
                seconds=time.perf_counter() - self._started,
            )
            with open(os.path.join(args.output_dir, TRAINER_STEPS_FILENAME), "a") as f:
                f.write(json.dumps(row) + "\n")

    def on_save(self, args, state, control, **kwargs):
        if self.runtime is None:
            return
        self.runtime.save(checkpoint_dir(args, state))
        self.runtime.restore_local_parameters()

    def on_train_end(self, args, state, control, **kwargs):
        if self.runtime is not None:
            self.runtime.restore_local_parameters()
            self._finish_run(args, state)
            self.runtime.close()

    def _start_run_log(self, args: Any, state: Any) -> None:
        """Start the clock; keep ``autoloco_steps.jsonl`` rows up to the step a resumed run restarts from."""
        self._started = time.perf_counter()
        self._last_sync = {}
        path = os.path.join(args.output_dir, TRAINER_STEPS_FILENAME)
        if not state.is_world_process_zero or not os.path.exists(path):
            return
        with open(path) as f:
            kept = [line for line in f if line.strip() and json.loads(line)["step"] <= state.global_step]
        with open(path, "w") as f:
            f.writelines(kept)

    def _finish_run(self, args: Any, state: Any) -> None:
        """Warn when the run stops before its planned last step; write the run summary for ``autoloco report``."""
        runtime = self.runtime
        if runtime.step < runtime.total_steps and self.config.is_interval_method:
            records = runtime.engine.records
            last = records[-1].start_step + records[-1].h_step if records else 0
            logger.warning(
                "AutoLoCo: training stopped at step %d of %d planned; the model holds this rank's local weights "
                "%d steps after the last synchronization (step %d), not a synchronized model",
                runtime.step,
                runtime.total_steps,
                runtime.step - last,
                last,
            )
        if state.is_world_process_zero:
            summary = dict(
                name=args.run_name or os.path.basename(os.path.normpath(args.output_dir)),
                method=str(self.config.method),
                steps=runtime.step,
                planned_steps=runtime.total_steps,
                wall_seconds=time.perf_counter() - self._started,
                totals=runtime.engine.totals.as_dict(),
                config=self.config.to_dict(),
                intervals_file=self.records_filename,
                steps_file=TRAINER_STEPS_FILENAME,
            )
            with open(os.path.join(args.output_dir, TRAINER_SUMMARY_FILENAME), "w") as f:
                json.dump(summary, f, indent=2, default=str)
