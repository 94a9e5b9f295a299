"""Live membership on loopback: faults that the survivors
ride out in process (docs/reliability.md "Live membership").

Not a test (``tests/integrations/elastic/test_membership.py`` runs the same worker). Real
processes on one machine, gloo over loopback, the toy language model of ``autoloco_hf.toy.pattern``,
DiLoCo at H 4 for 60 steps (a 0.02 s pause per step stands for the step's compute), and
the membership store on a 3-member etcd cluster (``--store tcp``: a ``TCPStore`` of this
process). Scenarios, 3 workers at the start unless said:

* ``fault_free``: nothing happens (the loss spread over seeds is the yardstick);
* ``fault_free_two``: two workers from the start, nothing
  happens (what a run that loses one worker tends to);
* ``node_lost``: worker 2 dies at step 10 (a closed connection);
* ``node_lost_exact_redo``: the same, each worker restoring
  its AdamW state of the boundary it goes on from;
* ``node_back``: ``node_lost``, and a new process joins after step 24;
* ``partition``: worker 2 stops answering at step 10 (SIGSTOP: a silent partition);
* ``two_lost``: worker 2 dies at step 10, worker 1 at step 30;
* ``store_member_lost``: ``node_lost`` with etcd member 0 killed after the survivors reformed.

Reported per scenario and seed: seconds from the fault to training again (the dead
worker writes the time of its death to the store; the survivors the time of their first
step after the reform), steps redone, goodput (the run's steps over the steps trained,
summed over the workers that finished), the final held-out loss (16 batches no worker
trains on) and its difference to the fault-free run of the same seed::

    # writes results/elastic/live_testbed.json
    PYTHONPATH=. python benchmarks/testbeds/live_testbed.py
    # the table from the committed JSON
    PYTHONPATH=. python benchmarks/testbeds/live_testbed.py --report-only
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import multiprocessing
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # its kinds import as packages

STEPS, H, STEP_SECONDS, SYNC_TIMEOUT_S = 60, 4, 0.02, 5.0
# a store request unanswered this long: cut off (a failover to a live member takes ~0-5 s)
STORE_TIMEOUT_S = 10.0
HELD_OUT_WORKER, HELD_OUT_BATCHES = 999, 16
SCENARIOS = (
    "fault_free",
    "fault_free_two",
    "node_lost",
    "node_lost_exact_redo",
    "node_back",
    "partition",
    "two_lost",
    "store_member_lost",
)
DEFAULT_OUT = ROOT / "results" / "elastic" / "live_testbed.json"


def run_worker(
    name: str,
    data_index: int,
    port: int,
    out: str,
    first_world: int,
    *,
    seed: int = 0,
    die_at_step: int | None = None,
    freeze_at_step: int | None = None,
    h_base: int = H,
    store_kind: str = "tcp",
    endpoints: str = "",
    wait_for_joiner_at: tuple[int, ...] = (),
    pause_at: int | None = None,
    resume_file: str | None = None,
    exact_redo: bool = False,
    die_entering_round: int | None = None,
    start_delay_s: float = 0.0,
    joiner_fault: str | None = None,
    steps: int = STEPS,
    step_seconds: float = STEP_SECONDS,
    trace: str | None = None,
) -> None:
    """One worker: trains, survives lost peers, lets others
    in; writes what it saw to ``<out>/<name>.json``.

    ``first_world``: the processes of round 0 (0: this process joins a running run).
    ``wait_for_joiner_at``: before these steps, wait until a process has registered for the
    next round, so that a run on a loaded machine does not end before the process it should
    take in has started. ``exact_redo``: keep the optimizer's state at each boundary and
    restore it with the boundary (``attach(local_state=...)``). ``pause_at``: before this step,
    write ``test/<name>/paused`` and wait for ``test/resume`` (the driver kills an etcd member
    while no process waits on the store: see docs/reliability.md on a member lost while a round
    forms); with ``resume_file``, write ``<out>/<name>.paused`` and wait until that file exists
    instead. ``die_entering_round``: end the process after that membership round closed, when
    its process group is set up (the others' set-up fails; they form the next round without
    it). ``start_delay_s``: reach round 0 that much later (a slow start-up). ``joiner_fault``
    (a joiner): ``"dies_before_saying_who"`` ends the process between taking its slot and
    writing who it is; ``"hangs_after_its_slot"`` stops it (SIGSTOP) right after it wrote its
    slot: a slot whose owner is gone or silent. ``steps``, ``step_seconds``: the run's length
    and the pause per step (a long run: the chaos run of ``netns_live_testbed.py``). ``trace``:
    append one JSON line per round entered and per step trained to this file, flushed at once,
    so a driver reads the history of a process that was killed.
    """
    import torch.distributed as dist

    from autoloco_hf import AutoLoCoConfig
    from autoloco_hf.algorithm.schedule import SchedulerPreview
    from autoloco_hf.algorithm.token_mapper import count_non_padding_tokens
    from autoloco_hf.integrations.elastic.errors import JoinRefused, RoundFailed
    from autoloco_hf.integrations.elastic.membership import LiveMembership
    from autoloco_hf.integrations.elastic.store import etcd_store
    from autoloco_hf.sync.communicators import PeerLostError, make_communicator
    from autoloco_hf.sync.schedules.factory import make_engine
    from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)
    if die_entering_round is not None:
        init_process_group = dist.init_process_group

        def init_or_die(*args, store, **kwargs):
            if live.round == die_entering_round:  # the round this process entered as a participant
                os._exit(1)
            return init_process_group(*args, store=store, **kwargs)

        dist.init_process_group = init_or_die
    if store_kind == "tcp":
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    else:
        store = etcd_store(endpoints, f"run-{port}", timeout)
    config = AutoLoCoConfig(method="diloco", h_base=h_base, sync_timeout_s=SYNC_TIMEOUT_S)
    model = make_model(seed=seed)
    optimizer = adamw(model.parameters())
    scheduler = cosine(steps, 4)(optimizer)
    live = LiveMembership(
        store,
        name,
        config,
        model,
        settle_s=1.0,
        round_timeout_s=60.0,
        store_timeout_s=STORE_TIMEOUT_S,
    )
    if joiner_fault is not None:
        live.store = _FaultAfterSlot(store, joiner_fault)
    seen: dict[str, Any] = {"name": name, "rounds": [], "steps": [], "faults": []}
    # line-buffered: each line written at once
    traced = open(trace, "a", buffering=1) if trace else None

    def write() -> None:
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(seen, f)

    def enter(agreement) -> tuple:
        comm = make_communicator(config, True)
        engine = make_engine(
            config, [model], SchedulerPreview(scheduler, steps), comm, steps, optimizers=[optimizer]
        )
        step = 0
        if agreement.state is not None:
            engine.resume_at_boundary(agreement.state["engine"])
            scheduler.load_state_dict(agreement.state["scheduler"])
            if agreement.local_state is not None:
                optimizer.load_state_dict(agreement.local_state["optimizer"])
            for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
                group["lr"] = lr
            step = engine.step
        local = (lambda: {"optimizer": optimizer.state_dict()}) if exact_redo else None
        live.attach(
            engine, extra_state=lambda: {"scheduler": scheduler.state_dict()}, local_state=local
        )
        adam = optimizer.state_dict()["state"].get(0, {})
        seen["rounds"].append(
            {
                "round": agreement.round,
                "rank": agreement.rank,
                "members": agreement.members,
                "from_step": step,
                # AdamW's own count of its steps
                "adam_step": float(adam["step"]) if "step" in adam else 0.0,
            }
        )
        if traced:
            traced.write(json.dumps({**seen["rounds"][-1], "t": time.time()}) + "\n")
        return engine, step

    time.sleep(start_delay_s)
    try:
        agreement = live.start(first_world) if first_world else live.join()
    except JoinRefused as err:
        seen["refused"] = str(err)
        write()
        return
    except RoundFailed as err:
        seen["failed"] = str(err)
        write()
        return
    engine, step = enter(agreement)
    lost_at = None
    while step < steps:
        if die_at_step is not None and step == die_at_step:
            store.set(f"test/{name}/fault_at", repr(time.time()))
            os._exit(1)  # a closed connection for the others
        if freeze_at_step is not None and step == freeze_at_step:
            store.set(f"test/{name}/fault_at", repr(time.time()))
            # a silent partition: the connection stays open, nothing answers
            os.kill(os.getpid(), signal.SIGSTOP)
        # a driver that cannot reach the store (another network namespace)
        if step == pause_at and resume_file:
            Path(out, f"{name}.paused").write_text(str(step))
            until = time.monotonic() + 120
            while not os.path.exists(resume_file) and time.monotonic() < until:
                time.sleep(0.05)
        elif step == pause_at:
            store.set(f"test/{name}/paused", str(step))
            until = time.monotonic() + 120
            while not store.check(["test/resume"]) and time.monotonic() < until:
                time.sleep(0.05)
        if step in wait_for_joiner_at:
            key = f"autoloco/round{live.round + 1}/count"
            until = time.monotonic() + 120
            while not (store.check([key]) and store.add(key, 0) > 0) and time.monotonic() < until:
                time.sleep(0.05)
        try:
            batch = batch_for(data_index + 100 * seed, step, padded=True)
            loss = model(**batch).loss
            loss.backward()
            lr = float(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            engine.after_optimizer_step(
                [count_non_padding_tokens(batch)], [float(loss.detach())], lr=lr
            )
            seen["steps"].append(step)
            if traced:
                traced.write(f'{{"step": {step}, "t": {time.time()!r}}}\n')
            step += 1
            time.sleep(step_seconds)
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
    with torch.no_grad():
        held_out = [
            float(model(**batch_for(HELD_OUT_WORKER, s)).loss) for s in range(HELD_OUT_BATCHES)
        ]
    seen["held_out_loss"] = statistics.fmean(held_out)
    write()
    dist.destroy_process_group()


class _FaultAfterSlot:
    """A store proxy for a joiner that fails right around
    writing its slot (``run_worker``'s ``joiner_fault``)."""

    def __init__(self, store: Any, fault: str) -> None:
        self._store, self._fault = store, fault

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def set(self, key: str, value: str) -> None:
        is_slot = "/slot" in key
        if is_slot and self._fault == "dies_before_saying_who":
            os._exit(1)
        self._store.set(key, value)
        if is_slot and self._fault == "hangs_after_its_slot":
            os.kill(os.getpid(), signal.SIGSTOP)


def spawn(ctx, out: str, port: int, name: str, data_index: int, first_world: int, **kwargs) -> Any:
    process = ctx.Process(
        target=run_worker, args=(name, data_index, port, out, first_world), kwargs=kwargs
    )
    process.start()
    return process


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to port 0 and let the OS choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_round(store: Any, number: int, deadline: float) -> None:
    """Until membership round ``number`` has formed (the store's ``autoloco/latest``)."""
    while time.monotonic() < deadline:
        if store.check(["autoloco/latest"]) and int(store.get("autoloco/latest")) >= number:
            return
        time.sleep(0.1)
    raise TimeoutError(f"membership round {number} never formed")


def kill_store_member(store: Any, cluster: Any, paused: list[str], deadline: float) -> None:
    """Once the ``paused`` workers wait (``pause_at``), kill
    etcd member 0, let the others elect, resume them."""
    while not all(store.check([f"test/{name}/paused"]) for name in paused):
        if time.monotonic() > deadline:
            raise TimeoutError("the workers never paused")
        time.sleep(0.1)
    cluster.kill(0)
    time.sleep(3.0)  # a new leader (etcd's election timeout is 1 s) before the run writes again
    store.set("test/resume", "1")


def collect(processes: list, out: str, names, deadline: float) -> dict[str, dict]:
    """Join the processes (killing any left at the deadline) and read what the named ones saw."""
    for process in processes:
        process.join(timeout=max(1.0, deadline - time.monotonic()))
    alive = [p for p in processes if p.is_alive()]
    for process in alive:
        process.kill()
    if alive:
        raise TimeoutError(f"{len(alive)} worker(s) hung")
    seen = {}
    for name in names:
        with open(os.path.join(out, f"{name}.json")) as f:
            seen[name] = json.load(f)
    return seen


def run_scenario(scenario: str, seed: int, store_kind: str) -> dict[str, Any]:
    """One scenario on a fresh store: what each finishing worker saw and the time of each fault."""
    import torch.distributed as dist
    from testbeds.etcd_cluster import EtcdCluster

    from autoloco_hf.integrations.elastic.store import etcd_store

    out = tempfile.mkdtemp(prefix=f"live_{scenario}_")
    port, timeout, cluster = free_port(), datetime.timedelta(seconds=60), None
    if store_kind == "tcp":
        store, where = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timeout), {}
    else:
        cluster = EtcdCluster([("127.0.0.1", free_port(), free_port()) for _ in range(3)], out)
        cluster.start()
        endpoints = ",".join(cluster.endpoints)
        store, where = (
            etcd_store(endpoints, f"run-{port}", timeout),
            {"store_kind": "etcd", "endpoints": endpoints},
        )
    ctx = multiprocessing.get_context("spawn")
    deadline = time.monotonic() + 240
    common = {"seed": seed, "exact_redo": scenario == "node_lost_exact_redo", **where}
    faults = {
        "fault_free": {},
        "fault_free_two": {},
        "node_lost": {2: {"die_at_step": 10}},
        "node_lost_exact_redo": {2: {"die_at_step": 10}},
        "node_back": {2: {"die_at_step": 10}},
        "partition": {2: {"freeze_at_step": 10}},
        "two_lost": {2: {"die_at_step": 10}, 1: {"die_at_step": 30}},
        "store_member_lost": {2: {"die_at_step": 10}},
    }[scenario]
    joins = {"wait_for_joiner_at": (24,)} if scenario == "node_back" else {}
    if scenario == "store_member_lost":
        joins = {"pause_at": 20}
    try:
        workers = {
            f"w{i}": spawn(ctx, out, port, f"w{i}", i, 3, **common, **joins, **faults.get(i, {}))
            for i in range(3)
        }
        finishing = [f"w{i}" for i in range(3) if i not in faults]
        if scenario == "store_member_lost":
            kill_store_member(store, cluster, finishing, deadline)
        if scenario == "node_back":
            wait_round(store, 1, deadline)
            workers["w2b"] = spawn(ctx, out, port, "w2b", 2, 0, **common, **joins)
            finishing.append("w2b")
        try:
            seen = collect([workers[name] for name in finishing], out, finishing, deadline)
        finally:
            for process in workers.values():
                if process.is_alive():
                    os.kill(process.pid, signal.SIGKILL)
                process.join()
        fault_at = {
            f"w{i}": float(store.get(f"test/w{i}/fault_at"))
            for i in faults
            if store.check([f"test/w{i}/fault_at"])
        }
    finally:
        if cluster is not None:
            cluster.stop()
    # the raw file keeps a digest of each worker's final theta, not the tensor
    for worker in seen.values():
        worker["theta"] = hashlib.sha256(json.dumps(worker["theta"]).encode()).hexdigest()
        del worker["params"]
    return {
        "scenario": scenario,
        "seed": seed,
        "store": store_kind,
        "seen": seen,
        "fault_at": fault_at,
    }


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Seconds back to training after each fault, steps
    redone, goodput and held-out loss of one run."""
    seen, fault_times = run["seen"], sorted(run["fault_at"].values())
    back = []
    for fault_time in fault_times:  # until the slowest survivor trains again
        again = [
            min(
                (
                    f["training_again_at"]
                    for f in w["faults"]
                    if f.get("training_again_at", 0) > fault_time
                ),
                default=0,
            )
            for w in seen.values()
            if w["faults"]
        ]
        if any(again):
            back.append(max(again) - fault_time)
    trained = sum(len(w["steps"]) for w in seen.values())
    useful = sum(STEPS - (w["steps"][0] if w["steps"] else STEPS) for w in seen.values())
    redone = max(len(w["steps"]) - len(set(w["steps"])) for w in seen.values())
    losses = {w["held_out_loss"] for w in seen.values()}
    return {
        "back_to_training_s": [round(b, 3) for b in back],
        "steps_redone": redone,
        "goodput": useful / trained,
        "held_out_loss": statistics.fmean(losses),
        "members_agree": len({w["theta"] for w in seen.values()}) == 1,
    }


def report(runs: list[dict[str, Any]]) -> str:
    base = {r["seed"]: summarize(r)["held_out_loss"] for r in runs if r["scenario"] == "fault_free"}
    spread = max(base.values()) - min(base.values()) if base else float("nan")
    lines = [
        "| scenario | seeds | fault to training again, s (each fault) | steps redone | goodput | "
        "held-out loss | minus fault-free (per seed) | members agree |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scenario in SCENARIOS:
        mine = sorted((r for r in runs if r["scenario"] == scenario), key=lambda r: r["seed"])
        if not mine:
            continue
        rows = [summarize(r) for r in mine]
        back = [b for row in rows for b in row["back_to_training_s"]]
        diffs = [
            row["held_out_loss"] - base[r["seed"]]
            for row, r in zip(rows, mine)
            if r["seed"] in base
        ]
        lines.append(
            f"| {scenario} | {','.join(str(r['seed']) for r in mine)} | "
            + (f"{min(back):.2f}-{max(back):.2f}" if back else "-")
            + f" | {max(row['steps_redone'] for row in rows)} | "
            f"{min(row['goodput'] for row in rows):.3f}-{max(row['goodput'] for row in rows):.3f} "
            f"| {statistics.fmean(row['held_out_loss'] for row in rows):.4f} | "
            + ", ".join(f"{d:+.4f}" for d in diffs)
            + f" | {all(row['members_agree'] for row in rows)} |"
        )
    lines.append("")
    lines.append(f"Fault-free spread over seeds (max - min held-out loss): {spread:.4f}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the raw results (JSON)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument(
        "--store", choices=("etcd", "tcp"), default="etcd", help="where the membership rounds live"
    )
    parser.add_argument("--report-only", action="store_true", help="print the table from --out")
    args = parser.parse_args()
    if not args.report_only:
        runs = []
        for seed in (int(s) for s in args.seeds.split(",")):
            for scenario in args.scenarios:
                store = "etcd" if scenario == "store_member_lost" else args.store
                started = time.monotonic()
                runs.append(run_scenario(scenario, seed, store))
                print(
                    f"{scenario} seed {seed}: {summarize(runs[-1])} "
                    f"({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "runs": runs}, f)
    with open(args.out) as f:
        print(report(json.load(f)["runs"]))


if __name__ == "__main__":
    main()
