"""Import the recipes, which are scripts rather than a
package (a unique module name: no clash with conftest.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

RECIPES = os.path.join(os.path.dirname(__file__), "..", "recipes")


def load_recipe(name: str):
    """Import ``recipes/<name>.py`` (the recipes are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(
        f"recipe_{name}", os.path.join(RECIPES, f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def eval_quick_nll(model_dir, out) -> dict:
    """`autoloco eval --suite quick --fixtures --offline --tasks
    nll` on what a recipe wrote (the documented next step)."""
    from autoloco_hf.cli import main

    assert (
        main(
            [
                "eval",
                str(model_dir),
                "--suite",
                "quick",
                "--fixtures",
                "--offline",
                "--tasks",
                "nll",
                "--out",
                str(out),
                "--run-name",
                "recipe",
            ]
        )
        == 0
    )
    return json.loads((out / "recipe.json").read_text())
