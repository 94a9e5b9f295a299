"""HumanEval+: scripted generations through our codegen loop and evalplus's real tests."""

import pytest
from evals_scripted import fixture_rows, scripted_model

from autoloco_evals.humaneval_plus import evaluate_humaneval_plus
from autoloco_evals.runner import FIXTURES_DIR

# Replies written as a base model continues the prompt (bodies only).
WRONG_BODIES = {
    # Passes the base tests but not the plus tests: only neighbours are compared.
    "has_close_elements": "    for a, b in zip(numbers, numbers[1:]):\n"
    "        if abs(a - b) < threshold:\n"
    "            return True\n"
    "    return False\n",
    "truncate_number": "    return number // 1.0\n",
    "greatest_common_divisor": "    return a * b\n",
}


@pytest.mark.slow
def test_humaneval_plus_scores_generations(tmp_path):
    problems = fixture_rows("humaneval_plus.jsonl")
    path = FIXTURES_DIR / "humaneval_plus.jsonl"

    # Instruct path: a chat reply holding the whole function in a code block, without
    # the prompt's `from typing import List` (the harness must supply it).
    right = {
        f"def {p['entry_point']}(": p["prompt"][p["prompt"].index("def ") :]
        + p["canonical_solution"]
        + "```\n"
        for p in problems
    }
    model, tokenizer = scripted_model(right, chat=True)
    got = evaluate_humaneval_plus(
        model, tokenizer, local=path, limit=None, chat=True, work_dir=tmp_path / "right"
    )
    assert (got["humaneval_plus"], got["humaneval_base"], got["n"]) == (1.0, 1.0, 3)

    # Base-model path: the reply continues the prompt.
    wrong = {f"def {p['entry_point']}(": WRONG_BODIES[p["entry_point"]] for p in problems}
    model, tokenizer = scripted_model(wrong, chat=False)
    got = evaluate_humaneval_plus(
        model, tokenizer, local=path, limit=None, chat=False, work_dir=tmp_path / "wrong"
    )
    assert got["humaneval_plus"] == 0.0
    assert got["humaneval_base"] == pytest.approx(1 / 3)  # plus pass@1 needs the plus tests too
    assert got["per_task"] == {"HumanEval/0": False, "HumanEval/2": False, "HumanEval/13": False}


def test_the_copied_prompt_is_evalplus_own():
    """The one part copied from evalplus (its codegen's default
    instruct prefixes) still matches evalplus's source.

    The rest is evalplus's own code: ``make_raw_chat_prompt``, the stop strings and ``sanitize``.
    """
    import ast
    import inspect

    import evalplus.codegen

    from autoloco_evals import humaneval_plus

    tree = ast.parse(inspect.getsource(evalplus.codegen.run_codegen))
    defaults = {}
    # the first assignment of each name is the default (the others are EvalPerf's)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    defaults.setdefault(target.id, node.value.value)
    assert defaults["instruction_prefix"] == humaneval_plus.INSTRUCTION_PREFIX
    assert defaults["response_prefix"] == humaneval_plus.RESPONSE_PREFIX
