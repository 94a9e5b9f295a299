"""The slow tier's rule (tests/slow_causes.py, applied by
tests/conftest.py): marked by cause, followed to any depth."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _dist import run_gloo
from integrations import launch
from slow_causes import SLOW_CAUSES, slow_cause


def _rank_sum(rank: int, world_size: int) -> int:
    return rank + world_size


def _two_ranks() -> list[int]:
    return run_gloo(_rank_sum, 2)


def _through_a_helper() -> list[int]:
    return _two_ranks()


def _through_a_helper_module() -> None:
    launch._run_local("trainer_worker.py", {}, 2, 1.0)  # never called: only its code is read


def _in_a_lambda() -> object:
    return lambda: subprocess.run([sys.executable, "-c", "pass"], check=True)


def _pure(x: int) -> int:
    return _pure(x - 1) if x else 0  # calls itself: the search must end


def test_a_cause_is_found_in_the_function_and_through_its_helpers() -> None:
    assert slow_cause(_two_ranks) == SLOW_CAUSES["run_gloo"]
    assert slow_cause(_through_a_helper) == SLOW_CAUSES["run_gloo"]
    assert slow_cause(_through_a_helper_module) == SLOW_CAUSES["subprocess"]
    assert slow_cause(_in_a_lambda) == SLOW_CAUSES["subprocess"]


def test_pure_code_and_code_outside_tests_have_no_cause() -> None:
    assert slow_cause(_pure) is None
    assert slow_cause(_rank_sum) is None
    assert slow_cause(subprocess.run) is None  # not under tests/: not followed


@pytest.fixture
def child_python():
    """Would start a child interpreter: requesting it makes a
    test slow, even when the test never calls it."""
    return lambda: subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_a_fixture_that_spawns_marks_its_test_slow(request, child_python) -> None:
    assert request.node.get_closest_marker("slow") is not None


def test_a_test_with_no_cause_stays_in_the_quick_tier(request, tmp_path) -> None:
    assert request.node.get_closest_marker("slow") is None
