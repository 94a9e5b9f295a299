"""FSDP2 workers under the Trainer (docs/algorithm.md#worker-groups):
what can be checked on CPU, in 4 gloo processes.

Accelerate enables FSDP for GPU-like devices only (``AcceleratorState`` sets the FSDP distributed
type for the ``MULTI_GPU``-like types, never ``MULTI_CPU``), so the Trainer's FSDP2 run itself is a
step of ``benchmarks/testbeds/gpu_check.py``. Here, 2 workers x 2 ranks:

* :func:`~autoloco_hf.integrations.groups.shard_worker` (what ``recipes/sft_ultrachat.py`` calls)
  shards a Llama over each worker's own ranks, FP32, every decoder layer and the root: the layout
  accelerate's FSDP2 plugin keeps and the callback accepts, with rank ``r`` of both workers holding
  the same shard and the sharded forward equal to the unsharded one;
* a model sharded in parts (the plugin would shard the rest over the world) is refused;
* a real ``Trainer`` on CPU with a sharded model is refused when it is
  built, in one line naming the fix, instead of failing later inside
  DDP ("c10d.broadcast_.default does not have a sharding strategy").
"""

from __future__ import annotations

import os

import pytest
import torch
from _dist import run_gloo

R, WORLD = 2, 4
VOCAB = 64


def tiny_llama():
    from autoloco_hf.toy.llama import tiny_llama as build

    return build(
        VOCAB,
        hidden_size=16,
        num_layers=2,
        num_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )


def _worker(rank: int, world_size: int, out_dir: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
    from autoloco_hf.errors import AutoLoCoConfigurationError
    from autoloco_hf.integrations.groups import (
        build_topology,
        fsdp2_mesh,
        shard_worker,
        worker_mesh,
    )
    from autoloco_hf.integrations.launch_checks import check_fsdp2_workers
    from autoloco_hf.integrations.runtime import check_fsdp2_worker

    topo = build_topology(R)
    reference = tiny_llama()
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(rank))
    expected_loss = float(reference(input_ids=ids, labels=ids).loss)

    model = shard_worker(tiny_llama(), R, "cpu")
    mesh = fsdp2_mesh(model)
    check_fsdp2_worker(mesh, topo)  # the worker's own ranks, 1-D
    # what the callback checks under accelerate's FSDP2 plugin
    check_fsdp2_workers(model, world_size, R)
    params = list(model.parameters())
    result = {
        "mesh_ranks": dist.get_process_group_ranks(mesh.get_group()),
        "sharded_modules": [name for name, m in model.named_modules() if isinstance(m, FSDPModule)],
        "all_dtensor_fp32": all(
            isinstance(p, DTensor) and p.dtype == torch.float32 for p in params
        ),
        "local_shards": [p.to_local().detach().clone() for p in params],
        "full_equal": all(
            torch.equal(p.full_tensor(), q.detach()) for p, q in zip(params, reference.parameters())
        ),
        "loss": float(model(input_ids=ids, labels=ids).loss),
        "expected_loss": expected_loss,
    }

    partial = tiny_llama()
    for layer in partial.model.layers:
        fully_shard(layer, mesh=worker_mesh(R))
    try:
        check_fsdp2_workers(partial, world_size, R)
    except AutoLoCoConfigurationError as err:
        result["partial_refused"] = str(err)

    from transformers import Trainer, TrainingArguments

    os.environ.update(
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )  # the process group exists already: accelerate joins it
    args = TrainingArguments(
        output_dir=out_dir, use_cpu=True, report_to=[], max_steps=2, save_strategy="no"
    )
    callback = AutoLoCoCallback(AutoLoCoConfig(method="diloco", h_base=2, ranks_per_worker=R))
    data = [{"input_ids": ids[0], "labels": ids[0]}] * 4
    try:
        Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    except AutoLoCoConfigurationError as err:
        result["trainer_refused"] = str(err)
    return result


@pytest.mark.slow
def test_sharded_workers_under_the_trainer_on_cpu(tmp_path):
    results = run_gloo(_worker, WORLD, str(tmp_path))
    for rank, result in enumerate(results):
        worker = rank // R
        assert result["mesh_ranks"] == list(range(worker * R, worker * R + R))
        assert result["sharded_modules"] == ["", "model.layers.0", "model.layers.1"]
        assert result["all_dtensor_fp32"] and result["full_equal"]
        assert result["loss"] == pytest.approx(result["expected_loss"], rel=1e-5)
        assert "root module (LlamaForCausalLM) is not sharded" in result["partial_refused"]
        refusal = result["trainer_refused"]
        assert "accelerate did not enable FSDP (distributed type MULTI_CPU)" in refusal
        assert "fsdp_version': 2" in refusal and "AutoLoCoAccelerate" in refusal
    # rank r of every worker holds the same shard (same
    # initialization): the outer sync runs shard by shard
    for r in range(R):
        same = [results[g * R + r]["local_shards"] for g in range(WORLD // R)]
        assert all(torch.equal(a, b) for a, b in zip(same[0], same[1]))
    numel = sum(p.numel() for p in tiny_llama().parameters())
    assert sum(t.numel() for t in results[0]["local_shards"] + results[1]["local_shards"]) == numel
