"""The pure algorithm imports neither ``torch`` nor
``transformers``: it runs in milliseconds on scripted numbers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PURE_MODULES = [
    "autoloco_hf.config",
    "autoloco_hf.algorithm.schedule",
    "autoloco_hf.algorithm.stats",
    "autoloco_hf.algorithm.token_mapper",
    "autoloco_hf.algorithm.rules.decisions",
    "autoloco_hf.algorithm.correction",
    "autoloco_hf.algorithm.policies",
    "autoloco_hf.algorithm.preview",
    "autoloco_hf.wire.accounting",
    "autoloco_hf.cli.plan",
    "autoloco_hf.usage",
]
HEAVY = ["torch", "torch.distributed", "transformers", "accelerate"]


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_loads_no_torch_or_transformers(module):
    probe = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(json.loads(out))
    assert not [m for m in HEAVY if m in loaded], (
        f"{module} loads {[m for m in HEAVY if m in loaded]}"
    )
