"""Exact, non-mutating learning-rate-mass previews (docs/algorithm.md#interval-statistics)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.optim import lr_scheduler
from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

from autoloco_hf.algorithm.schedule import (
    FunctionSchedule,
    SchedulerPreview,
    lr_mass,
    warmup_cosine,
    warmup_linear,
)

TOTAL = 120


def make_optimizer(lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=lr)


def stepped_lrs(scheduler_factory, steps: int) -> list[float]:
    """The learning rate of optimizer steps 0 .. steps-1 from
    a separately built, actually stepped scheduler."""
    opt = make_optimizer()
    sched = scheduler_factory(opt)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


HF_FACTORIES = {
    "cosine": lambda opt: get_cosine_schedule_with_warmup(
        opt, num_warmup_steps=10, num_training_steps=TOTAL
    ),
    "linear": lambda opt: get_linear_schedule_with_warmup(
        opt, num_warmup_steps=10, num_training_steps=TOTAL
    ),
}
OTHER_FACTORIES = {
    "step": lambda opt: lr_scheduler.StepLR(opt, step_size=17, gamma=0.5),
    "onecycle": lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=TOTAL + 1),
    "sequential": lambda opt: lr_scheduler.SequentialLR(
        opt,
        schedulers=[
            lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=10),
            lr_scheduler.CosineAnnealingLR(opt, T_max=TOTAL - 10),
        ],
        milestones=[10],
    ),
    "exponential": lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.97),
    "chained": lambda opt: lr_scheduler.ChainedScheduler(
        [
            lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=15),
            lr_scheduler.ExponentialLR(opt, gamma=0.98),
        ]
    ),
    "polynomial": lambda opt: lr_scheduler.PolynomialLR(opt, total_iters=TOTAL, power=2.0),
    "warm_restarts": lambda opt: lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=20, T_mult=2),
    "cyclic": lambda opt: lr_scheduler.CyclicLR(
        opt, base_lr=1e-4, max_lr=1e-2, step_size_up=9, cycle_momentum=False
    ),
}
ALL_FACTORIES = {**HF_FACTORIES, **OTHER_FACTORIES}
INTERVALS = [
    (0, 10),
    (0, 25),
    (5, 13),
    (10, 50),
    (37, 41),
    (100, 20),
    (110, 30),
    (119, 1),
    (TOTAL, 5),
]


def _epoch(scheduler) -> int:
    """``last_epoch``; ChainedScheduler keeps it only in its children."""
    if hasattr(scheduler, "last_epoch"):
        return scheduler.last_epoch
    return scheduler._schedulers[0].last_epoch


# ------------------------------------------------------------- lr_mass
def test_lr_mass_clamps_at_budget() -> None:
    """docs/algorithm.md#interval-statistics: steps at or
    beyond the training budget contribute 0."""
    sched = FunctionSchedule(lambda s: 1.0 + s, total_steps=10)
    assert lr_mass(sched, 0, 10) == sum(1.0 + s for s in range(10))
    assert lr_mass(sched, 8, 5) == 9.0 + 10.0
    assert lr_mass(sched, 10, 5) == 0.0
    assert lr_mass(sched, 3, 0) == 0.0
    assert sched.lr_mass(2, 3) == 3.0 + 4.0 + 5.0
    assert sched.lr_at(10) == 0.0 and sched.lr_at(-1) == 0.0


def test_lr_mass_clamps_any_schedule_object() -> None:
    """The clamp is part of ``lr_mass`` itself, not only of the schedules shipped here."""

    class Unclamped:
        total_steps = 10

        def lr_at(self, step: int) -> float:
            return 1.0

    assert lr_mass(Unclamped(), 8, 5) == 2.0
    assert lr_mass(Unclamped(), 12, 5) == 0.0


def test_hf_cosine_rises_past_its_end_but_preview_clamps() -> None:
    opt = make_optimizer(lr=1.0)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=10, num_training_steps=TOTAL)
    fn = sched.lr_lambdas[0]
    assert fn(TOTAL + 20) > fn(TOTAL) >= 0.0  # HF's cosine rises again past the budget
    preview = SchedulerPreview(sched, total_steps=TOTAL)
    assert preview.lr_at(TOTAL + 20) == 0.0
    assert preview.lr_mass(TOTAL - 5, 50) == pytest.approx(
        sum(fn(s) for s in range(TOTAL - 5, TOTAL)), rel=1e-12
    )
    f = warmup_cosine(1.0, 10, TOTAL)
    assert f.lr_at(TOTAL + 20) == 0.0
    assert f.lr_mass(TOTAL - 5, 50) == pytest.approx(
        sum(fn(s) for s in range(TOTAL - 5, TOTAL)), rel=1e-12
    )


# -------------------------------------------------- function schedules
@pytest.mark.parametrize("peak", [3e-4, 1e-3, 2e-5, 0.7])
@pytest.mark.parametrize("warmup, total", [(100, 1000), (0, 50), (7, 333), (65, 6490)])
def test_warmup_schedules_equal_transformers_exactly(peak: float, warmup: int, total: int) -> None:
    """``warmup_cosine``/``warmup_linear`` reproduce transformers' schedules bit for bit."""
    for mine, theirs in (
        (warmup_cosine, get_cosine_schedule_with_warmup),
        (warmup_linear, get_linear_schedule_with_warmup),
    ):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
        ref = theirs(opt, num_warmup_steps=warmup, num_training_steps=total)
        f = mine(peak, warmup, total)
        assert f.total_steps == total
        expected = [peak * ref.lr_lambdas[0](s) for s in range(total)]
        assert [f.lr_at(s) for s in range(total)] == expected


