"""Run a function in real ``torch.distributed`` gloo processes from pytest.

    from _dist import run_gloo

    def _worker(rank, world_size, x):          # module level: pickled by reference
        ...                                    # the gloo default group is initialized
        return {"rank": rank, "mean": ...}     # anything torch.save can write

    results = run_gloo(_worker, 2, x)          # [result of rank 0, result of rank 1]

Each rank is a fresh process (``torch.multiprocessing.start_processes``) that sets
``torch.set_num_threads(1)`` (the test machines have few cores; two processes with
the default thread count oversubscribe them several times over), joins a gloo group
over ``tcp://127.0.0.1:<free port>`` and runs ``fn``. A child exception fails the
test with the child's traceback; a hang is cut off after ``timeout`` seconds.

The ranks are forked from a ``forkserver`` that imported torch and transformers once per test
process (:data:`PRELOAD`), not ``spawn``-ed: a spawned child paid 2-3 s of imports
(``launch.forked_ranks`` forks the Trainer tests' ranks too, without torchrun's launcher).
Measured with ``-n 2`` (2026-12-07): the files that call :func:`run_gloo` took 99-124 s against
147 s, the live-membership files (:func:`process_context`) 112-116 s against 175 s. A forked
child has the server's environment and ``sys.path``, taken when a test of the process first started
one (after collection, so every test folder is on the path): a test that must hand a variable to
its processes passes it as an argument.

The children import ``fn``'s module by name, so ``fn`` must live at module level in
a module the child can import (a test module or this one).
"""

from __future__ import annotations

import datetime
import multiprocessing
import multiprocessing.context
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

START_METHOD = "forkserver"  # of every process the tests start themselves
# what every rank would import again. Not the Trainer's modules (3.4 s of a Trainer rank's 6 s):
# with transformers.trainer preloaded the live-membership ranks timed out in gloo (2026-12-07)
PRELOAD = ["torch", "torch.distributed", "transformers"]
mp.set_forkserver_preload(PRELOAD)


def process_context() -> multiprocessing.context.BaseContext:
    """The start method of every process a test starts with
    ``multiprocessing``: forked from the forkserver (see above)."""
    return multiprocessing.get_context(START_METHOD)


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to port 0 and let the OS choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int, fn: Callable[..., Any], world_size: int, init_method: str, out_dir: str, args: tuple
) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # nobody tears the group down while a peer is still in a collective
    finally:
        dist.destroy_process_group()
    # The rank's work is done and saved, its groups destroyed: leave without interpreter
    # finalization. A C++ thread still joinable when static objects are destroyed at exit aborts the
    # process ("terminate called without an active exception", SIGABRT) after a successful run,
    # which join() reports as a failed rank.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def join(ctx: mp.ProcessContext, timeout: float, what: str) -> None:
    """Wait for every process of ``ctx``; stop them all and
    raise ``TimeoutError`` naming ``what`` after ``timeout`` seconds.

    ``ProcessContext.join`` raises ``ProcessRaisedException`` (with the
    child's traceback) or ``ProcessExitedException`` when a child fails.
    """
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.0, min(5.0, deadline - time.monotonic()))):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes:
                p.join(10)
            raise TimeoutError(f"{what} took over {timeout:.0f} s")


def run_gloo(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 300.0
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size``
    gloo ranks; returns each rank's return value."""
    with tempfile.TemporaryDirectory(prefix="autoloco_gloo_") as out_dir:
        init_method = f"tcp://127.0.0.1:{free_port()}"
        ctx = mp.start_processes(
            _entry,
            args=(fn, world_size, init_method, out_dir, args),
            nprocs=world_size,
            join=False,
            start_method=START_METHOD,
        )
        join(ctx, timeout, f"{world_size} gloo processes running {fn.__name__}")
        return [
            torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
            for r in range(world_size)
        ]
