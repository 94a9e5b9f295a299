"""Shared test set-up: the ``slow`` mark given by cause.

``tests/`` and ``benchmarks/`` are on ``sys.path`` (``pythonpath`` in setup.cfg): test modules in
sub-folders share the helpers of ``tests/`` (``_dist``, ``slow_causes``) and import the benchmarks
by kind (``from campaigns import replicate``).

The quick tier, for use before every commit, is ``python -m pytest -q -m "not slow"``.
A test is ``slow`` when it is marked so, or when it, a fixture it requests or a test
helper they call spawns processes or trains a Trainer (``slow_causes.SLOW_CAUSES``): a
new test of that kind joins the slow tier with no mark to remember. A test slow for
another reason (a long in-process run, such as the demo) is marked by hand.

The README's test command runs on two pytest-xdist workers (``-n 2 --dist loadscope``), with the
scopes of :func:`scope_of`: a module's tests run on one worker, so that a module-scoped fixture (a
launch its tests share) runs once; every module that builds network namespaces (it uses
``netns_skip_reason``) shares one scope, so that two namespace tests never run at once (their timing
bounds assume no second testbed beside them); the documented commands' shards are scopes of their
own. (``xdist_group`` marks and ``--dist loadgroup`` would say the same, but pytest 9.2's node ids
no longer carry xdist's group suffix.)
"""

import os

# One intra-op thread in each test process and, through the environment, in every process a test
# starts. The suite runs on two xdist workers on two cores: at torch's default (a thread per core)
# the workers' OpenMP threads spin against each other, and CPU-bound files ran several times slower
# (tests/sync/test_lowbit_training.py on two workers: 80 s against 23 s). A test that needs more
# threads sets them itself; OMP_NUM_THREADS set by the caller wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from slow_causes import slow_cause  # noqa: E402
from xdist_scopes import scope_of  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# a hook of pytest-xdist: without it (.ci/min_versions) it is never called
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` with the scopes of :func:`scope_of`."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ByScope(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test whose code or fixtures reach one of ``SLOW_CAUSES``."""
    seen: dict = {}
    for item in items:
        if not isinstance(item, pytest.Function) or item.get_closest_marker("slow"):
            continue
        fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
        if any(slow_cause(func, seen) for func in (item.function, *fixtures)):
            item.add_marker(pytest.mark.slow)
