"""HumanEval+ with evalplus: our greedy generation, evalplus's sanitizer and tests.

Generation follows evalplus's own HF codegen (same chat prompt, same stop
strings) so scores match its harness; evalplus then runs both the base and
the plus tests. The score is plus pass@1: a task counts only when both pass.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from tqdm.auto import tqdm

# evalplus/codegen.py's default instruct prompt.
INSTRUCTION_PREFIX = (
    "Please provide a self-contained Python script that solves the following "
    "problem in a markdown code block:"
)
RESPONSE_PREFIX = (
    "Below is a Python script with a self-contained function that solves the "
    "problem and passes corresponding tests:"
)
_IMPORT_LINE = re.compile(r"^(?:from\s+\S+\s+)?import\s+.+$", re.MULTILINE)


def load_problems(local: Path | None, limit: int | None) -> dict[str, dict]:
    """HumanEval+ problems from a local JSONL (HumanEvalPlus format) or evalplus's release."""
    if local is not None:
        from evalplus.data.utils import stream_jsonl

        problems = {p["task_id"]: p for p in stream_jsonl(str(local))}
    else:
        from evalplus.data import get_human_eval_plus

        problems = get_human_eval_plus()
    return dict(list(problems.items())[:limit])


@torch.no_grad()
def generate_solutions(
    model, tokenizer, problems: dict[str, dict], *, chat: bool, max_new_tokens: int, batch_size: int
) -> list[dict]:
    """One greedy solution per problem, sanitized as evalplus does."""
    from evalplus.provider.utility import EOS, extra_eos_for_direct_completion, make_raw_chat_prompt
    from evalplus.sanitize import sanitize

    stops = EOS + (["\n```\n"] if chat else extra_eos_for_direct_completion("humaneval"))
    tasks = list(problems.values())
    prompts = [t["prompt"].strip() + "\n" for t in tasks]
    inputs = [
        make_raw_chat_prompt(p, INSTRUCTION_PREFIX, RESPONSE_PREFIX, tokenizer) if chat else p
        for p in prompts
    ]
    samples = []
    for start in tqdm(
        range(0, len(tasks), batch_size), desc="humaneval_plus generate", unit="batch"
    ):
        batch = inputs[start : start + batch_size]
        # A chat prompt already holds the template's special tokens.
        enc = tokenizer(
            batch,
            return_tensors="pt",
            padding=True,
            padding_side="left",
            add_special_tokens=not chat,
        ).to(model.device)
        out = model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            stop_strings=stops,
            tokenizer=tokenizer,
            pad_token_id=tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else tokenizer.eos_token_id,
        )
        texts = tokenizer.batch_decode(
            out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
        )
        for task, prompt, text in zip(tasks[start:], prompts[start:], texts):
            cut = min([text.index(s) for s in stops if s in text], default=len(text))
            impl = text[:cut].replace("\t", "    ")
            code = sanitize(impl if chat else prompt + impl, entrypoint=task["entry_point"])
            # The sanitizer keeps only what the model wrote; the prompt's imports
            # (e.g. `from typing import List`) belong to the task.
            imports = "\n".join(_IMPORT_LINE.findall(task["prompt"]))
            samples.append(
                {"task_id": task["task_id"], "solution": f"{imports}\n{code}" if imports else code}
            )
    return samples


def score_samples(problems: dict[str, dict], samples: list[dict], work_dir: Path) -> dict:
    """Run evalplus on the samples; return plus pass@1 (base and plus tests both pass)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    dataset_file = work_dir / "humaneval_plus_problems.jsonl"
    samples_file = work_dir / "humaneval_plus_samples.jsonl"
    results_file = work_dir / "humaneval_plus_samples_eval_results.json"
    dataset_file.write_text("".join(json.dumps(p) + "\n" for p in problems.values()))
    samples_file.write_text("".join(json.dumps(s) + "\n" for s in samples))
    results_file.unlink(missing_ok=True)  # evalplus would reuse it (or prompt on stdin)

    # evalplus reads HUMANEVAL_OVERRIDE_PATH when first imported; set the module's
    # copy too so a second run in the same process sees its own problem file.
    os.environ["HUMANEVAL_OVERRIDE_PATH"] = str(dataset_file)
    import evalplus.data.humaneval as he

    he.HUMANEVAL_OVERRIDE_PATH = str(dataset_file)
    from evalplus.eval import PASS
    from evalplus.evaluate import evaluate

    evaluate("humaneval", samples=str(samples_file))
    results = json.loads(results_file.read_text())["eval"]
    passed = {
        task_id: rows[0]["base_status"] == PASS and rows[0]["plus_status"] == PASS
        for task_id, rows in results.items()
    }
    base = {task_id: rows[0]["base_status"] == PASS for task_id, rows in results.items()}
    return {
        "humaneval_plus": sum(passed.values()) / len(passed),
        "humaneval_base": sum(base.values()) / len(base),
        "n": len(passed),
        "per_task": passed,
    }


def evaluate_humaneval_plus(
    model,
    tokenizer,
    *,
    local: Path | None,
    limit: int | None,
    chat: bool,
    work_dir: Path,
    max_new_tokens: int = 768,
    batch_size: int = 8,
) -> dict:
    """Generate greedily for each problem, then score with evalplus."""
    problems = load_problems(local, limit)
    samples = generate_solutions(
        model, tokenizer, problems, chat=chat, max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    return score_samples(problems, samples, work_dir)
