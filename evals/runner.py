"""One entry point for every benchmark: settings, data resolution, JSON output.

`evaluate(model, tokenizer, settings, out_dir)` is the Python API;
`evaluate_model_dir` loads a checkpoint first. Each task writes its score in
[0, 1] (NLL in nats per token) under `scores`, with timings and details.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .humaneval_plus import evaluate_humaneval_plus
from .lm_eval_tasks import LM_EVAL_TASKS, run_lm_eval
from .nll import evaluate_nll
from .offline import MissingLocalDataError, ensure_punkt_tab, resolve_local, set_offline

TASKS = ("mmlu_pro", "bbh", "ifeval", "ifbench", "humaneval_plus", "nll")
FIXTURES_DIR = Path(__file__).parent / "fixtures"


@dataclass(frozen=True)
class DataSource:
    """A dataset a task reads: its CLI option, its name under --data-dir, what it holds."""

    option: str
    filename: str
    what: str


DATA = {
    "mmlu_pro": DataSource(
        "--mmlu-pro-path", "mmlu_pro", "MMLU-Pro (TIGER-Lab/MMLU-Pro): a folder with test.jsonl and validation.jsonl"
    ),
    "bbh": DataSource("--bbh-path", "bbh", "BBH (SaylorTwift/bbh): a folder of <subtask>.jsonl files"),
    "ifeval": DataSource("--ifeval-path", "ifeval.jsonl", "IFEval (google/IFEval) rows as JSONL"),
    "ifbench": DataSource("--ifbench-path", "ifbench.jsonl", "IFBench (allenai/IFBench_test) rows as JSONL"),
    "humaneval_plus": DataSource(
        "--humaneval-plus-path", "humaneval_plus.jsonl", "HumanEval+ (evalplus HumanEvalPlus) JSONL"
    ),
    "c4": DataSource("--c4-path", "c4.jsonl", "C4-style documents (allenai/c4 en validation) as JSONL with 'text'"),
    "chat": DataSource(
        "--chat-path", "chat.jsonl", "conversations (HuggingFaceH4/ultrachat_200k test_sft) as JSONL with 'messages'"
    ),
}
TASK_DATA = {"nll": ("c4", "chat")}  # every other task reads the dataset of its own name


@dataclass
class EvalSettings:
    """What to run and how; `SUITES` holds the presets."""

    tasks: tuple[str, ...] = TASKS
    limit: int | None = None  # examples per (sub)task; None = all
    batch_size: int = 8
    max_gen_toks: int | None = None  # None = each task's own default
    chat_template: bool | None = None  # None = apply it when the tokenizer has one
    offline: bool = False
    data_dir: Path | None = None  # holds datasets under their DATA filenames
    paths: dict[str, Path] = field(default_factory=dict)  # DATA key -> explicit local path
    num_documents: int = 4096
    num_conversations: int = 1000
    nll_max_length: int = 2048
    humaneval_max_new_tokens: int = 768


SUITES = {
    "paper": EvalSettings(),
    "quick": EvalSettings(
        limit=10, max_gen_toks=256, num_documents=64, num_conversations=32, humaneval_max_new_tokens=256
    ),
}


def suite_settings(suite: str, **overrides) -> EvalSettings:
    """A suite's settings with the given fields replaced (None values keep the suite's)."""
    return replace(SUITES[suite], **{k: v for k, v in overrides.items() if v is not None})


def resolve_data(settings: EvalSettings) -> dict[str, Path | None]:
    """Local path (or None = hub) for every dataset the selected tasks read; fails fast."""
    resolved = {}
    for task in settings.tasks:
        for key in TASK_DATA.get(task, (task,)):
            source = DATA[key]
            path = settings.paths.get(key)
            if path is None and settings.data_dir is not None and (settings.data_dir / source.filename).exists():
                path = settings.data_dir / source.filename
            resolved[key] = resolve_local(path, source.option, source.what, settings.offline)
    return resolved


def evaluate(
    model, tokenizer, settings: EvalSettings, out_dir: Path, run_name: str = "run", meta: dict | None = None
) -> dict:
    """Run the selected tasks on a loaded model; write <out_dir>/<run_name>.json and return it.

    ``meta`` (e.g. the model path) is stored in the record as is.
    """
    unknown = set(settings.tasks) - set(TASKS)
    if unknown:
        raise ValueError(f"unknown tasks {sorted(unknown)}; choose from {TASKS}")
    if settings.offline:
        set_offline()
    local = resolve_data(settings)
    work_dir = Path(out_dir) / run_name
    work_dir.mkdir(parents=True, exist_ok=True)
    if {"ifeval", "ifbench"} & set(settings.tasks):
        ensure_punkt_tab(work_dir / "nltk_data", settings.offline)
    chat = tokenizer.chat_template is not None if settings.chat_template is None else settings.chat_template

    scores, details, timings = {}, {}, {}
    for task in settings.tasks:
        start = time.perf_counter()
        if task in LM_EVAL_TASKS:
            result = run_lm_eval(
                model,
                tokenizer,
                [task],
                local,
                work_dir,
                limit=settings.limit,
                batch_size=settings.batch_size,
                max_gen_toks=settings.max_gen_toks,
                chat=chat,
            )[task]
            scores[task] = result.pop("score")
        elif task == "humaneval_plus":
            result = evaluate_humaneval_plus(
                model,
                tokenizer,
                local=local["humaneval_plus"],
                limit=settings.limit,
                chat=chat,
                work_dir=work_dir,
                max_new_tokens=settings.humaneval_max_new_tokens,
                batch_size=settings.batch_size,
            )
            scores[task] = result.pop("humaneval_plus")
        else:
            result = evaluate_nll(
                model,
                tokenizer,
                c4_path=local["c4"],
                chat_path=local["chat"],
                num_documents=settings.num_documents,
                num_conversations=settings.num_conversations,
                max_length=settings.nll_max_length,
                batch_size=settings.batch_size,
            )
            scores.update({key: result.pop(key) for key in ("nll_c4", "nll_chat") if key in result})
        details[task] = result
        timings[task] = round(time.perf_counter() - start, 1)

    record = {
        "run": run_name,
        **(meta or {}),
        "chat_template": chat,
        "settings": json.loads(json.dumps(asdict(settings), default=str)),
        "data": {k: str(v) if v else "hub" for k, v in local.items()},
        "scores": scores,
        "details": details,
        "timings_s": timings,
    }
    (Path(out_dir) / f"{run_name}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    return record


def evaluate_model_dir(
    model_dir: str | Path,
    settings: EvalSettings,
    out_dir: Path,
    run_name: str | None = None,
    device: str | None = None,
    dtype: str = "auto",
) -> dict:
    """Load a checkpoint (model and tokenizer from one folder) and evaluate it."""
    if settings.offline:  # before the hub clients are imported: they read their offline switches at import
        set_offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolve_data(settings)  # fail on missing data before the slow model load
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    start = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    except (OSError, ValueError) as err:  # no weights / tokenizer files / model type: one line, not a traceback
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise MissingLocalDataError(f"MODEL_DIR {model_dir}: cannot load it ({first})") from err
    meta = {"model": str(model_dir), "load_s": round(time.perf_counter() - start, 1)}
    return evaluate(model, tokenizer, settings, out_dir, run_name or Path(model_dir).name, meta)
