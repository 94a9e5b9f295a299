"""What a new user installs: README's torch lines per platform, and dependency floors that hold."""

from __future__ import annotations

import configparser
import re
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def floors() -> dict[str, Version]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = (
        cfg["options"]["install_requires"].splitlines()
        + cfg["options.extras_require"]["sft"].splitlines()
    )
    found = {}
    for line in filter(None, (raw.strip() for raw in lines)):
        req = Requirement(line)
        for spec in req.specifier:
            if spec.operator == ">=":
                found[req.name.lower()] = Version(spec.version)
    return found


def test_readme_installs_torch_per_platform():
    """A plain `pip install torch==X` is the CUDA build on
    Linux: the CPU-only line must name the CPU index."""
    commands = [
        line.split("#")[0].strip()
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("pip install")
    ]
    torch_lines = [c for c in commands if re.search(r"\btorch==", c)]
    assert any(CPU_INDEX in c for c in torch_lines), (
        "a CPU-only install line with the CPU wheel index"
    )
    assert any(CPU_INDEX not in c and "--index-url" not in c for c in torch_lines), (
        "a GPU line with the default wheel"
    )
    pinned = {re.search(r"torch==(\S+)", c).group(1) for c in torch_lines}
    ci = re.search(r"torch==(\S+)", (ROOT / ".ci" / "run").read_text()).group(1)
    assert pinned == {ci}, "README and CI install the same torch"
    assert Version(ci) >= floors()["torch"]
    project = [c for c in commands if "-e " in c]
    assert project and not any("torch" in c for c in project), (
        "the project install keeps the torch installed first"
    )


def test_ci_runs_the_readmes_test_command_in_its_two_tiers():
    """The README's test command is what .ci/run runs: its quick tier first, then the slow one."""
    setup = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    (command,) = [line for line in setup.splitlines() if line.startswith("python -m pytest")]
    ci = (ROOT / ".ci" / "run").read_text()
    # the same command; CI adds only a report of the slowest tests
    for tier in ('-m "not slow"', "-m slow"):
        assert re.search(rf"^{re.escape(command)} {re.escape(tier)}( --durations=\d+)?$", ci, re.M)
    # the quick tier, as documented
    assert f'{command} -m "not slow"' in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("package", ["trl"])
def test_floors_meet_what_our_dependencies_require(package):
    """A floor below what TRL itself requires (accelerate>=1.10.1,
    datasets>=4.7, ...) cannot be installed as stated."""
    ours = floors()
    for line in requires(package) or []:
        req = Requirement(line)
        if req.marker is not None or req.name.lower() not in ours:
            continue
        for spec in req.specifier:
            if spec.operator == ">=":
                assert ours[req.name.lower()] >= Version(spec.version), (
                    f"setup.cfg {req.name}>={ours[req.name.lower()]} < {line}"
                )


def test_setup_cfg_lists_every_package():
    """A package folder missing from setup.cfg is missing
    from the wheel (.ci/wheel_check installs and runs it)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(filter(None, cfg["options"]["packages"].split()))
    renamed = {"evals": "autoloco_evals"}  # package_dir: evals/ installs as autoloco_evals
    found = set()
    for folder in ("autoloco_hf", "evals"):
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = list(init.parent.relative_to(ROOT).parts)
            found.add(".".join([renamed.get(parts[0], parts[0]), *parts[1:]]))
    assert listed == found
