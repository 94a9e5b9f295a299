"""The xdist scopes of the suite (tests/conftest.py's
scheduler): a module, ``namespaces`` or a shard."""

import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMESPACES = "namespaces"
SHARDED = "tests/test_documented_commands.py::test_documented_commands_run"  # one scope per shard


@functools.cache
def builds_namespaces(module: str) -> bool:
    """Whether a test module (a path from the repository root) builds network namespaces."""
    return "netns_skip_reason" in (ROOT / module).read_text()


def scope_of(nodeid: str) -> str:
    """The xdist scope of a test: its module, ``namespaces``, or a documented-commands shard."""
    module = nodeid.split("::")[0]
    if nodeid.startswith(SHARDED + "["):
        shard = nodeid.removeprefix(SHARDED + "[").removesuffix("]")
        return NAMESPACES if shard == NAMESPACES else f"{module}[{shard}]"
    return NAMESPACES if builds_namespaces(module) else module
