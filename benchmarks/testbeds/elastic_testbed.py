"""Elastic workers on a 3-node network-namespace testbed:
nodes leave and join, the run goes on by itself (not a test).

    # every scenario; writes --out
    sudo PYTHONPATH=. python benchmarks/testbeds/elastic_testbed.py
    sudo PYTHONPATH=. python benchmarks/testbeds/elastic_testbed.py --seeds 1 --scenarios leave_join
    # the docs/reliability.md table from --out
    PYTHONPATH=. python benchmarks/testbeds/elastic_testbed.py --report-only

Three network namespaces ``alh-el-<k>`` (10.233.0.<k+1>/24) on a bridge
(``benchmarks/testbeds/wan.py``'s ``Network``), one
``torchrun --nnodes 2:3 --max-restarts 3 --rdzv-backend c10d`` agent per node, the rendezvous hosted
by node 0's agent. Each agent runs one worker: this file with ``--worker``, a user-style ``Trainer``
+ ``AutoLoCoCallback`` script on a tiny Llama (a random Markov chain to learn) with
``AutoLoCoConfig(snapshot_dir=...)`` on storage every node reads, restartable as docs/hf.md says
(``trainer.train(resume_from_checkpoint=callback.resume_point())``). Nobody steps in during a run.

Scenarios (``--scenarios``), each seed paired with the fault-free run of the same seed:

* ``fault_free``: three nodes, no event;
* ``leave_join``: node 3 loses power (SIGKILL to everything in its
  namespace) inside an interval once the run passes step ``--leave-at``;
  once the two survivors pass ``--join-at``, node 3 starts again;
* ``write_fault``: the process writing the boundary snapshot of the
  first boundary past ``--leave-at`` (the main process) is killed
  during the write (the write is held for 30 s to land the kill in it);
* ``host_lost``: node 0, whose agent hosts the c10d rendezvous store, loses power;
* ``host_lost_etcd``: the same on the ``etcd-v2`` rendezvous, a 3-member etcd cluster with one
  member in each node's namespace and each agent pointed at its own node's member
  (``benchmarks/testbeds/etcd_cluster.py``): node 0 loses power with its member, the two survivors
  train on, then node 0 (member and agent) starts again and rejoins.

Measured per event from the workers' event log (wall-clock stamps of every step, launch and resume):
seconds from the fault to the first step trained again, steps redone (last step trained before the
fault minus the step resumed from) against the length of the interval the fault cut, the workers
before and after, and each run's final held-out loss; every agent's exit status. Namespaces and
processes are removed afterwards. Needs root (``ip netns``, ``tc``).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from enum import Enum
from pathlib import Path
from typing import Any

# benchmarks/: its kinds import as packages
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from testbeds.etcd_cluster import EtcdCluster, etcd_missing  # noqa: E402
from testbeds.wan import (  # noqa: E402
    Names,
    Network,
    _kill_namespace_processes,
    check_root,
    markov_sequences,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = Names("alh-el-", "alhe", "10.233.0")
NODES, VOCAB, SEQ, BATCH = 3, 128, 32, 8
SYNC_TIMEOUT_S = 30.0
# close a round 2 s after the minimum joined; a node silent for ~5 s is dead
RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=5,join_timeout=120"
ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380  # each member in its own namespace: the usual ports
# a heartbeat is an etcd write, which waits for a new leader when the
# lost member led: 10 s before a silent agent is dropped, so that a
# re-election under load does not drop a live one (docs/reliability.md)
ETCD_RDZV_CONF = RDZV_CONF.replace("keep_alive_max_attempt=5", "keep_alive_max_attempt=10")
# the longest any awaited event may take
EVENT_LIMIT_S = 300.0
# the workers of one launch begin within this many seconds of each other
LAUNCH_SPREAD_S = 5.0
WRITE_HOLD_S = 30.0


class Scenario(str, Enum):
    FAULT_FREE = "fault_free"
    LEAVE_JOIN = "leave_join"
    WRITE_FAULT = "write_fault"
    HOST_LOST = "host_lost"
    HOST_LOST_ETCD = "host_lost_etcd"


# ----------------------------------------------------------------------------- the worker
def worker(spec_path: str) -> int:
    """One rank: tiny Llama, Trainer + AutoLoCoCallback with
    boundary snapshots; events to ``events.jsonl``."""
    with open(spec_path) as f:
        spec = json.load(f)
    import torch

    torch.set_num_threads(1)
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
    from autoloco_hf.state import checkpoint
    from autoloco_hf.toy.llama import tiny_llama

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    node = int(os.environ["ALH_EL_NODE"])
    out = Path(spec["output_dir"])
    events = open(out / "events.jsonl", "a", buffering=1)

    def event(kind: str, **fields: Any) -> None:
        events.write(
            json.dumps(
                {
                    "t": time.time(),
                    "kind": kind,
                    "rank": rank,
                    "world": world,
                    "node": node,
                    **fields,
                }
            )
        )
        events.write("\n")

    model = tiny_llama(
        VOCAB,
        64,
        2,
        4,
        128,
        max_position_embeddings=SEQ,
        seed=spec["seed"],
        tie_word_embeddings=False,
    )
    # one dataset for any number of workers, so the step of a
    # boundary is a data position for every layout
    train = markov_sequences(VOCAB, spec["steps"] * BATCH * NODES, SEQ, draw_seed=spec["seed"])
    held_out = markov_sequences(VOCAB, 64, SEQ, draw_seed=10_000 + spec["seed"])
    config = AutoLoCoConfig(
        method="autoloco",
        controller="paper",  # the committed testbed runs' rule
        h_base=spec["h_base"],
        q_h=2,
        h_max=spec["h_base"] * 3 // 2,
        sync_timeout_s=SYNC_TIMEOUT_S,
        snapshot_dir=str(out / "snapshots"),
    )
    autoloco = AutoLoCoCallback(config, log_metrics=False)

    class Events(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            event("begin", step=state.global_step)

        last = [time.monotonic()]

        def on_step_end(self, args, state, control, **kwargs):
            # a model's compute time
            time.sleep(max(0.0, spec["step_seconds"] - (time.monotonic() - self.last[0])))
            self.last[0] = time.monotonic()
            interval = autoloco.engine.current_interval
            start, h = (
                (interval.start_step, interval.h_step)
                if interval is not None
                else (state.global_step, 0)
            )
            event("step", step=state.global_step, start=start, h=h)

    hold = spec.get("hold_write_at")
    if hold is not None and rank == 0 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        real_write = checkpoint.write_state

        # the main process's snapshot writer thread (not the copy's)
        def held_write(path, state, **kwargs):
            if os.path.basename(path).startswith("boundary-") and kwargs["step"] >= hold:
                (out / "writing").write_text(
                    json.dumps({"pid": os.getpid(), "step": kwargs["step"]})
                )
                time.sleep(WRITE_HOLD_S)
            real_write(path, state, **kwargs)

        checkpoint.write_state = held_write

    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=BATCH,
        max_steps=spec["steps"],
        learning_rate=3e-3,
        warmup_steps=4,
        lr_scheduler_type="cosine",
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=10**6,
        dataloader_num_workers=0,
        seed=spec["seed"],
        ddp_timeout=int(SYNC_TIMEOUT_S),
    )
    data = [{"input_ids": x, "labels": x} for x in train]
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[autoloco, Events()])
    trainer.train(resume_from_checkpoint=autoloco.resume_point())
    if rank == 0:  # the last step closes an interval: every rank holds theta_T
        model.eval()
        with torch.no_grad():
            loss = float(model(input_ids=held_out, labels=held_out).loss)
        result = {"val_loss": loss, "global_step": trainer.state.global_step, "world": world}
        result["syncs"] = autoloco.engine.totals.syncs
        (out / "result.json").write_text(json.dumps(result))
    event("end", step=trainer.state.global_step)
    return 0


# ----------------------------------------------------------------------------- the orchestrator
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """One job on the testbed: its agents (one per node), its event log, its output folder."""

    def __init__(
        self, net: Network, scenario: Scenario, seed: int, args: argparse.Namespace, workdir: str
    ) -> None:
        self.net = net
        self.out = Path(workdir) / f"{scenario.value}-seed{seed}"
        self.out.mkdir(parents=True)
        spec = {
            "output_dir": str(self.out),
            "seed": seed,
            "steps": args.steps,
            "h_base": args.h_base,
        }
        spec["step_seconds"] = args.step_seconds
        if scenario == Scenario.WRITE_FAULT:
            spec["hold_write_at"] = args.leave_at
        self.spec_path = self.out / "spec.json"
        self.spec_path.write_text(json.dumps(spec))
        self.port = _free_port()
        self.agents: dict[int, list[subprocess.Popen]] = {k: [] for k in range(NODES)}
        self.nice = args.nice
        self._seen = 0
        self.events: list[dict] = []
        self.etcd: EtcdCluster | None = None
        if scenario == Scenario.HOST_LOST_ETCD:  # one member per node, on the node's address
            members = [(net.names.addr(k), ETCD_CLIENT_PORT, ETCD_PEER_PORT) for k in range(NODES)]
            self.etcd = EtcdCluster(
                members, str(self.out), prefix=lambda k: ["ip", "netns", "exec", net.names.ns(k)]
            )
            self.etcd.start()

    def rendezvous(self, node: int) -> list[str]:
        """The agent's rendezvous: node 0's c10d store, or
        the etcd member on the agent's own node."""
        if self.etcd is not None:
            return [
                "--rdzv-backend", "etcd-v2", "--rdzv-id", "elastic-testbed",
                "--rdzv-endpoint", self.etcd.endpoints[node], "--rdzv-conf", ETCD_RDZV_CONF,
            ]  # fmt: skip
        return [
            "--rdzv-backend", "c10d", "--rdzv-id", "elastic-testbed",
            "--rdzv-endpoint", f"{self.net.names.addr(0)}:{self.port}",
            "--rdzv-conf", f"is_host={str(node == 0).lower()},{RDZV_CONF}",
        ]  # fmt: skip

    def start(self, node: int) -> float:
        cmd = [
            "ip", "netns", "exec", self.net.names.ns(node), "env",
            f"GLOO_SOCKET_IFNAME={self.net.names.node_dev(node)}", f"ALH_EL_NODE={node}",
            "nice", "-n", str(self.nice), sys.executable, "-m", "torch.distributed.run",
            "--nnodes", f"2:{NODES}", "--nproc_per_node", "1", "--max-restarts", "3",
            *self.rendezvous(node),
            "--local-addr", self.net.names.addr(node), "--monitor-interval", "0.5",
            os.path.abspath(__file__), "--worker", str(self.spec_path),
        ]  # fmt: skip
        env = dict(
            os.environ,
            PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
            OMP_NUM_THREADS="1",
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            # docs/reliability.md: a fresh store per attempt
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        )
        log = open(self.out / f"node{node}-{len(self.agents[node])}.log", "w")
        self.agents[node].append(
            subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        return time.time()

    def power_off(self, node: int) -> float:
        """SIGKILL everything in the node's namespace at once (its agent and worker)."""
        at = time.time()
        _kill_namespace_processes(self.net.names.ns(node))
        for agent in self.agents[node]:
            agent.wait()
        return at

    def poll(self) -> list[dict]:
        path = self.out / "events.jsonl"
        if path.exists():
            lines = path.read_text().splitlines()
            for line in lines[self._seen :]:
                with contextlib.suppress(json.JSONDecodeError):  # a line being written
                    self.events.append(json.loads(line))
            self._seen = len(lines) if lines and lines[-1].endswith("}") else max(0, len(lines) - 1)
        return self.events

    def wait_for(self, what: str, condition) -> None:
        deadline = time.monotonic() + EVENT_LIMIT_S
        while not condition(self.poll()):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.out.name}: never saw {what} within "
                    f"{EVENT_LIMIT_S:.0f} s; see {self.out}"
                )
            time.sleep(0.05)

    def finish(self, limit: float = EVENT_LIMIT_S) -> dict[str, int | None]:
        """Every live agent's exit status (``None``: still
        running after ``limit`` s, then killed)."""
        codes = {}
        deadline = time.monotonic() + limit
        for node, agents in self.agents.items():
            for i, agent in enumerate(agents):
                if agent.returncode is not None and agent.returncode < 0:
                    continue  # powered off by the scenario
                try:
                    codes[f"node{node}-{i}"] = agent.wait(
                        timeout=max(1.0, deadline - time.monotonic())
                    )
                except subprocess.TimeoutExpired:
                    codes[f"node{node}-{i}"] = None
        self.kill_all()
        return codes

    def kill_all(self) -> None:
        for node in range(NODES):
            _kill_namespace_processes(self.net.names.ns(node))
        if self.etcd is not None:
            self.etcd.stop()
        for agents in self.agents.values():
            for agent in agents:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    agent.wait(timeout=10)

    def result(self) -> dict | None:
        path = self.out / "result.json"
        return json.loads(path.read_text()) if path.exists() else None


