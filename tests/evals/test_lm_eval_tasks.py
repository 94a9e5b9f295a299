"""MMLU-Pro, BBH, IFEval, IFBench: lm-eval's real pipeline on scripted generations.

One scripted model answers every fixture prompt right, another answers every
one wrong; the metric code (lm-eval's filters and metrics, IFEval's and
IFBench's checkers) is the real one.
"""

import logging

import pytest
from evals_scripted import fixture_rows, scripted_model

from autoloco_evals.lm_eval_tasks import run_lm_eval
from autoloco_evals.offline import ensure_punkt_tab, set_offline
from autoloco_evals.runner import FIXTURES_DIR

LETTERS = "ABCDEFGHIJ"

# key (the prompt) -> (reply that follows every instruction, reply that breaks one)
IFEVAL = {
    1001: (
        "the ocean is vast and deep, and it covers most of our planet.",
        "The Ocean Is Vast And Deep.",
    ),
    1002: (
        "Red leaves drift down\nquiet wind across the field\nautumn says goodbye",
        "Red leaves, drifting down, slowly",
    ),
    1003: ("* apple\n* mango\n* kiwi", "* apple\n* mango"),
    1004: (
        "Cats are small and curious. They love to nap. Is there anything else I can help with?",
        "Cats are small. They nap. They purr. They play. Is there anything else I can help with?",
    ),
}
IFBENCH = {
    "1": (
        "meridian " + "gossamer " * 2 + "eclipse " * 3 + "threshold " * 5 + "cascade " * 7,
        "meridian gossamer eclipse threshold cascade",
    ),
    "288": ("The Rust Belt Union Rules Northern Ohio", "the rust belt union rules northern ohio"),
    "296": ("Notallclassesaresets;everysetisaclass.", "No, not all classes are sets."),
    "280": ("14, 21, 28, 35, 42, 49", "10, 14, 21, 28, 35, 42, 49"),
}


def _bbh_wrong(target: str) -> str:
    if target in ("True", "False"):
        return str(target == "False")
    if target.lstrip("-").isdigit():
        return str(int(target) + 1)
    return " ".join(reversed(target.split()))


def scripts(right: bool) -> dict[str, str]:
    """Prompt key -> scripted reply for every fixture example of the four tasks."""
    pick = 0 if right else 1
    script = {}
    for row in fixture_rows("mmlu_pro/test.jsonl"):
        letter = (
            row["answer"] if right else LETTERS[(row["answer_index"] + 1) % len(row["options"])]
        )
        script[row["question"]] = f"Let's think step by step. The answer is ({letter})."
    for name in ("boolean_expressions", "multistep_arithmetic_two", "word_sorting"):
        for row in fixture_rows(f"bbh/{name}.jsonl"):
            answer = row["target"] if right else _bbh_wrong(row["target"])
            script[row["input"]] = f"Let me work it out. So the answer is {answer}."
    for row in fixture_rows("ifeval.jsonl"):
        script[row["prompt"]] = IFEVAL[row["key"]][pick]
    for row in fixture_rows("ifbench.jsonl"):
        script[row["prompt"]] = IFBENCH[row["key"]][pick]
    return script


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """Offline for this test only; NLTK's punkt_tab from the local fallback."""
    import nltk

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setattr(nltk.downloader._downloader, "_url", nltk.downloader._downloader._url)
    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))
    set_offline()
    ensure_punkt_tab(tmp_path / "nltk_data", approximate=True)


@pytest.mark.slow
@pytest.mark.parametrize("right", [True, False], ids=["right", "wrong"])
def test_lm_eval_tasks_score_generations(right, offline, tmp_path):
    model, tokenizer = scripted_model(scripts(right))
    names = ["mmlu_pro", "bbh", "ifeval", "ifbench"]
    local = {
        "mmlu_pro": FIXTURES_DIR / "mmlu_pro",
        "bbh": FIXTURES_DIR / "bbh",
        "ifeval": FIXTURES_DIR / "ifeval.jsonl",
        "ifbench": FIXTURES_DIR / "ifbench.jsonl",
    }
    got = run_lm_eval(
        model,
        tokenizer,
        names,
        local,
        tmp_path,
        limit=None,
        batch_size=4,
        max_gen_toks=32,
        chat=True,
    )
    expected = 1.0 if right else 0.0
    assert {name: got[name]["score"] for name in names} == {name: expected for name in names}
    assert {name: got[name]["n"] for name in names} == {
        "mmlu_pro": 4,
        "bbh": 9,
        "ifeval": 4,
        "ifbench": 4,
    }
    assert (tmp_path / "samples_bbh.jsonl").read_text().count("So the answer is") == 9


@pytest.mark.slow
def test_lm_eval_console_is_quiet(offline, tmp_path, monkeypatch, capfd, caplog):
    """Was, once per task: "`pretrained` model kwarg is not of
    type `str`" and git's "fatal: not a git repository"."""
    monkeypatch.chdir(tmp_path)  # not a git repository
    model, tokenizer = scripted_model(scripts(True))
    local = {"ifeval": FIXTURES_DIR / "ifeval.jsonl"}
    with caplog.at_level("WARNING"):
        got = run_lm_eval(
            model,
            tokenizer,
            ["ifeval"],
            local,
            tmp_path,
            limit=2,
            batch_size=4,
            max_gen_toks=32,
            chat=True,
        )
    assert got["ifeval"]["n"] == 2
    console = capfd.readouterr().err + "".join(r.getMessage() for r in caplog.records)
    assert "not a git repository" not in console
    assert "not of type `str`" not in console


def test_lm_eval_warnings_repeated_per_task_are_shown_once(caplog):
    """A suite calls lm-eval once per task: its per-call
    warnings reach the console once, other messages always."""
    import lm_eval.evaluator  # noqa: F401 - its logger, as lm-eval configures it
    import lm_eval.models.huggingface  # noqa: F401

    from autoloco_evals.lm_eval_tasks import quiet_lm_eval

    messages = {
        "lm_eval.evaluator": "generation_kwargs: %s specified through cli, these settings "
        "will update set parameters",
        "lm_eval.models.huggingface": "Passed an already-initialized model through "
        "`pretrained`, assuming single-process",
    }
    with caplog.at_level(logging.DEBUG):
        for task in ("mmlu_pro", "bbh", "ifeval"):
            with quiet_lm_eval():
                logging.getLogger("lm_eval.evaluator").warning(
                    messages["lm_eval.evaluator"], {"max_gen_toks": 256}
                )
                logging.getLogger("lm_eval.models.huggingface").warning(
                    messages["lm_eval.models.huggingface"]
                )
            logging.getLogger("lm_eval.evaluator").warning("outside a run: %s", task)
    said = [(r.name, r.msg) for r in caplog.records]
    assert said.count(("lm_eval.evaluator", messages["lm_eval.evaluator"])) == 1, said
    assert (
        said.count(("lm_eval.models.huggingface", messages["lm_eval.models.huggingface"])) == 1
    ), said
    assert [r.getMessage() for r in caplog.records if r.msg.startswith("outside")] == [
        f"outside a run: {t}" for t in ("mmlu_pro", "bbh", "ifeval")
    ]
