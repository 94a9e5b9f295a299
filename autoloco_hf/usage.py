"""What the command-line tools share: one-line usage errors, ``argparse`` types and Markdown tables.

The ``autoloco`` command, the recipes and the evals use these helpers, so they all behave alike. A
usage error (a bad flag value, a missing input file, an output path that is a file) prints one
line, ``PROG: error: FLAG VALUE: fix``, and exits with code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

USAGE_ERROR = 2  # argparse's exit code for a usage error


def usage_error(message: str, prog: str | None = None) -> NoReturn:
    """Print ``<prog>: error: <message>`` (one line) and exit with code 2."""
    print(
        f"{prog or os.path.basename(sys.argv[0]) or 'autoloco'}: error: {message}", file=sys.stderr
    )
    raise SystemExit(USAGE_ERROR)


def _at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: pass a whole number >= {minimum}"
        ) from None
    if value < minimum:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: pass a whole number >= {minimum}"
        )
    return value


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (``0`` or ``-3``
    would otherwise mean "default" or "drop the last 3")."""
    return _at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 0 (a warm-up of 0 steps is none)."""
    return _at_least(text, 0)


def new_file_path(text: str) -> str:
    """An ``argparse`` type for an output folder: anything
    but an existing file, or a path inside one."""
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(
            f"{text} is an existing file: pass a folder (new or existing)"
        )
    parent = os.path.dirname(os.path.abspath(text))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(
            f"{text} is inside {parent}, an existing file: pass a folder elsewhere"
        )
    return text


def existing_file(text: str) -> str:
    """An ``argparse`` type for an input file that must exist."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return text


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (not the usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        usage_error(f"{message} (see {self.prog} --help)", self.prog)


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str] | None = None
) -> str:
    """A GitHub Markdown table; ``align`` holds each column's
    separator (``---``, ``---:``), default ``---``."""
    lines = [
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join(align or ["---"] * len(headers)) + " |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
