"""One live-membership worker of ``benchmarks/testbeds/live_testbed.py`` in its own process:
``python live_netns_worker.py SPEC``.

``SPEC`` is a JSON file of ``run_worker``'s arguments. The namespace tests start it with
``ip netns exec`` (a ``multiprocessing`` child cannot be placed in another network namespace); its
stderr is what a user would see.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from testbeds.live_testbed import run_worker  # noqa: E402

if __name__ == "__main__":
    run_worker(**json.loads(Path(sys.argv[1]).read_text()))
