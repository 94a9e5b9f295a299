"""One-process Trainer + AutoLoCoCallback with ``snapshot_dir``: a restart resumes from the last
boundary (docs/algorithm.md#boundary-snapshots).

The Trainer's own resume path (``global_step``, LR scheduler,
``skip_first_batches``) brings the run to the boundary; what fails to
verify is refused in one line naming the field. Other numbers of workers:
tests/integrations/trainer/test_trainer_elastic.py.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
from test_trainer_single_process import item, make_trainer
from transformers import TrainerCallback

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.integrations import AutoLoCoConfigurationError
from autoloco_hf.state.checkpoint import CheckpointError, ConfigMismatchError
from autoloco_hf.sync.snapshot import latest_snapshot, snapshot_path

pytestmark = pytest.mark.slow

STEPS = 12
DATA = [item(i) for i in range(STEPS * 2)]


class Watch(TrainerCallback):
    """Test-only: what each step trained on and at which
    learning rate; optionally stops after ``stop_at``."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.stop_at = stop_at
        self.batches: list[torch.Tensor] = []
        self.lrs: list[float] = []
        self.begin: dict = {}

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.begin = {
            "step": state.global_step,
            "params": [p.detach().clone() for p in model.parameters()],
            "optimizer_state": len(optimizer.state_dict()["state"]),
        }
        model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        if module.training:
            self.batches.append(kwargs["input_ids"].clone())

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.lrs.append(optimizer.param_groups[0]["lr"])

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop_at is not None and state.global_step >= self.stop_at:
            control.should_training_stop = True


def run(output_dir, config: dict, stop_at=None, resume=False, **kwargs):
    trainer, callback = make_trainer(
        output_dir, DATA, config, max_steps=STEPS, warmup_steps=2, **kwargs
    )
    watch = Watch(stop_at)
    trainer.add_callback(watch)
    point = callback.resume_point() if resume else None
    trainer.train(resume_from_checkpoint=point)
    return trainer, callback, watch, point


def diloco(folder) -> dict:
    return {"method": "diloco", "h_base": 4, "snapshot_dir": str(folder)}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run stopped inside its second interval (after step 7): its last snapshot is of step 4."""
    out = tmp_path_factory.mktemp("stopped")
    run(out, diloco(out / "snapshots"), stop_at=7)
    return out


def test_a_restart_resumes_from_the_last_boundary_by_the_trainers_path(stopped, tmp_path, caplog):
    folder = stopped / "snapshots"
    snapshot = latest_snapshot(str(folder), AutoLoCoConfig(**diloco(folder)))
    assert snapshot.step == 4
    theta = snapshot.engine_state["outer"]["params"]
    with caplog.at_level(logging.INFO, logger="autoloco_hf"):
        trainer, callback, watch, point = run(stopped, diloco(folder), resume=True)
    assert point == str(folder / "resume-000000004")
    assert watch.begin["step"] == 4 and watch.begin["optimizer_state"] == 0  # fresh AdamW moments
    assert torch.equal(torch.cat([p.reshape(-1) for p in watch.begin["params"]]), theta)
    assert trainer.state.global_step == STEPS and callback.engine.totals.syncs == 3
    [line] = [r.getMessage() for r in caplog.records if "resumed step" in r.getMessage()]
    assert "resumed step 4 from the boundary snapshot" in line and "1 workers, now 1" in line

    _, _, full, _ = run(tmp_path / "full", {"method": "diloco", "h_base": 4})
    assert watch.lrs == full.lrs[4:]  # the scheduler at the boundary step
    # data position
    assert all(torch.equal(a, b) for a, b in zip(watch.batches, full.batches[4:], strict=True))


def test_a_newer_trainer_checkpoint_of_the_same_layout_is_resumed_instead(tmp_path):
    run(tmp_path, diloco(tmp_path / "snapshots"), stop_at=7, save_strategy="steps", save_steps=6)
    trainer, callback = make_trainer(
        tmp_path, DATA, diloco(tmp_path / "snapshots"), max_steps=STEPS
    )
    # carries the inner state: exact
    assert callback.resume_point() == str(tmp_path / "checkpoint-6")


def test_another_algorithm_setting_is_refused_naming_the_field(stopped, tmp_path):
    _, callback = make_trainer(
        tmp_path, DATA, {**diloco(stopped / "snapshots"), "h_base": 3}, max_steps=STEPS
    )
    with pytest.raises(
        ConfigMismatchError, match=r"field config\.h_base=4 when the checkpoint was written"
    ):
        callback.resume_point()


def test_damaged_snapshots_are_refused(tmp_path, caplog):
    run(tmp_path, diloco(tmp_path / "snapshots"), stop_at=9)
    for step in (4, 8):
        path = snapshot_path(str(tmp_path / "snapshots"), step)
        data = bytearray(open(path, "rb").read())
        data[-5] ^= 0xFF
        open(path, "wb").write(bytes(data))
    _, callback = make_trainer(tmp_path, DATA, diloco(tmp_path / "snapshots"), max_steps=STEPS)
    with pytest.raises(CheckpointError, match="none of its 2 boundary snapshots verifies"):
        callback.resume_point()
    assert sum("field sha256 does not match" in r.getMessage() for r in caplog.records) == 2


def test_a_fresh_start_over_earlier_snapshots_is_refused(stopped, tmp_path):
    with pytest.raises(
        AutoLoCoConfigurationError, match=r"snapshot_dir=.* holds boundary snapshots past step 0"
    ):
        run(tmp_path, diloco(stopped / "snapshots"))
    assert not os.path.exists(tmp_path / "checkpoint-4")


def test_a_resume_from_a_checkpoint_older_than_the_last_boundary_is_refused(tmp_path):
    run(tmp_path, diloco(tmp_path / "snapshots"), stop_at=9, save_strategy="steps", save_steps=6)
    with pytest.raises(
        AutoLoCoConfigurationError,
        match=r"past step 6, where this run starts \(newest boundary-000000008",
    ):
        trainer, _ = make_trainer(tmp_path, DATA, diloco(tmp_path / "snapshots"), max_steps=STEPS)
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))


def test_snapshots_of_a_ddp_run_are_refused_naming_the_method(tmp_path):
    with pytest.raises(ValueError, match="method='ddp'"):
        run(tmp_path, {"method": "ddp", "snapshot_dir": str(tmp_path / "snapshots")})
