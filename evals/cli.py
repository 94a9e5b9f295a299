"""`autoloco eval` arguments and handler (also `python -m autoloco_evals`).

``--offline`` is applied before anything imports the hub clients (their
offline switches are read at import), and every path is checked before the
slow model load, so a typo costs one line and exit code 2, not a minute of
retries and a traceback.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autoloco_hf.cli import existing_file, new_file_path, positive_int, usage_error

from .offline import MissingLocalDataError, set_offline
from .report import load_records, markdown_table
from .runner import DATA, FIXTURES_DIR, SUITES, TASKS, evaluate_model_dir, resolve_data, suite_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add MODEL_DIR positionals and the evaluation options to ``parser``."""
    parser.add_argument("model_dirs", nargs="*", metavar="MODEL_DIR", help="checkpoint folders (model + tokenizer)")
    parser.add_argument(
        "--suite",
        choices=sorted(SUITES),
        default="paper",
        help="paper: full paper settings; quick: 10 examples per (sub)task, short generations",
    )
    parser.add_argument("--tasks", nargs="+", choices=TASKS, help="subset of tasks (default: all)")
    parser.add_argument("--limit", type=positive_int, help="examples per (sub)task (overrides the suite)")
    parser.add_argument("--batch-size", type=positive_int, help="generation / NLL batch size (default 8)")
    parser.add_argument(
        "--max-gen-toks", type=positive_int, help="max generated tokens for lm-eval tasks (default: each task's own)"
    )
    parser.add_argument(
        "--humaneval-max-new-tokens", type=positive_int, help="max generated tokens for HumanEval+ (default 768)"
    )
    parser.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="apply the tokenizer's chat template (default: when it has one)",
    )
    parser.add_argument("--num-documents", type=positive_int, help="C4-style documents for NLL (default 4096)")
    parser.add_argument("--num-conversations", type=positive_int, help="chat conversations for NLL (default 1000)")
    parser.add_argument(
        "--nll-max-length", type=positive_int, help="truncate NLL examples to this many tokens (default 2048)"
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="no network: every task needs local data; fail fast naming the missing option",
    )
    data = parser.add_mutually_exclusive_group()
    data.add_argument(
        "--data-dir",
        type=Path,
        help="folder holding datasets under their default names: " + ", ".join(s.filename for s in DATA.values()),
    )
    data.add_argument(
        "--fixtures", action="store_true", help="use the tiny bundled fixtures for every dataset (a smoke test)"
    )
    for key, source in DATA.items():
        parser.add_argument(source.option, dest=f"{key}_path", type=Path, metavar="PATH", help=f"local {source.what}")
    parser.add_argument(
        "--out",
        type=lambda text: Path(new_file_path(text)),
        default=Path("eval_results"),
        help="output folder (default ./eval_results)",
    )
    parser.add_argument("--run-name", help="name of the run in the JSON and table (default: the folder name)")
    parser.add_argument(
        "--compare",
        nargs="+",
        type=existing_file,
        default=[],
        metavar="RUN_JSON",
        help="earlier run JSON files to add as table rows",
    )
    parser.add_argument("--device", help="default: cuda when available, else cpu")
    parser.add_argument("--dtype", default="auto", help="torch dtype to load the model in (default: the checkpoint's)")


def run(args: argparse.Namespace) -> int:
    """Evaluate each MODEL_DIR, write one JSON per model and a Markdown table; return an exit code."""
    if args.offline:  # before transformers / datasets / huggingface_hub are imported
        set_offline()
    if not args.model_dirs and not args.compare:
        usage_error("give at least one MODEL_DIR or --compare RUN_JSON", "autoloco eval")
    if args.run_name and len(args.model_dirs) > 1:
        usage_error("--run-name needs a single MODEL_DIR", "autoloco eval")
    settings = suite_settings(
        args.suite,
        tasks=tuple(args.tasks) if args.tasks else None,
        limit=args.limit,
        batch_size=args.batch_size,
        max_gen_toks=args.max_gen_toks,
        humaneval_max_new_tokens=args.humaneval_max_new_tokens,
        chat_template=args.chat_template,
        num_documents=args.num_documents,
        num_conversations=args.num_conversations,
        nll_max_length=args.nll_max_length,
        offline=args.offline or None,
        data_dir=FIXTURES_DIR if args.fixtures else args.data_dir,
        paths={key: getattr(args, f"{key}_path") for key in DATA if getattr(args, f"{key}_path") is not None},
    )
    try:
        if args.model_dirs:
            resolve_data(settings)  # missing data first: it names the option to set
    except MissingLocalDataError as err:
        usage_error(str(err), "autoloco eval")
    for model_dir in args.model_dirs:
        if not (Path(model_dir) / "config.json").is_file():
            what = "has no config.json" if Path(model_dir).is_dir() else "does not exist"
            usage_error(
                f"MODEL_DIR {model_dir} {what}: pass a folder written by save_pretrained "
                "(a recipe's run folder, or a Trainer's output_dir)",
                "autoloco eval",
            )
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    try:
        for model_dir in args.model_dirs:
            records.append(evaluate_model_dir(model_dir, settings, args.out, args.run_name, args.device, args.dtype))
    except MissingLocalDataError as err:
        usage_error(str(err), "autoloco eval")
    table = markdown_table(records + load_records(args.compare))
    (args.out / "table.md").write_text(table)
    print(table)
    return 0