def test_warmup_cosine_min_ratio_matches_transformers() -> None:
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    ref = get_cosine_with_min_lr_schedule_with_warmup(opt, 10, 200, min_lr_rate=0.1)
    f = warmup_cosine(1e-3, 10, 200, min_ratio=0.1)
    for s in range(200):
        assert f.lr_at(s) == pytest.approx(1e-3 * ref.lr_lambdas[0](s), rel=1e-12, abs=1e-18)
    assert f.lr_at(199) > 0.9e-4


# ---------------------------------------------------- SchedulerPreview
@pytest.mark.parametrize("name", sorted(ALL_FACTORIES))
def test_preview_equals_actually_stepped_scheduler(name: str) -> None:
    """docs/algorithm.md#interval-statistics: the preview's per-step LR and interval sums equal a
    separate copy stepped for real."""
    factory = ALL_FACTORIES[name]
    actual = stepped_lrs(factory, TOTAL)
    opt = make_optimizer()
    live = factory(opt)
    preview = SchedulerPreview(live, total_steps=TOTAL)
    assert [preview.lr_at(s) for s in range(TOTAL)] == pytest.approx(actual, rel=1e-12, abs=0.0)
    for start, h in INTERVALS:
        expected = math.fsum(actual[start : min(start + h, TOTAL)])
        assert preview.lr_mass(start, h) == pytest.approx(expected, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("name", sorted(ALL_FACTORIES))
def test_preview_does_not_mutate_live_scheduler(name: str) -> None:
    """docs/algorithm.md#interval-statistics: previewing never steps the live scheduler nor touches
    its optimizer's learning rate."""
    opt = make_optimizer()
    live = ALL_FACTORIES[name](opt)
    for _ in range(7):  # training has started
        opt.step()
        live.step()
    epoch, lr, last = _epoch(live), opt.param_groups[0]["lr"], list(live.get_last_lr())
    state = {k: v for k, v in live.state_dict().items() if not callable(v)}
    preview = SchedulerPreview(live, total_steps=TOTAL)
    preview.lr_mass(7, 200)
    preview.lr_at(TOTAL - 1)
    assert _epoch(live) == epoch
    assert opt.param_groups[0]["lr"] == lr
    assert live.get_last_lr() == last
    assert {k: v for k, v in live.state_dict().items() if not callable(v)} == state
    # the live scheduler continues exactly as a never-previewed one
    actual = stepped_lrs(ALL_FACTORIES[name], 21)
    continued = []
    for _ in range(13):
        opt.step()
        live.step()
        continued.append(opt.param_groups[0]["lr"])
    assert continued == actual[8:21]


@pytest.mark.parametrize("name", sorted(ALL_FACTORIES))
def test_preview_created_mid_training_uses_absolute_steps(name: str) -> None:
    actual = stepped_lrs(ALL_FACTORIES[name], TOTAL)
    opt = make_optimizer()
    live = ALL_FACTORIES[name](opt)
    for _ in range(30):
        opt.step()
        live.step()
    preview = SchedulerPreview(live, total_steps=TOTAL)
    assert preview.lr_mass(30, 40) == pytest.approx(math.fsum(actual[30:70]), rel=1e-12)
    assert preview.lr_at(30) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12)


def test_non_lambda_preview_cannot_look_before_capture() -> None:
    opt = make_optimizer()
    live = OTHER_FACTORIES["step"](opt)
    for _ in range(5):
        opt.step()
        live.step()
    preview = SchedulerPreview(live, total_steps=TOTAL)
    with pytest.raises(ValueError, match="captured at step 5"):
        preview.lr_at(4)


def test_preview_param_group() -> None:
    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.AdamW(
        [{"params": [params[0]], "lr": 1e-3}, {"params": [params[1]], "lr": 5e-3}]
    )
    live = get_cosine_schedule_with_warmup(opt, 10, TOTAL)
    assert SchedulerPreview(live, TOTAL, param_group=1).lr_at(50) == pytest.approx(
        5 * SchedulerPreview(live, TOTAL, param_group=0).lr_at(50)
    )


def test_reduce_on_plateau_raises() -> None:
    """docs/algorithm.md#interval-statistics: a metric-driven scheduler has no exact preview."""
    opt = make_optimizer()
    with pytest.raises(TypeError, match="ReduceLROnPlateau"):
        SchedulerPreview(lr_scheduler.ReduceLROnPlateau(opt), total_steps=TOTAL)
