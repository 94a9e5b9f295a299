"""`autoloco eval` arguments and handler (also `python -m autoloco_evals`).

Every input is checked before the slow work: paths first (nothing heavy
imported), then ``--offline`` (before anything imports the hub clients: they
read their offline switches at import), then the rows of every local data file
and the device, all before the model loads. A typo costs one line and exit
code 2, not a minute of retries and a traceback. lm-eval's spellings work too:
``--output_path``, ``--batch_size``, ``--tasks nll,ifeval``.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

from autoloco_hf.usage import existing_file, new_file_path, positive_int, usage_error

from .errors import EvalInputError
from .report import load_records, scores_table
from .runner import (
    DATA,
    DTYPES,
    FIXTURES_DIR,
    SUITES,
    TASKS,
    evaluate_model_dir,
    resolve_data,
    suite_settings,
)

PROG = "autoloco eval"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def task_list(text: str) -> list[str]:
    """An ``argparse`` type: one task or comma-separated tasks (lm-eval's ``--tasks a,b``)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    for name in names:
        if name not in TASKS:
            close = difflib.get_close_matches(name, TASKS, n=1)
            hint = f"did you mean {close[0]}?" if close else f"choose from {', '.join(TASKS)}"
            raise argparse.ArgumentTypeError(f"unknown task {name!r}; {hint}")
    if not names:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: pass tasks such as nll,ifeval")
    return names


def device_name(text: str) -> str:
    """An ``argparse`` type: a PyTorch device name; whether
    this build has it is checked before the model loads."""
    if not re.fullmatch(r"(cpu|mps|(cuda|xpu)(:\d+)?)", text):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: pass cpu, cuda, cuda:1 or mps")
    return text


def model_folder(path: Path) -> Path:
    """The folder to load for MODEL_DIR: itself when it holds
    config.json, else a Trainer output_dir's last checkpoint.

    Where the folder also holds checkpoints, says which model is evaluated (one line on stderr); a
    folder with neither is a usage error.
    """
    if not path.is_dir():
        what = "is a file" if path.exists() else "does not exist"
        usage_error(f"MODEL_DIR {path} {what}: pass a folder written by save_pretrained", PROG)
    steps = {
        int(m.group(1)): d
        for d in path.iterdir()
        if (m := _CHECKPOINT.match(d.name)) and (d / "config.json").is_file()
    }
    if (path / "config.json").is_file():
        if steps:
            print(
                f"{PROG}: {path}: evaluating its final model, not its checkpoint-N folders",
                file=sys.stderr,
            )
        return path
    if not steps:
        usage_error(
            f"MODEL_DIR {path} has no config.json and no checkpoint-N folder with one: pass a "
            "folder written by save_pretrained (a recipe's run folder, a Trainer's output_dir "
            "after save_model, or its checkpoint-N)",
            PROG,
        )
    last = steps[max(steps)]
    print(
        f"{PROG}: {path} holds no final model (config.json): evaluating "
        f"its last checkpoint, {last}",
        file=sys.stderr,
    )
    return last


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add MODEL_DIR positionals and the evaluation options to ``parser``."""
    parser.add_argument(
        "model_dirs", nargs="*", metavar="MODEL_DIR", help="checkpoint folders (model + tokenizer)"
    )
    parser.add_argument(
        "--suite",
        choices=sorted(SUITES),
        default="paper",
        help="paper: full paper settings; quick: 10 examples per (sub)task, short generations",
    )
    parser.add_argument(
        "--tasks",
        nargs="+",
        type=task_list,
        metavar="TASK",
        help=f"subset of {', '.join(TASKS)}, space- or comma-separated (default: all)",
    )
    parser.add_argument(
        "--limit", type=positive_int, help="examples per (sub)task (overrides the suite)"
    )
    parser.add_argument(
        "--batch-size",
        "--batch_size",
        type=positive_int,
        help="generation / NLL batch size (default 8)",
    )
    parser.add_argument(
        "--max-gen-toks",
        type=positive_int,
        help="max generated tokens for lm-eval tasks (default: each task's own)",
    )
    parser.add_argument(
        "--humaneval-max-new-tokens",
        type=positive_int,
        help="max generated tokens for HumanEval+ (default 768)",
    )
    parser.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="apply the tokenizer's chat template (default: when it has one)",
    )
    parser.add_argument(
        "--num-documents", type=positive_int, help="C4-style documents for NLL (default 4096)"
    )
    parser.add_argument(
        "--num-conversations", type=positive_int, help="chat conversations for NLL (default 1000)"
    )
    parser.add_argument(
        "--nll-max-length",
        type=positive_int,
        help="truncate NLL examples to this many tokens (default 2048)",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="no network: every task needs local data; fail fast naming the missing option",
    )
    parser.add_argument(
        "--approximate-punkt",
        action="store_true",
        help="score IFEval / IFBench with an empty Punkt model when NLTK's punkt_tab is not "
        "installed (default: refuse; --fixtures implies it); the record "
        "says which splitter scored",
    )
    data = parser.add_mutually_exclusive_group()
    data.add_argument(
        "--data-dir",
        type=Path,
        help="folder holding datasets under their default names: "
        + ", ".join(s.filename for s in DATA.values()),
    )
    data.add_argument(
        "--fixtures",
        action="store_true",
        help="use the tiny bundled fixtures for every dataset (a smoke test)",
    )
    for key, source in DATA.items():
        parser.add_argument(
            source.option,
            dest=f"{key}_path",
            type=Path,
            metavar="PATH",
            help=f"local {source.what}",
        )
    parser.add_argument(
        "--out",
        "--output_path",
        "--output-path",
        dest="out",
        type=lambda text: Path(new_file_path(text)),
        default=Path("eval_results"),
        help="output folder (default ./eval_results)",
    )
    parser.add_argument(
        "--run-name", help="name of the run in the JSON and table (default: the folder name)"
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        type=existing_file,
        default=[],
        metavar="RUN_JSON",
        help="earlier run JSON files to add as table rows",
    )
    parser.add_argument(
        "--device", type=device_name, help="cpu, cuda, cuda:N or mps (default: cuda when available)"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="torch dtype to load the model in (default: the checkpoint's)",
    )


def run(args: argparse.Namespace) -> int:
    """Evaluate each MODEL_DIR, write one JSON per model and
    a Markdown table; return an exit code."""
    if not args.model_dirs and not args.compare:
        usage_error("give at least one MODEL_DIR or --compare RUN_JSON", PROG)
    if args.run_name and len(args.model_dirs) > 1:
        usage_error("--run-name needs a single MODEL_DIR", PROG)
    settings = suite_settings(
        args.suite,
        tasks=tuple(dict.fromkeys(t for group in args.tasks for t in group))
        if args.tasks
        else None,
        limit=args.limit,
        batch_size=args.batch_size,
        max_gen_toks=args.max_gen_toks,
        humaneval_max_new_tokens=args.humaneval_max_new_tokens,
        chat_template=args.chat_template,
        num_documents=args.num_documents,
        num_conversations=args.num_conversations,
        nll_max_length=args.nll_max_length,
        offline=args.offline or None,
        approximate_punkt=args.approximate_punkt or args.fixtures or None,
        data_dir=FIXTURES_DIR if args.fixtures else args.data_dir,
        paths={
            key: getattr(args, f"{key}_path")
            for key in DATA
            if getattr(args, f"{key}_path") is not None
        },
    )
    models = {Path(d): model_folder(Path(d)) for d in args.model_dirs}  # nothing heavy imported yet
    try:
        if models:
            resolve_data(settings)  # missing data first: it names the option to set
        records = []
        for given, folder in models.items():
            # a Trainer output_dir's name, not "checkpoint-N"
            run_name = args.run_name or given.name
            records.append(
                evaluate_model_dir(folder, settings, args.out, run_name, args.device, args.dtype)
            )
    except EvalInputError as err:
        usage_error(str(err), PROG)
    table = scores_table(records + load_records(args.compare))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table)
    print(table)
    return 0
