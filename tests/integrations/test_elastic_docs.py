"""The elastic command users copy from docs/hf.md recovers as
fast as the testbed measured (docs/reliability.md).

Every ``torchrun --nnodes MIN:MAX`` command in docs/hf.md is parsed by
torchrun's own argument parser and launch configuration; its rendezvous
settings must be those of ``benchmarks/testbeds/elastic_testbed.py``,
where the recovery times in docs/reliability.md come from.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
from torch.distributed.run import config_from_args, get_args_parser

ROOT = Path(__file__).resolve().parents[2]
TIMING_KEYS = ("last_call_timeout", "keep_alive_interval", "keep_alive_max_attempt")


def elastic_testbed_settings(backend: str) -> dict[str, str]:
    """The testbed's rendezvous timing for ``backend`` (its
    etcd agents tolerate a leader election, §etcd)."""
    spec = importlib.util.spec_from_file_location(
        "elastic_testbed", ROOT / "benchmarks" / "testbeds" / "elastic_testbed.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    conf = module.ETCD_RDZV_CONF if backend == "etcd-v2" else module.RDZV_CONF
    settings = dict(item.split("=", 1) for item in conf.split(","))
    return {key: settings[key] for key in TIMING_KEYS}


def documented_elastic_commands(markdown: str) -> list[list[str]]:
    """torchrun's arguments in each elastic command of
    ``markdown`` (table cells and indented blocks)."""
    text = markdown.replace("\\\n", " ")  # shell line continuations
    commands = [
        shlex.split(m.group(1)) for m in re.finditer(r"torchrun (--nnodes \d+:\d+[^`\n]*)", text)
    ]
    # placeholders the reader fills in: a process count
    return [["1" if arg == "G" else arg for arg in command] for command in commands]


def rendezvous_settings(argv: list[str]) -> dict[str, str]:
    """The ``--rdzv-conf`` torchrun would hand its rendezvous
    for ``argv`` (as torchrun itself parses it)."""
    config, _, _ = config_from_args(get_args_parser().parse_args(argv))
    return {key: str(value) for key, value in config.rdzv_configs.items()}


@pytest.mark.parametrize("doc", ["docs/hf.md"])
def test_the_documented_elastic_commands_carry_the_testbeds_rendezvous_settings(doc):
    commands = documented_elastic_commands((ROOT / doc).read_text())
    assert len(commands) >= 2, f"{doc}: expected the table's and the section's elastic command"
    backends = [argv[argv.index("--rdzv-backend") + 1] for argv in commands]
    assert "etcd-v2" in backends and "c10d" in backends, backends
    for argv, backend in zip(commands, backends):
        got = rendezvous_settings(argv)
        assert {key: got.get(key) for key in TIMING_KEYS} == elastic_testbed_settings(backend), (
            " ".join(argv)
        )