def steps_of(events: list[dict], world: int | None = None) -> list[dict]:
    return [e for e in events if e["kind"] == "step" and (world is None or e["world"] == world)]


def trained_again(events: list[dict], at: float, world: int) -> bool:
    """Whether a launch with ``world`` workers begun after ``at`` has trained a step."""
    begins = [
        e["t"] for e in events if e["kind"] == "begin" and e["world"] == world and e["t"] > at
    ]
    return bool(begins) and any(e["t"] > min(begins) for e in steps_of(events, world))


def recovery(events: list[dict], at: float, before: int, after: int) -> dict[str, Any]:
    """Seconds from ``at`` to the first step trained with ``after`` workers, and the steps redone.

    Redone: every step trained with ``before`` workers, also after ``at`` (survivors train on until
    their next boundary fails), past the boundary the ``after`` workers resume from.
    """
    begins = [e for e in events if e["kind"] == "begin" and e["world"] == after and e["t"] > at]
    restart = min(e["t"] for e in begins)
    last = max((e for e in steps_of(events, before) if e["t"] < restart), key=lambda e: e["step"])
    again = [e for e in steps_of(events, after) if e["t"] > restart]
    resumed = min(e["step"] for e in begins)
    return {
        "workers": [before, after],
        "last_step_before": last["step"],
        "cut_interval": [last["start"], last["start"] + last["h"]],
        "resumed_at": resumed,
        "steps_redone": last["step"] - resumed,
        "interval_length": last["h"],
        "fault_to_training_s": round(min(e["t"] for e in again) - at, 2),
    }


