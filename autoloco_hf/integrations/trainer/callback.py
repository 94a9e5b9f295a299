"""``AutoLoCoCallback``: AutoLoCo / DiLoCo / QSR / Linear
Interval for any ``Trainer`` or TRL ``SFTTrainer``.

Three lines::

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[AutoLoCoCallback(AutoLoCoConfig(method="autoloco", h_base=100))])
    trainer.train()

Launch one process per worker (``torchrun --nproc_per_node N train.py`` or
``accelerate launch --multi_gpu --num_processes N train.py``). What the
callback does:

* ``on_init_end``: binds to the Trainer being built (or call
  ``callback.attach(trainer)`` after ``trainer.add_callback(callback)``), rejects
  configurations it does not support (FSDP1, DeepSpeed, DataParallel, the silent
  "every rank trains alone" launch), and switches off what would add per-step traffic:
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
  ``on_save`` writes ``<checkpoint>/autoloco/rank{r}.safetensors`` on every rank: the
  engine (outer parameters, momentum, controller, token mapper, interval in
  flight, accounting) plus this rank's local replica and inner optimizer
  state, which differ between ranks mid-interval while the Trainer saves only
  rank 0's (an atomic, versioned, checksummed file: ``autoloco_hf.state.checkpoint``).
* resume: ``trainer.train(resume_from_checkpoint=True)`` (the last checkpoint
  in ``output_dir``, e.g. after ``torchrun --max-restarts``) or a path; the
  callback loads the AutoLoCo state of the checkpoint at the restored
  ``global_step`` and checks that it matches the weights the Trainer loaded.
  Resuming with another number of processes is refused (the local replicas
  and the data order belong to the launch layout): start a new run from the
  checkpoint's model weights instead.
* elastic: with ``AutoLoCoConfig.snapshot_dir`` the main process writes a
  boundary snapshot (shared outer state and the Trainer's) at every boundary,
  and ``trainer.train(resume_from_checkpoint=callback.resume_point())`` resumes
  the last boundary with any number of processes when it is newer than the
  last Trainer checkpoint or the layout changed
  (:mod:`autoloco_hf.integrations.trainer.resume`, docs/hf.md).
"""

from __future__ import annotations

import os
import time
from typing import Any

from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import SaveStrategy
from transformers.utils import logging as hf_logging

from autoloco_hf.algorithm.schedule import SchedulerPreview
from autoloco_hf.config import AutoLoCoConfig, Method, Pacing
from autoloco_hf.errors import AutoLoCoConfigurationError
from autoloco_hf.integrations.elastic.errors import MembershipChange
from autoloco_hf.integrations.elastic.membership import LiveMembership
from autoloco_hf.integrations.launch_checks import check_trainer_launch
from autoloco_hf.integrations.runtime import RECORDS_FILENAME, WorkerRuntime, record_metrics
from autoloco_hf.integrations.trainer.arguments import AutoLoCoArguments
from autoloco_hf.integrations.trainer.collectives import bound_trainer_collectives
from autoloco_hf.integrations.trainer.internals import (
    built_from_the_class_by_the_trainer,
    checkpoint_dir,
    quiet_console,
    trainer_being_built,
)
from autoloco_hf.integrations.trainer.log_levels import apply_trainer_log_levels
from autoloco_hf.integrations.trainer.pacing import BudgetTrainerSteps
from autoloco_hf.integrations.trainer.resume import (
    boundary_file,
    check_no_newer_snapshots,
    restore,
    resume_from_boundary,
    resume_point,
    resumed_checkpoint,
    trainer_boundary_state,
)
from autoloco_hf.state.trainer_log import TrainerRunLog
from autoloco_hf.sync.pacing import set_schedule_step

logger = hf_logging.get_logger(__name__)


def _as_config(config: Any) -> AutoLoCoConfig:
    """A config, a dict of its fields or parsed
    :class:`AutoLoCoArguments`; anything else fails now, in one line."""
    if config is None:
        if built_from_the_class_by_the_trainer():
            raise TypeError(
                "callbacks=[AutoLoCoCallback] passes the class, which would silently run the "
                "defaults: pass an instance, callbacks=[AutoLoCoCallback(AutoLoCoConfig(...))]"
            )
        return AutoLoCoConfig()
    if isinstance(config, AutoLoCoConfig):
        return config
    if isinstance(config, dict):
        return AutoLoCoConfig.from_dict(config)
    if isinstance(config, AutoLoCoArguments):
        return config.to_config()
    raise TypeError(
        f"AutoLoCoCallback(config={config!r}): expected an AutoLoCoConfig or a dict of its fields, "
        f"got {type(config).__name__}; e.g. "
        "AutoLoCoCallback(AutoLoCoConfig(method='diloco', h_base=100))"
    )


