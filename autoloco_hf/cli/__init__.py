"""The ``autoloco`` command: ``plan``, ``demo``, ``report`` and ``eval``.

Each sub-command lives in its own module, which provides
``add_arguments(parser)`` and ``run(args) -> int``; this file only wires them,
importing each lazily so that ``autoloco plan`` starts in well under a second.

Usage errors (a bad flag value, a missing input file, an output path that is
a file) print one line, ``autoloco CMD: error: FLAG VALUE: fix``, and exit
with code 2: the sub-commands, the recipes and the evals share the helpers of
:mod:`autoloco_hf.usage`, so they all behave alike.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from autoloco_hf.usage import OneLineParser

COMMANDS = {
    "plan": (
        "autoloco_hf.cli.plan",
        "preview the horizons, syncs and payload of a recipe before training",
    ),
    "demo": (
        "autoloco_hf.cli.demo",
        "train a tiny Llama on CPU with DiLoCo and AutoLoCo and compare them",
    ),
    "report": ("autoloco_hf.cli.report", "compare finished runs side by side (tables and plots)"),
    "eval": (
        "autoloco_evals.cli",
        "evaluate a model: NLL, MMLU-Pro, BBH, IFEval, IFBench, HumanEval+",
    ),
}


BROKEN_PIPE = 128 + 13  # the status of a process killed by SIGPIPE


def build_parser(
    argv: Sequence[str],
) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``autoloco`` parser and its sub-command parsers (by name)."""
    parser = OneLineParser(prog="autoloco", description="AutoLoCo low-communication training tools")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}"
    )
    commands = {}
    for name, (module, help_text) in COMMANDS.items():
        commands[name] = sub.add_parser(name, help=help_text, description=help_text)
        if name in argv:  # import only the module of the command being run
            importlib.import_module(module).add_arguments(commands[name])
    return parser, commands


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the sub-command's own error: "autoloco plan: ... (see autoloco plan --help)"
        commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    # `autoloco plan --json | head`: the reader left; stop as `yes | head` does
    except BrokenPipeError:
        # Python's documented recipe: point stdout at devnull
        # so that the flush at exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