def run_scenario(
    net: Network, scenario: Scenario, seed: int, args: argparse.Namespace, workdir: str
) -> dict:
    run = Run(net, scenario, seed, args, workdir)
    record: dict[str, Any] = {"scenario": scenario.value, "seed": seed, "events": []}
    try:
        for node in range(NODES):
            run.start(node)
        if scenario == Scenario.LEAVE_JOIN:
            run.wait_for(
                f"step {args.leave_at}",
                lambda ev: any(e["step"] >= args.leave_at for e in steps_of(ev, 3)),
            )
            lost = run.power_off(NODES - 1)
            run.wait_for("training with 2", lambda ev: trained_again(ev, lost, 2))
            record["events"].append({"event": "node 3 lost", **recovery(run.poll(), lost, 3, 2)})
            run.wait_for(
                f"step {args.join_at} with 2",
                lambda ev: any(e["step"] >= args.join_at for e in steps_of(ev, 2)),
            )
            joined = run.start(NODES - 1)
            run.wait_for("training with 3", lambda ev: trained_again(ev, joined, 3))
            record["events"].append({"event": "node 3 back", **recovery(run.poll(), joined, 2, 3)})
        elif scenario == Scenario.WRITE_FAULT:
            marker = run.out / "writing"
            run.wait_for("the held snapshot write", lambda ev: marker.exists())
            writer = json.loads(marker.read_text())
            at = time.time()
            # the main process, inside the write (its agent restarts it)
            os.kill(writer["pid"], signal.SIGKILL)
            run.wait_for("training again", lambda ev: trained_again(ev, at, 3))
            event = recovery(run.poll(), at, 3, 3)
            event["write_killed_at_step"] = writer["step"]
            snapshots = sorted(
                p.name for p in (run.out / "snapshots").glob("boundary-*.safetensors")
            )
            event["snapshots_on_disk_after"] = snapshots
            record["events"].append({"event": "writer killed during the boundary write", **event})
        elif scenario == Scenario.HOST_LOST_ETCD:
            assert run.etcd is not None
            run.wait_for(
                f"step {args.leave_at}",
                lambda ev: any(e["step"] >= args.leave_at for e in steps_of(ev, 3)),
            )
            lost = run.power_off(0)  # the agent, the worker and the node's etcd member
            run.etcd.kill(0)
            run.wait_for("training with 2", lambda ev: trained_again(ev, lost, 2))
            record["events"].append(
                {"event": "node 1 (and its etcd member) lost", **recovery(run.poll(), lost, 3, 2)}
            )
            run.wait_for(
                f"step {args.join_at} with 2",
                lambda ev: any(e["step"] >= args.join_at for e in steps_of(ev, 2)),
            )
            started = time.time()
            run.etcd.restart(0)  # the member first: the agent talks to it
            joined = run.start(0)
            run.wait_for("training with 3", lambda ev: trained_again(ev, joined, 3))
            event = recovery(run.poll(), joined, 2, 3)
            event["etcd_member_back_s"] = round(joined - started, 2)
            record["events"].append({"event": "node 1 back (member, then agent)", **event})
        elif scenario == Scenario.HOST_LOST:
            run.wait_for(
                f"step {args.leave_at}",
                lambda ev: any(e["step"] >= args.leave_at for e in steps_of(ev, 3)),
            )
            lost = run.power_off(0)
            codes = run.finish()
            record["events"].append(
                {
                    "event": "node 1 (rendezvous host) lost",
                    "agents_exit": codes,
                    "seconds_to_all_agents_exited": round(time.time() - lost, 1),
                    "trained_after": any(e["t"] > lost for e in steps_of(run.poll())),
                    "last_lines": _last_error_lines(run.out),
                }
            )
        record["agents_exit"] = run.finish()
    finally:
        run.kill_all()
    record["result"] = run.result()
    fields = ("t", "kind", "step", "world", "rank", "node")  # the raw event log, compact
    record["event_log"] = {"fields": fields, "rows": [[e[f] for f in fields] for e in run.poll()]}
    return record


