"""The Trainer on live membership, measured: a worker lost
and a new one joining, against fault-free runs.

Real processes on loopback, gloo, a ``TCPStore`` hosted by this script: each process a
``Trainer`` + ``AutoLoCoCallback`` on the tiny Llama of the tests
(``benchmarks/testbeds/live_trainer_worker.py``, DiLoCo at H 4 for 28 steps, ``sync_timeout_s`` 5 s,
``settle_s`` 1 s). Scenarios, per seed:

* ``fault_free``: 3 workers throughout;
* ``lost_and_joined``: 3 workers; one dies before step 11 (a closed connection); the two survivors
  reform in process and go on from the boundary of step 8; a new process joins at a later boundary;
* ``two_lost``: 3 workers; one dies before step 11, a second
  before step 19: the last one trains on alone;
* ``store_member_lost``: the rounds on a 3-member etcd cluster; one worker dies before step 11, and
  etcd member 0 is killed while the survivors wait before step 17 (between rounds): they go on.

For each: fault to training again (the death, written by the dying process, to the first step of the
slowest survivor after the reform), the steps redone, goodput (useful steps over steps trained by
the finishing members) and the held-out loss of the final model (64 sequences no worker trains on).
Raw results: ``results/elastic/live_trainer_testbed.json``.

    PYTHONPATH=. python benchmarks/testbeds/live_trainer_testbed.py  # about 3 minutes here
    PYTHONPATH=. python benchmarks/testbeds/live_trainer_testbed.py --report-only
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # its kinds import as packages

STEPS, H = 28, 4
SCENARIOS = ("fault_free", "lost_and_joined", "two_lost", "store_member_lost")
DEFAULT_OUT = ROOT / "results" / "elastic" / "live_trainer_testbed.json"


def run_scenario(scenario: str, seed: int) -> dict[str, Any]:
    """One scenario on a fresh store: what each finishing
    process saw, and when each lost one died."""
    import torch.distributed as dist
    from testbeds.etcd_cluster import EtcdCluster
    from testbeds.live_testbed import collect, free_port, kill_store_member, wait_round
    from testbeds.live_trainer_worker import run

    from autoloco_hf.integrations.elastic.store import etcd_store

    out, port = tempfile.mkdtemp(prefix=f"live-trainer-{scenario}-{seed}-"), free_port()
    timeout, cluster, where = datetime.timedelta(seconds=60), None, {}
    if scenario == "store_member_lost":
        cluster = EtcdCluster([("127.0.0.1", free_port(), free_port()) for _ in range(3)], out)
        cluster.start()
        where = {"endpoints": ",".join(cluster.endpoints)}
        store = etcd_store(where["endpoints"], f"run-{port}", timeout)
    else:
        store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timeout)
    ctx = multiprocessing.get_context("spawn")
    deadline = time.monotonic() + 300
    processes: dict[str, Any] = {}

    def spawn(name: str, first_world: int, **options: Any) -> None:
        kwargs = {"seed": seed, **where, **options}
        processes[name] = ctx.Process(
            target=run, args=(name, port, out, first_world, STEPS, H), kwargs=kwargs
        )
        processes[name].start()

    try:
        if scenario == "fault_free":
            for i in range(3):
                spawn(f"w{i}", 3)
        elif scenario == "lost_and_joined":
            spawn("w0", 3, wait_for_joiner_at=(16,))
            spawn("w1", 3, wait_for_joiner_at=(16,))
            spawn("w2", 3, die_at=10)
            wait_round(store, 1, deadline)
            spawn("w3", 0)
        elif scenario == "two_lost":
            spawn("w0", 3)
            spawn("w1", 3, die_at=18)
            spawn("w2", 3, die_at=10)
        else:  # store_member_lost
            spawn("w0", 3, pause_at=16)
            spawn("w1", 3, pause_at=16)
            spawn("w2", 3, die_at=10)
            kill_store_member(store, cluster, ["w0", "w1"], deadline)
        names = {"two_lost": ["w0"], "store_member_lost": ["w0", "w1"]}.get(
            scenario, [name for name in processes if name != "w2" or scenario == "fault_free"]
        )
        seen = collect(list(processes.values()), out, names, deadline)
        fault_at = [
            float(store.get(f"test/{name}/fault_at"))
            for name in ("w2", "w1")
            if store.check([f"test/{name}/fault_at"])
        ]
    finally:
        if cluster is not None:
            cluster.stop()
    agree = all(
        s["params"] == seen[names[0]]["params"] and s["theta"] == seen[names[0]]["theta"]
        for s in seen.values()
    )
    # the parameters themselves are not kept: only whether the members agree
    for s in seen.values():
        del s["params"], s["theta"]
    return {
        "scenario": scenario,
        "seed": seed,
        "fault_at": fault_at,
        "members_agree": agree,
        "seen": seen,
        "exitcodes": {name: process.exitcode for name, process in processes.items()},
    }


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    seen = run["seen"]
    trained = sum(len(s["steps"]) for s in seen.values())
    useful = sum(len(set(s["steps"])) for s in seen.values())
    # fault k is followed by round k + 1 of the processes that were there from the start
    first = [s for s in seen.values() if s["begins"][0]["round"] == 0]
    back = [
        max(s["begins"][k + 1]["first_step_at"] for s in first) - at
        for k, at in enumerate(run["fault_at"])
    ]
    return {
        "scenario": run["scenario"],
        "seed": run["seed"],
        "training_again_s": back,
        "steps_redone": max(
            (len(s["steps"]) - len(set(s["steps"])) for s in seen.values()), default=0
        ),
        "goodput": useful / trained,
        "held_out_loss": statistics.fmean(s["held_out_loss"] for s in seen.values()),
        "members_agree": run["members_agree"],
        "finishing_exit_zero": all(run["exitcodes"][name] == 0 for name in seen),
    }


def report(runs: list[dict[str, Any]]) -> str:
    rows = [summarize(r) for r in runs]
    free = {r["seed"]: r["held_out_loss"] for r in rows if r["scenario"] == "fault_free"}
    lines = [
        "| scenario | seeds | fault to training again, s (each fault) | steps redone | goodput | "
        "held-out loss | minus fault-free (per seed) | members agree | "
        "finishing processes exit 0 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scenario in SCENARIOS:
        mine = sorted((r for r in rows if r["scenario"] == scenario), key=lambda r: r["seed"])
        if not mine:
            continue
        back = [b for r in mine for b in r["training_again_s"]]
        diffs = [f"{r['held_out_loss'] - free[r['seed']]:+.4f}" for r in mine if r["seed"] in free]
        lines.append(
            f"| {scenario} | {','.join(str(r['seed']) for r in mine)} | "
            f"{f'{min(back):.2f}-{max(back):.2f}' if back else '-'} | "
            f"{max(r['steps_redone'] for r in mine)} | "
            f"{min(r['goodput'] for r in mine):.3f}-{max(r['goodput'] for r in mine):.3f} | "
            f"{statistics.fmean(r['held_out_loss'] for r in mine):.4f} | {', '.join(diffs)} | "
            f"{all(r['members_agree'] for r in mine)} | "
            f"{all(r['finishing_exit_zero'] for r in mine)} |"
        )
    spread = [free[s] for s in sorted(free)]
    if len(spread) > 1:
        lines += ["", f"Fault-free held-out loss over seeds: {min(spread):.4f}-{max(spread):.4f}."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the raw results (JSON)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--report-only", action="store_true", help="print the table from --out")
    args = parser.parse_args()
    if not args.report_only:
        runs = [
            run_scenario(s, int(seed)) for seed in args.seeds.split(",") for s in args.scenarios
        ]
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(runs, f)
    with open(args.out) as f:
        print(report(json.load(f)))


if __name__ == "__main__":
    main()
