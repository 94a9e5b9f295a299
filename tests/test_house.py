"""The house's size rules: modules a reader can hold in their head, packages a few floors tall, and
no benchmark reaching into tests/."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES = 600  # longest module of the package and the evals (at 100 characters a line)
ENGINE_CLASS_LINES = 400  # the interval engine, which the schedules lean on
FLOORS = 5  # the longest chain of run-time imports between the modules of one of these packages


def test_no_module_is_longer_than_the_limit():
    modules = [*(ROOT / "autoloco_hf").rglob("*.py"), *(ROOT / "evals").rglob("*.py")]
    long = {
        str(m.relative_to(ROOT)): n
        for m in modules
        if (n := len(m.read_text().splitlines())) > MODULE_LINES
    }
    assert modules and not long, f"split these modules (over {MODULE_LINES} lines): {long}"


def test_the_engine_class_stays_short():
    tree = ast.parse((ROOT / "autoloco_hf" / "sync" / "engine" / "engine.py").read_text())
    engine = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "IntervalEngine"
    )
    assert engine.end_lineno - engine.lineno + 1 <= ENGINE_CLASS_LINES


def test_no_benchmark_or_test_puts_tests_on_the_import_path():
    pattern = re.compile(r"sys\.path\.insert\([^)]*tests")
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("benchmarks", "tests")
        for path in (ROOT / folder).rglob("*.py")
        if pattern.search(path.read_text())
    ]
    assert not offenders, offenders


def longest_chain(graph: grimp.ImportGraph, package: str) -> list[str]:
    """The longest chain of run-time imports (type-only ones
    left out) between ``package``'s modules."""
    modules = {m for m in graph.modules if m == package or m.startswith(package + ".")}

    @functools.cache
    def chain(module: str) -> tuple[str, ...]:
        below = [
            chain(m) for m in graph.find_modules_directly_imported_by(module) & modules - {module}
        ]
        return (module, *max(below, key=len, default=()))

    return list(max((chain(m) for m in modules), key=len))


@pytest.mark.parametrize("package", ["autoloco_hf.sync", "autoloco_hf.integrations"])
def test_the_packages_are_at_most_five_floors_tall(package):
    graph = grimp.build_graph("autoloco_hf", exclude_type_checking_imports=True)
    chain = longest_chain(graph, package)
    assert len(chain) <= FLOORS, " -> ".join(chain)