def _last_error_lines(out: Path) -> list[str]:
    lines = []
    for log in sorted(out.glob("node[12]-*.log")):
        errors = [x for x in log.read_text().splitlines() if "Error" in x and not x.startswith(" ")]
        lines += errors[-1:]
    return lines


# ----------------------------------------------------------------------------- the report
def table(result: dict) -> str:
    """The docs/reliability.md table from the raw results."""
    runs = result["runs"]
    free = {
        r["seed"]: r["result"]["val_loss"]
        for r in runs
        if r["scenario"] == Scenario.FAULT_FREE.value
    }
    spread = f"{min(free.values()):.4f}-{max(free.values()):.4f}" if free else "-"
    lines = [
        "| scenario | seed | event | workers | fault to training again (s) | steps redone / "
        "interval cut | final held-out loss (vs fault-free) | agents' exit |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        final = run["result"]["val_loss"] if run["result"] else None
        loss = "-" if final is None else f"{final:.4f}"
        if (
            final is not None
            and run["seed"] in free
            and run["scenario"] != Scenario.FAULT_FREE.value
        ):
            loss += f" ({final - free[run['seed']]:+.4f})"
        exits = " ".join(str(c) for c in run["agents_exit"].values())
        if not run["events"]:
            lines.append(
                f"| {run['scenario']} | {run['seed']} | - | 3 | - | - | {loss} | {exits} |"
            )
        for e in run["events"]:
            if "fault_to_training_s" in e:
                workers = " -> ".join(map(str, e["workers"]))
                redone = (
                    f"{e['steps_redone']} / {e['interval_length']} (steps "
                    f"{e['cut_interval'][0] + 1}-{e['cut_interval'][1]})"
                )
                lines.append(
                    f"| {run['scenario']} | {run['seed']} | {e['event']} | {workers} | "
                    f"{e['fault_to_training_s']:.1f} | {redone} | {loss} | {exits} |"
                )
            else:
                codes = " ".join(str(c) for c in e["agents_exit"].values())
                lines.append(
                    f"| {run['scenario']} | {run['seed']} | {e['event']} | 3 -> 0 | never (every "
                    "agent exited after "
                    f"{e['seconds_to_all_agents_exited']:.0f} s) | - | - | {codes} |"
                )
    if len(free) > 1:
        sd = statistics.stdev(free.values())
        lines.append(
            f"\nFault-free held-out loss over seeds: {spread} (mean "
            f"{statistics.fmean(free.values()):.4f}, sd {sd:.4f})."
        )
        for scenario in Scenario:
            paired = [
                r["result"]["val_loss"] - free[r["seed"]]
                for r in runs
                if r["scenario"] == scenario.value and r["result"] and r["seed"] in free
            ]
            if scenario != Scenario.FAULT_FREE and paired:
                lines.append(
                    f"{scenario.value} against fault-free, paired over {len(paired)} seed(s): mean "
                    f"{statistics.fmean(paired):+.4f} ({', '.join(f'{d:+.4f}' for d in paired)})."
                )
    return "\n".join(lines)


def goodput(run: dict, fault_free_wall: float | None) -> tuple[float | None, float | None]:
    """Useful steps over steps trained, and the fault-free
    run's wall time over this one's (``None``: no result).

    Steps trained: the distinct steps of each launch (a launch's
    workers begin within a few seconds), so a step redone after a
    restart counts twice; wall time: the first begin to the last end.
    """
    if not run["result"]:
        return None, None
    fields = run["event_log"]["fields"]
    events = sorted(
        (dict(zip(fields, row)) for row in run["event_log"]["rows"]), key=lambda e: e["t"]
    )
    launches: list[float] = []
    for e in events:
        if e["kind"] == "begin" and (not launches or e["t"] > launches[-1] + LAUNCH_SPREAD_S):
            launches.append(e["t"])
    trained = {
        (bisect.bisect_right(launches, e["t"]), e["step"]) for e in events if e["kind"] == "step"
    }
    wall = events[-1]["t"] - events[0]["t"]
    return run["result"]["global_step"] / len(trained), (
        fault_free_wall / wall if fault_free_wall else None
    )


def goodput_table(result: dict) -> str:
    """Per run: steps and time goodput, the time one paired
    with the fault-free run of the same seed."""
    runs = result["runs"]
    walls = {}
    for r in runs:
        if r["scenario"] == Scenario.FAULT_FREE.value:
            times = [row[0] for row in r["event_log"]["rows"]]  # "t" is the first field
            walls[r["seed"]] = max(times) - min(times)
    lines = [
        "| scenario | seed | goodput: useful steps / steps trained | fault-free "
        "wall time / this run's |",
        "| --- | --- | --- | --- |",
    ]
    for r in runs:
        steps, by_time = goodput(r, walls.get(r["seed"]))
        show = [("-" if x is None else f"{x:.2f}") for x in (steps, by_time)]
        lines.append(f"| {r['scenario']} | {r['seed']} | {show[0]} | {show[1]} |")
    return "\n".join(lines)


def write_results(args: argparse.Namespace, runs: list[dict]) -> None:
    settings = {
        k: v for k, v in vars(args).items() if k not in ("worker", "report_only", "out", "workdir")
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        rdzv = {"rdzv_conf": RDZV_CONF, "etcd_rdzv_conf": ETCD_RDZV_CONF}
        json.dump({"settings": settings, "sync_timeout_s": SYNC_TIMEOUT_S, **rdzv, "runs": runs}, f)


def _interrupted(signum, frame):  # SIGTERM tears the testbed down like Ctrl-C
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=[s.value for s in Scenario],
        choices=[s.value for s in Scenario],
    )
    parser.add_argument(
        "--seeds", type=int, default=3, help="seeds 0..n-1 of fault_free and leave_join"
    )
    parser.add_argument("--steps", type=int, default=72)
    parser.add_argument("--h-base", type=int, default=8)
    parser.add_argument(
        "--leave-at", type=int, default=20, help="node 3 is lost once the run passes this step"
    )
    parser.add_argument(
        "--join-at", type=int, default=32, help="node 3 starts again once 2 workers pass this step"
    )
    parser.add_argument(
        "--step-seconds", type=float, default=0.5, help="each step lasts at least this long"
    )
    parser.add_argument("--nice", type=int, default=5)
    parser.add_argument(
        "--workdir", help="keep every run's logs and events here (default: a temporary folder)"
    )
    parser.add_argument("--out", default="results/elastic/testbed.json")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if not args.report_only:
        reason = check_root()
        if reason:
            print(
                reason.replace(
                    "benchmarks/testbeds/wan.py", "benchmarks/testbeds/elastic_testbed.py"
                ),
                file=sys.stderr,
            )
            return 2
        if Scenario.HOST_LOST_ETCD.value in args.scenarios and etcd_missing():
            print(
                f"benchmarks/testbeds/elastic_testbed.py: {Scenario.HOST_LOST_ETCD.value} "
                f"{etcd_missing()}",
                file=sys.stderr,
            )
            return 2
        signal.signal(signal.SIGTERM, _interrupted)
        runs = []
        keep = (
            contextlib.nullcontext(args.workdir)
            if args.workdir
            else tempfile.TemporaryDirectory(prefix="elastic_")
        )
        with keep as workdir, Network(NODES, 1500, NAMES) as net:
            for scenario in map(Scenario, args.scenarios):
                several = (Scenario.FAULT_FREE, Scenario.LEAVE_JOIN, Scenario.HOST_LOST_ETCD)
                seeds = range(args.seeds) if scenario in several else range(1)
                for seed in seeds:
                    runs.append(run_scenario(net, scenario, seed, args, workdir))
                    # after every run: a later failure keeps the earlier ones
                    write_results(args, runs)
    with open(args.out) as f:
        result = json.load(f)
    print(table(result))
    print()
    print(goodput_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
