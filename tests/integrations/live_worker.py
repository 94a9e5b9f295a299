"""One worker process of the live-membership tests: trains the toy model, survives lost peers, lets others in.

Run by ``test_live_membership.py`` in spawned processes (module level, so that ``spawn`` can import it).
Each process writes what it saw to ``<out>/<name>.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time

import torch

STEPS, H, STEP_SECONDS = 60, 4, 0.02


def run(
    name: str,
    data_index: int,
    port: int,
    out: str,
    first_world: int,
    die_at_step: int | None = None,
    freeze_at_step: int | None = None,
    h_base: int = H,
    store_kind: str = "tcp",
    endpoints: str = "",
    wait_for_joiner_at: tuple[int, ...] = (),
) -> None:
    """``first_world``: the number of processes of round 0 (0: this process joins a running run).

    ``wait_for_joiner_at``: before these steps, wait until a process has registered for the next round, so
    that a run on a loaded machine does not end before the process it should take in has started.
    """
    import torch.distributed as dist
    from toy import adamw, batch_for, cosine, make_model

    from autoloco_hf import AutoLoCoConfig
    from autoloco_hf.algorithm.schedule import SchedulerPreview
    from autoloco_hf.algorithm.token_mapper import count_non_padding_tokens
    from autoloco_hf.integrations.live_membership import JoinRefused, LiveMembership
    from autoloco_hf.sync.communicators import PeerLostError, make_communicator
    from autoloco_hf.sync.factory import make_engine

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)
    if store_kind == "tcp":
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    else:
        from autoloco_hf.integrations.live_membership import etcd_store

        store = etcd_store(endpoints, f"test-{port}", timeout)
    config = AutoLoCoConfig(method="diloco", h_base=h_base, sync_timeout_s=5.0)
    model = make_model(seed=0)
    optimizer = adamw(model.parameters())
    scheduler = cosine(STEPS, 4)(optimizer)
    live = LiveMembership(store, name, config, model, settle_s=1.0, round_timeout_s=60.0)
    seen: dict = {"name": name, "rounds": [], "steps": [], "faults": []}

    def write() -> None:
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(seen, f)

    def enter(agreement) -> tuple:
        comm = make_communicator(config, True)
        engine = make_engine(config, [model], SchedulerPreview(scheduler, STEPS), comm, STEPS, optimizers=[optimizer])
        step = 0
        if agreement.state is not None:
            engine.resume_at_boundary(agreement.state["engine"])
            scheduler.load_state_dict(agreement.state["scheduler"])
            for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
                group["lr"] = lr
            step = engine.step
        live.attach(engine, extra_state=lambda: {"scheduler": scheduler.state_dict()})
        seen["rounds"].append(
            {"round": agreement.round, "rank": agreement.rank, "members": agreement.members, "from_step": step}
        )
        return engine, step

    try:
        agreement = live.start(first_world) if first_world else live.join()
    except JoinRefused as err:
        seen["refused"] = str(err)
        write()
        return
    engine, step = enter(agreement)
    lost_at = None
    while step < STEPS:
        if die_at_step is not None and step == die_at_step:
            os._exit(1)  # a closed connection for the others
        if freeze_at_step is not None and step == freeze_at_step:
            store.set(f"test/{name}/frozen_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)  # a silent partition: the connection stays open, nothing answers
        if step in wait_for_joiner_at:
            key = f"autoloco/round{live.round + 1}/count"
            until = time.monotonic() + 120
            while not (store.check([key]) and store.add(key, 0) > 0) and time.monotonic() < until:
                time.sleep(0.05)
        try:
            batch = batch_for(data_index, step, padded=True)
            loss = model(**batch).loss
            loss.backward()
            lr = float(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            engine.after_optimizer_step([count_non_padding_tokens(batch)], [float(loss.detach())], lr=lr)
            seen["steps"].append(step)
            step += 1
            time.sleep(STEP_SECONDS)
            if live.join_pending:
                engine, step = enter(live.reform())
            if lost_at is not None:
                seen["faults"][-1]["training_again_s"] = time.monotonic() - lost_at
                seen["faults"][-1]["training_again_at"] = time.time()
                lost_at = None
        except PeerLostError as err:
            lost_at = time.monotonic()
            seen["faults"].append({"at_step": step, "error": str(err)})
            engine, step = enter(live.reform(lost=err.silent_ranks))
    seen["theta"] = engine.outer.params.detach().tolist()
    seen["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    seen["records"] = [(r.start_step, r.h_step) for r in engine.records]
    write()
    dist.destroy_process_group()
