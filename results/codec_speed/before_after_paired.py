"""Paired before/after codec timing (issue 36): the base kernels and today's, alternating in one process.

Encode + decode of 16M FP32 elements (one tensor, block 4096, one thread, persistent
wire buffers), the two implementations taking turns repeat by repeat (the order
flipped every round), so that the load of a shared machine hits both alike; the
speed-up is per round. The base package is imported under another name:

    git archive 47ecdaa autoloco_hf | tar -x -C /tmp/old && mv /tmp/old/autoloco_hf /tmp/old/autoloco_old
    grep -rl autoloco_hf /tmp/old/autoloco_old | xargs sed -i s/autoloco_hf/autoloco_old/g
    OLD_PKG_DIR=/tmp/old PYTHONPATH=$PWD python results/codec_speed/before_after_paired.py 7 \
        results/codec_speed/before_after_paired.json
"""

import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.environ.get("OLD_PKG_DIR", "/tmp/old"))
from autoloco_old.sync.codec import WireCodec as Old  # noqa: E402

from autoloco_hf.sync.codec import WireCodec as New  # noqa: E402

WIRES = [(w, None) for w in ("int8", "int4", "fp4", "int2")] + [(w, 0.02) for w in ("int8", "int4", "fp4", "int2")]


def main() -> None:
    torch.set_num_threads(1)
    n = 1 << 24
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    out = torch.empty(n)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    gb = 4 * n / 1e9
    res = {}
    for wire, topk in WIRES:
        name = wire if topk is None else f"{wire}+top{topk:g}"
        codecs = {}
        for tag, cls in (("before", Old), ("after", New)):
            codec = cls(wire, [n], block_size=4096, topk_fraction=topk)
            bufs = codec.empty_wire(0, n, torch.device("cpu"))
            codec.encode(x, 0, out=bufs)
            codec.decode(bufs, 0, n, out=out)
            codecs[tag] = (codec, bufs)
        times: dict[str, list[list[float]]] = {"before": [], "after": []}
        for i in range(rounds if topk is None else max(2, rounds // 2)):  # the base top-k takes ~2 s a call
            for tag in ("before", "after") if i % 2 == 0 else ("after", "before"):
                codec, bufs = codecs[tag]
                t0 = time.perf_counter()
                codec.encode(x, 0, out=bufs)
                t1 = time.perf_counter()
                codec.decode(bufs, 0, n, out=out)
                times[tag].append([t1 - t0, time.perf_counter() - t1])
        res[name] = times
        speed = {tag: [gb / (e + d) for e, d in t] for tag, t in times.items()}
        ratios = [(b[0] + b[1]) / (a[0] + a[1]) for b, a in zip(times["before"], times["after"])]
        print(
            f"{name:14s} "
            + "  ".join(f"{tag} {statistics.median(v):5.2f} [{min(v):.2f}-{max(v):.2f}]" for tag, v in speed.items())
            + f"  speedup median {statistics.median(ratios):5.1f} [{min(ratios):.1f}-{max(ratios):.1f}]",
            flush=True,
        )
    out_path = sys.argv[2] if len(sys.argv) > 2 else "before_after_paired.json"
    with open(out_path, "w") as f:
        json.dump({"elements": n, "threads": 1, "block_size": 4096, "seconds_encode_decode": res}, f, indent=1)


if __name__ == "__main__":
    main()
