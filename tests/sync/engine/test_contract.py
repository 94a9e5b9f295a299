"""The engine contract is written once, and the split modules keep every old import path."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.algorithm.schedule import FunctionSchedule
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.engine.contract import Engine
from autoloco_hf.sync.engine.engine import IntervalEngine
from autoloco_hf.sync.schedules import factory
from autoloco_hf.sync.schedules.gradient_averaging import GradientAveragingEngine


def engine_of(method: str) -> Engine:
    models = [torch.nn.Linear(3, 1) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    config = AutoLoCoConfig(method=method, h_base=2)
    schedule = FunctionSchedule(lambda s: 1e-2, 4)
    return factory.make_engine(config, models, schedule, SimulatedCommunicator(2), total_steps=4)


@pytest.mark.parametrize("method", ["diloco", "ddp"])
def test_both_engines_satisfy_the_contract(method: str) -> None:
    engine = engine_of(method)
    assert isinstance(engine, Engine)
    assert engine.after_optimizer_step(tokens=[4, 4], losses=[1.0, 1.0]) is None
    assert engine.step == 1 and engine.totals.steps == 1


@pytest.mark.parametrize("engine_class", [IntervalEngine, GradientAveragingEngine])
def test_after_optimizer_step_has_the_contract_signature(engine_class: type) -> None:
    expected = inspect.signature(Engine.after_optimizer_step)
    assert inspect.signature(engine_class.after_optimizer_step) == expected


def test_factory_engine_is_the_protocol() -> None:
    assert factory.Engine is Engine
    assert inspect.signature(factory.make_engine).return_annotation in ("Engine", Engine)


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (
            "autoloco_hf.sync.communicators",
            "ALL_GATHER OWNER_REDUCE AverageResult Communicator HierarchicalCommunicator "
            "PeerLostError PendingAverage ProcessGroupCommunicator ShardedWorkerCommunicator "
            "SimulatedCommunicator Traffic collective_device gathered_bytes_sent "
            "make_communicator peer_lost sum_in_worker_order worker_label",
        ),
        (
            "autoloco_hf.sync.engine.engine",
            "Aggregate BlockingSchedule BoundaryListener ClosedInterval Collected InFlight "
            "IntervalCounters IntervalEngine OuterStep OuterStepHook SyncSchedule "
            "TooManyInvalidIntervals WorkerDisagreement check_workers",
        ),
    ],
)
def test_old_import_paths_still_work(module: str, names: str) -> None:
    loaded = importlib.import_module(module)
    assert [n for n in names.split() if not hasattr(loaded, n)] == []
