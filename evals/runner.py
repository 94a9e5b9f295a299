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

from .data_files import check_files
from .errors import EvalInputError
from .lm_eval_tasks import LM_EVAL_TASKS, local_files, run_lm_eval
from .offline import (
    MissingLocalDataError,
    check_punkt_tab,
    ensure_punkt_tab,
    resolve_local,
    set_offline,
)

TASKS = ("mmlu_pro", "bbh", "ifeval", "ifbench", "humaneval_plus", "nll")
FIXTURES_DIR = Path(__file__).parent / "fixtures"


@dataclass(frozen=True)
class DataSource:
    """A dataset a task reads: its CLI option, its name under
    --data-dir, what it holds, the fields its rows need."""

    option: str
    filename: str
    what: str
    columns: tuple[str, ...]


DATA = {
    "mmlu_pro": DataSource(
        "--mmlu-pro-path",
        "mmlu_pro",
        "MMLU-Pro (TIGER-Lab/MMLU-Pro): a folder with test.jsonl and validation.jsonl",
        ("question", "options", "answer", "category"),
    ),
    "bbh": DataSource(
        "--bbh-path",
        "bbh",
        "BBH (SaylorTwift/bbh): a folder of <subtask>.jsonl files",
        ("input", "target"),
    ),
    "ifeval": DataSource(
        "--ifeval-path",
        "ifeval.jsonl",
        "IFEval (google/IFEval) rows as JSONL",
        ("key", "prompt", "instruction_id_list"),
    ),
    "ifbench": DataSource(
        "--ifbench-path",
        "ifbench.jsonl",
        "IFBench (allenai/IFBench_test) rows as JSONL",
        ("key", "prompt", "instruction_id_list"),
    ),
    "humaneval_plus": DataSource(
        "--humaneval-plus-path",
        "humaneval_plus.jsonl",
        "HumanEval+ (evalplus HumanEvalPlus) JSONL",
        ("task_id", "prompt", "entry_point"),
    ),
    "c4": DataSource(
        "--c4-path",
        "c4.jsonl",
        "C4-style documents (allenai/c4 en validation) as JSONL with 'text'",
        ("text",),
    ),
    "chat": DataSource(
        "--chat-path",
        "chat.jsonl",
        "conversations (HuggingFaceH4/ultrachat_200k test_sft) as JSONL with 'messages'",
        ("messages",),
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
    # score IFEval / IFBench with an empty Punkt model when punkt_tab is missing
    approximate_punkt: bool = False


SUITES = {
    "paper": EvalSettings(),
    "quick": EvalSettings(
        limit=10,
        max_gen_toks=256,
        num_documents=64,
        num_conversations=32,
        humaneval_max_new_tokens=256,
    ),
}


def suite_settings(suite: str, **overrides) -> EvalSettings:
    """A suite's settings with the given fields replaced (None values keep the suite's)."""
    return replace(SUITES[suite], **{k: v for k, v in overrides.items() if v is not None})


def needs_punkt_tab(settings: EvalSettings) -> bool:
    """IFEval and IFBench split sentences with NLTK's punkt_tab."""
    return bool({"ifeval", "ifbench"} & set(settings.tasks))


def check_sentence_splitter(settings: EvalSettings) -> None:
    """Before the model loads: the official punkt_tab is
    there, or --approximate-punkt allows the empty one."""
    if needs_punkt_tab(settings):
        check_punkt_tab(settings.approximate_punkt)


def resolve_data(settings: EvalSettings) -> dict[str, Path | None]:
    """Local path (or None = hub) for every dataset the selected tasks read; fails fast."""
    resolved = {}
    for task in settings.tasks:
        for key in TASK_DATA.get(task, (task,)):
            source = DATA[key]
            path = settings.paths.get(key)
            if (
                path is None
                and settings.data_dir is not None
                and (settings.data_dir / source.filename).exists()
            ):
                path = settings.data_dir / source.filename
            resolved[key] = resolve_local(path, source.option, source.what, settings.offline)
    return resolved


def check_data(settings: EvalSettings, local: dict[str, Path | None]) -> None:
    """Read the local rows every selected task will use (each file
    parses, has rows and the fields): before the model loads.

    Raises :class:`~autoloco_evals.data_files.DataFileError` naming the option, the file (and line).
    """
    limits = {"c4": settings.num_documents, "chat": settings.num_conversations}
    for key, path in local.items():
        if path is not None:
            source = DATA[key]
            check_files(
                local_files(key, path),
                source.option,
                source.columns,
                "",
                limits.get(key, settings.limit),
            )


def evaluate(
    model,
    tokenizer,
    settings: EvalSettings,
    out_dir: Path,
    run_name: str = "run",
    meta: dict | None = None,
) -> dict:
    """Run the selected tasks on a loaded model; write <out_dir>/<run_name>.json and return it.

    ``meta`` (e.g. the model path) is stored in the record as is.
    """
    unknown = set(settings.tasks) - set(TASKS)
    if unknown:
        raise ValueError(f"unknown tasks {sorted(unknown)}; choose from {TASKS}")
    if settings.offline:
        set_offline()
    # torch: imported only once a model is there
    from .humaneval_plus import evaluate_humaneval_plus
    from .nll import evaluate_nll

    local = resolve_data(settings)
    work_dir = Path(out_dir) / run_name
    work_dir.mkdir(parents=True, exist_ok=True)
    official_punkt = None
    if needs_punkt_tab(settings):
        official_punkt = ensure_punkt_tab(work_dir / "nltk_data", settings.approximate_punkt)
    chat = (
        tokenizer.chat_template is not None
        if settings.chat_template is None
        else settings.chat_template
    )

    from tqdm.auto import tqdm

    scores, details, timings = {}, {}, {}
    # the overall progress, "task 3/6" with the time left; each task draws its own bar below it
    tasks = tqdm(
        settings.tasks, desc="autoloco eval: task", unit="task", position=0, dynamic_ncols=True
    )
    for task in tasks:
        tasks.set_postfix_str(task)
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
    tasks.close()

    record = {
        "run": run_name,
        **(meta or {}),
        "chat_template": chat,
        **(
            {}
            if official_punkt is None
            else {"sentence_splitter": "punkt_tab" if official_punkt else "empty Punkt"}
        ),
        "settings": json.loads(json.dumps(asdict(settings), default=str)),
        "data": {k: str(v) if v else "hub" for k, v in local.items()},
        "scores": scores,
        "details": details,
        "timings_s": timings,
    }
    (Path(out_dir) / f"{run_name}.json").write_text(
        json.dumps(record, indent=2, default=str) + "\n"
    )
    return record


DTYPES = ("auto", "float32", "bfloat16", "float16")  # "auto": the checkpoint's own


def check_device(device: str | None) -> str:
    """``device``, or cuda when available else cpu; a device
    this PyTorch build lacks is an EvalInputError."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise EvalInputError(
            f"--device {device}: not a device name; pass cpu, cuda, cuda:1 or mps"
        ) from None
    backend = getattr(torch, kind, None)
    if kind != "cpu" and not (backend is not None and backend.is_available()):
        raise EvalInputError(
            f"--device {device}: this PyTorch build has no {kind} device ({torch.__version__}); "
            "pass --device cpu, or leave --device out to use cuda when there is one"
        )
    return device


def evaluate_model_dir(
    model_dir: str | Path,
    settings: EvalSettings,
    out_dir: Path,
    run_name: str | None = None,
    device: str | None = None,
    dtype: str = "auto",
) -> dict:
    """Load a checkpoint (model and tokenizer from one folder)
    and evaluate it; every input is checked before the load."""
    if dtype not in DTYPES:
        raise EvalInputError(f"--dtype {dtype}: not a dtype; pass one of {', '.join(DTYPES)}")
    # before the hub clients are imported: they read their offline switches at import
    if settings.offline:
        set_offline()
    # missing or bad data first: before the slow imports and load
    check_data(settings, resolve_data(settings))
    check_sentence_splitter(settings)
    device = check_device(device)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    # no weights / tokenizer files / model type: one line, not a traceback
    except (OSError, ValueError) as err:
        first = next(
            (line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__
        )
        raise MissingLocalDataError(f"MODEL_DIR {model_dir}: cannot load it ({first})") from err
    meta = {"model": str(model_dir), "load_s": round(time.perf_counter() - start, 1)}
    return evaluate(model, tokenizer, settings, out_dir, run_name or Path(model_dir).name, meta)
