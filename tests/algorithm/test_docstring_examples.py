"""The rules' and the config's docstring examples run as written: they state the defaults (gain, h_max)."""

from __future__ import annotations

import doctest

import pytest

from autoloco_hf import config
from autoloco_hf.algorithm.rules import descent, paper


@pytest.mark.parametrize("module", [descent, paper, config], ids=lambda m: m.__name__)
def test_the_examples_give_what_they_show(module) -> None:
    failed, attempted = doctest.testmod(module)
    assert attempted > 0 and failed == 0
