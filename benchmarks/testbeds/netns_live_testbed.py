"""Live membership on real links: two network namespaces, a real etcd cluster, a chaos run.

Not a test (docs/reliability.md, "On real links: namespaces, etcd, a chaos run"). Two network
namespaces joined by a veth pair (``benchmarks/testbeds/netns.py``): node A holds etcd members m0
and m1 and workers w0 and w1; node B holds member m2 and worker w2. Each worker is one process of
``live_testbed.run_worker``: the toy LM, DiLoCo at H 4, gloo on the veth
(``GLOO_SOCKET_IFNAME``), ``sync_timeout_s`` 5 s, ``store_timeout_s`` 10 s, ``settle_s`` 1 s,
``round_timeout_s`` 60 s. Every process of a seat is started by the same command; it names
itself ``<seat>-<pid>``. Needs root, ``ip netns`` and the etcd server.

Scenarios (60 steps; the workers pause at step 6, mid-interval, while the fault is made):

* ``worker_killed``: w2 killed;
* ``host_lost_follower``: w2 and m2 killed, m2 a follower;
* ``host_lost_leader``: the same, with m2 made the leader first;
* ``link_down``: the link goes down; A keeps the store's majority, w2 ends in one line;
* ``join``: a fourth process w3, started later with the same command, is taken in at a boundary.

``--chaos``: one long run with random faults from a seeded RNG: a worker killed and started
again a few seconds later; the link down and up again (a process it cut off is started again
once the link is up: it rejoins); a host lost (its worker(s) and its etcd member; the member is
restarted, then the workers); an extra process joining (an extra that is killed is not started
again: it left). Node B is one host (m2, w2 and the extras w3, w4); node A holds two (m0 with
w0, m1 with w1). At most one etcd member is down at a time, and a fault waits until the run has
re-formed after the last one (every wanted process trains in one round).

    PYTHONPATH=. python benchmarks/testbeds/netns_live_testbed.py             # the scenarios
    PYTHONPATH=. python benchmarks/testbeds/netns_live_testbed.py --chaos     # 20+ minutes
    PYTHONPATH=. python benchmarks/testbeds/netns_live_testbed.py --report-only   # both tables

The scenarios write ``results/elastic/netns_live.json``, the chaos run
``results/elastic/netns_chaos.json``; ``--report-only`` prints the tables from those files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # its kinds import as packages
from testbeds.etcd_cluster import EtcdCluster, etcd_missing  # noqa: E402
from testbeds.live_testbed import (  # noqa: E402
    STEPS,
    STORE_TIMEOUT_S,
    SYNC_TIMEOUT_S,
    H,
    run_worker,
)
from testbeds.netns import TwoNodes, netns_skip_reason, process_env  # noqa: E402

ROUND_TIMEOUT_S = 60.0  # run_worker's
CUT_OFF_BOUND_S = SYNC_TIMEOUT_S + STORE_TIMEOUT_S  # docs/reliability.md, "Cut off from the store"
SCENARIO_NODE, CHAOS_NODE = 43, 42  # namespaces alh-faults-<k>-{0,1}: apart from the tests' 40, 41
PAUSE_AT = 6  # mid-interval: the next boundary, step 8, is the first a fault shows at
RUN_LIMIT_S = 240.0  # one scenario on a loaded 2-core machine
REFORM_LIMIT_S = 240.0  # a chaos fault to a run re-formed
SCENARIOS = ("worker_killed", "host_lost_follower", "host_lost_leader", "link_down", "join")
KINDS = ("kill", "link", "host", "join")
WEIGHTS = (0.3, 0.25, 0.25, 0.2)
SEATS = {"w0": (0, 0), "w1": (0, 1), "w2": (1, 2), "w3": (1, 2), "w4": (1, 2)}  # seat: node, host
EXTRAS = ("w3", "w4")
LIVE_OUT = ROOT / "results" / "elastic" / "netns_live.json"
CHAOS_OUT = ROOT / "results" / "elastic" / "netns_chaos.json"


def digest(values: Any) -> str:
    return hashlib.sha256(json.dumps(values).encode()).hexdigest()


def load() -> str:
    return "load average {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


class Instance:
    """One process of a seat: its Popen, when it started and ended, and its trace read so far."""

    def __init__(self, seat: str, proc: subprocess.Popen, out: Path, stderr: Path) -> None:
        self.seat, self.proc, self.out, self.stderr = seat, proc, out, stderr
        self.node, self.host = SEATS[seat]
        self.name = f"{seat}-{proc.pid}"  # what the worker calls itself
        self.started_at, self.exit_at, self.killed = time.time(), None, False
        self.round, self.members, self.round_steps, self.last_step = None, [], 0, -1
        self._offset = 0

    def ended(self) -> bool:
        if self.exit_at is None and self.proc.poll() is not None:
            self.exit_at = time.time()
        return self.exit_at is not None

    def update(self) -> None:
        """Read the new lines of its trace: the round it is in, its steps in it."""
        path = self.out / f"{self.name}.trace"
        if not path.exists():
            return
        with open(path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        done = chunk.rfind(b"\n") + 1
        self._offset += done
        for line in chunk[:done].decode().splitlines():
            record = json.loads(line)
            if "round" in record:
                self.round, self.members, self.round_steps = record["round"], record["members"], 0
            else:
                self.round_steps, self.last_step = self.round_steps + 1, record["step"]

    def record(self) -> dict[str, Any]:
        """What the raw JSON keeps: times, exit, its last stderr line, its rounds and steps."""
        lines = [x for x in self.stderr.read_text().splitlines() if x.strip()]
        result: dict[str, Any] = {
            "seat": self.seat,
            "name": self.name,
            "node": self.node,
            "started_at": self.started_at,
            "exit_at": self.exit_at,
            "returncode": self.proc.returncode,
            "killed": self.killed,
            "stderr_lines": len(lines),
            "last_line": lines[-1][:600] if lines else "",
            "line_at": self.stderr.stat().st_mtime if lines else None,
            **history(self.out / f"{self.name}.trace"),
        }
        seen_path = self.out / f"{self.name}.json"
        if seen_path.exists():
            seen = json.loads(seen_path.read_text())
            if "theta" in seen:
                result["theta"], result["params"] = digest(seen["theta"]), digest(seen["params"])
            for key in ("failed", "refused"):
                if key in seen:
                    result[key] = seen[key]
        return result


def history(path: Path) -> dict[str, Any]:
    """A trace in short: a segment per round entered (its steps first to last), the longest wait."""
    segments: list[dict[str, Any]] = []
    longest, before, previous = 0.0, None, None
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
            continue
        if "round" in record:
            segments.append(
                {
                    "round": record["round"],
                    "members": record["members"],
                    "from_step": record["from_step"],
                    "entered_at": record["t"],
                    "steps": 0,
                    "first_at": None,
                    "last_step": None,
                    "last_at": None,
                    "consecutive": True,
                }
            )
            continue
        seg, step, t = segments[-1], record["step"], record["t"]
        expected = seg["from_step"] if seg["last_step"] is None else seg["last_step"] + 1
        seg["consecutive"] = seg["consecutive"] and step == expected
        seg["first_at"] = seg["first_at"] or t
        seg["last_step"], seg["last_at"], seg["steps"] = step, t, seg["steps"] + 1
        if previous is not None and t - previous > longest:
            longest, before = t - previous, step
        previous = t
    return {"segments": segments, "longest_wait_s": longest, "longest_wait_before_step": before}


class Testbed:
    """The two nodes, the etcd cluster and the worker processes of one run."""

    def __init__(self, k: int, out: Path, spec: dict[str, Any]) -> None:
        self.nodes, self.out, self.spec = TwoNodes(k=k), out, spec
        self.instances: list[Instance] = []
        self.cluster: EtcdCluster | None = None
        self.endpoints = ""

    def in_ns(self, node: int) -> list[str]:
        return ["ip", "netns", "exec", self.nodes.ns[node]]

    def start(self) -> None:
        self.nodes.create()
        a, b = self.nodes.addr
        members = [(a, 2379, 2380), (a, 2381, 2382), (b, 2379, 2380)]
        prefix = lambda k: self.in_ns(0 if k < 2 else 1)  # noqa: E731
        self.cluster = EtcdCluster(members, str(self.out), prefix=prefix)
        self.cluster.start()
        self.endpoints = ",".join(self.cluster.endpoints)

    def start_worker(self, seat: str) -> Instance:
        """A process of ``seat``: every one of a seat runs the same command (its spec file)."""
        node = SEATS[seat][0]
        spec_path = self.out / f"{seat}.spec.json"
        if not spec_path.exists():
            spec = {"seat": seat, "data_index": int(seat[1:]), "out": str(self.out)}
            spec_path.write_text(json.dumps({**spec, "endpoints": self.endpoints, **self.spec}))
        count = sum(i.seat == seat for i in self.instances)
        command = [*self.in_ns(node), sys.executable, str(Path(__file__).resolve())]
        stderr_path = self.out / f"{seat}.{count}.stderr"
        with open(self.out / f"{seat}.{count}.stdout", "w") as out, open(stderr_path, "w") as err:
            proc = subprocess.Popen(
                [*command, "--worker", str(spec_path)],
                env=process_env(GLOO_SOCKET_IFNAME=self.nodes.dev[node]),
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        self.nodes.procs.append(proc)  # destroy() ends it whatever happens
        instance = Instance(seat, proc, self.out, stderr_path)
        self.instances.append(instance)
        return instance

    def kill(self, instance: Instance) -> None:
        try:
            os.killpg(instance.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        instance.proc.wait()
        instance.killed = True
        instance.ended()

    def live(self) -> list[Instance]:
        return [i for i in self.instances if not i.ended()]

    def wait_until(self, condition, what: str, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"never saw {what} within {limit_s:g} s; see {self.out}")
            time.sleep(0.05)

    def wait_ended(self, limit_s: float) -> list[str]:
        """Until every process ended; those left at the bound are killed and named."""
        deadline = time.monotonic() + limit_s
        while self.live() and time.monotonic() < deadline:
            time.sleep(0.05)
        hung = [i.name for i in self.live()]
        for instance in self.live():
            self.kill(instance)
        return hung

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        self.nodes.destroy()


# ---------------------------------------------------------------------------------------- scenarios
def run_scenario(scenario: str, seed: int) -> dict[str, Any]:
    """One scenario on fresh namespaces and a fresh etcd cluster."""
    out = Path(tempfile.mkdtemp(prefix=f"netns_live_{scenario}_{seed}_"))
    join = scenario == "join"
    spec: dict[str, Any] = {"port": SCENARIO_NODE, "first_world": 3, "store_kind": "etcd"}
    spec["seed"] = seed
    if join:  # the members wait before step 24 until a process waits to join (a loaded machine)
        spec["wait_for_joiner_at"] = [24]
    else:
        spec.update(pause_at=PAUSE_AT, resume_file=str(out / "resume"))
    bed, leader = Testbed(SCENARIO_NODE, out, spec), None
    try:
        bed.start()
        if scenario == "host_lost_leader":
            bed.cluster.make_leader(2)
        first = [bed.start_worker(seat) for seat in ("w0", "w1", "w2")]
        if join:

            def trained() -> bool:
                for i in first:
                    i.update()
                return all(i.last_step >= 8 for i in first)

            bed.wait_until(trained, "the three past step 8", RUN_LIMIT_S)
            fault_at = time.time()
            bed.start_worker("w3")
        else:
            paused = lambda: all((out / f"{i.name}.paused").exists() for i in first)  # noqa: E731
            bed.wait_until(paused, f"the three paused at step {PAUSE_AT}", RUN_LIMIT_S)
            if scenario.startswith("host_lost"):
                if scenario == "host_lost_leader" and bed.cluster.leader() != 2:
                    bed.cluster.make_leader(2)  # the leadership moved while the workers started
                if scenario == "host_lost_follower" and bed.cluster.leader() == 2:
                    bed.cluster.make_leader(0)  # m2 was elected: the host lost must hold a follower
                leader = bed.cluster.leader()
            fault_at = time.time()
            if scenario == "link_down":
                bed.nodes.link_down()
            else:
                bed.kill(first[2])
                if scenario.startswith("host_lost"):
                    bed.cluster.kill(2)
            (out / "resume").touch()
        hung = bed.wait_ended(RUN_LIMIT_S)
        instances = [i.record() for i in bed.instances]
    finally:
        bed.stop()
    return {
        "scenario": scenario,
        "seed": seed,
        "fault_at": fault_at,
        "leader_before": leader,
        "hung": hung,
        "instances": instances,
        "out": str(out),
    }


def after_fault(instances: list[dict], t: float, victims: set[str], until: float = 1e20) -> dict:
    """The survivors of a fault at ``t``: their time to training again and steps redone.

    A survivor was running at ``t`` and is no victim; it trains again at its first step in a
    round entered after ``t`` (and before ``until``, the next fault). Its pause: from its last
    step before that round to its first in it. Steps redone: those it had trained past the
    boundary the new round goes on from.
    """
    again, pause, redone = {}, {}, {}
    for inst in instances:
        if inst["name"] in victims or inst["started_at"] > t:
            continue
        if inst["exit_at"] is not None and inst["exit_at"] < t:
            continue
        segments = inst["segments"]
        old = [s for s in segments if s["entered_at"] <= t]
        new = [s for s in segments if t < s["entered_at"] < until and s["first_at"] is not None]
        if not old or not new:
            continue
        again[inst["name"]] = new[0]["first_at"] - t
        back = new[0]["first_at"]
        before = [s["last_at"] for s in segments if s["last_at"] and s["last_at"] < back]
        pause[inst["name"]] = back - max(before, default=t)
        last = old[-1]["last_step"]
        last = old[-1]["from_step"] - 1 if last is None else last
        redone[inst["name"]] = max(0, last + 1 - new[0]["from_step"])
    return {"again_s": again, "pause_s": pause, "redone": redone}


def first_step_s(inst: dict) -> float | None:
    """From its start to its first step (a new process: imports, then taken in)."""
    firsts = [s["first_at"] for s in inst["segments"] if s["first_at"] is not None]
    return firsts[0] - inst["started_at"] if firsts else None


def summarize_run(run: dict[str, Any]) -> dict[str, Any]:
    """One scenario run: survivors back, steps redone, the cut-off side, exit codes, identical."""
    instances, t = run["instances"], run["fault_at"]
    victims = {i["name"] for i in instances if i["seat"] == "w2" and run["scenario"] != "join"}
    survivors = after_fault(instances, t, victims)
    finishing = [i for i in instances if "theta" in i]
    expected = 4 if run["scenario"] == "join" else 2
    summary: dict[str, Any] = {
        "again_s": survivors["again_s"],
        "pause_s": survivors["pause_s"],
        "redone": max(survivors["redone"].values(), default=0),
        "exit_codes": {i["seat"]: i["returncode"] for i in instances},
        "identical": len(finishing) == expected
        and len({i["theta"] for i in finishing}) == 1
        and len({i["params"] for i in finishing}) == 1,
        "finished_all_steps": all(i["segments"][-1]["last_step"] == STEPS - 1 for i in finishing),
    }
    if run["scenario"] == "link_down":
        (cut,) = [i for i in instances if i["seat"] == "w2"]
        summary["cut_off"] = {
            "line_s": cut["line_at"] - t if cut["line_at"] else None,
            "exit_s": cut["exit_at"] - t,
            "lines": cut["stderr_lines"],
            "line": cut["last_line"],
        }
    if run["scenario"] == "join":
        (joiner,) = [i for i in instances if i["seat"] == "w3"]
        summary["joiner_first_step_s"] = first_step_s(joiner)
    return summary


def span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def report_scenarios(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | seeds | to training again, s (each survivor; join: its pause) | "
        "steps redone | "
        "cut off: line / exit, s | new process: start to first step, s | exit codes | identical |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scenario in SCENARIOS:
        mine = sorted((r for r in runs if r["scenario"] == scenario), key=lambda r: r["seed"])
        if not mine:
            continue
        rows = [summarize_run(r) for r in mine]
        key = "pause_s" if scenario == "join" else "again_s"  # a join: the members' pause
        again = [s for row in rows for s in row[key].values()]
        cut = [row["cut_off"] for row in rows if "cut_off" in row]
        cut_text = "-"
        if cut:
            cut_text = f"{span([c['line_s'] for c in cut])} / {span([c['exit_s'] for c in cut])}"
        joiner = [row["joiner_first_step_s"] for row in rows if row.get("joiner_first_step_s")]
        exits = [" ".join(f"{k} {v}" for k, v in sorted(r["exit_codes"].items())) for r in rows]
        codes = sorted(set(exits))
        lines.append(
            f"| {scenario} | {','.join(str(r['seed']) for r in mine)} | {span(again)} | "
            f"{max(row['redone'] for row in rows)} | {cut_text} | {span(joiner)} | "
            f"{'; '.join(codes)} | {'yes' if all(row['identical'] for row in rows) else 'no'} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- chaos
class Chaos:
    """The chaos run's driver: faults, and a supervisor that starts again what should run."""

    def __init__(self, bed: Testbed, rng: random.Random) -> None:
        self.bed, self.rng = bed, rng
        self.wanted = {"w0", "w1", "w2"}
        self.link_up, self.hosts_down = True, set()
        self.due: dict[str, float] = {}
        self.faults: list[dict[str, Any]] = []
        self.finished = False
        self.checked: set[str] = set()

    def tick(self) -> None:
        """Note ended processes; start a wanted seat again a few seconds after it emptied."""
        for instance in self.bed.instances:
            if not instance.ended():
                instance.update()
            elif instance.proc.returncode == 0 and instance.name not in self.checked:
                self.checked.add(instance.name)
                seen = self.bed.out / f"{instance.name}.json"
                if seen.exists() and "theta" in json.loads(seen.read_text()):
                    self.finished = True  # the run reached its last step: nothing starts again
        if self.finished:
            return
        running = {i.seat for i in self.bed.live()}
        for seat in sorted(self.wanted - running):
            node, host = SEATS[seat]
            if host in self.hosts_down or (node == 1 and not self.link_up):
                self.due.pop(seat, None)
                continue
            due = self.due.setdefault(seat, time.time() + self.rng.uniform(2.0, 6.0))
            if time.time() >= due:
                del self.due[seat]
                started = self.bed.start_worker(seat)
                if self.faults:
                    self.faults[-1]["started"].append(started.name)

    def sleep(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.tick()
            time.sleep(0.1)

    def reformed(self) -> bool:
        """Every wanted process runs and trains in one round that holds them all."""
        live = self.bed.live()
        if self.hosts_down or not self.link_up or {i.seat for i in live} != self.wanted:
            return False
        if len(live) != len(self.wanted):
            return False
        rounds = {i.round for i in live}
        return (
            len(rounds) == 1
            and None not in rounds
            and all(len(i.members) == len(live) and i.round_steps > 0 for i in live)
        )

    def wait_reformed(self) -> float | None:
        deadline = time.monotonic() + REFORM_LIMIT_S
        while time.monotonic() < deadline:
            self.tick()
            if self.finished:
                return None
            if self.reformed():
                return time.time()
            time.sleep(0.1)
        return None

    def progress(self) -> int:
        return max((i.last_step for i in self.bed.instances), default=0)

    def fault(self) -> dict[str, Any]:
        extras = [s for s in EXTRAS if s not in self.wanted]
        kinds = [k for k in KINDS if k != "join" or extras]
        kind = self.rng.choices(kinds, [WEIGHTS[KINDS.index(k)] for k in kinds])[0]
        record: dict[str, Any] = {"kind": kind, "victims": [], "started": []}
        if kind == "kill":
            victim = self.rng.choice(sorted(self.bed.live(), key=lambda i: i.seat))
            if victim.seat in EXTRAS:
                self.wanted.discard(victim.seat)  # an extra that is killed has left
            record.update(t=time.time(), victims=[victim.name], seat=victim.seat)
            self.faults.append(record)
            self.bed.kill(victim)
        elif kind == "link":
            down_s = self.rng.uniform(3.0, 40.0)
            side_b = [i.name for i in self.bed.live() if i.node == 1]
            record.update(t=time.time(), down_s=down_s, side_b=side_b)
            self.faults.append(record)
            self.link_up = False
            self.bed.nodes.link_down()
            self.sleep(down_s)
            self.bed.nodes.link_up()
            self.link_up = True
            record["up_at"] = time.time()
        elif kind == "host":
            host = self.rng.choice([0, 1, 2])
            try:
                if self.rng.random() < 0.5:
                    self.bed.cluster.make_leader(host)
            except RuntimeError:
                pass
            leader = self.bed.cluster.leader()
            victims = [i for i in self.bed.live() if i.host == host]
            self.hosts_down.add(host)
            record.update(t=time.time(), host=host, leader=leader == host)
            record["victims"] = [i.name for i in victims]
            self.faults.append(record)
            for victim in victims:
                self.bed.kill(victim)
            self.bed.cluster.kill(host)
            self.sleep(self.rng.uniform(3.0, 10.0))
            self.bed.cluster.restart(host)
            self.hosts_down.discard(host)
            record["member_back_at"] = time.time()
        else:
            self.wanted.add(extras[0])
            self.faults.append({**record, "t": time.time(), "seat": extras[0]})
            self.due[extras[0]] = time.time()
            self.tick()
        return self.faults[-1]


def run_chaos(minutes: float, min_faults: int, seed: int, steps: int, step_seconds: float) -> dict:
    """One long run with random faults; what every process did, and each fault."""
    out = Path(tempfile.mkdtemp(prefix="netns_chaos_"))
    spec = {"port": CHAOS_NODE, "first_world": 3, "store_kind": "etcd", "seed": 0, "steps": steps}
    spec["step_seconds"] = step_seconds
    bed = Testbed(CHAOS_NODE, out, spec)
    chaos = Chaos(bed, random.Random(seed))
    load_before, notes = load(), []
    try:
        bed.start()
        for seat in ("w0", "w1", "w2"):
            bed.start_worker(seat)
        started_at = time.time()
        if chaos.wait_reformed() is None:
            raise TimeoutError(f"the run never formed; see {out}")
        window_end = time.monotonic() + minutes * 60
        while time.monotonic() < window_end or len(chaos.faults) < min_faults:
            if chaos.progress() > 0.9 * steps or chaos.finished:
                notes.append(f"the run neared its end after {len(chaos.faults)} faults")
                break
            chaos.sleep(chaos.rng.uniform(3.0, 15.0))
            if chaos.finished or len(bed.live()) < 2:  # a short run may end here
                break
            fault = chaos.fault()
            fault["reformed_at"] = chaos.wait_reformed()
            for i in bed.instances:  # what the fault cut off: it ended by itself
                ended_since = i.exit_at is not None and i.exit_at >= fault["t"]
                if ended_since and i.proc.returncode not in (0, -9):
                    fault["victims"].append(i.name)
            print(f"{len(chaos.faults)} {time.strftime('%H:%M:%S')} {fault}", flush=True)
            if fault["reformed_at"] is None:
                n = len(chaos.faults)
                notes.append(f"not re-formed within {REFORM_LIMIT_S:g} s after fault {n}")
                break
        last_step_seen, quiet_since = chaos.progress(), time.monotonic()
        while bed.live() and time.monotonic() - quiet_since < 300:  # to the end; 300 s: a hang
            chaos.tick()
            if chaos.progress() != last_step_seen:
                last_step_seen, quiet_since = chaos.progress(), time.monotonic()
            time.sleep(0.2)
        hung = bed.wait_ended(1.0)
        ended_at = time.time()
        instances = [i.record() for i in bed.instances]
    finally:
        bed.stop()
    return {
        "command": " ".join(sys.argv),
        "seed": seed,
        "minutes": minutes,
        "steps": steps,
        "step_seconds": step_seconds,
        "h": H,
        "load_before": load_before,
        "load_after": load(),
        "started_at": started_at,
        "ended_at": ended_at,
        "hung": hung,
        "notes": notes,
        "faults": chaos.faults,
        "instances": instances,
        "out": str(out),
    }


def untraced_steps(instances: list[dict]) -> tuple[list[dict], int]:
    """The instances with the last step of an interval put back where its trace line is missing.

    ``run_worker`` writes a step's line after ``after_optimizer_step``. When a peer is lost in
    the boundary's look for joining processes, after the outer step, that call raises: the step
    was trained and its outer step applied, but its line is never written. A round's
    ``from_step`` is the boundary its source kept, which only the outer step keeps; so a member
    whose next round goes on from two steps past its last line, at a boundary, trained that step.
    """
    out, count = json.loads(json.dumps(instances)), 0
    for inst in out:
        for a, b in zip(inst["segments"], inst["segments"][1:]):
            last = a["last_step"]
            if last is not None and b["from_step"] == last + 2 and b["from_step"] % H == 0:
                a["last_step"], a["steps"], count = last + 1, a["steps"] + 1, count + 1
    return out, count


def round_line(instances: list[dict], steps: int) -> dict[str, Any]:
    """The run's line of rounds: no boundary lost, no step skipped, every step to the end.

    A member goes on from a boundary no older than the newest it held; within a round its steps
    are consecutive; each round starts no later than one step past the last its forerunner
    reached; the last round reaches the last step.
    """
    rounds: dict[int, dict[str, Any]] = {}
    problems = []
    for inst in instances:
        segments = inst["segments"]
        for seg in segments:
            first = {"from": seg["from_step"], "members": seg["members"], "last": -1}
            r = rounds.setdefault(seg["round"], first)
            if (r["from"], r["members"]) != (seg["from_step"], seg["members"]):
                problems.append(f"round {seg['round']}: members disagree on it")
            if not seg["consecutive"]:
                problems.append(f"{inst['name']} skipped a step in round {seg['round']}")
            if seg["last_step"] is not None:
                r["last"] = max(r["last"], seg["last_step"])
        for a, b in zip(segments, segments[1:]):
            held = (a["last_step"] + 1) // H * H if a["last_step"] is not None else a["from_step"]
            if b["from_step"] < held:
                where = f"round {b['round']} went on from {b['from_step']}"
                problems.append(f"{inst['name']} held boundary {held}, {where}")
    numbers = sorted(rounds)
    for a, b in zip(numbers, numbers[1:]):
        if rounds[b]["from"] > rounds[a]["last"] + 1:
            problems.append(f"round {b} went on from {rounds[b]['from']}, past round {a}'s end")
    if not numbers or rounds[numbers[-1]]["last"] != steps - 1:
        problems.append("the last round did not reach the last step")
    return {"rounds": len(numbers), "problems": problems}


def summarize_chaos(raw: dict[str, Any]) -> dict[str, Any]:
    """Per fault: survivors back, steps redone, rejoin, cut off; over the run: waits, goodput."""
    instances, untraced = untraced_steps(raw["instances"])
    faults = raw["faults"]
    by_name = {i["name"]: i for i in instances}
    per_fault = []
    for n, fault in enumerate(faults):
        until = faults[n + 1]["t"] if n + 1 < len(faults) else raw["ended_at"]
        survivors = after_fault(instances, fault["t"], set(fault["victims"]), until)
        started = [first_step_s(by_name[name]) for name in fault["started"]]
        cut = [by_name[name] for name in fault["victims"] if not by_name[name]["killed"]]
        per_fault.append(
            {
                "kind": fault["kind"],
                "again_s": max(survivors["again_s"].values(), default=None),
                "pause_s": max(survivors["pause_s"].values(), default=None),
                "redone": max(survivors["redone"].values(), default=0),
                "rejoin_s": max((s for s in started if s is not None), default=None),
                "cut_off_line_s": [c["line_at"] - fault["t"] for c in cut if c["line_at"]],
                "cut_off_lines": [c["stderr_lines"] for c in cut],
                "reformed": fault["reformed_at"] is not None,
            }
        )
    finishing = [i for i in instances if "theta" in i]
    trained = sum(s["steps"] for i in instances for s in i["segments"])
    useful = 0
    for inst in instances:
        for seg in inst["segments"]:
            if seg["last_step"] is not None:
                useful += max(0, (seg["last_step"] + 1) // H * H - seg["from_step"])
    waits = [(i["longest_wait_s"], i["name"]) for i in instances if i["segments"]]
    first_fault, last_fault = (faults[0]["t"], faults[-1]["t"]) if faults else (0.0, 0.0)
    return {
        "per_fault": per_fault,
        "untraced": untraced,
        "faults": len(faults),
        "minutes": (raw["ended_at"] - raw["started_at"]) / 60,
        "fault_minutes": (last_fault - first_fault) / 60,
        "processes": len(instances),
        "finishing": len(finishing),
        "identical": len(finishing) >= 2
        and len({i["theta"] for i in finishing}) == 1
        and len({i["params"] for i in finishing}) == 1,
        "longest_wait": max(waits),
        "line": round_line(instances, raw["steps"]),
        "trained": trained,
        "useful": useful,
        "goodput": useful / trained,
    }


def row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def report_chaos(raw: dict[str, Any]) -> str:
    s = summarize_chaos(raw)
    lines = [
        "| fault | count | to training again, s (slowest survivor; join: its pause) | "
        "steps redone | "
        "started again: start to first step, s | cut off: its one line after, s | re-formed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind in KINDS:
        mine = [f for f in s["per_fault"] if f["kind"] == kind]
        if not mine:
            continue
        key = "pause_s" if kind == "join" else "again_s"  # a join: the members' pause
        again = [f[key] for f in mine if f[key] is not None]
        rejoin = [f["rejoin_s"] for f in mine if f["rejoin_s"] is not None]
        cut = [x for f in mine for x in f["cut_off_line_s"]]
        lines.append(
            f"| {kind} | {len(mine)} | {span(again)} | {max(f['redone'] for f in mine)} | "
            f"{span(rejoin)} | {span(cut)} | {sum(f['reformed'] for f in mine)} of {len(mine)} |"
        )
    wait, name = s["longest_wait"]
    cut_all = [x for f in s["per_fault"] for x in f["cut_off_line_s"]]
    one_line = "yes" if all(n == 1 for f in s["per_fault"] for n in f["cut_off_lines"]) else "no"
    kinds = ", ".join(f"{k} {sum(f['kind'] == k for f in raw['faults'])}" for k in KINDS)
    leaders = sum(f["kind"] == "host" and f["leader"] for f in raw["faults"])
    problems = len(s["line"]["problems"])
    identical = f"{'yes' if s['identical'] else 'no'} ({s['finishing']} members)"
    minutes = f"{s['minutes']:.1f} / {s['fault_minutes']:.1f}"
    counts = f"{raw['steps']}; {s['processes']}; {s['line']['rounds']}"
    goodput = f"{s['goodput']:.3f} ({s['useful']} / {s['trained']})"
    bound = f"round_timeout_s {ROUND_TIMEOUT_S:g}"
    lines += [
        "",
        "| over the run | measured | bound or target |",
        "| --- | --- | --- |",
        row("faults", f"{s['faults']} ({kinds}; the etcd leader's host {leaders})", "at least 20"),
        row("minutes: the run / first to last fault", minutes, "at least 20"),
        row("steps; processes started; rounds", counts, ""),
        row("boundaries lost or steps skipped", str(problems), "0"),
        row("a step's trace line lost to a peer lost after its outer step", str(s["untraced"]), ""),
        row("longest wait between two steps of a process, s", f"{wait:.1f}", bound),
        row(
            "cut off: its line after the link went down, s",
            f"{span(cut_all)} (one line each: {one_line})",
            f"sync_timeout_s + store_timeout_s = {CUT_OFF_BOUND_S:g} after the next boundary",
        ),
        row("goodput: useful / trained steps, all processes", goodput, ""),
        row("finishing members bit-identical (theta, parameters)", identical, "yes"),
    ]
    return "\n".join(lines)


def report(data: dict[str, Any]) -> str:
    """The markdown table of a raw JSON: the scenarios' (``runs``) or the chaos run's."""
    return report_scenarios(data["runs"]) if "runs" in data else report_chaos(data)


# ---------------------------------------------------------------------------------------- main
def worker(spec_path: str) -> None:
    """One worker: ``run_worker`` with its seat's spec, named ``<seat>-<pid>``, traced."""
    spec = json.loads(Path(spec_path).read_text())
    name = f"{spec.pop('seat')}-{os.getpid()}"
    run_worker(name=name, trace=str(Path(spec["out"]) / f"{name}.trace"), **spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--chaos", action="store_true", help="the chaos run, not the scenarios")
    parser.add_argument("--out", help="the raw results (JSON)")
    parser.add_argument("--seeds", default="0,1,2", help="scenarios: one run per seed")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--minutes", type=float, default=22.0, help="chaos: the faults' window")
    parser.add_argument("--faults", type=int, default=20, help="chaos: at least this many faults")
    parser.add_argument("--seed", type=int, default=0, help="chaos: the faults' RNG")
    parser.add_argument("--steps", type=int, help="chaos: the run's steps (default from --minutes)")
    parser.add_argument("--step-seconds", type=float, default=0.25, help="chaos: pause per step")
    parser.add_argument("--report-only", action="store_true", help="print the tables from the JSON")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if args.report_only:
        for path in [Path(args.out)] if args.out else [LIVE_OUT, CHAOS_OUT]:
            print(report(json.loads(path.read_text())) + "\n")
        return
    reason = netns_skip_reason() or etcd_missing()
    if reason:
        sys.exit(f"netns_live_testbed: {reason}")
    if args.chaos:
        out = Path(args.out or CHAOS_OUT)
        # about 2.5 steps a second at 0.25 s a step (2.8 measured, less a fault's pauses): the run
        # outlasts the faults' window by half (a fault and its recovery take about a minute)
        steps = args.steps or int(args.minutes * 60 * 1.5 * 2.5) // H * H
        raw = run_chaos(args.minutes, args.faults, args.seed, steps, args.step_seconds)
    else:
        out, runs = Path(args.out or LIVE_OUT), []
        load_before = load()
        for seed in (int(s) for s in args.seeds.split(",")):
            for scenario in args.scenarios:
                started = time.monotonic()
                runs.append(run_scenario(scenario, seed))
                took = time.monotonic() - started
                summary = summarize_run(runs[-1])
                print(f"{scenario} seed {seed}: {summary} ({took:.0f} s)", flush=True)
        raw = {"command": " ".join(sys.argv), "load_before": load_before, "load_after": load()}
        raw["runs"] = runs
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(raw))
    print(report(raw))


if __name__ == "__main__":
    main()
