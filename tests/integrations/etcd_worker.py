"""One rank under ``torchrun --rdzv-backend etcd-v2``
(tests/integrations/elastic/test_etcd_rendezvous.py).

Usage: ``etcd_worker.py OUT_DIR``. Every attempt all-reduces its rank over gloo and appends
``{first_round, rank, world, sum}`` to ``OUT_DIR/attempts.jsonl``. On the first attempt rank 1 then
fails while rank 0 still runs, so both agents must rendezvous again through etcd (rank 0's agent
restarts it for the new round). With a file ``OUT_DIR/fail_after`` naming another file, rank 1 fails
only once that file exists (the test loses an etcd member in between).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main(out: str) -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])  # a membership change does not count
    marker = os.path.join(out, "rank1_failed")
    first_round = not os.path.exists(marker)
    with open(os.path.join(out, "attempts.jsonl"), "a") as f:
        f.write(
            json.dumps(
                {"first_round": first_round, "rank": rank, "world": world, "sum": total.item()}
            )
            + "\n"
        )
    dist.barrier()
    dist.destroy_process_group()
    if attempt == 0 and rank == 1:
        gate = os.path.join(out, "fail_after")
        if os.path.exists(gate):
            with open(gate) as f:
                awaited = f.read().strip()
            deadline = time.monotonic() + 60
            while not os.path.exists(awaited) and time.monotonic() < deadline:
                time.sleep(0.05)
        open(marker, "w").close()
        return 1
    if first_round:
        time.sleep(120)  # still running: its agent ends it when rank 1's agent waits in a new round
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