def _sync_summary(metrics: dict[str, float], workers: int) -> str:
    """The latest sync in one short console field:
    ``syncs 12 | H 20 | mu 0.70 | eta 0.70 | 1.5 MiB``.

    One worker sends nothing, so its field says so instead of
    the payload a worker of several would send.
    """
    sent = (
        f"{metrics['autoloco/payload_bytes'] / 2**20:,.1f} MiB"
        if workers > 1
        else "1 worker, nothing sent"
    )
    return (
        f"syncs {metrics['autoloco/syncs']:.0f} | H {metrics['autoloco/H_step']:.0f} | "
        f"mu {metrics['autoloco/mu_t']:.2f} | eta {metrics['autoloco/eta_t']:.2f} | {sent}"
    )


def _rule(config: AutoLoCoConfig) -> str:
    """How H is chosen: the controller of an adaptive AutoLoCo
    run, a fixed H, or QSR / Linear Interval's schedule."""
    if config.method == Method.AUTOLOCO:
        return f"controller {config.controller}" if config.adaptive_horizon else "fixed H"
    return "fixed H" if config.method == Method.DILOCO else f"{config.method} schedule"


def _mib(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB"


def _run_summary(engine: Any, steps: int, output_dir: str) -> str:
    """``12 syncs in 600 steps, 35.2 MiB sent by this worker,
    final H 60; report: autoloco report OUT``."""
    totals = engine.totals
    sent = (
        "nothing sent (1 worker)"
        if engine.num_workers == 1
        else f"{_mib(totals.wire_bytes)} sent by this worker"
    )
    final = f", final H {engine.records[-1].h_step}" if engine.records else ""
    syncs = f"{totals.syncs} sync{'' if totals.syncs == 1 else 's'}"
    return f"{syncs} in {steps} steps, {sent}{final}; report: autoloco report {output_dir}"


def _progress(engine: Any) -> str:
    """``5 syncs done, H 10 (steps 51-60)``: where a resumed run stands."""
    syncs = f"{engine.totals.syncs} sync{'' if engine.totals.syncs == 1 else 's'} done"
    interval = engine.current_interval
    if interval is None:
        return syncs
    return (
        f"{syncs}, H {interval.h_step} (steps "
        f"{interval.start_step + 1}-{interval.start_step + interval.h_step})"
    )


class AutoLoCoCallback(TrainerCallback):
    """Turns ``Trainer`` / ``SFTTrainer`` data-parallel
    training into AutoLoCo (or DiLoCo, QSR, Linear Interval).

    Args:
        config: the :class:`AutoLoCoConfig`, a dict of its fields, or parsed
            :class:`~autoloco_hf.integrations.trainer.arguments.AutoLoCoArguments`
            (default: AutoLoCo with its defaults).
        records_filename: per-interval JSONL, written in ``args.output_dir`` by the main process.
        log_metrics: send ``autoloco/*`` to the ``report_to`` trackers at every synchronization (the
            console shows a short summary on the Trainer's ``logging_steps`` cadence either way).
        resume_from_checkpoint: checkpoint folder with AutoLoCo state; by default the one given to
            ``trainer.train(resume_from_checkpoint=...)``.
        manage_ddp_kwargs: switch off DDP's ``find_unused_parameters`` and buffer broadcast when the
            user did not set them (each adds a small collective per step).
        membership: live membership
            (:class:`~autoloco_hf.integrations.elastic.membership.LiveMembership`):
            survivors of a lost peer and processes that join go on in process; train with
            :func:`~autoloco_hf.integrations.trainer.live.train_live` (docs/reliability.md).

    Attributes after ``on_train_begin``: ``runtime`` (:class:`WorkerRuntime`), ``engine``
    (:class:`~autoloco_hf.sync.engine.engine.IntervalEngine`; ``engine.totals`` holds syncs
    and bytes).
    """

    def __init__(
        self,
        config: AutoLoCoConfig | dict | AutoLoCoArguments | None = None,
        records_filename: str = RECORDS_FILENAME,
        log_metrics: bool = True,
        resume_from_checkpoint: str | None = None,
        manage_ddp_kwargs: bool = True,
        membership: LiveMembership | None = None,
    ) -> None:
        self.config = _as_config(config)
        self.membership = membership
        self.records_filename = records_filename
        self.log_metrics = log_metrics
        self.resume_from_checkpoint = resume_from_checkpoint
        self.manage_ddp_kwargs = manage_ddp_kwargs
        self.trainer: Trainer | None = None
        self.runtime: WorkerRuntime | None = None
        self._lr: float | None = None
        self._step_started: float | None = None
        # pacing="budget": the Trainer follows the run's steps
        self.budget: BudgetTrainerSteps | None = None
        self._checked = False
        self._last_sync: dict[str, float] = {}
        self.run_log: TrainerRunLog | None = None

    # ------------------------------------------------------------ wiring
    @property
    def engine(self):
        return self.runtime.engine if self.runtime is not None else None

    def attach(self, trainer: Trainer) -> AutoLoCoCallback:
        """Bind to ``trainer`` explicitly (automatic when the
        Trainer calls the callback), and check it."""
        self.trainer = trainer
        apply_trainer_log_levels(trainer.args)
        if not self._checked:
            self._check_and_prepare(trainer)
        return self

    def _trainer(self) -> Trainer:
        if self.trainer is None:
            raise AutoLoCoConfigurationError(
                "AutoLoCoCallback has no Trainer: it binds itself when passed as "
                "`Trainer(callbacks=[...])`; after `trainer.add_callback(callback)` call "
                "`callback.attach(trainer)` before train()"
            )
        return self.trainer

    def _check_and_prepare(self, trainer: Trainer) -> None:
        check_trainer_launch(trainer, self.config)
        quiet_console(trainer)
        # under live membership a run of one process may grow:
        # no per-step collective that a new round would break
        several = trainer.accelerator.num_processes > 1 or self.membership is not None
        if self.config.is_interval_method and several:
            self._no_token_gather(trainer.args)
            self._no_ddp_extras(trainer.args, trainer.accelerator)
        if self.config.pacing == Pacing.BUDGET:
            workers = trainer.accelerator.num_processes // self.config.ranks_per_worker
            self.budget = BudgetTrainerSteps(trainer.args, workers)
        self._checked = True

    # The notices below are the same on every rank: printed
    # where the Trainer logs (args.should_log).
    @staticmethod
    def _no_token_gather(args: Any) -> None:
        """No per-step gather of token counts (``average_tokens_across_devices``).

        The Trainer would also multiply every rank's loss by the world size, which DDP's averaging
        undoes but AutoLoCo's local gradients would not.
        """
        if args.average_tokens_across_devices:
            if args.should_log:
                logger.info(
                    "AutoLoCo: setting average_tokens_across_devices=False (no per-step gather; "
                    "each worker's loss is normalized by its own tokens)"
                )
            args.average_tokens_across_devices = False
        if args.include_num_input_tokens_seen not in ("no", False, None) and args.should_log:
            logger.warning(
                "AutoLoCo: include_num_input_tokens_seen gathers token counts every step"
            )

    def _no_ddp_extras(self, args: Any, accelerator: Any) -> None:
        """No ``find_unused_parameters`` all-reduce per backward unless the user asked for it."""
        if self.manage_ddp_kwargs:
            from accelerate.utils import DistributedDataParallelKwargs

            if getattr(accelerator, "ddp_handler", None) is None:
                accelerator.ddp_handler = DistributedDataParallelKwargs()
            if args.ddp_find_unused_parameters is None:
                accelerator.ddp_handler.find_unused_parameters = False
        if args.ddp_find_unused_parameters and args.should_log:
            logger.warning(
                "AutoLoCo: ddp_find_unused_parameters=True adds one small all-reduce of the "
                "used-parameter map per backward (no gradient traffic)"
            )

    # ------------------------------------------------------------ events
    def on_init_end(self, args, state, control, **kwargs):
        if self.trainer is None:
            trainer = trainer_being_built(self)
            if trainer is not None:
                self.attach(trainer)

    def on_train_begin(
        self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs
    ):
        trainer = self._trainer()
        self._last_sync = {}
        self.run_log = TrainerRunLog(args.output_dir, state.is_world_process_zero)
        self.run_log.start(state.global_step)
        if self.runtime is not None:  # a second train() call on the same trainer
            self.runtime.close()
            self.runtime = None
        if self.budget is not None:
            self.budget.begin(trainer, state)
        max_steps = state.max_steps
        warmup = (
            self.config.warmup_steps
            if self.config.warmup_steps is not None
            else args.get_warmup_steps(max_steps)
        )
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
            snapshot_dir=self.config.snapshot_dir,
            snapshot_state=lambda: trainer_boundary_state(trainer),
            live=self.membership is not None,
        )
        check_no_newer_snapshots(self.config, state.global_step)
        bound_trainer_collectives(trainer, self.config.sync_timeout_s, self._restart_advice)
        if state.global_step > 0:
            self._resume(args, state)
        # after the resume: it keeps a copy of each boundary from this one on
        if self.membership is not None:
            self.membership.attach(self.engine, extra_state=lambda: trainer_boundary_state(trainer))
        if state.is_world_process_zero:
            self._announce(max_steps)

    def _announce(self, max_steps: int) -> None:
        """One line on what the run will do, and a warning
        for each setting that makes it something else."""
        config, engine = self.config, self.engine
        workers = f"{engine.num_workers} worker{'' if engine.num_workers == 1 else 's'}"
        if not config.is_interval_method:
            logger.info(
                "AutoLoCo: %s, method %s (every step), %d steps planned",
                workers,
                config.method,
                max_steps,
            )
            return
        interval = engine.current_interval
        h = f"H {interval.h_step}" if interval is not None else "no interval left"
        logger.info(
            "AutoLoCo: %s, method %s, %s, h_base %d, %s, %d steps planned",
            workers,
            config.method,
            _rule(config),
            config.h_base,
            h,
            max_steps,
        )
        if config.h_base > max_steps:
            logger.warning(
                "AutoLoCo: h_base %d is longer than the run's %d steps: one interval, cut to the "
                "run, ends it; lower h_base (AutoLoCoConfig(h_base=...)) below max_steps "
                "for the horizon to matter",
                config.h_base,
                max_steps,
            )
        if engine.num_workers == 1:
            logger.warning(
                "AutoLoCo: 1 worker: nothing is exchanged, so this is local training with an "
                "outer step every H; start one process per worker (torchrun --nproc_per_node N "
                "train.py) to train N workers"
            )

    def _restart_advice(self) -> str:
        """After a peer was lost outside a synchronization:
        the outer state is still the last boundary's."""
        recovery = self.runtime.recovery(self.engine.current_interval)
        return f"the outer state is the last synchronized one: {recovery} (docs/reliability.md)"

    def resume_point(self) -> str | None:
        """What to pass to ``trainer.train(resume_from_checkpoint=...)``
        in a script that a launcher restarts.

        ``None`` on the first attempt; after a restart, the last complete Trainer checkpoint, or,
        with ``snapshot_dir`` set, the last boundary when it is newer or the launch layout changed
        (:mod:`autoloco_hf.integrations.trainer.resume`): any number of workers goes on from there.
        """
        self.resume_from_checkpoint = (
            resume_point(self._trainer(), self.config) or self.resume_from_checkpoint
        )
        return self.resume_from_checkpoint

    def _resume(self, args, state) -> None:
        agreement = self.membership.agreement if self.membership is not None else None
        if agreement is not None and agreement.state is not None:
            engine_state = agreement.state["engine"]
            if int(engine_state["step"]) != state.global_step:
                raise RuntimeError(
                    f"live membership round {agreement.round} agreed on step "
                    f"{engine_state['step']} but the Trainer resumes at step {state.global_step}: "
                    "train with train_live(trainer, membership)"
                )
            self.runtime.resume_at_boundary(engine_state)
            workers = f"{agreement.world_size} worker{'' if agreement.world_size == 1 else 's'}"
            source = f"live membership round {agreement.round} ({workers})"
        else:
            source = self._resume_from_files(args, state)
        engine = self.engine
        # the console's sync summary from the first log on, as in the uninterrupted run
        if engine.records:
            self._last_sync = record_metrics(engine.records[-1], engine)
        if state.is_world_process_zero:
            logger.info(
                "AutoLoCo: resumed step %d from %s: %s",
                state.global_step,
                source,
                _progress(engine),
            )

    def _resume_from_files(self, args, state) -> str:
        checkpoint = resumed_checkpoint(args, state, self.resume_from_checkpoint)
        if os.path.isfile(boundary_file(checkpoint)):
            snapshot = resume_from_boundary(self.runtime, checkpoint, state.global_step)
            source = (
                f"the boundary snapshot {snapshot.path} ({snapshot.workers} workers, now "
                f"{self.engine.num_workers})"
            )
        else:
            restore(self.runtime, checkpoint, state.global_step)
            source = checkpoint
        return source

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
        seconds = None
        if self.budget is not None and self._step_started is not None:
            # this rank's step, without the sync that follows
            seconds = time.perf_counter() - self._step_started
        record = runtime.after_optimizer_step(self._lr, seconds)
        self._lr = None
        if self.budget is not None:
            self.budget.after_step(args, state, control, runtime.step, synced=record is not None)
        if record is not None and self.trainer is not None:
            metrics = runtime.pop_metrics()
            self._last_sync = metrics or self._last_sync
            if metrics and self.log_metrics:
                # Trainer.log (the base method: no subclass side effects such as TRL's metric flush)
                # ends in on_log, which clears control.should_log: keep the Trainer's own logging
                # decision for this step. The console callbacks skip these autoloco/*-only logs
                # (quiet_console); the trackers get them.
                should_log = control.should_log
                Trainer.log(self.trainer, metrics)
                control.should_log = self.trainer.control.should_log = should_log
        if control.should_save:  # decided by DefaultFlowCallback, which runs before user callbacks
            runtime.show_global_parameters()

    # A checkpoint's model file must be the model the workers agreed on: from the moment
    # the Trainer decides to save until on_save, the model holds theta_t and this rank's
    # replica waits in host memory. An evaluation run in the same step (eval_steps ==
    # save_steps) therefore evaluates theta_t too; with save_strategy="best" the
    # decision comes after the evaluation, which saw rank 0's replica.
    def on_step_begin(self, args, state, control, **kwargs):
        if self.runtime is not None:  # save_strategy="best" evaluated theta_t but found no new best
            self.runtime.restore_local_parameters()
            if self.membership is not None and self.membership.join_pending:
                # seen at the last boundary; taken in only now, after the
                # Trainer logged, evaluated and saved that step as it would
                # without the join (the members go on from that boundary)
                raise MembershipChange(
                    "AutoLoCo: a process waits to join at step "
                    f"{self.runtime.step}: the members reform"
                )
            # this rank's next step belongs to the run's step after the catch-up
            if self.budget is not None:
                self.runtime.catch_up()
                set_schedule_step(self.trainer.lr_scheduler, self.runtime.step)
                self._step_started = time.perf_counter()

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
        # the console's view of the sync (later callbacks: progress bar / printer)
        if self._last_sync:
            logs["autoloco"] = _sync_summary(self._last_sync, self.engine.num_workers)
        self.run_log.log_step(state.global_step, logs, self.engine.totals)

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

    def _finish_run(self, args: Any, state: Any) -> None:
        """Warn when the run stops before its planned last
        step; write the run summary for ``autoloco report``."""
        runtime = self.runtime
        if (
            runtime.step < runtime.total_steps
            and self.config.is_interval_method
            and args.should_log
        ):
            records = runtime.engine.records
            last = records[-1].start_step + records[-1].h_step if records else 0
            logger.warning(
                "AutoLoCo: training stopped at step %d of %d planned; the model holds this rank's "
                "local weights %d steps after the last synchronization (step %d), "
                "not a synchronized model",
                runtime.step,
                runtime.total_steps,
                runtime.step - last,
                last,
            )
        self.run_log.finish(
            args.run_name or os.path.basename(os.path.normpath(args.output_dir)),
            self.config,
            runtime.step,
            runtime.total_steps,
            runtime.engine.totals,
            self.records_filename,
        )
        if state.is_world_process_zero:
            logger.info("AutoLoCo: %s", _run_summary(runtime.engine, runtime.step, args.output_dir))
