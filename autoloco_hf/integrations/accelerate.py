"""``AutoLoCoAccelerate``: AutoLoCo for a plain Accelerate
training loop (in the style of accelerate's ``LocalSGD``).

Wrap the prepared model, optimizer and scheduler once; the loop stays as it is::

    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    with AutoLoCoAccelerate(accelerator, model, optimizer, scheduler,
                            AutoLoCoConfig(method="diloco", h_base=100),
                            total_steps=len(loader)) as autoloco:
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                # a post-step hook counts the true optimizer step and syncs
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()

Per-step gradient all-reduce is removed by the same DDP communication hook as
the Trainer callback; tokens and losses are read from the model's forward
calls. With ``auto_step=False`` nothing is hooked on the optimizer and the loop
calls ``autoloco.step(loss=loss)`` after ``optimizer.step()`` instead (optionally
with ``tokens=`` when the model is not called with ``input_ids`` /
``attention_mask``).

Checkpoints: inside ``with autoloco.synchronized_parameters():`` the model
holds the last synchronized parameters, so the saved model is the one every
worker agreed on, and ``autoloco.save`` keeps this rank's local replica::

    with autoloco.synchronized_parameters():
        accelerator.save_state(folder)
        # every rank; resume: accelerator.load_state(folder); autoloco.load(folder)
        autoloco.save(folder)

Unlike accelerate's ``LocalSGD``, the interval length counts true optimizer
steps (a post-step hook on the unwrapped optimizer fires only when gradient
accumulation actually steps, and not for steps a gradient scaler skipped).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from autoloco_hf.algorithm.schedule import FunctionSchedule, LRMassMixin, SchedulerPreview
from autoloco_hf.config import AutoLoCoConfig, Pacing
from autoloco_hf.integrations.launch_checks import check_launch, fsdp_version
from autoloco_hf.integrations.runtime import RECORDS_FILENAME, WorkerRuntime
from autoloco_hf.sync.pacing import set_schedule_step

logger = hf_logging.get_logger(__name__)


class _StridedSchedule(LRMassMixin):
    """``lr_at(s) = inner.lr_at(s * stride)``: an
    ``AcceleratedScheduler`` steps ``num_processes`` times per step."""

    def __init__(self, inner: Any, stride: int, total_steps: int) -> None:
        self.inner, self.stride, self.total_steps = inner, stride, total_steps

    def lr_at(self, step: int) -> float:
        return 0.0 if step < 0 or step >= self.total_steps else self.inner.lr_at(step * self.stride)


def schedule_preview(
    scheduler: Any, optimizer: torch.optim.Optimizer, total_steps: int, num_processes: int = 1
):
    """An exact LR preview for a raw or accelerate-wrapped
    scheduler (or a constant LR without one)."""
    if scheduler is None:
        lr = float(optimizer.param_groups[0]["lr"])
        return FunctionSchedule(lambda step: lr, total_steps)
    inner = getattr(scheduler, "scheduler", None)
    # accelerate.scheduler.AcceleratedScheduler
    if inner is not None and hasattr(scheduler, "split_batches"):
        stride = (
            1 if (scheduler.split_batches or not scheduler.step_with_optimizer) else num_processes
        )
        if stride == 1:
            return SchedulerPreview(inner, total_steps)
        return _StridedSchedule(SchedulerPreview(inner, total_steps * stride), stride, total_steps)
    return SchedulerPreview(scheduler, total_steps)


def _budget_schedule(scheduler: Any, num_processes: int) -> tuple[Any, int] | None:
    """The ``LambdaLR`` that budget pacing sets to the run's
    step, and its steps per step of the run.

    ``None`` without a scheduler (a constant LR). Other schedulers
    are refused: their LR is not a function of the step.
    """
    from torch.optim.lr_scheduler import LambdaLR

    if scheduler is None:
        return None
    inner = getattr(scheduler, "scheduler", None)
    stride = 1
    # accelerate.scheduler.AcceleratedScheduler
    if inner is not None and hasattr(scheduler, "split_batches"):
        stride = (
            1 if (scheduler.split_batches or not scheduler.step_with_optimizer) else num_processes
        )
        scheduler = inner
    if type(scheduler) is not LambdaLR:
        raise ValueError(
            f"AutoLoCoAccelerate(scheduler={type(scheduler).__name__}) with "
            "AutoLoCoConfig.pacing='budget': each step runs at the run's step of the schedule, "
            "which needs a LambdaLR (transformers' get_*_schedule)"
        )
    return scheduler, stride


class AutoLoCoAccelerate:
    """AutoLoCo / DiLoCo / QSR / Linear Interval around an Accelerate loop.

    Args:
        accelerator: the ``accelerate.Accelerator``.
        model: the prepared model (DDP-wrapped in multi-process runs).
        optimizer: the prepared optimizer.
        scheduler: the prepared LR scheduler, or ``None`` for a constant LR.
        config: the :class:`AutoLoCoConfig`.
        total_steps: the budget in true optimizer steps; the last interval ends there. With
            ``pacing="budget"`` it counts the run's steps (``N`` inner steps of the cluster each):
            loop over :meth:`batches` until :attr:`finished`
            (docs/algorithm.md#pacing-under-the-trainer).
        warmup_steps: inner-LR warm-up (default ``config.warmup_steps`` or 0).
        output_dir: where the main process writes ``autoloco_intervals.jsonl`` (optional).
        auto_step: count optimizer steps with a post-step
            hook (default); ``False``: call :meth:`step`.
    """

    def __init__(
        self,
        accelerator: Any,
        model: torch.nn.Module,
        optimizer: Any,
        scheduler: Any = None,
        config: AutoLoCoConfig | None = None,
        total_steps: int = 0,
        warmup_steps: int | None = None,
        output_dir: str | None = None,
        auto_step: bool = True,
    ) -> None:
        self.config = config or AutoLoCoConfig()
        if total_steps <= 0:
            raise ValueError(
                "total_steps (the number of true optimizer steps of the run) must be positive"
            )
        check_launch(
            accelerator.num_processes,
            accelerator.distributed_type,
            1,
            ranks_per_worker=self.config.ranks_per_worker,
            fsdp_version=fsdp_version(accelerator),
        )
        self.accelerator = accelerator
        self.inner_optimizer = getattr(optimizer, "optimizer", optimizer)
        self.auto_step = auto_step
        warmup = warmup_steps if warmup_steps is not None else (self.config.warmup_steps or 0)
        records = os.path.join(output_dir, RECORDS_FILENAME) if output_dir else None
        self.runtime = WorkerRuntime(
            self.config,
            accelerator.unwrap_model(model),
            model,
            self.inner_optimizer,
            schedule_preview(
                scheduler, self.inner_optimizer, total_steps, accelerator.num_processes
            ),
            total_steps,
            warmup,
            records_path=records,
            is_main_process=accelerator.is_main_process,
        )
        # manual mode: the LR of the last optimizer step, taken at the step
        self._step_lr: float | None = None
        self._hook = self.inner_optimizer.register_step_post_hook(self._post_step)
        self._paced = self.config.pacing == Pacing.BUDGET
        self._pre_hook = None
        if self._paced:
            self._schedule = _budget_schedule(scheduler, accelerator.num_processes)
            self._pre_hook = self.inner_optimizer.register_step_pre_hook(self._before_step)
        self._mark = time.perf_counter()

    # ------------------------------------------------------------ per step
    @property
    def engine(self):
        return self.runtime.engine

    @property
    def finished(self) -> bool:
        """Whether the run's last interval is done (with ``pacing="budget"``,
        ranks get there after different step counts)."""
        return self.runtime.step >= self.runtime.total_steps

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """``loader``'s batches, epoch after epoch, until the run is :attr:`finished`.

        The loop for ``pacing="budget"``, where a fast rank takes more steps than
        ``total_steps`` and a slow one fewer (docs/algorithm.md#pacing-under-the-trainer);
        with lockstep it yields what ``total_steps`` needs.
        """
        while not self.finished:
            empty = True
            for batch in loader:
                empty = False
                if self.finished:
                    return
                yield batch
            if empty:
                raise ValueError("AutoLoCoAccelerate.batches: the loader yielded no batch")

    def _before_step(self, optimizer, args, kwargs) -> None:
        """Budget pacing: this step belongs to the run's step
        after the catch-up; it runs at that step's LR."""
        if self.finished:
            return
        self.runtime.catch_up()
        if self._schedule is not None:
            scheduler, stride = self._schedule
            set_schedule_step(scheduler, self.runtime.step * stride)

    def _account(self, lr: float) -> Any:
        """One true optimizer step: timed from the previous
        one's end (sync excluded) when the pacing needs it."""
        seconds = time.perf_counter() - self._mark if self._paced else None
        record = self.runtime.after_optimizer_step(lr, seconds)
        self._mark = time.perf_counter()
        return record

    def _post_step(self, optimizer, args, kwargs) -> None:
        lr = float(optimizer.param_groups[0]["lr"])
        if not self.auto_step:  # step() accounts it, maybe after the loop has stepped the scheduler
            self._step_lr = lr
        elif not self.finished:
            self._account(lr)

    def step(self, loss: Any = None, tokens: int | None = None):
        """Manual mode (``auto_step=False``): call after
        ``optimizer.step()``; returns a record at a sync.

        The step is accounted at the learning rate the optimizer used, also when
        ``scheduler.step()`` ran in between.

        Calls made while gradients accumulate (``accelerator.sync_gradients`` is ``False``) or after
        a step the gradient scaler skipped are ignored, so intervals count true optimizer steps.
        """
        if self.auto_step:
            raise RuntimeError(
                "this AutoLoCoAccelerate counts steps by itself "
                "(auto_step=True): do not call step()"
            )
        if not self.accelerator.sync_gradients or getattr(
            self.accelerator, "optimizer_step_was_skipped", False
        ):
            return None
        meter = self.runtime.meter
        if tokens is not None:
            meter.step_tokens = int(tokens)
        if loss is not None and not meter.loss_seen:
            meter.step_plain_loss, meter.step_plain_count = float(loss), 1
        if self.finished:
            return None
        lr, self._step_lr = self._step_lr, None
        return self._account(
            lr if lr is not None else float(self.inner_optimizer.param_groups[0]["lr"])
        )

    def pop_metrics(self) -> dict[str, float]:
        """``autoloco/*`` scalars of the syncs since the last call, e.g. for ``accelerator.log``."""
        return self.runtime.pop_metrics()

    # ------------------------------------------------------------ state
    @contextlib.contextmanager
    def synchronized_parameters(self) -> Iterator[None]:
        """Within the block the model holds theta_t, the last
        synchronized parameters; the replica returns after.

        Wrap ``accelerator.save_state`` / ``save_pretrained`` / an
        evaluation in it so that what is saved or evaluated is the model
        every worker agreed on, not this rank's mid-interval replica.
        """
        self.runtime.show_global_parameters()
        try:
            yield
        finally:
            self.runtime.restore_local_parameters()

    def save(self, checkpoint_dir: str) -> str:
        """Write this rank's AutoLoCo state (call on every rank, next to
        ``accelerator.save_state``)."""
        return self.runtime.save(checkpoint_dir)

    def load(self, checkpoint_dir: str) -> str:
        """Load this rank's state: outer parameters, momentum,
        controller, local parameters, inner optimizer."""
        return self.runtime.load(checkpoint_dir)

    def state_dict(self) -> dict[str, Any]:
        return self.runtime.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.runtime.load_state_dict(state)

    # ------------------------------------------------------------ context
    def close(self) -> None:
        for hook in (self._hook, self._pre_hook):
            if hook is not None:
                hook.remove()
        self._hook = self._pre_hook = None
        self.runtime.close()

    def __enter__(self) -> AutoLoCoAccelerate:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if (
            exc_type is None
            and self.runtime.step < self.runtime.total_steps
            and self.accelerator.is_main_process
        ):
            logger.warning(
                "AutoLoCo: the loop ended at step %d before total_steps=%d: workers hold "
                "different parameters (the last interval never synchronized)",
                self.runtime.step,
                self.runtime.total_steps,
            )
        self.close()
