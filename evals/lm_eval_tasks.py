"""MMLU-Pro, BBH, IFEval and IFBench through lm-eval's own tasks and metrics.

With hub data we run lm-eval's built-in tasks (and our IFBench task) as they
are. A local data path gets a generated task YAML that `include:`s the
built-in one and only swaps the dataset for local JSONL, so prompts, filters
and metrics stay lm-eval's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from .data_files import DataFileError, builder, find_split, load_rows

TASKS_DIR = Path(__file__).parent / "tasks"


@dataclass(frozen=True)
class LmEvalTask:
    """How one of our task names maps onto lm-eval."""

    builtin: str  # lm-eval task or group run on hub data
    metric: str  # result key, "metric,filter"


LM_EVAL_TASKS = {
    # 5-shot CoT generation; accuracy of the extracted letter, micro-averaged over subjects.
    "mmlu_pro": LmEvalTask("mmlu_pro", "exact_match,custom-extract"),
    # 3-shot CoT; exact match of the extracted answer, micro-averaged over subtasks.
    "bbh": LmEvalTask("bbh_cot_fewshot", "exact_match,get-answer"),
    "ifeval": LmEvalTask("ifeval", "prompt_level_strict_acc,none"),
    "ifbench": LmEvalTask("autoloco_ifbench", "prompt_level_loose_acc,none"),
}


def _builtin_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def _json_task(include: Path, task: str, data_files: dict[str, list[str]]) -> dict:
    """The built-in task ``include`` on local files (JSON
    Lines, JSON or Parquet, by name as ``datasets`` does)."""
    return {
        "include": str(include),
        "task": task,
        "dataset_path": builder([f for files in data_files.values() for f in files], "local data"),
        "dataset_name": None,
        "dataset_kwargs": {"data_files": data_files},
    }


def _split_files(path: Path, split: str, option: str) -> list[str]:
    files = find_split(path, split)
    if not files:
        raise DataFileError(
            f"{option} {path}: no {split}.jsonl, {split}.parquet or data/{split}-*.parquet in it"
        )
    return [str(f) for f in files]


def mmlu_pro_files(path: Path) -> dict[str, list[str]]:
    """The test and validation files of a local MMLU-Pro folder."""
    return {split: _split_files(path, split, "--mmlu-pro-path") for split in ("test", "validation")}


def bbh_files(path: Path) -> dict[str, list[str]]:
    """Subtask -> files of a local BBH folder: ``<subtask>.jsonl`` / ``.parquet``, or the hub's
    ``<subtask>/test-*.parquet``."""
    if not path.is_dir():
        raise DataFileError(
            f"--bbh-path {path}: not a folder; pass a folder of <subtask>.jsonl files"
        )
    subtasks = {
        f.name.split(".")[0]: [str(f)]
        for f in sorted(path.glob("*.jsonl")) + sorted(path.glob("*.parquet"))
    }
    subtasks.update(
        {
            d.name: [str(f) for f in find_split(d, "test")]
            for d in sorted(path.iterdir())
            if d.is_dir() and find_split(d, "test")
        }
    )
    if not subtasks:
        raise DataFileError(
            f"--bbh-path {path}: no <subtask>.jsonl / <subtask>.parquet files in it"
        )
    return subtasks


def local_files(name: str, path: Path) -> list[str]:
    """Every file task ``name`` reads from its local ``path``
    (for the checks before the model loads)."""
    if name == "mmlu_pro":
        return [f for files in mmlu_pro_files(path).values() for f in files]
    if name == "bbh":
        return [f for files in bbh_files(path).values() for f in files]
    return [str(path)]


def _group(builtin_group_yaml: Path, group: str, tasks: list[str]) -> dict:
    config = yaml.safe_load(builtin_group_yaml.read_text())
    return {**config, "group": group, "task": tasks}


def local_task_configs(name: str, path: Path) -> dict[str, dict]:
    """Task YAMLs (file stem -> config) that run task ``name`` on local data at ``path``.

    mmlu_pro: a folder with test and validation files (TIGER-Lab/MMLU-Pro rows): ``test.jsonl``,
    ``test.parquet`` or the hub's ``data/test-*.parquet`` (see
    :func:`~autoloco_evals.data_files.find_split`); bbh: a folder of ``<subtask>.jsonl`` or
    ``<subtask>.parquet`` files, or the hub's ``<subtask>/test-*.parquet`` folders ({"input",
    "target"} rows); ifeval, ifbench: one JSONL or Parquet file of their hub rows.
    """
    builtin = _builtin_dir()
    group = f"local_{name}"
    if name == "mmlu_pro":
        files = mmlu_pro_files(path)
        subjects = sorted(
            {c.replace(" ", "_") for c in load_rows(files["test"], "--mmlu-pro-path")["category"]}
        )
        configs = {
            f"{group}_{s}": _json_task(
                builtin / "mmlu_pro" / f"mmlu_pro_{s}.yaml", f"{group}_{s}", files
            )
            for s in subjects
        }
        configs[group] = _group(builtin / "mmlu_pro" / "_mmlu_pro.yaml", group, list(configs))
        return configs
    if name == "bbh":
        cot = builtin / "bbh" / "cot_fewshot"
        configs = {
            f"{group}_{name}": _json_task(cot / f"{name}.yaml", f"{group}_{name}", {"test": files})
            for name, files in bbh_files(path).items()
        }
        configs[group] = _group(cot / "_bbh_cot_fewshot.yaml", group, list(configs))
        return configs
    include = (
        builtin / "ifeval" / "ifeval.yaml"
        if name == "ifeval"
        else TASKS_DIR / "ifbench" / "autoloco_ifbench.yaml"
    )
    return {group: _json_task(include, group, {"train": [str(path)]})}


class _DropMessage(logging.Filter):
    """Drops log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


