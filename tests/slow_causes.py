"""Why a test is ``slow``: its code reaches a name of
``SLOW_CAUSES`` (``tests/conftest.py`` applies it).

The search follows the test function, the fixtures it requests and the helpers
they name that live under ``tests/`` (functions of the same module, or of a helper
module such as ``launch``), to any depth. Code outside ``tests/`` (the package,
pytest, torch) is not followed: the causes are the test helpers' own calls.
"""

from __future__ import annotations

import inspect
import types
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# A name in the code, and why reaching it makes a test slow. Each costs
# seconds: a spawned interpreter imports torch (2-3 s) and, through
# transformers' Trainer, much more (~9 s); a Trainer run trains.
SLOW_CAUSES = {
    "run_gloo": "spawns gloo ranks (_dist.run_gloo)",
    "torchrun": "launches torchrun (launch.torchrun)",
    "torchrun_failing": "launches torchrun (launch.torchrun_failing)",
    "subprocess": "runs a child process",
    "multiprocessing": "spawns processes",
    "start_processes": "spawns processes",
    "Trainer": "trains a transformers Trainer",
    "SFTTrainer": "trains a TRL SFTTrainer",
}


def _under_tests(obj: object) -> bool:
    path = getattr(getattr(obj, "__code__", None), "co_filename", None) or getattr(
        obj, "__file__", None
    )
    return path is not None and Path(path).resolve().is_relative_to(TESTS)


def _names(code: types.CodeType) -> set[str]:
    """The global and attribute names ``code`` uses, nested functions and lambdas included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def slow_cause(func: object, seen: dict[types.CodeType, str | None] | None = None) -> str | None:
    """Why calling ``func`` is slow (a ``SLOW_CAUSES`` value), or None.

    ``seen``: the answers so far, shared across calls (a
    collection asks about the same helpers many times).
    """
    seen = {} if seen is None else seen
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if code is None or not _under_tests(func):
        return None
    if code in seen:
        return seen[code]
    seen[code] = None  # a helper that calls itself ends here
    names = _names(code)
    cause = next((SLOW_CAUSES[name] for name in sorted(names & SLOW_CAUSES.keys())), None)
    scope = func.__globals__
    helper_modules = [
        m for m in (scope.get(n) for n in names) if inspect.ismodule(m) and _under_tests(m)
    ]
    for name in sorted(names):
        if cause is not None:
            break
        for helper in (scope.get(name), *(getattr(m, name, None) for m in helper_modules)):
            if inspect.isfunction(helper) and (cause := slow_cause(helper, seen)):
                break
    seen[code] = cause
    return cause
