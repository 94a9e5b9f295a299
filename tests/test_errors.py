"""Every exception class of the package derives from
``AutoLoCoError``, so one ``except`` catches them all."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import autoloco_hf
from autoloco_hf.errors import AutoLoCoError


def _package_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(autoloco_hf.__path__, prefix="autoloco_hf."):
        if info.name.startswith("autoloco_hf.cli.__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == info.name:
                found.append(value)
    return found


def test_every_exception_of_the_package_is_an_autoloco_error() -> None:
    exceptions = _package_exceptions()
    assert len(exceptions) >= 15  # the walk found the package's modules
    assert [e.__qualname__ for e in exceptions if not issubclass(e, AutoLoCoError)] == []


def test_each_keeps_the_built_in_base_callers_already_catch() -> None:
    from autoloco_hf.config import ConfigError
    from autoloco_hf.state.checkpoint import CheckpointError
    from autoloco_hf.sync.control import WorkerDisagreement

    assert issubclass(ConfigError, ValueError) and issubclass(CheckpointError, ValueError)
    assert issubclass(WorkerDisagreement, RuntimeError)
