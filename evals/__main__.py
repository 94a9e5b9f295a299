"""`python -m autoloco_evals MODEL_DIR ...`: the same command as `autoloco eval`."""

import sys

from autoloco_hf.usage import OneLineParser

from .cli import add_arguments, run


def main() -> int:
    parser = OneLineParser(prog="python -m autoloco_evals", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
