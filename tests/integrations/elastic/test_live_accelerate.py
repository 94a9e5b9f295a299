"""A plain Accelerate loop + AutoLoCoAccelerate on live membership
(docs/reliability.md, "Live membership in a plain Accelerate loop"): real processes,
gloo, a ``TCPStore`` hosted by this test process. Three start; one dies mid-interval;
the survivors re-prepare the model on the new group in process and go on from the
last boundary; a fourth joins at a later boundary; all end on the same model."""

from __future__ import annotations

import datetime
import time

import torch.distributed as dist
from _dist import free_port, process_context
from live_accelerate_worker import run
from testbeds.live_testbed import collect, wait_round

STEPS, H = 28, 4


def test_the_survivors_of_a_plain_accelerate_loop_go_on_in_process_and_take_a_joiner_in(
    tmp_path,
) -> None:
    out, port = str(tmp_path), free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=60))
    ctx = process_context()
    deadline = time.monotonic() + 300

    def spawn(name: str, first_world: int, **options):
        process = ctx.Process(
            target=run, args=(name, port, out, first_world, STEPS, H), kwargs=options
        )
        process.start()
        return process

    first = [spawn(f"w{i}", 3, wait_for_joiner_at=(16,)) for i in range(2)] + [
        spawn("w2", 3, die_at=10)
    ]
    wait_round(store, 1, deadline)
    processes = [*first, spawn("w3", 0)]
    seen = collect(processes, out, ("w0", "w1", "w3"), deadline)
    assert [p.exitcode for p in processes] == [0, 0, 1, 0]
    for name in ("w0", "w1"):
        begins = seen[name]["begins"]
        assert [(b["round"], b["world"], b["step"]) for b in begins][:2] == [(0, 3, 0), (1, 2, 8)]
        assert begins[1]["adam_step"] >= 11  # its own AdamW moments go on
        # the cut interval, once more
        assert seen[name]["steps"] == list(range(1, 13)) + list(range(9, STEPS + 1))
    (joined,) = seen["w3"]["begins"]
    assert joined["round"] == 2 and joined["world"] == 3 and joined["step"] in (16, 20)
    assert seen["w0"]["begins"][2]["step"] == joined["step"]
    for name in ("w1", "w3"):
        assert seen[name]["params"] == seen["w0"]["params"] and seen[name]["final_step"] == STEPS
