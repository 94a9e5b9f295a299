"""Evaluation suite: validation NLL and lm-eval / evalplus wrappers (installed as `autoloco_evals`).

Python API: `evaluate(model, tokenizer, settings, out_dir)` or
`evaluate_model_dir(path, settings, out_dir)`, with `suite_settings("paper" | "quick", ...)`.
"""

from .offline import MissingLocalDataError
from .report import scores_table
from .runner import TASKS, EvalSettings, evaluate, evaluate_model_dir, suite_settings

__all__ = [
    "TASKS",
    "EvalSettings",
    "MissingLocalDataError",
    "evaluate",
    "evaluate_model_dir",
    "scores_table",
    "suite_settings",
]
