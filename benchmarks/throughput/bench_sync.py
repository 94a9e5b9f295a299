"""Cost of one outer synchronization on real gloo processes
(docs/algorithm.md#wire-codecs, #accounting).

Not a test. Spawns ``--world-size`` gloo processes on this machine (one thread each)
and times, for a flat FP32 buffer of each ``--sizes`` with a transformer-like segment
layout (a few hundred tensors):

* ``all_reduce``: a bare ``dist.all_reduce`` of the same buffer (the reference);
* ``average <wire>``: :meth:`ProcessGroupCommunicator.average` with that
  wire (FP32: bucketed all-reduce; every lossy wire: owner-reduce over all_to_all_single),
  including the float64 scalar vector the engine sends with it;
* ``gathered <wire>``: a lossy wire's overlapped average (``start_average``: the all-gather of the
  encoded buffers, decoded and summed at the merge) waited for at once.

Median of ``--repeats`` runs after one warm-up, rank 0's clock, a barrier before each
run; the methods take turns within each repeat (interleaved), and ``x bare`` is the
median over repeats of each method's time over the bare all-reduce timed just before
it (``max x``: the largest), so a load swing hits both sides of a ratio alike. Also printed: wire
bytes one worker sends (ring ``2 (N-1)/N`` for the all-reduces, exact all_to_all splits for
owner-reduce), the encode / collective / decode split that the communicator reports, and the codec's
encode+decode throughput on the whole buffer into persistent wire buffers (``_median_seconds`` of
``bench_codec_throughput.py``).

    python benchmarks/throughput/bench_sync.py [--sizes 16M 64M] [--world-size 2] [--repeats 5]

Processes on one machine talk over loopback, so "collective" is memory bandwidth and
gloo overhead, not a network: on a real cluster the wire bytes matter far more.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# benchmarks/: its kinds import as packages
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from throughput.bench_codec_throughput import _median_seconds, _parse_size  # noqa: E402

from autoloco_hf.sync.communicators import ProcessGroupCommunicator  # noqa: E402
from autoloco_hf.wire.codec import WireCodec  # noqa: E402

WIRES = ("fp32", "bf16", "int8", "int4", "fp4", "int2")


def block_layout(h: int, layers: int = 24, vocab: int = 32000) -> list[int]:
    """Segment sizes at hidden size ``h``: per block 2 norms, q/k/v/o (h x h), gate/up/down
    (h x 8h/3); embedding and head (vocab x h) and a final norm."""
    f = (8 * h // 3 + 63) // 64 * 64
    block = [h, h * h, h * h, h * h, h * h, h, h * f, h * f, f * h]
    return [vocab * h] + block * layers + [h, vocab * h]


def transformer_layout(numel: int, layers: int = 24, vocab: int = 32000) -> list[int]:
    """Segment sizes of a Llama-like model with ``layers`` blocks and ``numel`` parameters in total.

    ``h`` is the largest multiple of 64 that fits (:func:`block_layout`); the embedding absorbs
    the remainder so that the total is exactly ``numel``.
    """
    h = 64
    while sum(block_layout(h + 64, layers, vocab)) <= numel:
        h += 64
    out = block_layout(h, layers, vocab)
    out[0] += numel - sum(out)
    if out[0] <= 0:
        raise ValueError(f"{numel} elements are too few for a {layers}-layer layout")
    return out


def _timed_interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int
) -> tuple[dict[str, list[float]], dict]:
    """Every ``fn``'s seconds per repeat, the methods taking
    turns within each repeat, and each one's results.

    Interleaved so that a load swing on a shared machine hits the reference and
    the codec paths alike: their per-repeat ratios compare like with like.
    """
    for fn in fns.values():  # warm-up: allocator, gloo pairs, codec construction
        dist.barrier()
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    results: dict[str, list] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            dist.barrier()
            t0 = time.perf_counter()
            results[name].append(fn())
            times[name].append(time.perf_counter() - t0)
    return times, results


def _worker(
    rank: int, world_size: int, port: int, sizes: list[int], repeats: int, threads: int, queue
) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=600),
    )
    rows = []
    for numel in sizes:
        segments = transformer_layout(numel)
        gen = torch.Generator().manual_seed(rank)
        magnitudes = torch.cat([torch.full((s,), 10.0 ** -(i % 4)) for i, s in enumerate(segments)])
        x = torch.randn(numel, generator=gen) * magnitudes
        scalars = torch.arange(9, dtype=torch.float64)
        ring = 2 * (world_size - 1) * 4 * numel // world_size

        buf = torch.empty_like(x)

        def bare() -> None:
            buf.copy_(x)  # inside the timer, like average()'s own copy; ~1% of the all-reduce
            dist.all_reduce(buf)

        comms = {wire: ProcessGroupCommunicator(wire_dtype=wire) for wire in WIRES}
        fns: dict[str, Callable[[], Any]] = {"all_reduce fp32": bare}
        for wire, comm in comms.items():
            fns[f"average {wire}"] = lambda comm=comm: comm.average([x], [scalars], segments)
        # the overlapped lossy average's all-gather, waited for at once
        for wire, comm in list(comms.items())[1:]:
            fns[f"gathered {wire}"] = lambda comm=comm: comm.start_average(
                [x], [scalars], segments
            ).wait()
        times, results = _timed_interleaved(fns, repeats)
        reference = times["all_reduce fp32"]
        for name, seconds in times.items():
            row = dict(
                numel=numel,
                segments=len(segments),
                method=name,
                seconds=statistics.median(seconds),
                times=seconds,
                # per repeat, over the bare all-reduce timed right before it
                x_bare=statistics.median(t / ref for t, ref in zip(seconds, reference)),
                x_bare_max=max(t / ref for t, ref in zip(seconds, reference)),
                wire_bytes=ring,
            )
            if name != "all_reduce fp32":
                row["wire_bytes"] = results[name][0].traffic.wire_bytes
                row.update(
                    {
                        k: statistics.median(getattr(r.traffic, k) for r in results[name])
                        for k in ("encode_seconds", "collective_seconds", "decode_seconds")
                    }
                )
            rows.append(row)
        if rank == 0:
            for wire in WIRES[1:]:
                codec = WireCodec(wire, segments)
                bufs, out = codec.empty_wire(0, numel), torch.empty_like(x)
                t_rt = _median_seconds(
                    lambda: codec.decode(codec.encode(x, 0, out=bufs), 0, numel, out=out),
                    repeats,
                    x.device,
                )
                rows.append(
                    dict(
                        numel=numel,
                        segments=len(segments),
                        method=f"codec {wire}",
                        gbps=4 * numel / 1e9 / t_rt,
                    )
                )
        dist.barrier()
        # free this size's buffers before the next size allocates its own
        x = buf = magnitudes = None
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", nargs="+", default=["16M", "64M"], help="FP32 elements, e.g. 16M"
    )
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument(
        "--json", help="also write every row (each repeat's seconds included) to this file"
    )
    args = parser.parse_args()
    sizes = [_parse_size(s) for s in args.sizes]
    for text, numel in zip(args.sizes, sizes):
        try:
            transformer_layout(numel)
        except ValueError as err:  # the layout the timings assume needs a few million elements
            least = sum(block_layout(64))
            parser.error(f"--sizes {text}: {err}; give at least {least} (e.g. 6M)")

    print(
        f"torch {torch.__version__}, gloo, {args.world_size} processes x {args.threads} thread(s), "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), load average "
        f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}, median of {args.repeats} "
        "interleaved after 1 warm-up"
    )
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(
        _worker,
        args=(args.world_size, _free_port(), sizes, args.repeats, args.threads, queue),
        nprocs=args.world_size,
        start_method="spawn",
    )
    rows = queue.get()

    print(
        f"{'elements':>12} {'segs':>4} {'method':<16} {'seconds':>8} {'x bare':>7} {'max x':>6} "
        f"{'wire MB/worker':>15} {'x fp32':>7} {'encode s':>9} {'collect. s':>10} {'decode s':>9}"
    )
    for numel in sizes:
        mine = [r for r in rows if r["numel"] == numel and "seconds" in r]
        bare = mine[0]
        for r in mine:
            split = (
                f"{r['encode_seconds']:>9.3f} {r['collective_seconds']:>10.3f} "
                f"{r['decode_seconds']:>9.3f}"
                if "encode_seconds" in r
                else f"{'':>9} {'':>10} {'':>9}"
            )
            print(
                f"{numel:>12,} {r['segments']:>4} {r['method']:<16} {r['seconds']:>8.3f} "
                f"{r['x_bare']:>7.2f} {r['x_bare_max']:>6.2f} {r['wire_bytes'] / 1e6:>15.2f} "
                f"{r['wire_bytes'] / bare['wire_bytes']:>7.4f} {split}"
            )
    print(
        "codec encode+decode of the whole buffer into persistent buffers "
        "(rank 0), GB/s of FP32 input:"
    )
    for r in rows:
        if "gbps" in r:
            print(f"{r['numel']:>12,} {r['segments']:>4} {r['method']:<16} {r['gbps']:>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"load_average": os.getloadavg(), "torch": torch.__version__, "rows": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
