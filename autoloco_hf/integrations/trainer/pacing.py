"""Budget pacing under the ``Trainer``: each rank takes the optimizer steps of its share
(docs/algorithm.md#pacing-under-the-trainer).

With ``pacing="budget"`` a fast rank takes more optimizer steps in an interval
than a slow one, so the ranks' Trainers no longer count the same steps. The
Trainer's own step counter (``state.global_step``) is kept as the **run's**
step, the one the engine counts (``N`` inner steps of the cluster each, as in
lockstep), so that everything the Trainer derives from it agrees across ranks:
``max_steps`` (the run's budget), checkpoint folders, the progress bar, the
learning-rate schedule and the ``logging_steps`` / ``eval_steps`` /
``save_steps`` cadence. Each rank's optimizer steps are its own
(:attr:`BudgetTrainerSteps.optimizer_steps`).

The Trainer's collectives (the loss gather of a log, evaluation, the checkpoint
barriers) must be entered by every rank in the same order. Ranks only meet at a
synchronization, so under budget pacing logs, evaluations and checkpoints
happen at boundaries: the first one at or after each multiple of the cadence.
"""

from __future__ import annotations

from typing import Any

from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from autoloco_hf.errors import AutoLoCoConfigurationError


def _refuse(field: str, value: Any, fix: str) -> None:
    raise AutoLoCoConfigurationError(
        f"TrainingArguments.{field}={value!r} does not work with AutoLoCoConfig.pacing='budget' "
        "(ranks take different numbers of steps, "
        f"docs/algorithm.md#pacing-under-the-trainer): {fix}"
    )


class BudgetTrainerSteps:
    """The Trainer's side of budget pacing: its step counter,
    schedule and cadence follow the run's steps.

    Built before ``train()`` (the callback's ``attach``): the Trainer sizes its
    epochs from ``max_steps``, and the fastest rank may take up to ``N`` times
    the run's steps, so ``args.max_steps`` becomes ``N * max_steps`` for that
    sizing only; the run's budget stays ``run_steps``.
    """

    def __init__(self, args: Any, workers: int) -> None:
        self.check(args)
        self.run_steps = int(args.max_steps)
        args.max_steps = self.run_steps * workers
        self.optimizer_steps = 0  # this rank's own, since train() began
        self._last_boundary = 0

    @staticmethod
    def check(args: Any) -> None:
        """One line for each Trainer setting budget pacing cannot honour."""
        if args.max_steps is None or args.max_steps <= 0:
            _refuse(
                "max_steps",
                args.max_steps,
                "set max_steps, the run's budget in steps (epochs differ by rank)",
            )
        for field in ("logging_strategy", "eval_strategy", "save_strategy"):
            if getattr(args, field) == IntervalStrategy.EPOCH:
                _refuse(
                    field,
                    str(getattr(args, field)),
                    "use 'steps' (ranks finish their epochs at different times)",
                )
        if args.include_num_input_tokens_seen not in ("no", False, None):
            _refuse(
                "include_num_input_tokens_seen",
                args.include_num_input_tokens_seen,
                "unset it (it gathers token counts at every step; the interval records "
                "count each worker's tokens)",
            )

    def begin(self, trainer: Any, state: Any) -> None:
        """At ``on_train_begin``: the run's budget, cadence
        and learning-rate schedule (over ``run_steps``)."""
        from torch.optim.lr_scheduler import LambdaLR

        args = trainer.args
        state.max_steps = self.run_steps
        # logging/eval/save steps given as ratios: of the run's budget
        state.compute_steps(args, self.run_steps)
        inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        trainer.lr_scheduler = None
        trainer.create_scheduler(num_training_steps=self.run_steps, optimizer=inner)
        if type(trainer.lr_scheduler) is not LambdaLR:
            _refuse(
                "lr_scheduler_type",
                str(args.lr_scheduler_type),
                "use a schedule of the step alone (linear, cosine, constant, ...: LambdaLR)",
            )
        self.optimizer_steps = 0
        self._last_boundary = state.global_step

    def after_step(self, args: Any, state: Any, control: Any, run_step: int, synced: bool) -> None:
        """At ``on_step_end``, after the engine accounted the
        step: the run's step, and what the Trainer does now.

        Between boundaries nothing is logged, evaluated or saved; at a boundary, whatever the
        cadence (``state.logging_steps`` ...) placed since the previous one. The run stops at its
        budget, not at the Trainer's count of this rank's steps.
        """
        self.optimizer_steps += 1
        # DefaultFlowCallback's reason to stop
        stopped_by_step_count = state.global_step >= state.max_steps
        state.global_step = run_step
        cadence = {
            "should_log": (args.logging_strategy == IntervalStrategy.STEPS, state.logging_steps),
            "should_evaluate": (
                args.eval_strategy == IntervalStrategy.STEPS and run_step >= (args.eval_delay or 0),
                state.eval_steps,
            ),
            "should_save": (args.save_strategy == SaveStrategy.STEPS, state.save_steps),
        }
        ended = run_step >= self.run_steps
        for flag, (enabled, every) in cadence.items():
            crossed = bool(every) and run_step // every > self._last_boundary // every
            # the run's end evaluates and saves as DefaultFlowCallback's
            # last step does; the first log likewise
            first = flag == "should_log" and args.logging_first_step and self._last_boundary == 0
            at_end = ended and flag != "should_log"
            setattr(control, flag, synced and enabled and (crossed or first or at_end))
        if synced:
            self._last_boundary = run_step
        if ended:
            control.should_training_stop = True
        elif stopped_by_step_count:
            control.should_training_stop = False
