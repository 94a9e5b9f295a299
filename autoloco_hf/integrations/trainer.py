"""``AutoLoCoCallback``: AutoLoCo / DiLoCo / QSR / Linear Interval for any ``Trainer`` or TRL ``SFTTrainer``.

Three lines::

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[AutoLoCoCallback(AutoLoCoConfig(method="autoloco", h_base=100))])
    trainer.train()

Launch one process per worker (``torchrun --nproc_per_node N train.py`` or
``accelerate launch --multi_gpu --num_processes N train.py``). What the
callback does:

* ``on_init_end``: finds its Trainer, rejects configurations it does not
  support (FSDP, DeepSpeed, DataParallel, the silent "every rank trains alone"
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
* ``on_save``: writes ``<checkpoint>/autoloco/rank{r}.pt`` on every rank: the
  engine (outer parameters, momentum, controller, token mapper, interval in
  flight, accounting) plus this rank's local parameters and inner optimizer
  state, which differ between ranks mid-interval while the Trainer saves only
  rank 0's.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, Optional, Union

from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from autoloco_hf.config import AutoLoCoConfig
from autoloco_hf.algorithm.schedule import SchedulerPreview
from autoloco_hf.integrations.arguments import AutoLoCoArguments
from autoloco_hf.integrations.groups import check_worker_layout
from autoloco_hf.integrations.runtime import RECORDS_FILENAME, WorkerRuntime
from autoloco_hf.sync.records import TRAINER_STEPS_FILENAME, TRAINER_SUMMARY_FILENAME

logger = logging.getLogger("autoloco_hf")

SUPPORTED = (
    "supported: a single process, or one process per worker (or per rank of a worker group) with "
    "DistributedDataParallel, on CPU (gloo) or GPU (NCCL), launched by torchrun or "
    "`accelerate launch --multi_gpu`"
)


class AutoLoCoConfigurationError(RuntimeError):
    """The Trainer is set up in a way AutoLoCo cannot run correctly."""


def _env_world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def check_launch(world_size: int, distributed_type: Any = None, n_gpu: int = 1, *, fsdp: bool = False,
                 deepspeed: bool = False, ranks_per_worker: int = 1) -> None:
    """Raise :class:`AutoLoCoConfigurationError` for launches AutoLoCo does not support (issue item 7)."""
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
        raise AutoLoCoConfigurationError(f"AutoLoCo does not support DeepSpeed yet; {SUPPORTED}.")
    if fsdp or "FSDP" in dtype:
        raise AutoLoCoConfigurationError(f"AutoLoCo does not support FSDP yet; {SUPPORTED}.")
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




def _as_config(config: Any) -> AutoLoCoConfig:
    """A config, a dict of its fields or parsed :class:`AutoLoCoArguments`; anything else fails now, in one line."""
    if config is None:
        # Trainer(callbacks=[AutoLoCoCallback]) instantiates the class with no arguments, in CallbackHandler.add_callback
        caller = sys._getframe(2)
        if caller.f_code.co_name == "add_callback" and isinstance(caller.f_locals.get("callback"), type):
            raise TypeError("callbacks=[AutoLoCoCallback] passes the class, which would silently run the defaults: "
                            "pass an instance, callbacks=[AutoLoCoCallback(AutoLoCoConfig(...))]")
        return AutoLoCoConfig()
    if isinstance(config, AutoLoCoConfig):
        return config
    if isinstance(config, dict):
        return AutoLoCoConfig.from_dict(config)
    if isinstance(config, AutoLoCoArguments):
        return config.to_config()
    raise TypeError(f"AutoLoCoCallback(config={config!r}): expected an AutoLoCoConfig or a dict of its fields, got "
                    f"{type(config).__name__}; e.g. AutoLoCoCallback(AutoLoCoConfig(method='diloco', h_base=100))")


def _sync_summary(metrics: dict[str, float]) -> str:
    """The latest sync in one short console field: ``syncs 12 | H 20 | mu 0.70 | eta 0.70 | 1.5 MiB``."""
    return (f"syncs {metrics['autoloco/syncs']:.0f} | H {metrics['autoloco/H_step']:.0f} | "
            f"mu {metrics['autoloco/mu_t']:.2f} | eta {metrics['autoloco/eta_t']:.2f} | "
            f"{metrics['autoloco/payload_bytes'] / 2**20:,.1f} MiB")


def _quiet_console(printer_on_log: Any) -> Any:
    """Wrap a console callback's ``on_log`` so per-sync ``autoloco/*``-only logs (for the trackers) are not printed."""

    def on_log(args, state, control, logs=None, **kwargs):
        if logs and all(key.startswith("autoloco/") or key in ("epoch", "step") for key in logs):  # Trainer.log adds epoch
            return None
        return printer_on_log(args, state, control, logs=logs, **kwargs)

    return on_log


