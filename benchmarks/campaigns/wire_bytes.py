"""Bytes one worker sends per synchronization, per wire format, at N = 2, 4 and 8 workers
(docs/algorithm.md#owner-reduce).

Not a timing: exact byte counts from the package's accounting
(``autoloco_hf.wire.accounting.wire_bytes_sent``: the owner-reduce's ``all_to_all``
splits leaving the worker, which tests/sync/test_communicators.py checks against
what gloo is handed; the FP32 ring all-reduce's ``2 (N-1)/N`` times the buffer).
Next to it, what an all-gather of each worker's whole compressed buffer would
send, ``(N-1)`` times that buffer, and the largest ``N`` at which that
all-gather still sends fewer bytes than the FP32 ring.

The model is a decoder-only transformer layout (tensor sizes below, ~58M
parameters), so blocks are cut at tensor boundaries as in training.

    # writes results/wire_bytes/wire_bytes.json
    python benchmarks/campaigns/wire_bytes.py
    # prints the markdown table of the committed JSON
    python benchmarks/campaigns/wire_bytes.py --table
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULT = Path(__file__).resolve().parents[2] / "results" / "wire_bytes" / "wire_bytes.json"
WORKERS = (2, 4, 8)
FORMATS = (
    ("fp32", None),
    ("bf16", None),
    ("int8", None),
    ("int4", None),
    ("fp4", None),
    ("int2", None),
    ("int4", 0.02),
    ("int2", 0.02),
    ("int2", 0.01),
)


def model_layout(
    hidden: int = 512, ffn: int = 2048, vocab: int = 32_000, layers: int = 8
) -> list[int]:
    """Tensor sizes of a decoder-only transformer: embedding,
    per layer norm + q/k/v/o + norm + gate/up/down, head."""
    sizes = [vocab * hidden]
    for _ in range(layers):
        sizes += [hidden, *[hidden * hidden] * 4, hidden, *[hidden * ffn] * 3]
    return sizes + [hidden, vocab * hidden]


def label(wire: str, topk: float | None) -> str:
    return wire if topk is None else f"{wire} top-{topk:g}"


def measure(block_size: int = 4096) -> dict:
    from autoloco_hf.wire.accounting import wire_bytes_sent
    from autoloco_hf.wire.codec import WireCodec

    sizes = model_layout()
    numel = sum(sizes)
    rows = []
    for wire, topk in FORMATS:
        codec = WireCodec(wire, sizes, block_size, topk)
        whole = codec.wire_bytes(0, numel)
        row = {
            "format": label(wire, topk),
            "wire_dtype": wire,
            "topk_fraction": topk,
            "whole_buffer_bytes": whole,
        }
        for n in WORKERS:
            # the busiest worker
            row[f"owner_reduce_N{n}"] = max(wire_bytes_sent(codec, n, w) for w in range(n))
            row[f"all_gather_N{n}"] = (n - 1) * whole
            row[f"fp32_ring_N{n}"] = 2 * (n - 1) * 4 * numel // n
        rows.append(row)
    return {
        "numel": numel,
        "tensors": len(sizes),
        "block_size": block_size,
        "workers": list(WORKERS),
        "rows": rows,
    }


def all_gather_limit(whole_bytes: int, numel: int) -> int:
    """Largest N with ``(N-1) * whole < 2 (N-1)/N * 4 numel``, i.e. ``N < 8 numel / whole``."""
    return -(-8 * numel // whole_bytes) - 1


def table(data: dict) -> str:
    numel = data["numel"]
    head = ["format", "bits/param", *[f"owner-reduce N={n} (x FP32 ring)" for n in data["workers"]]]
    head += [f"all-gather N={n} (x FP32 ring)" for n in data["workers"]] + [
        "all-gather < FP32 ring up to N"
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in data["rows"]:
        cells = [row["format"], f"{8 * row['whole_buffer_bytes'] / numel:.3f}"]
        for kind in ("owner_reduce", "all_gather"):
            for n in data["workers"]:
                sent, ring = row[f"{kind}_N{n}"], row[f"fp32_ring_N{n}"]
                cells.append(f"{sent / 2**20:,.1f} MiB ({sent / ring:.4f})")
        limit = all_gather_limit(row["whole_buffer_bytes"], numel)
        cells.append(str(limit) if limit >= 2 else "never")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--table", action="store_true", help="print the markdown table of the committed JSON"
    )
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(RESULT.read_text())))
        return
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(measure(), indent=1) + "\n")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
