"""Shared test set-up: the ``slow`` mark given by cause.

``tests/`` and ``benchmarks/`` are on ``sys.path`` (``pythonpath`` in setup.cfg): test modules in
sub-folders share the helpers of ``tests/`` (``_dist``, ``slow_causes``) and import the benchmarks by
kind (``from campaigns import replicate``).

The quick tier, for use before every commit, is ``python -m pytest -q -m "not slow"``. A test is ``slow``
when it is marked so, or when it, a fixture it requests or a test helper they call spawns processes or
trains a Trainer (``slow_causes.SLOW_CAUSES``): a new test of that kind joins the slow tier with no mark to
remember. A test slow for another reason (a long in-process run, such as the demo) is marked by hand.

The README's test command runs on two pytest-xdist workers (``-n 2 --dist loadgroup``). Each test joins an
``xdist_group``: its module's, so that a module-scoped fixture (a launch shared by a module's tests) runs
once; every test of a module that builds network namespaces (it uses ``netns_skip_reason``) joins one
group, ``namespaces``, so that two namespace tests never run at once (they share the probe namespace, and
their timing bounds assume no second testbed beside them). A test that names its own group keeps it.
"""

import pytest
from slow_causes import slow_cause

NAMESPACES = "namespaces"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test whose code or fixtures reach one of ``SLOW_CAUSES``; give each its xdist group."""
    seen: dict = {}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            module = getattr(item, "module", None)
            in_namespaces = module is not None and "netns_skip_reason" in vars(module)
            item.add_marker(pytest.mark.xdist_group(NAMESPACES if in_namespaces else item.nodeid.split("::")[0]))
        if not isinstance(item, pytest.Function) or item.get_closest_marker("slow"):
            continue
        fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
        if any(slow_cause(func, seen) for func in (item.function, *fixtures)):
            item.add_marker(pytest.mark.slow)