def _find_trainer(callback: "AutoLoCoCallback") -> Optional[Trainer]:
    """The Trainer whose callback handler is calling us (walks the caller frames)."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer) and callback in getattr(candidate.callback_handler, "callbacks", ()):
            return candidate
        frame = frame.f_back
    return None


def _resume_dir_from_stack() -> Optional[str]:
    """The ``resume_from_checkpoint`` the running ``Trainer._inner_training_loop`` received."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_inner_training_loop":
            value = frame.f_locals.get("resume_from_checkpoint")
            return value if isinstance(value, str) else None
        frame = frame.f_back
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
        config: Union[AutoLoCoConfig, dict, AutoLoCoArguments, None] = None,
        records_filename: str = RECORDS_FILENAME,
        log_metrics: bool = True,
        resume_from_checkpoint: Optional[str] = None,
        manage_ddp_kwargs: bool = True,
    ) -> None:
        self.config = _as_config(config)
        self.records_filename = records_filename
        self.log_metrics = log_metrics
        self.resume_from_checkpoint = resume_from_checkpoint
        self.manage_ddp_kwargs = manage_ddp_kwargs
        self.trainer: Optional[Trainer] = None
        self.runtime: Optional[WorkerRuntime] = None
        self._lr: Optional[float] = None
        self._checked = False
        self._last_sync: dict[str, float] = {}
        self._started = time.perf_counter()

    # ------------------------------------------------------------ wiring
    @property
    def engine(self):
        return self.runtime.engine if self.runtime is not None else None

    def attach(self, trainer: Trainer) -> "AutoLoCoCallback":
        """Bind to ``trainer`` explicitly (automatic when the Trainer calls the callback), and check it."""
        self.trainer = trainer
        if not self._checked:
            self._check_and_prepare(trainer)
        return self

    def _trainer(self) -> Trainer:
        if self.trainer is None:
            trainer = _find_trainer(self)
            if trainer is None:
                raise AutoLoCoConfigurationError(
                    "AutoLoCoCallback could not find its Trainer; call `callback.attach(trainer)` before train()"
                )
            self.attach(trainer)
        assert self.trainer is not None
        return self.trainer

    def _check_and_prepare(self, trainer: Trainer) -> None:
        args, accelerator = trainer.args, trainer.accelerator
        check_launch(
            accelerator.num_processes,
            accelerator.distributed_type,
            args.n_gpu,
            fsdp=bool(getattr(trainer, "is_fsdp_enabled", False)),
            deepspeed=bool(getattr(trainer, "is_deepspeed_enabled", False)),
            ranks_per_worker=self.config.ranks_per_worker,
        )
        if getattr(args, "parallelism_config", None) is not None:
            raise AutoLoCoConfigurationError(f"AutoLoCo does not support ParallelismConfig (TP/CP/SP) yet; {SUPPORTED}.")
        self._check_exports(args)
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, (ProgressCallback, PrinterCallback)):
                callback.on_log = _quiet_console(callback.on_log)
        if self.config.is_interval_method and accelerator.num_processes > 1:
            if args.average_tokens_across_devices:
                # A per-step gather of token counts, and the Trainer then multiplies every rank's loss by the
                # world size, which DDP's averaging would undo but AutoLoCo's local gradients would not.
                logger.warning("AutoLoCo: setting average_tokens_across_devices=False (no per-step gather; "
                               "each worker's loss is normalized by its own tokens)")
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
                logger.warning("AutoLoCo: ddp_find_unused_parameters=True adds one small all-reduce of the "
                               "used-parameter map per backward (no gradient traffic)")
            if args.include_num_input_tokens_seen not in ("no", False, None):
                logger.warning("AutoLoCo: include_num_input_tokens_seen gathers token counts every step")
        self._checked = True

    def _check_exports(self, args: Any) -> None:
        """Refuse exports of a checkpoint's weights: mid-interval they are rank 0's local model, not the synchronized one."""
        if not self.config.is_interval_method:
            return
        if args.load_best_model_at_end:
            raise AutoLoCoConfigurationError(
                "load_best_model_at_end=True would end the run on a checkpoint's weights, which AutoLoCo leaves "
                "unsynchronized mid-interval (rank 0's local model): set load_best_model_at_end=False; the model at "
                "the end of training is the synchronized one")
        strategy = str(getattr(args.hub_strategy, "value", args.hub_strategy))
        if args.push_to_hub and strategy != "end":
            raise AutoLoCoConfigurationError(
                f"push_to_hub with hub_strategy={strategy!r} would upload checkpoints' unsynchronized (rank 0's local) "
                "weights: set hub_strategy='end' so that only the synchronized final model is pushed")

    # ------------------------------------------------------------ events
    def on_init_end(self, args, state, control, **kwargs):
        self._trainer()

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
            resume = self.resume_from_checkpoint or _resume_dir_from_stack()
            if resume is None:
                resume = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            self.runtime.load(resume)
            if self.runtime.step != state.global_step:
                raise RuntimeError(
                    f"AutoLoCo state in {resume} is at step {self.runtime.step} but the Trainer resumes at "
                    f"step {state.global_step}"
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
        if record is None or self.trainer is None:
            return
        metrics = runtime.pop_metrics()
        self._last_sync = metrics or self._last_sync
        if metrics and self.log_metrics:
            # Trainer.log (the base method: no subclass side effects such as TRL's metric flush) ends in
            # on_log, which clears control.should_log: keep the Trainer's own logging decision for this step.
            # The console callbacks skip these autoloco/*-only logs (_quiet_console); the trackers get them.
            should_log = control.should_log
            Trainer.log(self.trainer, metrics)
            control.should_log = self.trainer.control.should_log = should_log

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or self.runtime is None:
            return
        if self._last_sync:  # the console's view of the sync (later callbacks: progress bar / printer)
            logs["autoloco"] = _sync_summary(self._last_sync)
        if state.is_world_process_zero:
            totals = self.engine.totals
            row = dict(step=state.global_step, loss=float(logs["loss"]), lr=float(logs.get("learning_rate", 0.0)),
                       syncs=totals.syncs, payload_bytes=totals.payload_bytes, seconds=time.perf_counter() - self._started)
            with open(os.path.join(args.output_dir, TRAINER_STEPS_FILENAME), "a") as f:
                f.write(json.dumps(row) + "\n")

    def on_save(self, args, state, control, **kwargs):
        if self.runtime is None or self.trainer is None:
            return
        run_dir = self.trainer._get_output_dir(trial=None)
        checkpoint = os.path.join(run_dir, f"checkpoint-{state.global_step}")
        self.runtime.save(checkpoint)

    def on_train_end(self, args, state, control, **kwargs):
        if self.runtime is not None:
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
                runtime.step, runtime.total_steps, runtime.step - last, last)
        if state.is_world_process_zero:
            summary = dict(name=args.run_name or os.path.basename(os.path.normpath(args.output_dir)),
                           method=str(self.config.method), steps=runtime.step, planned_steps=runtime.total_steps,
                           wall_seconds=time.perf_counter() - self._started, totals=runtime.engine.totals.as_dict(),
                           config=self.config.to_dict(), intervals_file=self.records_filename, steps_file=TRAINER_STEPS_FILENAME)
            with open(os.path.join(args.output_dir, TRAINER_SUMMARY_FILENAME), "w") as f:
                json.dump(summary, f, indent=2, default=str)
