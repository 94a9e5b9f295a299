"""The rules' and the config's docstring examples run as
written: they state the defaults (gain, h_max)."""

from __future__ import annotations

import doctest

import pytest

from autoloco_hf.algorithm.rules import descent, paper
from autoloco_hf.config import autoloco_config


@pytest.mark.parametrize("module", [descent, paper, autoloco_config], ids=lambda m: m.__name__)
def test_the_examples_give_what_they_show(module) -> None:
    failed, attempted = doctest.testmod(module)
    assert attempted > 0 and failed == 0
