"""A horizon rule defined outside the package runs unchanged under the simulated engine, the Trainer
callback (2 processes, gloo) and ``autoloco plan`` (docs/algorithm.md#rule-plugins)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launch import forked_ranks

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.algorithm.schedule import FunctionSchedule
from autoloco_hf.config import ConfigError
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.schedules.factory import make_engine

HERE = Path(__file__).parent
RULE = dict(method="autoloco", controller="fixed_schedule", rule_module="fixed_schedule_rule")


def test_the_rule_is_found_by_name_once_its_module_is_named() -> None:
    cfg = AutoLoCoConfig(h_base=10, q_h=5, rule_options={"start": 40}, **RULE)
    assert (cfg.rule_class.__name__, cfg.rule_options.start, cfg.h_max) == ("FixedSchedule", 40, 40)
    with pytest.raises(
        ConfigError, match=r"rule_options\['gain'\] is not an option of rule 'fixed_schedule'"
    ):
        AutoLoCoConfig(h_base=10, rule_options={"gain": 0.9}, **RULE)
    with pytest.raises(ConfigError, match="rule_module='no_such_rules' cannot be imported"):
        AutoLoCoConfig(h_base=10, **{**RULE, "rule_module": "no_such_rules"})


def test_simulated_engine_runs_the_schedule_and_serves_its_measurements() -> None:
    torch.manual_seed(0)
    models = [torch.nn.Linear(4, 1) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    cfg = AutoLoCoConfig(h_base=10, q_h=5, map_tokens=False, **RULE)
    engine = make_engine(
        cfg, models, FunctionSchedule(lambda s: 0.05, 90), SimulatedCommunicator(2), total_steps=90
    )
    for _ in range(90):
        for i, (model, optimizer) in enumerate(zip(models, optimizers)):
            x = torch.randn(8, 4)
            (model(x) - (i + 1) * x.sum(1, keepdim=True)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        engine.after_optimizer_step(tokens=[8, 8], losses=[0.0, 0.0])
    assert [r.h_step for r in engine.records] == [40, 20, 10, 10, 10]
    # the shared displacements (after 1 and 2 steps, summed over both workers) reached the rule
    assert all(r.probe_exponent is not None and r.probe_exponent > 0.0 for r in engine.records)


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory) -> tuple[dict, dict]:
    autoloco = {**RULE, "h_base": 4, "q_h": 2, "rule_options": {"start": 16}, "map_tokens": False}
    spec = {
        "output_dir": str(tmp_path_factory.mktemp("rule")),
        "steps": 28,
        "batch": 2,
        "autoloco": autoloco,
    }
    r0, r1 = forked_ranks("trainer_worker.py", spec, nproc=2)
    return r0, r1


def test_trainer_callback_two_processes_run_the_rule(trainer_run) -> None:
    r0, r1 = trainer_run
    assert (
        [r["h_step"] for r in r0["records"]] == [r["h_step"] for r in r1["records"]] == [16, 8, 4]
    )
    # the run ends at a boundary: theta_t
    assert all(torch.equal(a, b) for a, b in zip(r0["params"], r1["params"]))
    exponents = [r["probe_exponent"] for r in r0["records"]]
    assert all(e is not None and e > 0 for e in exponents)  # the shared requests were served ...
    # ... by one all-gather: the same sums
    assert exponents == [r["probe_exponent"] for r in r1["records"]]


def test_plan_accepts_the_rule_by_name() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        str(Path(sys.executable).parent / "autoloco"),
        "plan",
        "--recipe",
        "sft",
        "--rule-module",
    ]
    done = subprocess.run(
        [
            *command,
            "fixed_schedule_rule",
            "--controller",
            "fixed_schedule",
            "--rule-options",
            "start=400",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("autoloco: 400x1, 200x1, 100x58, 90x1")
    refused = subprocess.run(
        [*command, "fixed_schedule_rule", "--method", "diloco", "--controller", "fixed_schedule"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (
        refused.returncode == 2
        and "controller='fixed_schedule' is invalid: it only applies" in refused.stderr
    )
