"""Bandwidth-limited multi-node benchmark: Trainer +
AutoLoCoCallback across network namespaces (not a test).

    sudo python benchmarks/testbeds/wan.py              # all rows at 100mbit, 1gbit, unlimited
    sudo python benchmarks/testbeds/wan.py --rates 100mbit --rows diloco autoloco-int8 --steps 40
    sudo python benchmarks/testbeds/wan.py --smoke      # a few steps, 2 nodes, one row (CI smoke)

Builds ``--nodes`` network namespaces ``alh-lp-<k>`` (addresses 10.232.0.<k+1>/24; another
prefix with ``--netns-prefix``, so that two testbeds on one machine never meet). Two nodes
are joined by one veth pair (``alhl0`` <-> ``alhl1``); more nodes hang off a bridge
``alhlbr0`` in its own namespace ``alh-lp-br`` through veth pairs ``alhl<k>`` (in the node)
/ ``alhlp<k>`` (at the bridge). Each node's interface gets a ``tbf`` egress limit per rate
(``unlimited``: no qdisc), MTU ``--mtu``. Per run, one ``torchrun --nnodes N --node_rank k``
launcher agent per namespace starts a user-style ``Trainer`` + ``AutoLoCoCallback`` script
(this file with ``--worker``), gloo bound to the namespace's interface
(``GLOO_SOCKET_IFNAME``). Everything is torn down afterwards, also on error and Ctrl-C. Only
addresses in the namespaces this script created are used. Needs root (``ip netns``, ``tc``).

Rows (``--rows``):

* ``single``: one process in one namespace, no communication: the lower bound of
  wall time per step (same per-rank batch, same steps);
* ``local``: every node trains alone at the same time (one independent launcher
  per namespace, no communication): the lower bound under the same CPU load as
  the multi-node rows, which on a machine with fewer cores than ranks is the fair
  one. ``x bound`` is the step time over this row's when it ran, else ``single``'s;
* ``ddp``: gradient all-reduce every step (torch DDP), one rank per node;
* ``diloco``, ``autoloco``, ``autoloco-int8``: one rank per node, FP32 / FP32 / INT8 wire;
* ``diloco-delayed``, ``autoloco-delayed``, ``autoloco-eager``, ``autoloco-int8-delayed``,
  ``autoloco-int8-eager``: the same with the outer collective overlapped with the
  following inner steps (docs/algorithm.md#overlap; ``delayed`` merges
  ``--overlap-steps`` steps after the boundary, ``eager`` at the next boundary);
* ``diloco-2x2-flat``: 2 ranks per node, ``ranks_per_worker=2``, each outer group
  ``{r, r+2}`` syncing the whole model (every node sends 2 copies);
* ``diloco-2x2-hier``: the same with the hierarchical sync (reduce-scatter in the
  node, outer collective on the 1/2 shard, all-gather in the node).
* ``stream[-int8]-f{1,2,4}[-delayed]`` (``STREAM_ROWS``): AutoLoCo with ``fragments = F``
  (docs/algorithm.md#fragments), ``h_min = h_base`` and the token mapper on; the delayed
  ones merge ``min(--overlap-steps, h_base // F - 1)`` steps after each fragment's sync.
* ``wire-<format>-f{1,4}-delayed`` (``WIRE_ROWS``): DiLoCo at ``H = h_base`` with the delayed
  overlap and ``F`` fragments in each wire format (``fp32``, ``int8``, and the lossy
  ``int4-ef``, ``fp4-ef``, ``int2-ef``, ``int2-top2-ef``: error feedback, top-k 2 %). A lossy wire's
  overlapped average is the all-gather of the encoded buffers;
  ``wire-<format>-f{1,4}-delayed-thread`` runs the earlier owner-reduce on a background thread
  (``overlap_aggregation="owner_reduce"``) beside it.
* ``torchft-diloco``, ``torchft-diloco-f4-delayed``
  (``TORCHFT_ROWS``, optional: ``pip install torchft``):
  torchft's own ``DiLoCo`` (``torchft.local_sgd``, gloo) on the same model, data, batch, H, inner
  AdamW and link, next to ``diloco`` and ``wire-fp32-f4-delayed``. Each node is a 1-rank replica
  group (its own ``torchrun --nnodes 1``, ``REPLICA_GROUP_ID=k``), a ``torchft_lighthouse`` runs in
  node 0 on node 0's address, and the loop is plain PyTorch (torchft hooks the inner optimizer;
  ``torchft_worker`` says what it mirrors of the Trainer). FP32 only: torchft's ``should_quantize``
  needs triton and an accelerator (without triton it silently sends FP32). The fragment row (4
  fragments of the project's layout, the all-reduce started
  ``min(--overlap-steps, h_base // 4 - 1)`` steps before the merge,
  ``fragment_update_alpha = overlap_mix``) needs ``--h-base`` divisible by 4. ``sync %`` is the time
  inside torchft's post-step hook; the engine columns read ``-``.

Per run (columns): steps/s (training loop, rank 0), ``sync %`` (share of the
training wall time the engine spent blocked in synchronization; ``steady %`` the
same without the run's last sync, which blocks with or without overlap; for ``ddp``,
whose all-reduce overlaps the backward pass, ``1 - single step time / ddp step
time`` marked ``~``), the bytes each node's interface sent during training
(kernel ``tx_bytes``, read inside the namespace after a barrier at train begin and
end) next to the engine's own ``wire_bytes`` summed over the node's ranks, their
ratio, and the seconds until rank 0's training loss (mean of the last 5 steps)
first reaches the target (``--target-loss``; default: the largest final loss of
the rows at that rate, so every row reaches it). Last columns: ``F`` (fragments),
``peak Mbit/s`` (the largest mean send rate over 100 ms of either node's interface,
from its kernel ``tx_bytes`` sampled every 10 ms by a thread during training) and
``kB/event`` (the node's kernel bytes over its sync events, one per fragment per
interval).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RATES = ("100mbit", "1gbit", "unlimited")
LOSS_WINDOW = 5
SAMPLE_PERIOD_S = 0.01  # kernel tx_bytes sampled this often during training
PEAK_WINDOW_S = 0.1  # the peak link rate is the largest mean rate over spans this long


@dataclass(frozen=True)
class Row:
    """One benchmark row: launch layout and AutoLoCo settings."""

    name: str
    method: str  # "none": no AutoLoCo, no communication (the lower bounds)
    ranks_per_node: int = 1
    wire_dtype: str = "fp32"
    ranks_per_worker: int = 1
    hierarchical: bool = False
    overlap: str = "none"
    # method "none": every node trains alone at once (independent launchers)
    every_node: bool = False
    # streaming rows (docs/algorithm.md#fragments): F
    # fragments, h_min = h_base; 0: not a streaming row
    fragments: int = 0
    # "budget": each node takes the steps its measured speed allows (docs/algorithm.md#pacing)
    pacing: str = "lockstep"
    # the last node runs at half speed: after each step's work it sleeps as long again
    slow: bool = False
    # top-k sparsification of the wire (docs/algorithm.md#wire-codecs)
    topk_fraction: float | None = None
    error_feedback: bool = False
    # an overlapped lossy average: "all_gather" (the default)
    # or "owner_reduce" on the background thread
    overlap_aggregation: str = "all_gather"

    @property
    def single(self) -> bool:
        return self.method == "none" and not self.every_node


WIRES: dict[str, dict[str, Any]] = {
    "fp32": dict(wire_dtype="fp32"),
    "int8": dict(wire_dtype="int8"),
    "int4-ef": dict(wire_dtype="int4", error_feedback=True),
    "fp4-ef": dict(wire_dtype="fp4", error_feedback=True),
    "int2-ef": dict(wire_dtype="int2", error_feedback=True),
    "int2-top2-ef": dict(wire_dtype="int2", topk_fraction=0.02, error_feedback=True),
}

THREAD = dict(overlap_aggregation="owner_reduce")

ROWS = {
    r.name: r
    for r in (
        Row("single", "none"),
        Row("local", "none", every_node=True),
        Row("ddp", "ddp"),
        Row("diloco", "diloco"),
        Row("autoloco", "autoloco"),
        Row("autoloco-int8", "autoloco", wire_dtype="int8"),
        Row("diloco-delayed", "diloco", overlap="delayed"),
        Row("autoloco-delayed", "autoloco", overlap="delayed"),
        Row("autoloco-eager", "autoloco", overlap="eager"),
        Row("autoloco-int8-delayed", "autoloco", wire_dtype="int8", overlap="delayed"),
        Row("autoloco-int8-eager", "autoloco", wire_dtype="int8", overlap="eager"),
        Row("diloco-2x2-flat", "diloco", ranks_per_node=2, ranks_per_worker=2),
        Row("diloco-2x2-hier", "diloco", ranks_per_node=2, ranks_per_worker=2, hierarchical=True),
        # workers of unequal speed (docs/algorithm.md#pacing):
        # the last node at half speed, lockstep or budget pacing
        *(
            Row(
                f"{method}-slow{'-budget' if pacing == 'budget' else ''}",
                method,
                pacing=pacing,
                slow=True,
            )
            for method in ("diloco", "autoloco")
            for pacing in ("lockstep", "budget")
        ),
        *(
            Row(
                f"stream{'-int8' if wire == 'int8' else ''}-f{f}{'-delayed' if overlap else ''}",
                "autoloco",
                **kw,
            )
            for wire in ("fp32", "int8")
            for overlap in (False, True)
            for f in (1, 2, 4)
            for kw in [dict(wire_dtype=wire, overlap="delayed" if overlap else "none", fragments=f)]
        ),
        # every wire format on the link (issue 36): DiLoCo,
        # delayed overlap, the whole model or 4 fragments
        *(
            Row(f"wire-{label}-f{f}-delayed", "diloco", overlap="delayed", fragments=f, **wire)
            for label, wire in WIRES.items()
            for f in (1, 4)
        ),
        # the lossy wires' earlier overlapped average
        # (owner-reduce on a Python thread), beside the all-gather
        *(
            Row(
                f"wire-{label}-f{f}-delayed-thread",
                "diloco",
                overlap="delayed",
                fragments=f,
                **wire,
                **THREAD,
            )
            for label, wire in WIRES.items()
            if label != "fp32"
            for f in (1, 4)
        ),
        # torchft's DiLoCo on the same model, data and link
        # (issue 36): a plain loop, one replica group per node
        Row("torchft-diloco", "torchft"),
        Row("torchft-diloco-f4-delayed", "torchft", overlap="delayed", fragments=4),
    )
}
STREAM_ROWS = [name for name, row in ROWS.items() if row.fragments and row.method == "autoloco"]
WIRE_ROWS = [name for name in ROWS if name.startswith("wire-")]
TORCHFT_ROWS = [name for name, row in ROWS.items() if row.method == "torchft"]
TORCHFT_MISSING = "the torchft rows need torchft: pip install torchft"


# ----------------------------------------------------------------------------- network namespaces
def _ip(*args: str, ns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@dataclass(frozen=True)
class Names:
    """The namespace, interface and address names of one testbed
    (each benchmark its own, so two can run at once)."""

    prefix: str  # namespaces <prefix><k>, the bridge's <prefix>br
    dev: str  # node k's interface <dev><k>, its bridge end <dev>p<k>, the bridge <dev>br0
    subnet: str  # node k's address <subnet>.<k+1>/24

    def ns(self, k: int) -> str:
        return f"{self.prefix}{k}"

    def node_dev(self, k: int) -> str:
        return f"{self.dev}{k}"

    def addr(self, k: int) -> str:
        return f"{self.subnet}.{k + 1}"

    @property
    def bridge_ns(self) -> str:
        return self.prefix + "br"

    @property
    def bridge(self) -> str:
        return f"{self.dev}br0"


WAN = Names("alh-lp-", "alhl", "10.232.0")


def names_with_prefix(prefix: str) -> Names:
    """The testbed's names under another namespace prefix, so two engineers' runs never meet."""
    return Names(prefix, WAN.dev, WAN.subnet)  # interfaces and addresses live inside the namespaces


class Network:
    """The namespaces, links and qdiscs of one benchmark; a
    context manager that always removes them."""

    def __init__(self, nodes: int, mtu: int, names: Names = WAN) -> None:
        if nodes < 2:
            raise ValueError(f"--nodes={nodes}: a link needs at least 2 nodes")
        self.nodes = nodes
        self.mtu = mtu
        self.names = names
        self.namespaces: list[str] = []

    def __enter__(self) -> Network:
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.teardown()

    def _add_ns(self, name: str) -> None:
        subprocess.run(["ip", "netns", "add", name], check=True, stderr=subprocess.PIPE)
        self.namespaces.append(name)
        _ip("ip", "link", "set", "lo", "up", ns=name)

    def _build(self) -> None:
        names = self.names
        stale = [n for n in _list_namespaces() if n.startswith(names.prefix)]
        if stale:
            raise RuntimeError(
                f"namespaces {stale} exist already (an earlier run?): remove them with `ip "
                "netns del NAME` and rerun"
            )
        for k in range(self.nodes):
            self._add_ns(names.ns(k))
        if self.nodes == 2:  # one veth pair, one end in each node
            _ip(
                "ip",
                "link",
                "add",
                names.node_dev(0),
                "netns",
                names.ns(0),
                "type",
                "veth",
                "peer",
                "name",
                names.node_dev(1),
                "netns",
                names.ns(1),
            )
        else:  # a bridge in its own namespace, one veth pair per node
            self._add_ns(names.bridge_ns)
            _ip("ip", "link", "add", names.bridge, "type", "bridge", ns=names.bridge_ns)
            _ip("ip", "link", "set", names.bridge, "mtu", str(self.mtu), "up", ns=names.bridge_ns)
            for k in range(self.nodes):
                peer = f"{names.dev}p{k}"
                _ip(
                    "ip",
                    "link",
                    "add",
                    names.node_dev(k),
                    "netns",
                    names.ns(k),
                    "type",
                    "veth",
                    "peer",
                    "name",
                    peer,
                    "netns",
                    names.bridge_ns,
                )
                _ip(
                    "ip",
                    "link",
                    "set",
                    peer,
                    "mtu",
                    str(self.mtu),
                    "master",
                    names.bridge,
                    "up",
                    ns=names.bridge_ns,
                )
        for k in range(self.nodes):
            _ip(
                "ip", "addr", "add", f"{names.addr(k)}/24", "dev", names.node_dev(k), ns=names.ns(k)
            )
            _ip("ip", "link", "set", names.node_dev(k), "mtu", str(self.mtu), "up", ns=names.ns(k))

    def set_rate(self, rate: str) -> None:
        """``tbf`` egress limit on every node's interface (``unlimited``: no qdisc)."""
        for k in range(self.nodes):
            ns, dev = self.names.ns(k), self.names.node_dev(k)
            subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # none yet is fine
            if rate != "unlimited":
                # >= 10 ms of traffic, > a 64 KB GSO packet
                burst = max(256 * 1024, _rate_bits(rate) // 8 // 100)
                _ip(
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    str(burst),
                    "latency",
                    "2s",
                    ns=ns,
                )

    def teardown(self) -> None:
        for ns in reversed(self.namespaces):
            _kill_namespace_processes(ns)
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        self.namespaces = []

    def exec_prefix(self, k: int) -> list[str]:
        """What runs a command in node ``k``: inside its namespace, gloo bound to its interface."""
        return [
            "ip",
            "netns",
            "exec",
            self.names.ns(k),
            "env",
            f"GLOO_SOCKET_IFNAME={self.names.node_dev(k)}",
        ]

    def addr(self, k: int) -> str:
        return self.names.addr(k)


class Loopback:
    """Every node on this machine's loopback interface: no
    namespaces, no rate limit, no root (the torchft test).

    Only rows that give each node its own ports (the torchft rows) run on it; ``tx MB/node`` is then
    every process's loopback traffic, both nodes' included."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes

    def exec_prefix(self, k: int) -> list[str]:
        return ["env", "GLOO_SOCKET_IFNAME=lo"]

    def addr(self, k: int) -> str:
        return "127.0.0.1"


def _rate_bits(rate: str) -> int:
    units = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
    for unit, mult in units.items():
        if rate.endswith(unit):
            return int(float(rate[: -len(unit)]) * mult)
    raise ValueError(f"--rates: {rate!r} is not a rate like 100mbit, 1gbit or 'unlimited'")


def _list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILL what still runs inside one of our namespaces (left-over launchers after an error)."""
    pids = subprocess.run(
        ["ip", "netns", "pids", ns], capture_output=True, text=True
    ).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def check_root() -> str | None:
    """Why this machine cannot run the benchmark (one line), or None."""
    if os.geteuid() != 0:
        return (
            "benchmarks/testbeds/wan.py needs root (network namespaces, veth, tc): rerun with sudo"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"benchmarks/testbeds/wan.py needs `{tool}` (iproute2): install it"
    return None


# ----------------------------------------------------------------------------- runs
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_row(
    net: Network | Loopback, row: Row, rate: str, args: argparse.Namespace, workdir: str
) -> dict[str, Any]:
    """Launch one row (one torchrun agent per node namespace) and collect rank 0's result."""
    nodes = 1 if row.single else net.nodes
    out = os.path.join(workdir, f"{row.name}-{rate}")
    os.makedirs(out, exist_ok=True)
    torchft = row.method == "torchft"
    spec = dict(
        row.__dict__,
        steps=args.steps,
        h_base=args.h_base,
        output_dir=out,
        batch=args.batch,
        seq=args.seq,
        hidden=args.hidden,
        layers=args.layers,
        vocab=args.vocab,
        threads=args.threads,
        overlap_steps=args.overlap_steps,
        nodes=nodes,
        # the torchft rows' cross-node barrier
        barrier=f"{net.addr(0)}:{_free_port()}" if torchft else None,
    )
    spec_path = os.path.join(out, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    port = _free_port()
    env = dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        OMP_NUM_THREADS=str(args.threads),
        TOKENIZERS_PARALLELISM="false",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
    )
    procs = []
    try:
        if torchft:  # the Lighthouse that forms torchft's quorums, in node 0 on node 0's address
            lighthouse_port = _free_port()
            env["TORCHFT_LIGHTHOUSE"] = f"http://{net.addr(0)}:{lighthouse_port}"
            cmd = net.exec_prefix(0) + [
                _lighthouse_binary(),
                "--min_replicas",
                str(nodes),
                "--join_timeout_ms",
                "60000",
                "--quorum_tick_ms",
                "10",
                "--bind",
                f"{net.addr(0)}:{lighthouse_port}",
            ]
            log = open(os.path.join(out, "lighthouse.log"), "w")
            procs.append(
                (
                    subprocess.Popen(
                        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    ),
                    log,
                )
            )
        launchers = []
        for k in range(nodes):
            # torchft: every node its own replica group, a 1-rank
            # torchrun job with its own store on its own address
            separate = row.every_node or torchft
            cmd = net.exec_prefix(k) + [
                f"ALH_WAN_NODE={k}",
                f"REPLICA_GROUP_ID={k}",
                "nice",
                "-n",
                str(args.nice),
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(1 if separate else nodes),
                "--node_rank",
                str(0 if separate else k),
                "--nproc_per_node",
                str(row.ranks_per_node),
                "--master_addr",
                net.addr(k if separate else 0),  # every_node: k independent single-node jobs
                "--master_port",
                # distinct ports: the loopback test runs every node on lo
                str(_free_port() if torchft else port),
                os.path.abspath(__file__),
                "--worker",
                spec_path,
            ]
            log = open(os.path.join(out, f"node{k}.log"), "w")
            proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            procs.append((proc, log))
            launchers.append(proc)
        deadline = time.monotonic() + args.run_timeout
        for proc in launchers:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            if rc != 0:
                raise RuntimeError(
                    f"row {row.name} at {rate}: a launcher exited with {rc}; see {out}/node*.log"
                )
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
    results = []
    for name in sorted(os.listdir(out)):
        if name.startswith("result_"):
            with open(os.path.join(out, name)) as f:
                results.append(json.load(f))
    return summarize(row, rate, results)


def _lighthouse_binary() -> str:
    """torchft's ``torchft_lighthouse``, next to this
    interpreter (a virtual environment's bin/) or on PATH."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    found = shutil.which("torchft_lighthouse", path=path)
    if found is None:
        raise RuntimeError(
            TORCHFT_MISSING + " (no torchft_lighthouse next to the interpreter or on PATH)"
        )
    return found


def torchft_unavailable(row: Row, h_base: int) -> str | None:
    """Why a torchft row cannot run with these settings (one line), or None."""
    import importlib.util

    if row.method != "torchft":
        return None
    if importlib.util.find_spec("torchft") is None:
        return TORCHFT_MISSING
    if row.fragments > 1 and h_base % row.fragments:
        return (
            f"--h-base {h_base}: torchft's DiLoCo syncs one of {row.fragments} fragments every "
            f"h_base/{row.fragments} steps and needs h_base divisible by {row.fragments}"
        )
    return None


def summarize(row: Row, rate: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row from the per-rank results (kernel bytes
    per node, engine bytes per node, times)."""
    rank0 = next(r for r in results if r["rank"] == 0 and r["node"] == 0)
    nodes = sorted({r["node"] for r in results})
    tx = [
        sum(r["tx_bytes"] for r in results if r["node"] == n and r["local_rank"] == 0)
        for n in nodes
    ]
    engine = [sum(r["wire_bytes"] for r in results if r["node"] == n) for n in nodes]
    wall = rank0["train_seconds"]
    return dict(
        row=row.name,
        rate=rate,
        steps=rank0["steps"],
        steps_per_s=rank0["steps"] / wall,
        step_seconds=statistics.median(rank0["step_seconds"]) if rank0["step_seconds"] else wall,
        sync_share=rank0["sync_seconds"] / wall,
        # without the run's last sync, which blocks with or
        # without overlap (the run ends on one model)
        steady_share=(rank0["sync_seconds"] - rank0["last_sync_seconds"]) / wall,
        syncs=rank0["syncs"],
        tx_bytes_per_node=max(tx),
        engine_bytes_per_node=max(engine),
        losses=rank0["losses"],
        loss_times=rank0["loss_times"],
        outer_state_bytes=rank0["outer_state_bytes"],
        method=row.method,
        # streaming rows (docs/algorithm.md#fragments): one sync event per fragment per interval
        fragments=rank0.get("fragments", 0),
        sync_events=rank0["syncs"] * max(rank0.get("fragments", 0), 1),
        tx_bytes_per_event=max(tx) / max(rank0["syncs"] * max(rank0.get("fragments", 0), 1), 1),
        largest_fragment_share=(
            max(rank0["fragment_payload_bytes"]) / sum(rank0["fragment_payload_bytes"])
            if rank0.get("fragment_payload_bytes")
            else None
        ),
        peak_bits_per_s=max(r.get("peak_bits_per_s", 0.0) for r in results if r["local_rank"] == 0),
        train_seconds=wall,
        intervals=rank0.get("intervals", []),
        worker_steps=rank0.get("worker_steps"),
        aggregations=rank0.get("aggregations", {}),
    )


def time_to_target(losses: list[float], times: list[float], target: float) -> float | None:
    """Seconds until the mean of the last ``LOSS_WINDOW``
    losses (fewer at the start) first reaches ``target``."""
    for i in range(len(losses)):
        if statistics.fmean(losses[max(0, i - LOSS_WINDOW + 1) : i + 1]) <= target:
            return times[i]
    return None


def final_loss(losses: list[float]) -> float:
    return statistics.fmean(losses[-LOSS_WINDOW:])


def print_table(rows: list[dict[str, Any]], target_loss: float | None) -> None:
    header = (
        f"{'rate':>9} {'row':<21} {'steps/s':>7} {'x bound':>8} {'sync %':>7} {'steady %':>8} "
        f"{'syncs':>5} {'tx MB/node':>10} {'engine MB/node':>14} {'tx/engine':>9} {'target':>6} "
        f"{'s to target':>11} {'outer MB/rank':>13} {'F':>2} {'peak Mbit/s':>11} {'kB/event':>9}"
    )
    print(header)
    for rate in dict.fromkeys(r["rate"] for r in rows):
        mine = [r for r in rows if r["rate"] == rate]
        target = (
            target_loss if target_loss is not None else max(final_loss(r["losses"]) for r in mine)
        )
        # the lower bound under the same load
        local = next((r for r in mine if r["row"] == "local"), None)
        single = local or next((r for r in mine if r["method"] == "none"), None)
        for r in mine:
            share = f"{100 * r['sync_share']:>7.1f}"
            if r["method"] == "ddp" and single is not None:
                share = f"~{100 * max(0.0, 1 - single['step_seconds'] / r['step_seconds']):>6.1f}"
            ratio = (
                f"{r['tx_bytes_per_node'] / r['engine_bytes_per_node']:>9.4f}"
                if r["engine_bytes_per_node"]
                else f"{'-':>9}"
            )
            # torchft's rows: no engine, so no engine accounting
            engine = "-" if r["method"] == "torchft" else f"{r['engine_bytes_per_node'] / 1e6:.2f}"
            reach = time_to_target(r["losses"], r["loss_times"], target)
            vs_single = (
                f"{single['steps_per_s'] / r['steps_per_s']:>8.2f}" if single else f"{'-':>8}"
            )
            print(
                f"{rate:>9} {r['row']:<21} {r['steps_per_s']:>7.2f} {vs_single} {share} "
                f"{100 * r['steady_share']:>8.1f} {r['syncs']:>5} "
                f"{r['tx_bytes_per_node'] / 1e6:>10.2f} {engine:>14} {ratio} "
                f"{target:>6.2f} {reach if reach is None else round(reach, 1)!s:>11} "
                f"{r['outer_state_bytes'] / 1e6:>13.2f} {r.get('fragments') or '-':>2} "
                f"{r.get('peak_bits_per_s', 0.0) / 1e6:>11.1f} "
                f"{r['tx_bytes_per_event'] / 1e3 if r['syncs'] else 0.0:>9.1f}"
            )


def print_speed_table(rows: list[dict[str, Any]]) -> None:
    """The unequal-speed rows (docs/algorithm.md#pacing): the cluster's
    tokens per second, and the wall time to lockstep DiLoCo's final
    loss (the mean loss of all workers over the last 3 intervals)."""
    slow = [r for r in rows if r["row"].endswith(("-slow", "-slow-budget"))]
    if not slow:
        return
    print(
        f"{'rate':>9} {'row':<21} {'wall s':>7} {'tok/s':>8} {'x lockstep':>10} {'loss':>6} "
        f"{'s to target':>11} steps"
    )
    for rate in dict.fromkeys(r["rate"] for r in slow):
        mine = [r for r in slow if r["rate"] == rate]
        base = next((r for r in mine if r["row"] == "diloco-slow"), None)
        target = interval_loss(base) if base else None
        for r in mine:
            tokens = sum(tokens for _, _, tokens in r["intervals"])
            rate_tok = tokens / r["train_seconds"]
            vs = (
                # the f-string's field cannot break across lines before Python 3.12
                f"{rate_tok / (sum(t for _, _, t in base['intervals']) / base['train_seconds']):>10.2f}"  # noqa: E501
                if base
                else "-"
            )
            reach = interval_time_to(r, target) if target is not None else None
            print(
                f"{rate:>9} {r['row']:<21} {r['train_seconds']:>7.1f} {rate_tok:>8.0f} {vs:>10} "
                f"{interval_loss(r):>6.3f} {reach if reach is None else round(reach, 1)!s:>11} "
                f"{r['worker_steps']}"
            )


def interval_loss(row: dict[str, Any], window: int = 3) -> float:
    return statistics.fmean(loss for _, loss, _ in row["intervals"][-window:])


def interval_time_to(row: dict[str, Any], target: float, window: int = 3) -> float | None:
    """Seconds until the mean loss of the last ``window`` intervals first reaches ``target``."""
    for i in range(len(row["intervals"])):
        if (
            statistics.fmean(
                loss for _, loss, _ in row["intervals"][max(0, i - window + 1) : i + 1]
            )
            <= target
        ):
            return row["intervals"][i][0]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument(
        "--nodes", type=int, default=2, help="network namespaces (2: one veth pair; more: a bridge)"
    )
    parser.add_argument(
        "--rates", nargs="+", default=list(RATES), help="tbf egress rate per node, or 'unlimited'"
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=list(ROWS),
        help="default: every row (the torchft ones where they can run)",
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--h-base", type=int, default=10, help="DiLoCo H / AutoLoCo h_base (optimizer steps)"
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--overlap-steps",
        type=int,
        default=3,
        help="delayed rows: inner steps between a boundary and the merge of its average "
        "(below AutoLoCo's h_min)",
    )
    parser.add_argument(
        "--netns-prefix",
        default=WAN.prefix,
        help="namespace names <prefix><k> (one prefix per concurrent testbed)",
    )
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument("--target-loss", type=float, default=None)
    parser.add_argument(
        "--run-timeout", type=float, default=900.0, help="seconds per row before it is killed"
    )
    parser.add_argument("--json", help="also write every row's numbers to this file")
    parser.add_argument(
        "--smoke", action="store_true", help="CI: 2 nodes, unlimited, diloco, 4 steps, H=2"
    )
    parser.add_argument(
        "--from-json",
        nargs="+",
        metavar="JSON",
        help="print the tables of runs saved with --json (no namespaces)",
    )
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.from_json:
        for path in args.from_json:
            with open(path) as f:
                saved = json.load(f)
            print(path)
            print_table(saved, args.target_loss)
            print_speed_table(saved)
        return 0
    for rate in args.rates:
        if rate != "unlimited":
            _rate_bits(rate)
    if args.smoke:
        args.nodes, args.rates, args.rows, args.steps, args.h_base = (
            2,
            ["unlimited"],
            ["diloco"],
            4,
            2,
        )
        args.hidden, args.layers, args.vocab, args.seq = 32, 1, 128, 16
    reason = check_root()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    if args.rows is None:  # every row; a torchft row that cannot run here is left out, with a line
        args.rows = []
        for name, row in ROWS.items():
            why = torchft_unavailable(row, args.h_base)
            if why:
                print(f"{name} left out: {why}", file=sys.stderr)
            else:
                args.rows.append(name)
    for name in args.rows:  # asked for by name: refused before any namespace is built
        why = torchft_unavailable(ROWS[name], args.h_base)
        if why:
            print(f"{name}: {why}", file=sys.stderr)
            return 2
    rows = [ROWS[name] for name in args.rows]
    if any(r.ranks_per_node > 1 for r in rows) and args.nodes != 2:
        parser.error("--rows diloco-2x2-*: the 2 x 2 rows need --nodes 2")

    def interrupted(signum, frame):  # SIGTERM tears down like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    print(
        f"{args.nodes} nodes, rates {' '.join(args.rates)}, {args.steps} steps, H {args.h_base}, "
        f"MTU {args.mtu}, load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}",
        flush=True,
    )
    results = []
    workdir = tempfile.mkdtemp(prefix="alh-wan-")
    try:
        with Network(args.nodes, args.mtu, names_with_prefix(args.netns_prefix)) as net:
            # rows interleaved within each rate, so load swings hit them alike
            for rate in args.rates:
                net.set_rate(rate)
                for row in rows:
                    print(f"  {rate} {row.name} ...", flush=True)
                    results.append(run_row(net, row, rate, args, workdir))
    except KeyboardInterrupt:
        print("interrupted: namespaces removed", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
        return 130
    finally:
        if results:
            print_table(results, args.target_loss)
            print_speed_table(results)
        if args.json and results:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


# -----------------------------------------------------------------------------
# the user-style training script
def markov_sequences(vocab: int, n_seq: int, seq: int, draw_seed: int | None = None):
    """Sequences of a fixed random Markov chain with 4 successors per token: learnable, loss falls
    from ln(vocab) to ~ln(4). ``draw_seed``: other sequences of the same chain (a held-out set)."""
    import torch

    g = torch.Generator().manual_seed(1)
    successors = torch.randint(0, vocab, (vocab, 4), generator=g)
    if draw_seed is not None:
        g = torch.Generator().manual_seed(draw_seed)
    ids = torch.empty(n_seq, seq, dtype=torch.long)
    ids[:, 0] = torch.randint(0, vocab, (n_seq,), generator=g)
    for t in range(1, seq):
        ids[:, t] = successors[ids[:, t - 1], torch.randint(0, 4, (n_seq,), generator=g)]
    return ids


def worker(spec_path: str) -> int:
    """One rank: a tiny GPT-2 trained by ``Trainer`` (+
    ``AutoLoCoCallback`` unless the row is ``single``)."""
    with open(spec_path) as f:
        spec = json.load(f)
    if spec["method"] == "torchft":
        return torchft_worker(spec)
    import torch

    torch.set_num_threads(spec["threads"])
    import torch.distributed as dist
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    node = int(os.environ.get("ALH_WAN_NODE", rank // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    dev = os.environ.get("GLOO_SOCKET_IFNAME")
    torch.manual_seed(0)
    vocab, seq = spec["vocab"], spec["seq"]
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=vocab,
            n_positions=seq,
            n_embd=spec["hidden"],
            n_layer=spec["layers"],
            n_head=4,
        )
    )
    data = [
        {"input_ids": x, "labels": x}
        for x in markov_sequences(vocab, spec["steps"] * spec["batch"] * world, seq)
    ]

    def tx_bytes() -> int:
        if dev is None or local_rank != 0:
            return 0
        with open(f"/sys/class/net/{dev}/statistics/tx_bytes") as f:
            return int(f.read())

    sampler = TxSampler(tx_bytes)

    losses: list[float] = []
    loss_times: list[float] = []
    step_ends: list[float] = []
    marks: dict[str, float] = {}

    # the local loss of every step, without the Trainer's per-log gather
    class TimedTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            out = super().compute_loss(model, inputs, return_outputs=return_outputs, **kwargs)
            loss = out[0] if return_outputs else out
            losses.append(float(loss.detach()))
            return out

    # (seconds since start, mean loss of all workers, tokens) per sync
    intervals: list[tuple[float, float, int]] = []
    nodes = int(os.environ.get("WORLD_SIZE", "1")) // spec["ranks_per_node"]
    half_speed = spec["slow"] and node == nodes - 1

    class Meter(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if dist.is_initialized():
                dist.barrier()
            # the engine exists now: pick the row's overlapped lossy aggregation
            if autoloco is not None:
                autoloco.engine.comm.overlap_aggregation = spec["overlap_aggregation"]
            marks["tx0"], marks["t0"] = tx_bytes(), time.perf_counter()
            sampler.start()

        def on_step_begin(self, args, state, control, **kwargs):
            marks["step"] = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            # an injected delay as long as the step's own work: this node runs at half speed
            if half_speed:
                time.sleep(time.perf_counter() - marks["step"])

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            step_ends.append(now)
            loss_times.append(now - marks["t0"])
            records = autoloco.engine.records if autoloco is not None else []
            if len(records) > len(intervals):
                intervals.append((now - marks["t0"], records[-1].mean_loss, records[-1].tokens))

        def on_train_end(self, args, state, control, **kwargs):
            marks["t1"] = time.perf_counter()
            sampler.stop()
            if dist.is_initialized():
                dist.barrier()
            marks["tx1"] = tx_bytes()

    callbacks: list[Any] = []
    autoloco = None
    if spec["method"] != "none":
        config = dict(
            method=spec["method"],
            h_base=spec["h_base"],
            wire_dtype=spec["wire_dtype"],
            ranks_per_worker=spec["ranks_per_worker"],
            pacing=spec["pacing"],
        )
        if spec["method"] == "autoloco":
            q_h = max(1, spec["h_base"] // 5)
            # h_min a multiple of q_H
            config.update(h_min=max(q_h, spec["h_base"] // 2 // q_h * q_h), q_h=q_h)
            config["controller"] = "paper"  # the committed link rows' rule
        if spec.get("error_feedback"):
            config["error_feedback"] = True
        if spec.get("topk_fraction"):
            config["topk_fraction"] = spec["topk_fraction"]
        if spec["ranks_per_worker"] > 1:
            config["hierarchical_sync"] = spec["hierarchical"]
        if spec["overlap"] != "none":
            config.update(overlap=spec["overlap"], overlap_steps=spec["overlap_steps"])
            # every step has the same tokens here;
            if spec["method"] == "autoloco" and not spec["fragments"]:
                config["map_tokens"] = (
                    # without the mapper intervals are >= h_min: a merge may land h_min - 1 late
                    False
                )
        # streaming rows: H never below h_base, every fragment's merge before the next sync
        if spec["fragments"]:
            fragments = spec["fragments"]
            config["fragments"] = fragments
            if spec["method"] == "autoloco":
                config["h_min"] = spec["h_base"]
            if spec["overlap"] != "none":
                config["overlap_steps"] = min(
                    spec["overlap_steps"], spec["h_base"] // fragments - 1
                )
        autoloco = AutoLoCoCallback(AutoLoCoConfig(**config), log_metrics=False)
        callbacks.append(autoloco)
    callbacks.append(Meter())
    args = TrainingArguments(
        output_dir=spec["output_dir"],
        per_device_train_batch_size=spec["batch"],
        max_steps=spec["steps"],
        learning_rate=3e-3,
        warmup_steps=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=10**6,
        dataloader_num_workers=0,
        seed=0,
        ddp_broadcast_buffers=False,
    )
    TimedTrainer(model=model, args=args, train_dataset=data, callbacks=callbacks).train()
    totals = autoloco.engine.totals if autoloco is not None else None
    outer = (
        autoloco.engine.outer
        if autoloco is not None and autoloco.engine.outer is not None
        else None
    )
    steps_between = [b - a for a, b in zip(step_ends, step_ends[1:])]
    result = dict(
        rank=rank,
        node=node,
        local_rank=local_rank,
        steps=len(step_ends),
        train_seconds=marks["t1"] - marks["t0"],
        step_seconds=steps_between,
        sync_seconds=totals.sync_seconds if totals else 0.0,
        last_sync_seconds=autoloco.engine.records[-1].sync_seconds
        if autoloco and autoloco.engine.records
        else 0.0,
        syncs=totals.syncs if totals else 0,
        wire_bytes=totals.wire_bytes if totals else 0,
        tx_bytes=marks["tx1"] - marks["tx0"],
        losses=losses,
        loss_times=loss_times,
        outer_state_bytes=_outer_state_bytes(outer) if outer is not None else 0,
        peak_bits_per_s=sampler.peak_rate(PEAK_WINDOW_S) * 8,
        tx_samples=len(sampler.samples),
        fragments=autoloco.engine.config.fragments if autoloco is not None else 0,
        fragment_payload_bytes=list(getattr(autoloco.engine, "fragment_payload_bytes", []))
        if autoloco
        else [],
        intervals=intervals,
        worker_steps=autoloco.engine.records[-1].worker_steps
        if autoloco and autoloco.engine.records
        else None,
        aggregations=dict(getattr(autoloco.engine.comm, "aggregations", {})) if autoloco else {},
    )
    with open(os.path.join(spec["output_dir"], f"result_node{node}_rank{rank}.json"), "w") as f:
        json.dump(result, f)
    return 0


def torchft_worker(spec: dict[str, Any]) -> int:
    """One replica group of the torchft rows: torchft's
    ``DiLoCo`` around a plain PyTorch loop on the same model.

    torchft's DiLoCo hooks the inner optimizer's ``step`` and needs a ``Manager`` (quorum from the
    Lighthouse, a reconfigurable gloo group across replica groups), which the Trainer cannot host
    without patching its loop, so this loop does by hand what the Trainer does for the other rows:
    the same model (seed 0), the same sequences (``markov_sequences``, each node a disjoint shard,
    shuffled with seed 0: the order differs from the Trainer's sampler), batch, fused AdamW (lr
    3e-3, Trainer's defaults otherwise), linear schedule with 2 warmup steps, gradient clipping at
    1.0, dropout on, and the loss normalized as the Trainer does. The outer step is the project's
    DiLoCo defaults (Nesterov SGD, ``outer_lr``, ``outer_momentum``); the delayed row merges with
    ``fragment_update_alpha = overlap_mix``. ``sync_seconds`` is the time spent inside torchft's
    post-step hook (quorum, pseudo-gradients, starting and waiting for the all-reduce, outer step),
    so it is the blocked sync time, measured directly.
    """
    try:
        from torchft.local_sgd import DiLoCo
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo
    except ImportError:
        print(TORCHFT_MISSING, file=sys.stderr)
        return 2
    from datetime import timedelta

    import torch

    torch.set_num_threads(spec["threads"])
    from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

    from autoloco_hf import AutoLoCoConfig
    from autoloco_hf.sync.engine.fragments import split_fragments

    node, nodes = int(os.environ["ALH_WAN_NODE"]), spec["nodes"]
    h_base, fragments = spec["h_base"], max(spec["fragments"], 1)
    # torchft's delay: the fragment's all-reduce starts `delay` steps before
    # its merge, as the project's delayed rows start it `overlap_steps`
    # steps before theirs (one fragment in flight: delay < h_base / F)
    delay = min(spec["overlap_steps"], h_base // fragments - 1) if spec["overlap"] != "none" else 0
    defaults = AutoLoCoConfig(method="diloco", h_base=h_base)
    dev = os.environ.get("GLOO_SOCKET_IFNAME")
    addr = spec["barrier"].rsplit(":", 1)[0] if node == 0 else os.environ["MASTER_ADDR"]

    torch.manual_seed(0)
    vocab, seq, batch, steps = spec["vocab"], spec["seq"], spec["batch"], spec["steps"]
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=vocab,
            n_positions=seq,
            n_embd=spec["hidden"],
            n_layer=spec["layers"],
            n_head=4,
        )
    )
    model.train()
    data = markov_sequences(vocab, steps * batch * nodes, seq)
    shard = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[node::nodes]
    params = list(model.parameters())
    # the project's layout (docs/algorithm.md#fragment-layout):
    # contiguous tensors, balanced by elements
    if fragments > 1:
        layout = split_fragments([p.numel() for p in params], fragments)
        pieces: list[torch.nn.Module] = []
        for frag in layout:
            piece = torch.nn.Module()
            piece.params = torch.nn.ParameterList(params[frag.first : frag.last])
            pieces.append(piece)
        outer: Any = [
            torch.optim.SGD(
                piece.parameters(),
                lr=defaults.outer_lr,
                momentum=defaults.outer_momentum,
                nesterov=True,
            )
            for piece in pieces
        ]
    else:
        pieces = [model]
        outer = torch.optim.SGD(
            params, lr=defaults.outer_lr, momentum=defaults.outer_momentum, nesterov=True
        )
    # the Trainer's adamw_torch_fused
    inner = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0, fused=True)
    schedule = get_linear_schedule_with_warmup(inner, num_warmup_steps=2, num_training_steps=steps)

    # a cross-node barrier on node 0's store (the other rows
    # use torch.distributed's), around the measured loop
    store = torch.distributed.TCPStore(
        spec["barrier"].rsplit(":", 1)[0],
        int(spec["barrier"].rsplit(":", 1)[1]),
        is_master=node == 0,
        timeout=timedelta(seconds=300),
        wait_for_workers=False,
    )

    def barrier(name: str) -> None:
        store.set(f"{name}/{node}", "1")
        store.wait([f"{name}/{k}" for k in range(nodes)])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=120)),
        load_state_dict=None,
        state_dict=None,
        min_replica_size=nodes,
        use_async_quorum=False,  # DiLoCo requires it
        replica_id=f"alh_wan_{node}",
        hostname=addr,
        init_sync=False,  # every node builds the same model from seed 0
        timeout=timedelta(seconds=120),
        quorum_timeout=timedelta(seconds=300),
        connect_timeout=timedelta(seconds=60),
    )

    def tx_bytes() -> int:
        if dev is None:
            return 0
        with open(f"/sys/class/net/{dev}/statistics/tx_bytes") as f:
            return int(f.read())

    events: list[float] = []  # seconds blocked in each fragment's merge step (one per sync event)
    blocked = [0.0]  # seconds inside torchft's hook, summed

    class TimedDiLoCo(DiLoCo):
        """torchft's DiLoCo, timing its post-step hook (everything it does for synchronization)."""

        def _step_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
            start = time.perf_counter()
            merged = self._local_step + 1 == self._sync_every  # this call syncs (merges) a fragment
            super()._step_post_hook(optimizer, args, kwargs)
            seconds = time.perf_counter() - start
            blocked[0] += seconds
            if merged:
                events.append(seconds)

    # the first quorum (the Lighthouse, connecting the gloo group) before the clock starts, as the
    # other rows connect their process group before training
    manager.start_quorum()
    manager.wait_quorum()
    sampler = TxSampler(tx_bytes)
    losses: list[float] = []
    loss_times: list[float] = []
    step_ends: list[float] = []
    with TimedDiLoCo(
        manager,
        pieces,
        inner,
        outer,
        sync_every=h_base,
        should_quantize=False,  # needs triton and an accelerator (docs/benchmarks.md)
        fragment_sync_delay=delay,
        fragment_update_alpha=defaults.overlap_mix if delay else 0.0,
    ) as diloco:
        barrier("begin")
        tx0, t0 = tx_bytes(), time.perf_counter()
        sampler.start()
        for i in range(steps):
            ids = data[shard[i * batch : (i + 1) * batch]]
            inner.zero_grad()
            # the loss over the labels the Trainer counts (all of
            # them: GPT-2 sets no loss_type), so the scale matches
            loss = model(
                input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(ids.numel())
            ).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            inner.step()  # torchft's hooks synchronize here every h_base / F steps
            schedule.step()
            now = time.perf_counter()
            losses.append(float(loss.detach()))
            step_ends.append(now)
            loss_times.append(now - t0)
        t1 = time.perf_counter()
        sampler.stop()
        barrier("end")
        tx1 = tx_bytes()
    commits = manager.current_step()  # one per committed fragment sync
    if commits != len(events):
        raise RuntimeError(
            f"torchft committed {commits} of {len(events)} syncs (should_commit refused the rest)"
        )
    backup = sum(
        t.numel() * t.element_size()
        for f in diloco._fragments
        for t in f.original_parameters.values()
    )
    momentum = sum(
        state["momentum_buffer"].numel() * state["momentum_buffer"].element_size()
        for opt in (outer if isinstance(outer, list) else [outer])
        for state in opt.state.values()
        if state.get("momentum_buffer") is not None
    )
    sizes = [sum(p.numel() for p in piece.parameters()) * 4 for piece in pieces]
    result = dict(
        rank=0,
        node=node,
        local_rank=0,
        steps=len(step_ends),
        train_seconds=t1 - t0,
        step_seconds=[b - a for a, b in zip(step_ends, step_ends[1:])],
        sync_seconds=blocked[0],
        last_sync_seconds=events[-1] if events else 0.0,
        syncs=len(events) // fragments,  # whole-model rounds, as the engine counts intervals
        wire_bytes=0,  # no engine accounting: the kernel's bytes only
        tx_bytes=tx1 - tx0,
        losses=losses,
        loss_times=loss_times,
        # the FP32 backup of the global parameters plus the momentum
        outer_state_bytes=backup + momentum,
        peak_bits_per_s=sampler.peak_rate(PEAK_WINDOW_S) * 8,
        tx_samples=len(sampler.samples),
        fragments=spec["fragments"],
        fragment_payload_bytes=sizes if fragments > 1 else [],
        intervals=[],
        worker_steps=None,
        sync_events=len(events),
        commits=commits,
        fragment_sync_delay=delay,
    )
    with open(os.path.join(spec["output_dir"], f"result_node{node}_rank0.json"), "w") as f:
        json.dump(result, f)
    if node != 0:
        store.set(f"left/{node}", "1")  # the last use of node 0's store
    else:
        # keep the store up until every node is done with it
        store.wait([f"left/{k}" for k in range(1, nodes)])
    manager.shutdown(wait=False)
    return 0


class TxSampler:
    """Reads the interface's kernel ``tx_bytes`` every
    ``period`` seconds on a thread, from train begin to end."""

    def __init__(self, read: Any, period: float = SAMPLE_PERIOD_S) -> None:
        import threading

        self.read, self.period = read, period
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tx-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), self.read()))
            self._stop.wait(self.period)
        self.samples.append((time.perf_counter(), self.read()))

    def peak_rate(self, window: float) -> float:
        """Largest bytes/s over any span of at least ``window``
        seconds between two samples (0 without traffic)."""
        return peak_rate(self.samples, window)


def peak_rate(samples: list[tuple[float, int]], window: float) -> float:
    """Largest ``(b_j - b_i) / (t_j - t_i)`` over sample
    pairs, ``j`` the first sample ``window`` after ``i``."""
    best, j = 0.0, 0
    for i, (t_i, b_i) in enumerate(samples):
        j = max(j, i + 1)
        while j < len(samples) and samples[j][0] - t_i < window:
            j += 1
        if j == len(samples):
            break
        t_j, b_j = samples[j]
        best = max(best, (b_j - b_i) / (t_j - t_i))
    return best


def _outer_state_bytes(outer: Any) -> int:
    """FP32 outer parameters plus momentum held by this rank."""
    params = outer.params.numel() * outer.params.element_size()
    momentum = outer.momentum_buffer
    return params + (momentum.numel() * momentum.element_size() if momentum is not None else 0)


if __name__ == "__main__":
    sys.exit(main())
