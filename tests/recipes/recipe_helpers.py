"""Import the recipes, which are scripts rather than a package (a unique module name: no clash with conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import sys

RECIPES = os.path.join(os.path.dirname(__file__), "..", "..", "recipes")


def load_recipe(name: str):
    """Import ``recipes/<name>.py`` (the recipes are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", os.path.join(RECIPES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
