"""Live membership under the Trainer, on several machines:
one command starts the run and adds a process later.

Every process, the launch's and any started later, runs the same command; a process that comes
after the launch is taken in at the members' next boundary, and one that dies is left behind
while the others train on (docs/reliability.md, "Live membership under the Trainer"). It trains
the package's tiny Llama on its padded toy tokens, so it runs anywhere as written; swap
``build_model`` and ``build_dataset`` for your own.

One process per machine, each started by ``torchrun`` on its own node::

    export AUTOLOCO_ETCD_ENDPOINTS=10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379
    export AUTOLOCO_RUN_ID=run-7 AUTOLOCO_WORLD_SIZE=3
    # the interface the hosts share (NCCL_SOCKET_IFNAME with NCCL)
    export GLOO_SOCKET_IFNAME=eth0
    torchrun --standalone --nproc-per-node 1 recipes/live_trainer.py --output-dir out \\
        --max-steps 200

Environment variables:

* ``AUTOLOCO_ETCD_ENDPOINTS``: every member of the etcd
  cluster the processes meet on, ``host:port,...``;
* ``AUTOLOCO_RUN_ID``: the run's name on that cluster (a new name starts a new run);
* ``AUTOLOCO_WORLD_SIZE``: how many processes the launch
  waits for (a majority of them decides the run);
* ``AUTOLOCO_MEMBER_ID`` (optional): this process's name in
  rounds and messages (default ``<host>-<pid>``);
* ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``: on several hosts, the interface they share;
* ``LOCAL_RANK``: set by ``torchrun`` (``0``); accelerate then treats the process as one of a run.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import socket
import sys
from collections.abc import Sequence

import torch

ENVIRONMENT = ("AUTOLOCO_ETCD_ENDPOINTS", "AUTOLOCO_RUN_ID", "AUTOLOCO_WORLD_SIZE")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--output-dir", required=True, help="the Trainer's output folder (one per process)"
    )
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--h-base", type=int, default=10, help="AutoLoCo's base horizon H_base")
    parser.add_argument("--method", default="autoloco", choices=("autoloco", "diloco"))
    parser.add_argument("--sync-timeout-s", type=float, default=60.0)
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    args = parser.parse_args(argv)
    missing = [name for name in ENVIRONMENT if not os.environ.get(name)]
    if missing:
        parser.exit(
            2,
            f"live_trainer: set {', '.join(missing)} (see the module's "
            "docstring); none may be empty\n",
        )
    if (
        not os.environ["AUTOLOCO_WORLD_SIZE"].isdigit()
        or int(os.environ["AUTOLOCO_WORLD_SIZE"]) < 1
    ):
        value = os.environ["AUTOLOCO_WORLD_SIZE"]
        parser.exit(
            2,
            f"live_trainer: AUTOLOCO_WORLD_SIZE={value!r} must be a whole "
            "number >= 1 (processes)\n",
        )
    return args


def build_model() -> torch.nn.Module:
    from autoloco_hf.toy.llama import tiny_llama
    from autoloco_hf.toy.padded import LLAMA

    return tiny_llama(**LLAMA, seed=0)  # every process starts from the same weights


def build_dataset() -> torch.utils.data.Dataset:
    from autoloco_hf.toy.padded import PaddedTokens

    return PaddedTokens(2048, seed=1)  # the Trainer gives each rank its share


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # without torchrun: still one process of a distributed run
    os.environ.setdefault("LOCAL_RANK", "0")
    from transformers import Trainer, TrainingArguments

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
    from autoloco_hf.integrations import LiveMembership, etcd_store, train_live

    member_id = os.environ.get("AUTOLOCO_MEMBER_ID") or f"{socket.gethostname()}-{os.getpid()}"
    config = AutoLoCoConfig(
        method=args.method, h_base=args.h_base, sync_timeout_s=args.sync_timeout_s
    )
    model = build_model()
    store = etcd_store(
        os.environ["AUTOLOCO_ETCD_ENDPOINTS"],
        os.environ["AUTOLOCO_RUN_ID"],
        datetime.timedelta(seconds=60),
    )
    live = LiveMembership(store, member_id, config, model, backend=args.backend)
    # the launch and later alike
    agreement = live.start(world_size=int(os.environ["AUTOLOCO_WORLD_SIZE"]))
    where = (
        f"member {agreement.rank + 1} of {agreement.world_size} in "
        f"membership round {agreement.round}"
    )
    print(f"live_trainer: {member_id} is {where}", flush=True)
    training = TrainingArguments(  # after the round: accelerate sees its process group
        output_dir=os.path.join(args.output_dir, member_id),
        max_steps=args.max_steps,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, args.max_steps // 50),
        logging_steps=args.h_base,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=args.backend == "gloo",
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=build_dataset(),
        callbacks=[AutoLoCoCallback(config, membership=live)],
    )
    train_live(trainer, live, agreement)
    # theta_t, written by rank 0 of the last round
    trainer.save_model(os.path.join(args.output_dir, "final"))
    digest = hashlib.sha256(
        b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())
    )
    step = trainer.state.global_step
    print(
        f"live_trainer: {member_id} finished at step {step}, parameters {digest.hexdigest()[:16]}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
