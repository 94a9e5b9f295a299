"""One process of a plain Accelerate loop + AutoLoCoAccelerate on live membership (spawned by
test_live_accelerate.py): the loop of docs/reliability.md,
"Live membership in a plain Accelerate loop".

``die_at``: the process ends (a closed connection for the others) before that step;
``wait_for_joiner_at``: before that step, wait until a process has taken a slot of the next round.
What it saw goes to ``<out>/<name>.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import time

import torch


def run(name: str, port: int, out: str, first_world: int, steps: int, h: int, **options) -> None:
    # accelerate: a distributed CPU process (one per worker)
    os.environ.setdefault("LOCAL_RANK", "0")
    torch.set_num_threads(1)
    import torch.distributed as dist
    from accelerate import Accelerator
    from transformers import get_cosine_schedule_with_warmup

    from autoloco_hf import AutoLoCoAccelerate, AutoLoCoConfig
    from autoloco_hf.integrations.elastic.errors import MembershipChange
    from autoloco_hf.integrations.elastic.membership import LiveMembership
    from autoloco_hf.integrations.elastic.process_group import adopt_process_group
    from autoloco_hf.sync.communicators import PeerLostError
    from autoloco_hf.toy.llama import tiny_llama
    from autoloco_hf.toy.padded import LLAMA, PaddedTokens

    store = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60)
    )
    config = AutoLoCoConfig(method="diloco", h_base=h, sync_timeout_s=5.0)
    model = tiny_llama(**LLAMA, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = get_cosine_schedule_with_warmup(optimizer, 2, steps)
    live = LiveMembership(store, name, config, model, settle_s=1.0, round_timeout_s=60.0)
    seen: dict = {"name": name, "begins": [], "steps": []}

    agreement = live.start(first_world) if first_world else live.join()  # before the Accelerator
    # one scheduler step per step
    accelerator = Accelerator(cpu=True, step_scheduler_with_optimizer=False)
    data = PaddedTokens(1024, seed=1)
    while True:
        adopt_process_group(accelerator)  # the round's group: world size, rank, a new DDP wrapper
        loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=False)
        wrapped, prepared, loader = accelerator.prepare(model, optimizer, loader)
        with AutoLoCoAccelerate(
            accelerator, wrapped, prepared, scheduler, config, total_steps=steps
        ) as autoloco:
            step = 0
            # the agreed boundary: theta_t into the model, the outer state
            if agreement.state is not None:
                autoloco.runtime.resume_at_boundary(agreement.state["engine"])
                scheduler.load_state_dict(agreement.state["scheduler"])
                for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
                    group["lr"] = lr
                step = autoloco.engine.step
            live.attach(autoloco.engine, extra_state=lambda: {"scheduler": scheduler.state_dict()})
            seen["begins"].append(
                {
                    "round": live.agreement.round,
                    "members": live.agreement.members,
                    "step": step,
                    "world": accelerator.num_processes,
                    "adam_step": float(optimizer.state_dict()["state"].get(0, {}).get("step", 0.0)),
                }
            )
            try:
                for batch in accelerator.skip_first_batches(loader, step):
                    if step == options.get("die_at"):
                        os._exit(1)
                    if step in options.get("wait_for_joiner_at", ()):
                        key = f"autoloco/round{live.round + 1}/count"
                        until = time.monotonic() + 120
                        while (
                            not (store.check([key]) and store.add(key, 0) > 0)
                            and time.monotonic() < until
                        ):
                            time.sleep(0.05)
                    seen["steps"].append(step + 1)
                    loss = wrapped(**batch).loss
                    accelerator.backward(loss)
                    prepared.step()  # AutoLoCoAccelerate's hook counts it and syncs at a boundary
                    scheduler.step()
                    prepared.zero_grad()
                    step += 1
                    if autoloco.finished:
                        break
                    if live.join_pending:
                        raise MembershipChange(f"a process waits to join at step {step}")
                break
            except PeerLostError as err:
                agreement = live.reform(lost=err.silent_ranks)
            except MembershipChange:
                agreement = live.reform()
        wrapped = prepared = None  # the old group's wrappers
    seen["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    seen["final_step"] = autoloco.engine.step
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()
