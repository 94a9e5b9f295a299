"""AutoLoCo's console lines follow the Trainer's log_level
(main process) and log_level_replica (other ranks)."""

from __future__ import annotations

import logging

import pytest
from transformers import TrainingArguments

from autoloco_hf.integrations.trainer.log_levels import (
    PACKAGE_LOGGER,
    apply_trainer_log_levels,
    process_log_level,
)


def args(tmp_path, **overrides) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **overrides)


@pytest.fixture(autouse=True)
def keep_the_package_level():
    package = logging.getLogger(PACKAGE_LOGGER)
    level = package.level
    yield
    package.setLevel(level)


@pytest.mark.parametrize(
    "main, overrides, level",
    [
        (True, {}, logging.INFO),  # passive: AutoLoCo's info lines on the main process
        (True, {"log_level": "warning"}, logging.WARNING),
        (True, {"log_level": "debug"}, logging.DEBUG),
        (False, {}, logging.WARNING),  # log_level_replica's default
        (False, {"log_level": "debug", "log_level_replica": "error"}, logging.ERROR),
        (False, {"log_level_replica": "info"}, logging.INFO),
    ],
)
def test_the_process_level_is_the_trainers(tmp_path, monkeypatch, main, overrides, level):
    monkeypatch.setattr(TrainingArguments, "should_log", property(lambda self: main))
    training_args = args(tmp_path, **overrides)
    assert process_log_level(training_args) == level
    apply_trainer_log_levels(training_args)
    assert logging.getLogger(PACKAGE_LOGGER).level == level
    assert (
        logging.getLogger("autoloco_hf.integrations.trainer.callback").getEffectiveLevel() == level
    )
