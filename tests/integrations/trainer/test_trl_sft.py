"""TRL SFTTrainer (assistant_only_loss=True) + AutoLoCoCallback,
2 processes, on a chat dataset built in the worker."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from launch import forked_ranks  # noqa: E402

pytestmark = pytest.mark.slow


def test_sft_trainer_with_autoloco(tmp_path):
    spec = {
        "output_dir": str(tmp_path),
        "steps": 8,
        "autoloco": {"method": "autoloco", "controller": "paper", "h_base": 4, "q_h": 1},
    }
    results = forked_ranks("trl_worker.py", spec, nproc=2, timeout=400)
    r0, r1 = results
    # syncs happen, at the same steps on both workers, and leave identical replicas
    assert r0["totals"]["syncs"] == r1["totals"]["syncs"] == 2
    assert r0["synced"] == r1["synced"] == [False, False, False, True, False, False, False, True]
    assert r0["final"] == r1["final"]
    # the engine's global token count is exactly the non-padding tokens both workers consumed
    assert r0["totals"]["tokens"] == r0["mask_tokens"] + r1["mask_tokens"]
    for r in results:
        assert r["mask_tokens"] < r["positions"], "the batches contain padding"
        assert r["loss_positions"] < r["mask_tokens"], (
            "assistant_only_loss masks prompt tokens in the labels"
        )
        big = [c for c in r["collectives"] if c[1] >= r["model_bytes"] // 2]
        assert len(big) == r["totals"]["syncs"], big  # TRL's per-step metric gathers are scalars
        assert all(c[1] <= 1024 for c in r["collectives"] if c not in big)
    logged = [h for h in r0["log_history"] if "autoloco/H_step" in h]
    assert [h["step"] for h in logged] == [4, 8]
    assert sum(h["autoloco/interval_tokens"] for h in logged) == r0["totals"]["tokens"]
