"""Encode/decode throughput of the pseudo-gradient wire codecs (docs/algorithm.md#wire-codecs).

Not a test: prints GB/s of FP32 input processed (4 bytes per element) for
encode, decode and encode+decode of any wire (bf16, int8, int4, fp4, int2; ``--topk``
adds each blockwise wire sparsified to that fraction), median of
``--repeats`` runs after one warm-up, so that the codec's cost can be compared
with the time an outer synchronization spends on the network. ``encode`` /
``decode`` write into persistent wire buffers (``out=``, what the communicator
does); ``enc+dec fresh`` allocates the outputs on every call. The ``copy`` row is
the physical limit: a plain ``torch`` copy of the same FP32 buffer into a
preallocated one.

    python benchmarks/throughput/bench_codec_throughput.py [--sizes 16M 64M] [--device cuda] \
        [--threads 8]
    # the issue-36 run (docs/benchmarks.md)
    python benchmarks/throughput/bench_codec_throughput.py --threads 1 --sizes 16M \
        --wires int8 int4 fp4 int2 --topk 0.02 --json results/codec_speed/codec_throughput.json
    python benchmarks/throughput/bench_codec_throughput.py --threads 1 --sizes 16M \
        --wires int4 fp4 int2 --kernels eager compiled --repeats 7 \
        --json results/codec_speed/codec_kernels.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from autoloco_hf.config import BLOCKWISE_WIRES, GRID_WIRES, WIRE_DTYPES, CodecKernel
from autoloco_hf.wire.codec import WireCodec


def _parse_size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1].upper()] if text[-1].upper() in mult else int(text)


def _median_seconds(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    return statistics.median(_seconds(fn, repeats, device))


def _once(fn: Callable[[], object], device: torch.device) -> float:
    """One call's wall time (a GPU's queued work included)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _seconds(fn: Callable[[], object], repeats: int, device: torch.device) -> list[float]:
    """Every repeat's wall time after one warm-up call (allocator, kernels)."""
    fn()
    return [_once(fn, device) for _ in range(repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["16M", "64M"], help="elements, e.g. 16M")
    parser.add_argument("--wires", nargs="+", default=["bf16", "int8"], choices=WIRE_DTYPES)
    parser.add_argument(
        "--topk", type=float, default=None, help="also each blockwise wire with this topk_fraction"
    )
    parser.add_argument(
        "--kernels",
        nargs="+",
        default=["eager"],
        choices=[k.value for k in CodecKernel],
        help="codec_kernel values, timed interleaved (compiled: the int4, fp4 and int2 wires only)",
    )
    parser.add_argument("--json", default=None, help="write every repeat's times here")
    parser.add_argument("--block-size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    args = parser.parse_args()

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"torch {torch.__version__}, device {device}, torch.get_num_threads() = "
        f"{torch.get_num_threads()}, block_size {args.block_size}, median of {args.repeats}"
    )
    header = (
        "wire",
        "elements",
        "encode GB/s",
        "decode GB/s",
        "enc+dec GB/s",
        "enc+dec fresh",
        "wire/fp32",
    )
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (16, 12, 12, 12, 13, 14, 10))))
    gen = torch.Generator().manual_seed(0)
    wires = [(w, None) for w in args.wires]
    wires += [(w, args.topk) for w in args.wires if args.topk is not None and w in BLOCKWISE_WIRES]
    raw: dict = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "block_size": args.block_size,
        "rows": [],
    }
    for size in args.sizes:
        numel = _parse_size(size)
        x = torch.randn(numel, generator=gen).to(device)
        gb = 4 * numel / 1e9
        copy = torch.empty_like(x)
        copies = _seconds(lambda: copy.copy_(x), args.repeats, device)
        t_copy = statistics.median(copies)
        raw["rows"].append({"wire": "copy", "elements": numel, "copy_s": copies})
        print(
            f"{'copy':>16} {numel:>12,} {gb / t_copy:>12.2f} {'':>12} "
            f"{'':>13} {'':>14} {1.0:>10.4f}"
        )
        for wire, topk in wires:
            kernels = [k for k in args.kernels if k == "eager" or wire in GRID_WIRES]
            codecs = {k: WireCodec(wire, [numel], args.block_size, topk, k) for k in kernels}
            bufs = {k: codec.empty_wire(0, numel, device) for k, codec in codecs.items()}
            # warm-up: allocator, and the compiled kernel's compilation
            for k, codec in codecs.items():
                codec.encode(x, 0, out=bufs[k])
                codec.decode(bufs[k], 0, numel, out=copy)
            times = {k: {"encode_s": [], "decode_s": [], "fresh_s": []} for k in kernels}
            # the kernels interleaved, repeat by repeat: the same moment of the machine
            for _ in range(args.repeats):
                for k, codec in codecs.items():
                    times[k]["encode_s"].append(
                        _once(lambda: codec.encode(x, 0, out=bufs[k]), device)
                    )
                    times[k]["decode_s"].append(
                        _once(lambda: codec.decode(bufs[k], 0, numel, out=copy), device)
                    )
                    times[k]["fresh_s"].append(_once(lambda: codec.roundtrip(x, 0), device))
            for k, codec in codecs.items():
                t_enc, t_dec, t_fresh = (
                    statistics.median(times[k][key]) for key in ("encode_s", "decode_s", "fresh_s")
                )
                ratio = codec.wire_bytes(0, numel) / (4 * numel)
                name = (wire if topk is None else f"{wire}+top{topk:g}") + (
                    "" if k == "eager" else f" {k}"
                )
                raw["rows"].append({"wire": name, "kernel": k, "elements": numel, **times[k]})
                print(
                    f"{name:>16} {numel:>12,} {gb / t_enc:>12.2f} {gb / t_dec:>12.2f} "
                    f"{gb / (t_enc + t_dec):>13.2f} {gb / t_fresh:>14.2f} {ratio:>10.4f}"
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
