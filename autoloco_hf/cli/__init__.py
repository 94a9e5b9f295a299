"""The ``autoloco`` command: ``plan``, ``demo``, ``report`` and ``eval``.

Each sub-command lives in its own module, which provides
``add_arguments(parser)`` and ``run(args) -> int``; this file only wires them,
importing each lazily so that ``autoloco plan`` starts in well under a second.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

COMMANDS = {
    "plan": ("autoloco_hf.cli.plan", "preview the horizons, syncs and payload of a recipe before training"),
    "demo": ("autoloco_hf.cli.demo", "train a tiny Llama on CPU with DiLoCo and AutoLoCo and compare them"),
    "report": ("autoloco_hf.cli.report", "compare finished runs side by side (tables and plots)"),
    "eval": ("autoloco_evals.cli", "evaluate a model: NLL, MMLU-Pro, BBH, IFEval, IFBench, HumanEval+"),
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoloco", description="AutoLoCo low-communication training tools")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if name in argv:  # import only the module of the command being run
            importlib.import_module(module).add_arguments(command)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