class _Once(logging.Filter):
    """Lets each message of a logger through once per
    process: lm-eval repeats some for every task."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


# "generation_kwargs ... specified through cli" (evaluator) and "Passed an already-initialized
# model" (HFLM) come once per run_lm_eval call, i.e. once per task of a suite
_ONCE = _Once()
_REPEATING_LOGGERS = ("lm_eval.evaluator", "lm_eval.models.huggingface")


def _quiet_git_hash() -> str | None:
    """lm-eval's git hash of the working directory, without
    git's "fatal: not a git repository" on the console."""
    done = subprocess.run(
        ["git", "describe", "--always"], capture_output=True, text=True, check=False
    )  # noqa: S607
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


@contextlib.contextmanager
def quiet_lm_eval() -> Iterator[None]:
    """lm-eval without its console noise for our use: a model
    passed as an object is on purpose, no git repo is fine.

    HFLM warns "`pretrained` model kwarg is not of type `str`" for every
    in-memory model, and ``simple_evaluate`` runs ``git describe`` with git's
    stderr on the console; both come once per task. The other warnings of the
    evaluator and of HFLM are shown once per process, not once per task.
    """
    import lm_eval.evaluator

    hf_logger = logging.getLogger("lm_eval.models.huggingface")
    dropped = _DropMessage("`pretrained` model kwarg is not of type `str`")
    hf_logger.addFilter(dropped)
    for name in _REPEATING_LOGGERS:
        logging.getLogger(name).addFilter(_ONCE)
    git_hash = lm_eval.evaluator.get_git_commit_hash
    lm_eval.evaluator.get_git_commit_hash = _quiet_git_hash
    try:
        yield
    finally:
        lm_eval.evaluator.get_git_commit_hash = git_hash
        hf_logger.removeFilter(dropped)
        for name in _REPEATING_LOGGERS:
            logging.getLogger(name).removeFilter(_ONCE)


def run_lm_eval(
    model,
    tokenizer,
    names: list[str],
    local: dict[str, Path | None],
    work_dir: Path,
    *,
    limit: int | None,
    batch_size: int,
    max_gen_toks: int | None,
    chat: bool,
) -> dict[str, dict]:
    """Evaluate ``names`` in one lm-eval call; return per task its score and sample count."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    include_dir = work_dir / "lm_eval_tasks"
    include_dir.mkdir(parents=True, exist_ok=True)
    run_names = {}
    for name in names:
        if local.get(name) is None:
            run_names[name] = LM_EVAL_TASKS[name].builtin
            continue
        for stem, config in local_task_configs(name, local[name]).items():
            (include_dir / f"{stem}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        run_names[name] = f"local_{name}"

    with quiet_lm_eval():
        lm = HFLM(
            pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(model.device)
        )
        output = simple_evaluate(
            model=lm,
            tasks=list(run_names.values()),
            limit=limit,
            apply_chat_template=chat,
            fewshot_as_multiturn=chat,
            gen_kwargs={"max_gen_toks": max_gen_toks} if max_gen_toks else None,
            task_manager=TaskManager(include_path=[str(TASKS_DIR), str(include_dir)]),
            bootstrap_iters=0,
            log_samples=True,
        )
    scores = {}
    for name, run_name in run_names.items():
        metric = LM_EVAL_TASKS[name].metric
        scores[name] = {
            "score": output["results"][run_name][metric],
            "n": _sample_count(output, run_name),
            "metric": metric,
        }
        _write_samples(output, run_name, work_dir / f"samples_{name}.jsonl")
    return scores


def _subtasks(output: dict, run_name: str) -> list[str]:
    return output.get("group_subtasks", {}).get(run_name) or [run_name]


def _sample_count(output: dict, run_name: str) -> int:
    return sum(output["n-samples"][t]["effective"] for t in _subtasks(output, run_name))


def _write_samples(output: dict, run_name: str, path: Path) -> None:
    """The model's generations and per-sample metrics, for reading failures."""
    with open(path, "w", encoding="utf-8") as f:
        for task in _subtasks(output, run_name):
            for s in output["samples"][task]:
                row = {
                    "task": task,
                    "doc_id": s["doc_id"],
                    "response": s["resps"][0][0],
                    "filtered": s["filtered_resps"],
                }
                row.update({k: s[k] for k in s if k in s.get("metrics", [])})
                f.write(json.dumps(row, default=str) + "\n")
