"""AutoLoCo's console lines at the Trainer's levels: ``log_level`` on the main process,
``log_level_replica`` elsewhere.

Every module logs under the ``autoloco_hf`` logger: the integrations through
``transformers.utils.logging.get_logger(__name__)``, ``autoloco_hf/sync`` through
``logging.getLogger("autoloco_hf")``, because that layer imports torch but not
transformers (the layering of README.md's Layout table; the engine also serves
custom Accelerate and plain PyTorch loops). Both are the same standard-library
logger tree (transformers' ``get_logger`` is ``logging.getLogger``), so one
level applies: the callback sets it per process from the ``TrainingArguments``,
as the Trainer does for transformers' own logger, and a two-rank launch prints
AutoLoCo's start-up and resume lines once. The one handler added here is what
transformers adds to its own ``transformers`` logger: a stderr handler, only
when the application configured none (our tree is not below ``transformers``,
so it cannot use that one).
"""

from __future__ import annotations

import logging
from typing import Any

from transformers.utils import logging as hf_logging

PACKAGE_LOGGER = "autoloco_hf"


def process_log_level(args: Any) -> int:
    """``args.get_process_log_level()``; ``log_level="passive"`` (the default) shows AutoLoCo's info
    lines on the main process, which transformers' default verbosity (warning) would hide."""
    if args.should_log and args.log_level == "passive":
        return min(logging.INFO, hf_logging.get_verbosity())
    return args.get_process_log_level()


def apply_trainer_log_levels(args: Any) -> None:
    """Set the ``autoloco_hf`` logger to this process's level;
    give it a stderr handler when nothing else prints."""
    package = logging.getLogger(PACKAGE_LOGGER)
    package.setLevel(process_log_level(args))
    # else the application's handlers print it
    if not package.handlers and not logging.getLogger().handlers:
        package.addHandler(logging.StreamHandler())
