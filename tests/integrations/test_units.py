"""In-process unit tests of the integration's pieces (no launch)."""

from __future__ import annotations

import math

import pytest
import torch

from autoloco_hf.integrations.accelerate import schedule_preview
from autoloco_hf.integrations.ddp_hooks import BatchMeter
from autoloco_hf.integrations.groups import WorkerTopology, build_topology, check_worker_layout
from autoloco_hf.integrations.runtime import TrainableParameters


class Toy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.frozen = torch.nn.Linear(4, 4)
        self.frozen.requires_grad_(False)

    def forward(self, input_ids=None, attention_mask=None, labels=None, num_items_in_batch=None):
        h = self.frozen(self.emb(input_ids))
        loss = h.pow(2).sum() / (num_items_in_batch or h.numel())
        return {"loss": loss, "logits": h}


def test_batch_meter_counts_non_padding_tokens_and_step_losses():
    model = Toy()
    meter = BatchMeter(model)
    ids = torch.ones(2, 5, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    # one optimizer step of two micro-batches with num_items_in_batch: losses add up
    a = model(input_ids=ids, attention_mask=mask, num_items_in_batch=20)["loss"]
    b = model(input_ids=ids, attention_mask=mask, num_items_in_batch=20)["loss"]
    meter.end_step()
    # one step of two plain micro-batches (means): their
    # mean; no attention_mask: every position counts
    c = model(input_ids=ids)["loss"]
    d = model(input_ids=ids[:, :3])["loss"]
    meter.end_step()
    # evaluation forwards are not counted
    model.eval()
    model(input_ids=ids, attention_mask=mask)
    with torch.no_grad():
        model.train()
        model(input_ids=ids, attention_mask=mask)
    tokens, loss = meter.flush()
    assert tokens == 8 + 8 + 10 + 6
    assert loss == pytest.approx(float((a + b).detach()) + float((c + d).detach()) / 2, rel=1e-6)
    assert meter.forwards == 4
    assert meter.flush() == (0, 0.0)
    meter.remove()
    model(input_ids=ids)
    assert meter.forwards == 4


def test_trainable_parameters_view_skips_frozen():
    model = Toy()
    view = TrainableParameters(model)
    assert [p.shape for p in view.parameters()] == [torch.Size([10, 4])]


def test_schedule_preview_accelerated_scheduler_stride():
    from accelerate.scheduler import AcceleratedScheduler
    from transformers import get_linear_schedule_with_warmup

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    inner = get_linear_schedule_with_warmup(opt, 2, 40)
    wrapped = AcceleratedScheduler(inner, [opt], step_with_optimizer=True, split_batches=False)
    preview = schedule_preview(wrapped, opt, total_steps=20, num_processes=2)
    # optimizer step s runs at the inner schedule's step 2 s
    # (the wrapper steps twice per optimizer step)
    assert [preview.lr_at(s) for s in range(3)] == [
        0.0,
        inner.lr_lambdas[0](2),
        inner.lr_lambdas[0](4),
    ]
    assert preview.lr_at(20) == 0.0
    assert math.isclose(preview.lr_mass(0, 3), sum(preview.lr_at(s) for s in range(3)))
    fresh = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    constant = schedule_preview(None, fresh, total_steps=5)
    assert constant.lr_mass(0, 10) == 5.0


def test_topology_layout():
    topo = WorkerTopology(world_size=8, rank=5, ranks_per_worker=2)
    assert (topo.num_workers, topo.worker_index, topo.rank_in_worker) == (4, 2, 1)
    assert topo.inner_ranks() == [4, 5] and topo.outer_ranks() == [1, 3, 5, 7]
    with pytest.raises(ValueError, match="does not divide"):
        check_worker_layout(6, 4)
    single = build_topology(1)
    assert (single.world_size, single.num_workers) == (1, 1)
    with pytest.raises(ValueError, match="distributed launch"):
        build_topology(2)


def _runtime(config, model=None):
    from autoloco_hf.algorithm.schedule import FunctionSchedule
    from autoloco_hf.integrations.runtime import WorkerRuntime

    torch.manual_seed(0)
    model = model or Toy()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    runtime = WorkerRuntime(
        config, model, model, optimizer, FunctionSchedule(lambda s: 1e-2, 8), 8, 0
    )
    return runtime, model, optimizer


def _steps(runtime, model, optimizer, n):
    ids = torch.tensor([[1, 2, 3, 4]])
    for _ in range(n):
        model(input_ids=ids, attention_mask=torch.ones_like(ids))["loss"].backward()
        optimizer.step()
        optimizer.zero_grad()
        runtime.after_optimizer_step(1e-2)


def test_checkpoint_model_shows_theta_and_state_keeps_the_local_replica(tmp_path):
    """Mid-interval: while saving, the model holds theta_t;
    the state file holds this rank's own replica."""
    from autoloco_hf import AutoLoCoConfig

    runtime, model, optimizer = _runtime(AutoLoCoConfig(method="diloco", h_base=3))
    _steps(runtime, model, optimizer, 4)  # sync at 3, step 4 is mid-interval
    local = model.emb.weight.detach().clone()
    theta = runtime.global_parameters()[0].clone()
    assert not torch.equal(local, theta)
    runtime.show_global_parameters()
    assert torch.equal(model.emb.weight, theta) and runtime.shows_global_parameters
    runtime.save(str(tmp_path))
    runtime.restore_local_parameters()
    assert torch.equal(model.emb.weight, local) and not runtime.shows_global_parameters

    resumed, model2, _ = _runtime(AutoLoCoConfig(method="diloco", h_base=3))
    resumed.load(str(tmp_path))
    assert torch.equal(model2.emb.weight, local) and torch.equal(
        resumed.global_parameters()[0], theta
    )
    assert resumed.step == 4


def test_show_global_is_a_no_op_at_a_boundary():
    from autoloco_hf import AutoLoCoConfig

    runtime, model, optimizer = _runtime(AutoLoCoConfig(method="diloco", h_base=3))
    _steps(runtime, model, optimizer, 3)
    runtime.show_global_parameters()
    assert not runtime.shows_global_parameters, "right after a sync the model already is theta_t"


def test_runtime_refuses_state_of_another_world_size_or_config(tmp_path):
    from autoloco_hf import AutoLoCoConfig
    from autoloco_hf.integrations.runtime import state_path
    from autoloco_hf.state.checkpoint import CheckpointError, write_state

    config = AutoLoCoConfig(method="diloco", h_base=3)
    runtime, _, _ = _runtime(config)
    path = state_path(str(tmp_path), 0)
    write_state(
        path, runtime.state_dict(), config=config, world_size=2, ranks_per_worker=1, rank=0, step=0
    )
    with pytest.raises(
        CheckpointError, match=r"autoloco/rank0\.safetensors: field world_size=2 .* world_size=1"
    ):
        runtime.load(str(tmp_path))
    runtime.save(str(tmp_path))
    other, _, _ = _runtime(AutoLoCoConfig(method="diloco", h_base=6))
    with pytest.raises(CheckpointError, match=r"rank0\.safetensors: field config\.h_base=3"):
        other.load(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no AutoLoCo state for rank 0"):
        other.load(str(tmp_path / "elsewhere"))


def test_accelerate_synchronized_parameters_for_saving(tmp_path):
    """AutoLoCoAccelerate: theta_t inside the block, the
    replica after it; save inside keeps the replica."""
    from accelerate import Accelerator

    from autoloco_hf import AutoLoCoAccelerate, AutoLoCoConfig

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = Toy()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    ids = torch.tensor([[1, 2, 3, 4]])
    with AutoLoCoAccelerate(
        accelerator,
        model,
        optimizer,
        None,
        AutoLoCoConfig(method="diloco", h_base=3),
        total_steps=6,
    ) as autoloco:
        for _ in range(4):
            accelerator.backward(model(input_ids=ids)["loss"])
            optimizer.step()
            optimizer.zero_grad()
        replica = model.emb.weight.detach().clone()
        theta = autoloco.runtime.global_parameters()[0]
        with autoloco.synchronized_parameters():
            assert torch.equal(model.emb.weight, theta)
            autoloco.save(str(tmp_path))
        assert torch.equal(model.emb.weight, replica)
        autoloco.load(str(tmp_path))
        assert torch.equal(model.emb.weight, replica) and autoloco.runtime.step == 4
