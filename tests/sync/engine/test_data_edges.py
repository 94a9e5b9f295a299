"""Data edge cases at the engine (issue 10 item 6):
zero-token intervals, short runs, runs shorter than warm-up.

The Trainer-level cases (no attention_mask, all-padding batches, a dataset shorter than one
interval, gradient accumulation that does not divide the dataset) are in
tests/integrations/trainer/test_trainer_single_process.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.algorithm.schedule import warmup_cosine
from autoloco_hf.sync.communicators import SimulatedCommunicator
from autoloco_hf.sync.schedules.factory import make_engine


def run(
    config: AutoLoCoConfig, total: int, tokens_at=lambda step: 64, warmup: int = 0, workers: int = 2
):
    """Two simulated workers on a linear regression;
    ``tokens_at(step)`` non-padding tokens per worker and step."""
    torch.manual_seed(0)
    models = [torch.nn.Linear(4, 1) for _ in range(workers)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    schedule = warmup_cosine(0.05, warmup, total)
    engine = make_engine(
        config,
        models,
        schedule,
        SimulatedCommunicator(workers),
        total_steps=total,
        warmup_steps=warmup,
        optimizers=optimizers,
    )
    for step in range(total):
        for worker, (m, o) in enumerate(zip(models, optimizers)):
            g = torch.Generator().manual_seed(100 * step + worker)
            x = torch.randn(8, 4, generator=g)
            (m(x) - x.sum(1, keepdim=True)).pow(2).mean().backward()
            for group in o.param_groups:
                group["lr"] = schedule.lr_at(step)
            o.step()
            o.zero_grad()
        engine.after_optimizer_step(tokens=[tokens_at(step)] * workers, losses=[1.0] * workers)
    return engine, models


def test_interval_with_zero_tokens_is_valid_and_not_calibrated():
    """An all-padding interval: outer step applied as usual;
    the token mapper does not learn a density of 0."""
    config = AutoLoCoConfig(method="autoloco", controller="paper", h_base=4, q_h=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division warnings either
        engine, models = run(config, 48, tokens_at=lambda step: 0 if step < 8 else 64)
    records = engine.records
    assert [r.tokens for r in records[:2]] == [0, 0]
    assert all(r.outer_step_applied for r in records)
    mapper = engine.policy.mapper
    assert mapper.base_counts and 0 not in mapper.base_counts, (
        "zero-token intervals are not calibration data"
    )
    assert mapper.tokens_per_step == pytest.approx(2 * 64)
    assert all(r.h_step >= 4 for r in records[:-1]), (
        "a zero M_base would have mapped every horizon to q_h=1"
    )
    assert torch.equal(models[0].weight, models[1].weight)


def test_every_interval_without_tokens():
    """No token in the whole run: the mapper stays the
    identity (H_step = H_tok), nothing divides by zero."""
    engine, _ = run(
        AutoLoCoConfig(method="autoloco", controller="paper", h_base=4, q_h=1),
        24,
        tokens_at=lambda step: 0,
    )
    assert engine.totals.tokens == 0 and engine.totals.syncs == len(engine.records) >= 1
    assert not engine.policy.mapper.ready
    assert sum(r.h_step for r in engine.records) == 24


@pytest.mark.parametrize("method", ["autoloco", "diloco"])
def test_run_shorter_than_one_interval(method):
    """total_steps < h_base: a single interval that ends, and synchronizes, at the last step."""
    engine, models = run(AutoLoCoConfig(method=method, h_base=10), 3)
    assert [(r.start_step, r.h_step) for r in engine.records] == [(0, 3)]
    assert engine.current_interval is None and torch.equal(models[0].weight, models[1].weight)


def test_run_shorter_than_warmup():
    """warmup_steps > total_steps: intervals still cover the
    budget exactly, every outer step is finite."""
    engine, models = run(
        AutoLoCoConfig(method="autoloco", controller="paper", h_base=4, q_h=1), 10, warmup=25
    )
    assert sum(r.h_step for r in engine.records) == 10
    assert all(r.outer_step_applied for r in engine.records)
    assert torch.isfinite(models[0].weight).all() and torch.equal(
        models[0].weight, models[1].weight
    )
