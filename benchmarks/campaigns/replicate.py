"""Replicate the paper's Tables 1, 2, 7, 8 and 14 at CPU
scale, with seeds, on a corpus that never repeats.

Not a test. Trains the demo's tiny Llama (``autoloco_hf.toy.demo``) with
``LocalWorkers`` + ``SimulatedCommunicator`` on the Python standard library's
own sources and documentation (every ``.py`` file under the stdlib folder,
site-packages excluded, plus ``pydoc_data.topics``): nothing is downloaded.
Documents are split into training and held-out validation text by whole
file; a byte-level BPE is trained on the training documents once and cached
with the token ids (``--cache-dir``). Workers read disjoint windows
(:class:`~autoloco_hf.toy.text.DisjointWindowSampler`), so no token is
seen twice in a run, and the script refuses to start when the corpus holds
less than 4x what the largest selected run consumes.

The schedule is the paper's with the same ratios: ``T`` steps, ``H_base =
T/100``, warm-up 2% then cosine, ``q_H = H_base/10`` (at least 1), ``H_max =
1.5 H_base``. Keep ``T`` a multiple of 1000: at ``T = 500`` (``H_base`` 5,
``q_H`` 1) the smallest increase adds 20% of learning-rate mass, more than
the controller's ``gamma_inc`` budget of 15%, and AutoLoCo never leaves
``H_base`` (measured; ``docs/results.md``). Every method of a seed starts from the same
initialization and reads the same batches, so the differences across seeds are paired.

Each finished run is one folder ``OUT/<table>/seed<k>/<variant>/`` with
``summary.json`` (which records the git commit); a rerun skips finished runs,
and a lock file lets several copies of the command share the work::

    nohup nice -n 10 python benchmarks/campaigns/replicate.py --out runs/replicate &
    python benchmarks/campaigns/replicate.py --out runs/replicate --report-only --report-dir results

Tables (``--only``): ``table1`` (``--workers`` workers: DDP, DiLoCo mu 0.9 and
0.7, AutoLoCo, QSR, Linear Interval), ``table14`` (BF16 / INT8 wire, INT8 +
error feedback; FP32 is Table 1), ``table7`` (``--workers // 2`` workers:
DiLoCo 0.7, intervals only, + momentum, full AutoLoCo), ``table8``
(normalization on; off is Table 1), ``beyond`` (``H_max`` = 2, 3, 4 x
``H_base``, ``--beyond-config`` variants, and ``2 x --workers`` workers).
Table 2 is computed from Table 1's logs: steps and modeled wall time
(measured compute + each sync's wire bytes / bandwidth + latency per
collective) to reach training-loss thresholds.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from autoloco_hf.config import Controller, Method
from autoloco_hf.state.run_folder import SUMMARY, Run, load_run, moving_average
from autoloco_hf.state.run_plots import write_plots
from autoloco_hf.toy import demo
from autoloco_hf.toy.llama import tiny_llama
from autoloco_hf.toy.text import TokenSplits
from autoloco_hf.usage import markdown_table

# benchmarks/: its kinds import as packages
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from campaigns.rule_settings import FIRST_DESCENT_H_MAX_FACTOR, first_descent  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BATCH_SIZE = 2  # windows per worker per step (the demo uses 8; quartered for the CPU budget)
HIDDEN, LAYERS, HEADS = 64, 2, 4
VOCAB_SIZE = 1024
VAL_FRACTION = 0.02  # of the documents
CORPUS_FORMAT = 2  # bump when the split or the encoding changes: it keys the cache
CORPUS_MARGIN = 4  # the corpus must hold this many times the largest run's tokens
KIB = 1024
# committed runs keep their logs compressed
STEPS_GZ, INTERVALS_GZ = "steps.jsonl.gz", "intervals.jsonl.gz"


class Table(str, Enum):
    """The benchmark's tables, in the order they run (most important first)."""

    TABLE1 = "table1"
    TABLE14 = "table14"
    TABLE7 = "table7"
    TABLE8 = "table8"
    BEYOND = "beyond"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Variant:
    """One row of a table: a demo method plus ``AutoLoCoConfig`` overrides, at a worker count."""

    table: Table
    name: str
    method: str  # a key of autoloco_hf.toy.demo.METHODS
    description: str
    workers_factor: float = 1.0  # x --workers
    overrides: dict[str, Any] = field(default_factory=dict)
    h_max_factor: float | None = None  # H_max = factor x H_base (rounded down to q_H)
    # DiLoCo at a multiple of the paper's H_base (the trivial way to fewer syncs)
    h_base_factor: int = 1

    def workers(self, base: int) -> int:
        return max(1, int(self.workers_factor * base))


def variants(beyond_configs: Sequence[tuple[str, dict[str, Any]]] = ()) -> list[Variant]:
    """Every row of every table, in run order."""
    t1 = [
        Variant(Table.TABLE1, name, name, demo.METHODS[name][0])
        for name in ("ddp", "diloco", "diloco_mu07", "autoloco", "qsr", "linear")
    ]
    # most important first (the INT8 target compares autoloco_int8
    # with diloco_bf16), in case the budget ends early
    t14 = [
        Variant(
            Table.TABLE14,
            f"{base}_{wire}",
            base,
            f"{demo.METHODS[base][0]}; {wire.upper()} wire",
            overrides=dict(wire_dtype=wire),
        )
        for base, wire in (
            ("diloco", "bf16"),
            ("autoloco", "int8"),
            ("autoloco", "bf16"),
            ("diloco_mu07", "bf16"),
            ("diloco", "int8"),
            ("diloco_mu07", "int8"),
        )
    ]
    t14.append(
        Variant(
            Table.TABLE14,
            "autoloco_int8_ef",
            "autoloco",
            "AutoLoCo; INT8 wire with error feedback",
            overrides=dict(wire_dtype="int8", error_feedback=True),
        )
    )
    half = 0.5
    t7 = [
        Variant(Table.TABLE7, "diloco_mu07", "diloco_mu07", "DiLoCo at outer momentum 0.7", half),
        Variant(
            Table.TABLE7,
            "intervals_only",
            "autoloco",
            "adaptive intervals, fixed mu and eta",
            half,
            dict(adjust_momentum=False, scale_outer_lr=False),
        ),
        Variant(
            Table.TABLE7,
            "plus_momentum",
            "autoloco",
            "adaptive intervals + momentum retention",
            half,
            dict(scale_outer_lr=False),
        ),
        Variant(Table.TABLE7, "autoloco", "autoloco", "full AutoLoCo (+ outer-step scaling)", half),
    ]
    t8 = [
        Variant(
            Table.TABLE8,
            "autoloco_norm",
            "autoloco",
            "AutoLoCo with pseudo-gradient normalization",
            overrides=dict(normalize_pseudo_grad=True),
        )
    ]
    t1, t14, t7, t8 = (rules_side_by_side(rows) for rows in (t1, t14, t7, t8))
    beyond = [
        Variant(
            Table.BEYOND,
            f"autoloco_hmax{k}",
            "autoloco",
            f"AutoLoCo, H_max = {k} x H_base",
            h_max_factor=float(k),
        )
        for k in (2, 3, 4)
    ]
    beyond += [
        Variant(Table.BEYOND, name, "autoloco", f"AutoLoCo with {fields}", overrides=fields)
        for name, fields in beyond_configs
    ]
    beyond += [
        Variant(
            Table.BEYOND, f"{name}_x2workers", name, f"{demo.METHODS[name][0]}; 2 x workers", 2.0
        )
        for name in ("diloco_mu07", "autoloco")
    ]
    beyond += [
        Variant(
            Table.BEYOND,
            "diloco_mu07_h2x",
            "diloco_mu07",
            "DiLoCo at outer momentum 0.7, H = 2 x H_base (0.5x syncs by construction)",
            h_base_factor=2,
        ),
        Variant(
            Table.BEYOND,
            "autoloco_h2x",
            "autoloco",
            "AutoLoCo from H_base = 2 x the paper's (q_H, H_max scaled alike)",
            h_base_factor=2,
        ),
    ]
    beyond = [pin_paper_rule(v) for v in beyond]
    return t1 + t14 + t7 + t8 + beyond


def pin_paper_rule(variant: Variant) -> Variant:
    """The paper's horizon rule, whatever the library's default (these rows replicate the paper)."""
    if variant.method != "autoloco":
        return variant
    return replace(variant, overrides={**variant.overrides, "controller": Controller.PAPER})


# the descent rule as these tables first ran it (rule_settings.FIRST_DESCENT: from 4 H_base, gain 1,
# unguarded, outer momentum 0.7), and at gain 0.9 with the start probe
# (docs/algorithm.md#descent-rule)
DESCENT_RULES: dict[str, tuple[str, dict[str, Any]]] = {
    "_descent": ("descent rule", first_descent()),
    "_probe": (
        "descent rule, gain 0.9, start probe 1.85",
        first_descent(gain=0.9, start_probe=1.85),
    ),
}
RULES = ("", *DESCENT_RULES)  # row-name suffixes: the paper's rule, then each descent setting


def rules_side_by_side(rows: list[Variant]) -> list[Variant]:
    """Each AutoLoCo row once per rule: the paper's (pinned),
    then ``<name><suffix>`` for each of DESCENT_RULES."""
    out = []
    for v in rows:
        if v.method != "autoloco":
            out.append(v)
            continue
        out.append(pin_paper_rule(v))
        out += [
            replace(
                v,
                name=f"{v.name}{suffix}",
                description=f"{v.description}; {what}",
                overrides={**v.overrides, **fields},
                h_max_factor=FIRST_DESCENT_H_MAX_FACTOR,
            )
            for suffix, (what, fields) in DESCENT_RULES.items()
        ]
    return out


# ------------------------------------------------------------------ corpus
def stdlib_documents(max_docs: int | None = None) -> list[tuple[str, str]]:
    """``(name, text)`` of every UTF-8 ``.py`` file of the
    standard library, then the pydoc topics, in a fixed order."""
    from pydoc_data.topics import topics

    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "site-packages" in rel.parts or "dist-packages" in rel.parts:
            continue
        try:
            docs.append((str(rel), path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue  # a few test fixtures are deliberately not UTF-8
    docs += [(f"pydoc:{key}", topics[key].strip()) for key in sorted(topics) if topics[key].strip()]
    return docs[:max_docs] if max_docs else docs


def split_documents(
    docs: Sequence[tuple[str, str]], val_fraction: float
) -> tuple[list[str], list[str]]:
    """Hold out whole documents, every ``1 / val_fraction``-th
    one (spread evenly over the sorted corpus)."""
    every = max(2, round(1 / val_fraction))
    val = [text for i, (_, text) in enumerate(docs) if i % every == every // 2]
    train = [text for i, (_, text) in enumerate(docs) if i % every != every // 2]
    return train, val


@dataclass
class Corpus:
    tokenizer: Any
    splits: TokenSplits
    info: dict[str, Any]


def load_corpus(cache_dir: str, vocab_size: int, max_docs: int | None) -> Corpus:
    """The tokenizer and token splits, built once and cached
    under ``cache_dir`` (keyed by the corpus and settings)."""
    from transformers import PreTrainedTokenizerFast

    from autoloco_hf.toy.text import train_tokenizer

    docs = stdlib_documents(max_docs)
    key_text = json.dumps(
        [
            CORPUS_FORMAT,
            sys.version,
            vocab_size,
            VAL_FRACTION,
            [(name, len(text)) for name, text in docs],
        ]
    )
    folder = (
        Path(cache_dir)
        / f"stdlib-v{vocab_size}-{hashlib.sha256(key_text.encode()).hexdigest()[:12]}"
    )
    tokens_path = folder / "tokens.pt"
    if tokens_path.exists():
        data = torch.load(tokens_path)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder / "tokenizer"))
        return Corpus(
            tokenizer, TokenSplits(data["train"].long(), data["val"].long()), data["info"]
        )
    started = time.perf_counter()
    train_docs, val_docs = split_documents(docs, VAL_FRACTION)
    tokenizer = train_tokenizer("\n\n".join(train_docs), vocab_size)

    def encode(texts: list[str]) -> torch.Tensor:
        ids: list[int] = []
        for chunk in range(0, len(texts), 64):
            for row in tokenizer(texts[chunk : chunk + 64], add_special_tokens=False)["input_ids"]:
                ids.extend(row)
                ids.append(tokenizer.eos_token_id)
        return torch.tensor(ids, dtype=torch.int32)

    train, val = encode(train_docs), encode(val_docs)
    info = dict(
        source=f"Python {sys.version.split()[0]} standard library .py files + pydoc_data.topics",
        documents=len(docs),
        train_documents=len(train_docs),
        val_documents=len(val_docs),
        characters=sum(len(t) for _, t in docs),
        train_tokens=int(train.numel()),
        val_tokens=int(val.numel()),
        vocab_size=len(tokenizer),
        build_seconds=round(time.perf_counter() - started, 1),
    )
    write_cache(folder, tokenizer, dict(train=train, val=val, info=info))
    return Corpus(tokenizer, TokenSplits(train.long(), val.long()), info)


def write_cache(folder: Path, tokenizer: Any, tokens: dict[str, Any]) -> None:
    """Save the tokenizer and ``tokens.pt`` so that campaigns
    started together can build the same cache at once.

    Each writer writes under names of its own, then renames: a reader sees a whole file or none. The
    tokenizer goes first, since ``tokens.pt`` existing is what tells a reader the cache is complete.
    """
    folder.mkdir(parents=True, exist_ok=True)
    staging = tempfile.mkdtemp(dir=folder, prefix=".tokenizer-")
    tokenizer.save_pretrained(staging)
    try:
        os.rename(staging, folder / "tokenizer")
    except OSError:  # another writer renamed its copy first: the same tokenizer, from the same text
        shutil.rmtree(staging)
    handle, partial = tempfile.mkstemp(dir=folder, prefix=".tokens-", suffix=".pt")
    os.close(handle)
    torch.save(tokens, partial)
    os.replace(partial, folder / "tokens.pt")


def eval_subset(val: torch.Tensor, seq_len: int, windows: int) -> torch.Tensor:
    """``windows`` evenly spaced validation windows (all of them if fewer), as one token stream."""
    all_windows = val[: (val.numel() // seq_len) * seq_len].view(-1, seq_len)
    if all_windows.shape[0] > windows:
        all_windows = all_windows[torch.linspace(0, all_windows.shape[0] - 1, windows).long()]
    return all_windows.reshape(-1)


# ------------------------------------------------------------------ running
def git_commit() -> str:
    """HEAD of the checkout the package is imported from, ``+dirty`` when tracked files differ."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True
        ).stdout.strip()

    head = git("rev-parse", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def compress_logs(folder: Path) -> None:
    """Gzip the step log (without lr and timings) and the interval records: the raw data stay
    committed at ~1/10 the size."""
    steps = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    with gzip.open(folder / STEPS_GZ, "wt") as f:
        # what the report and Table 2 read; not lr or seconds
        kept = ("step", "loss", "syncs", "payload_bytes")
        f.writelines(
            json.dumps({k: round(r[k], 6) if k == "loss" else r[k] for k in kept}) + "\n"
            for r in steps
        )
    (folder / "steps.jsonl").unlink()
    intervals = folder / "intervals.jsonl"
    if intervals.exists():  # DDP has no intervals
        with open(intervals, "rb") as src, gzip.open(folder / INTERVALS_GZ, "wb") as dst:
            dst.write(src.read())
        intervals.unlink()


def run_dir(out: str, variant: Variant, seed: int) -> Path:
    return Path(out) / variant.table.value / f"seed{seed}" / variant.name


def take_lock(folder: Path) -> bool:
    """Claim ``folder`` for this process (several copies of the command share the work); False if
    another live process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / "run.lock"
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                os.kill(int(lock.read_text() or 0), 0)
                return False
            except (ProcessLookupError, ValueError):
                lock.unlink(missing_ok=True)  # left by a process that died: retake it
                continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True
    return False


def schedule(steps: int) -> tuple[int, int]:
    """``(H_base, q_H)`` of the paper's ratios: ``T/100`` (at
    least 2) and ``H_base/10`` (at least 1)."""
    h_base = max(2, steps // 100)
    return h_base, max(1, h_base // 10)


def variant_config(variant: Variant, steps: int) -> Any:
    h_base, q_h = schedule(steps)
    overrides = dict(variant.overrides)
    if variant.h_max_factor:
        overrides["h_max"] = int(variant.h_max_factor * h_base) // q_h * q_h
    factor = variant.h_base_factor
    # the only method whose horizons round to q_H
    if demo.method_of(variant.method) == Method.AUTOLOCO:
        overrides["q_h"] = factor * q_h
    return demo.scaled_config(variant.method, steps, factor * h_base, **overrides)


def run_campaign(args: argparse.Namespace, selected: list[Variant], corpus: Corpus) -> None:
    from tqdm.auto import tqdm

    from autoloco_hf.toy.text import DisjointWindowSampler

    commit = git_commit()
    val = eval_subset(corpus.splits.val, demo.SEQ_LEN, args.val_windows)
    # fail on a bad scale first
    configs = {v.name + v.table.value: variant_config(v, args.steps) for v in selected}
    for table in Table:
        for seed in args.seeds:
            for variant in (v for v in selected if v.table is table):
                folder = run_dir(args.out, variant, seed)
                if (folder / SUMMARY).exists():
                    continue
                if not take_lock(folder):
                    print(f"skip {folder}: another process is running it", flush=True)
                    continue
                try:
                    workers = variant.workers(args.workers)
                    model = tiny_llama(
                        len(corpus.tokenizer),
                        args.hidden,
                        args.layers,
                        HEADS,
                        max_position_embeddings=demo.SEQ_LEN,
                        seed=seed,
                    )
                    setup = demo.DemoSetup(
                        corpus.tokenizer, TokenSplits(corpus.splits.train, val), model
                    )
                    sampler = DisjointWindowSampler(
                        corpus.splits.train, demo.SEQ_LEN, args.batch_size, workers, seed=seed
                    )
                    run_args = argparse.Namespace(
                        out=str(folder.parent), steps=args.steps, workers=workers, seed=seed
                    )
                    started = time.perf_counter()
                    with tqdm(
                        total=args.steps, unit="step", mininterval=30, disable=args.quiet
                    ) as bar:
                        summary = demo.train_method(
                            variant.name,
                            configs[variant.name + variant.table.value],
                            setup,
                            run_args,
                            bar,
                            sampler=sampler,
                            description=variant.description,
                            table=variant.table.value,
                            variant=variant.name,
                            seed=seed,
                            batch_size=args.batch_size,
                            seq_len=demo.SEQ_LEN,
                            train_tokens_per_step=workers * args.batch_size * demo.SEQ_LEN,
                            corpus=corpus.info,
                            git_commit=commit,
                            command=args.command,
                            batched_workers=args.batched_workers,
                        )
                    compress_logs(folder)
                    print(
                        f"done {folder}: syncs {summary['totals']['syncs']}, train "
                        f"{summary['train_loss_last']:.4f}, val {summary['val_loss']:.4f}, "
                        f"{time.perf_counter() - started:.0f} s",
                        flush=True,
                    )
                finally:
                    (folder / "run.lock").unlink(missing_ok=True)


# ------------------------------------------------------------------ report
@dataclass
class Cell:
    """One variant of one table across seeds."""

    variant: str
    runs: dict[int, Run]  # seed -> run

    def values(self, key: str) -> dict[int, float]:
        return {seed: float(metric(run, key)) for seed, run in self.runs.items()}


def metric(run: Run, key: str) -> float:
    totals = run.summary["totals"]
    return {
        "syncs": totals["syncs"],
        "payload_mib": totals["payload_bytes"] / 2**20,
        "train": run.summary["train_loss_last"],
        "val": run.summary["val_loss"],
        "cpu": run.summary.get("cpu_seconds", math.nan),
    }[key]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def fmt(values: Sequence[float], digits: int = 4) -> str:
    mean, std = mean_std(values)
    if math.isnan(mean):
        return "-"
    return f"{mean:,.{digits}f}" + ("" if math.isnan(std) else f" ± {std:,.{digits}f}")


def paired(a: Cell, b: Cell, key: str) -> list[float]:
    """Per-seed ``a - b`` over the seeds both finished."""
    va, vb = a.values(key), b.values(key)
    return [va[s] - vb[s] for s in sorted(set(va) & set(vb))]


def collect(out: str) -> dict[Table, dict[str, Cell]]:
    """Finished runs under ``out``, by table and variant (variants in run order)."""
    order = {(v.table, v.name): i for i, v in enumerate(variants())}
    found: dict[Table, dict[str, Cell]] = {}
    for summary in sorted(Path(out).glob(f"*/seed*/*/{SUMMARY}")):
        folder = summary.parent
        try:
            table = Table(folder.parent.parent.name)
        except ValueError:
            continue
        seed = int(folder.parent.name.removeprefix("seed"))
        found.setdefault(table, {}).setdefault(folder.name, Cell(folder.name, {})).runs[seed] = (
            load_run(str(folder))
        )
    return {
        t: dict(sorted(cells.items(), key=lambda kv: order.get((t, kv[0]), len(order))))
        for t, cells in sorted(found.items(), key=lambda kv: list(Table).index(kv[0]))
    }


def quality_table(cells: dict[str, Cell]) -> str:
    rows = []
    for cell in cells.values():
        any_run = next(iter(cell.runs.values()))
        rows.append(
            [
                cell.variant,
                str(any_run.summary.get("workers", "-")),
                str(len(cell.runs)),
                fmt(cell.values("syncs").values(), 1),
                fmt(cell.values("payload_mib").values(), 1),
                fmt(cell.values("train").values()),
                fmt(cell.values("val").values()),
                fmt(cell.values("cpu").values(), 0),
            ]
        )
    headers = [
        "variant",
        "workers",
        "seeds",
        "syncs",
        "payload (MiB/worker)",
        "train loss (last 2%)",
        "val loss",
        "CPU s/run",
    ]
    return markdown_table(headers, rows)


def diff_line(label: str, a: Cell | None, b: Cell | None) -> str:
    """``label``: paired differences of train and val loss
    (mean ± std) and the syncs / payload ratios."""
    if a is None or b is None:
        return f"- {label}: not run"
    dv, dt = paired(a, b, "val"), paired(a, b, "train")
    if not dv:
        return f"- {label}: no seed finished for both"
    syncs = statistics.fmean(a.values("syncs").values()) / statistics.fmean(
        b.values("syncs").values()
    )
    payload = statistics.fmean(a.values("payload_mib").values()) / statistics.fmean(
        b.values("payload_mib").values()
    )
    return (
        f"- {label} ({len(dv)} paired seeds): val loss {fmt(dv)}, train loss {fmt(dt)}; "
        f"syncs x{syncs:.3f}, payload x{payload:.3f}"
    )


def within_one_std(diffs: Sequence[float]) -> bool:
    """'No worse' as the issue defines it: the mean paired
    difference is at most its std (or negative)."""
    mean, std = mean_std(diffs)
    return mean <= 0 or (not math.isnan(std) and mean <= std)


# --- Table 2
def per_worker_step_seconds(cells: dict[str, Cell]) -> float:
    """Median CPU seconds of one worker's step over the
    table's runs (the same compute for every method)."""
    values = [
        r.summary["cpu_seconds"] / (r.summary["steps"] * r.summary["workers"])
        for c in cells.values()
        for r in c.runs.values()
    ]
    return statistics.median(values)


def comm_events(run: Run) -> list[tuple[int, int, int]]:
    """``(step at which it completes, wire bytes,
    collectives)`` of every communication of ``run``."""
    config = run.summary["config"]
    if config["method"] == "ddp":
        per_step = run.summary["totals"]["wire_bytes"] // max(1, run.summary["steps"])
        return [(s, per_step, 1) for s in range(1, run.summary["steps"] + 1)]
    collectives = (
        1 if config.get("wire_dtype", "fp32") == "fp32" else 2
    )  # all-reduce vs owner-reduce (all_to_all + all_gather)
    return [(r["start_step"] + r["h_step"], r["wire_bytes"], collectives) for r in run.intervals]


def modeled_seconds(run: Run, step: int, compute: float, bandwidth: float, latency: float) -> float:
    """Compute of ``step`` steps + the communications
    finished by then (bytes / bandwidth + latency each)."""
    comm = sum(b * 8 / bandwidth + c * latency for s, b, c in comm_events(run) if s <= step)
    return step * compute + comm


def first_reach(run: Run, threshold: float) -> int | None:
    window = max(1, math.ceil(0.02 * len(run.steps)))
    for row, loss in zip(run.steps, moving_average([s["loss"] for s in run.steps], window)):
        if loss <= threshold:
            return int(row["step"])
    return None


def parse_rate(text: str) -> float:
    """``100M``, ``1G``, ``10G`` (bits per second) -> float."""
    units = {"K": 1e3, "M": 1e6, "G": 1e9}
    text = text.strip().upper().removesuffix("BIT").removesuffix("BPS")
    return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)


def table2(
    cells: dict[str, Cell], thresholds: Sequence[float], bandwidths: Sequence[str], latency: float
) -> tuple[str, float]:
    compute = per_worker_step_seconds(cells)
    headers = ["variant", "threshold", "reached", "steps"] + [
        f"modeled time @ {b}bit/s (s)" for b in bandwidths
    ]
    rows = []
    for threshold in thresholds:
        for cell in cells.values():
            hits = {seed: first_reach(run, threshold) for seed, run in cell.runs.items()}
            reached = {s: h for s, h in hits.items() if h is not None}
            row = [cell.variant, f"{threshold:g}", f"{len(reached)}/{len(hits)}"]
            if not reached:
                rows.append(row + ["-"] * (1 + len(bandwidths)))
                continue
            row.append(fmt(list(map(float, reached.values())), 0))
            for b in bandwidths:
                row.append(
                    fmt(
                        [
                            modeled_seconds(cell.runs[s], h, compute, parse_rate(b), latency)
                            for s, h in reached.items()
                        ],
                        1,
                    )
                )
            rows.append(row)
    return markdown_table(headers, rows), compute


def default_thresholds(cells: dict[str, Cell]) -> list[float]:
    """The final smoothed training loss of DiLoCo 0.9, DiLoCo
    0.7 and AutoLoCo, worst seed (rounded up to 0.01).

    The worst seed's, so that every seed of that method
    reaches it: seeds differ far more than methods.
    """
    levels = []
    for name in ("diloco", "diloco_mu07", "autoloco"):
        if name in cells:
            finals = [r.smoothed_loss[-1] for r in cells[name].runs.values()]
            levels.append(math.ceil(max(finals) * 100) / 100)
    return sorted(set(levels), reverse=True)


def write_report(args: argparse.Namespace) -> str:
    """Every table (mean ± std over seeds), paired
    differences, Table 2, the targets, and plots of seed 0."""
    tables = collect(args.out)
    report_dir = Path(args.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    latency = args.latency_ms / 1000
    lines = ["# Replication tables (generated by benchmarks/campaigns/replicate.py)", ""]
    commits = sorted(
        {
            r.summary.get("git_commit", "?")
            for cells in tables.values()
            for c in cells.values()
            for r in c.runs.values()
        }
    )
    lines += [
        f"Runs under `{args.out}`; code version(s): {', '.join(f'`{c}`' for c in commits)}.",
        "",
    ]
    t1 = tables.get(Table.TABLE1, {})
    for table, cells in tables.items():
        lines += [f"## {table.value}", "", quality_table(cells), ""]
        lines += diffs(table, cells, tables)
        seeds0 = [c.runs[min(c.runs)] for c in cells.values()]
        plot_dir = report_dir / table.value
        write_plots(seeds0, str(plot_dir))
        lines += [
            f"Plots (seed {min(min(c.runs) for c in cells.values())}): "
            + ", ".join(
                f"[{p}]({table.value}/{p})"
                for p in sorted(os.listdir(plot_dir))
                if p.endswith(".png")
            ),
            "",
        ]
    if t1:
        thresholds = (
            [float(t) for t in args.thresholds.split(",")]
            if args.thresholds
            else default_thresholds(t1)
        )
        text, compute = table2(t1, thresholds, args.bandwidths.split(","), latency)
        lines += [
            "## table2",
            "",
            "Steps and modeled wall time until the training loss (trailing mean over 2% of the "
            f"steps) first reaches each threshold; modeled time = steps x {compute * 1000:.2f} ms "
            "(median measured CPU time of one worker step over Table 1's runs) + every finished "
            f"communication's wire bytes / bandwidth + {args.latency_ms:g} ms per collective. Mean "
            "± std over the seeds that reached it.",
            "",
            text,
            "",
        ]
    lines += ["## targets", ""] + targets(tables)
    path = report_dir / "tables.md"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def diffs(table: Table, cells: dict[str, Cell], tables: dict[Table, dict[str, Cell]]) -> list[str]:
    t1 = tables.get(Table.TABLE1, {})
    get = cells.get
    out: list[str] = []
    if table is Table.TABLE1:
        out.append(diff_line("autoloco - diloco_mu07", get("autoloco"), get("diloco_mu07")))
        out.append(diff_line("autoloco - diloco (mu 0.9)", get("autoloco"), get("diloco")))
        out.append(diff_line("diloco_mu07 - diloco (mu 0.9)", get("diloco_mu07"), get("diloco")))
        for name in ("autoloco_descent", "autoloco_probe", "qsr", "linear", "ddp"):
            out.append(diff_line(f"{name} - diloco_mu07", get(name), get("diloco_mu07")))
        for suffix in DESCENT_RULES:
            out.append(
                diff_line(f"autoloco{suffix} - autoloco", get(f"autoloco{suffix}"), get("autoloco"))
            )
    elif table is Table.TABLE14:
        for name in (n for n in cells if n != "diloco_bf16"):
            out.append(diff_line(f"{name} - diloco_bf16", get(name), get("diloco_bf16")))
        out.append(
            diff_line(
                "autoloco_int8 - diloco_mu07_bf16", get("autoloco_int8"), get("diloco_mu07_bf16")
            )
        )
        out.append(
            diff_line(
                "autoloco_int8_ef - autoloco_int8", get("autoloco_int8_ef"), get("autoloco_int8")
            )
        )
        for rule in RULES:
            out.append(
                diff_line(
                    f"autoloco_int8{rule} - autoloco{rule} (fp32, table1)",
                    get(f"autoloco_int8{rule}"),
                    t1.get(f"autoloco{rule}"),
                )
            )
    elif table is Table.TABLE7:
        for name in ("intervals_only", "plus_momentum", "autoloco"):
            for rule in RULES:
                out.append(
                    diff_line(f"{name}{rule} - diloco_mu07", get(name + rule), get("diloco_mu07"))
                )
    elif table is Table.TABLE8:
        for rule in RULES:
            out.append(
                diff_line(
                    f"autoloco_norm{rule} - autoloco{rule} (table1)",
                    get(f"autoloco_norm{rule}"),
                    t1.get(f"autoloco{rule}"),
                )
            )
    else:
        for name in cells:
            ref = (
                get("diloco_mu07_x2workers")
                if name.endswith("_x2workers")
                else t1.get("diloco_mu07")
            )
            if name != "diloco_mu07_x2workers":
                out.append(diff_line(f"{name} - diloco_mu07", get(name), ref))
        out.append(
            diff_line(
                "diloco_mu07_x2workers - diloco_mu07 (table1)",
                get("diloco_mu07_x2workers"),
                t1.get("diloco_mu07"),
            )
        )
    return ["Paired differences (mean ± std over seeds; negative loss = better):", ""] + out + [""]


def targets(tables: dict[Table, dict[str, Cell]]) -> list[str]:
    """The issue's three targets, each met or missed with the measured figures."""
    t1, t14 = tables.get(Table.TABLE1, {}), tables.get(Table.TABLE14, {})
    lines = []

    def verdict(label: str, a: Cell | None, b: Cell | None, max_ratio: float, key: str) -> str:
        if a is None or b is None or not paired(a, b, "val"):
            return f"- {label}: NOT RUN"
        ratio = statistics.fmean(a.values(key).values()) / statistics.fmean(b.values(key).values())
        dv = paired(a, b, "val")
        ok = ratio <= max_ratio and within_one_std(dv)
        return (
            f"- {label}: {'MET' if ok else 'MISSED'} ({key} x{ratio:.3f} (target <= "
            f"{max_ratio}), paired val-loss difference {fmt(dv)})"
        )

    for rule in RULES:
        lines.append(
            verdict(
                f"AutoLoCo{f' ({DESCENT_RULES[rule][0]})' if rule else ''} syncs <= 0.73x "
                "DiLoCo's, val loss no worse than DiLoCo 0.7",
                t1.get(f"autoloco{rule}"),
                t1.get("diloco_mu07"),
                0.73,
                "syncs",
            )
        )
    beyond = tables.get(Table.BEYOND, {})
    best = [
        verdict(
            f"beyond: {name} <= 0.5x DiLoCo's syncs at the same val loss",
            cell,
            t1.get("diloco_mu07"),
            0.5,
            "syncs",
        )
        for name, cell in beyond.items()
        if "x2workers" not in name
    ]
    lines += best or ["- beyond: NOT RUN"]
    lines.append(
        verdict(
            "INT8 + AutoLoCo payload <= 0.38x DiLoCo BF16 (mu 0.9, the "
            "paper's), val within one std",
            t14.get("autoloco_int8"),
            t14.get("diloco_bf16"),
            0.38,
            "payload_mib",
        )
    )
    lines.append(
        verdict(
            "INT8 + AutoLoCo payload <= 0.38x DiLoCo BF16 at mu 0.7 (stricter)",
            t14.get("autoloco_int8"),
            t14.get("diloco_mu07_bf16"),
            0.38,
            "payload_mib",
        )
    )
    for suffix, (what, _) in DESCENT_RULES.items():
        lines.append(
            verdict(
                f"INT8 + AutoLoCo ({what}) payload <= 0.38x DiLoCo BF16 (mu "
                "0.9), val within one std",
                t14.get(f"autoloco_int8{suffix}"),
                t14.get("diloco_bf16"),
                0.38,
                "payload_mib",
            )
        )
    return lines


# ------------------------------------------------------------------ main
def parse_beyond(specs: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """``NAME:field=value,field=value`` -> ``(NAME, {field: value})``
    (values parsed as JSON when they can be)."""
    parsed = []
    for spec in specs:
        name, _, body = spec.partition(":")
        if not name or not body:
            raise SystemExit(
                f"replicate: --beyond-config {spec!r}: expected NAME:field=value[,field=value]"
            )
        fields = {}
        for item in body.split(","):
            key, _, value = item.partition("=")
            try:
                fields[key.strip()] = json.loads(value)
            except json.JSONDecodeError:
                fields[key.strip()] = value
        parsed.append((name, fields))
    return parsed


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out", default="runs/replicate", help="folder of the run folders (default runs/replicate)"
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument(
        "--steps",
        type=int,
        default=1000,
        help="optimizer steps T per run (default 1000: H_base 10, q_H 1, H_max 15)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=8,
        help="workers of Tables 1, 8, 14 (Table 7 uses half, the scaling run twice)",
    )
    parser.add_argument(
        "--only",
        help="comma-separated tables to run, from "
        f"{', '.join(t.value for t in Table)} (default all)",
    )
    parser.add_argument(
        "--variants",
        help="comma-separated variant names to run within the selected tables (default all)",
    )
    parser.add_argument(
        "--bandwidths",
        default="100M,1G,10G",
        help="Table 2 link rates in bits/s (default 100M,1G,10G)",
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=5.0,
        help="Table 2 latency per collective in ms (default 5)",
    )
    parser.add_argument(
        "--thresholds",
        help="Table 2 training-loss thresholds (default: worst-seed final losses of "
        "DiLoCo 0.9, 0.7, AutoLoCo)",
    )
    parser.add_argument(
        "--beyond-config",
        action="append",
        default=[],
        metavar="NAME:FIELD=VALUE,...",
        help="extra AutoLoCo variant for the beyond table (repeatable)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=BATCH_SIZE,
        help=f"windows of 64 tokens per worker per step (default {BATCH_SIZE})",
    )
    parser.add_argument(
        "--hidden", type=int, default=HIDDEN, help=f"model width (default {HIDDEN})"
    )
    parser.add_argument(
        "--layers", type=int, default=LAYERS, help=f"model depth (default {LAYERS})"
    )
    parser.add_argument(
        "--vocab", type=int, default=VOCAB_SIZE, help=f"BPE vocabulary (default {VOCAB_SIZE})"
    )
    parser.add_argument(
        "--val-windows",
        type=int,
        default=1024,
        help="held-out windows of 64 tokens evaluated per run (default 1024)",
    )
    parser.add_argument(
        "--max-docs", type=int, help="use only the first N documents (tiny smoke runs)"
    )
    parser.add_argument(
        "--cache-dir",
        default=os.path.join(os.path.expanduser("~"), ".cache", "autoloco"),
        help="tokenizer + token cache",
    )
    parser.add_argument(
        "--report-dir", help="where tables.md and the plots go (default OUT/report)"
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="do not train; only write the report of the finished runs",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--batched-workers",
        action="store_true",
        help="step the workers as one batched computation (same results within float rounding; "
        "default: the per-worker loop that made the committed runs)",
    )
    args = parser.parse_args(argv)
    args.command = shlex.join(
        [
            "python",
            "benchmarks/campaigns/replicate.py",
            *(argv if argv is not None else sys.argv[1:]),
        ]
    )
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        args.tables = [Table(t.strip()) for t in args.only.split(",")] if args.only else list(Table)
        [parse_rate(b) for b in args.bandwidths.split(",")]
    except ValueError as err:
        parser.exit(
            2,
            f"replicate: bad --seeds/--only/--bandwidths value ({err}); e.g. --seeds 0,1,2 --only "
            "table1,table14 --bandwidths 100M,1G\n",
        )
    if args.steps < 10 or args.workers < 2 or not args.seeds:
        parser.exit(
            2,
            f"replicate: need --steps >= 10 (got {args.steps}), --workers >= 2 (got "
            f"{args.workers}) and one seed at least\n",
        )
    args.report_dir = args.report_dir or os.path.join(args.out, "report")
    args.beyond = parse_beyond(args.beyond_config)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.report_only:
        torch.set_num_threads(1)
        wanted = {n.strip() for n in args.variants.split(",")} if args.variants else None
        selected = [
            v
            for v in variants(args.beyond)
            if v.table in args.tables and (wanted is None or v.name in wanted)
        ]
        if not selected:
            raise SystemExit(
                f"replicate: --variants {args.variants!r} names no variant of "
                f"{', '.join(map(str, args.tables))}"
            )
        h_base, q_h = schedule(args.steps)
        # measured at T=500: +1 step = +20% LR mass > gamma_inc, AutoLoCo never grew
        if 10 * q_h != h_base:
            print(
                f"warning: --steps {args.steps} gives H_base {h_base}, q_H {q_h}: not the paper's "
                "q_H = H_base/10 (use a multiple of 1000 steps); one increment may exceed the "
                "controller's gamma_inc budget",
                flush=True,
            )
        corpus = load_corpus(args.cache_dir, args.vocab, args.max_docs)
        largest = (
            max(v.workers(args.workers) for v in selected)
            * args.batch_size
            * demo.SEQ_LEN
            * args.steps
        )
        if corpus.splits.train.numel() < CORPUS_MARGIN * largest:
            raise SystemExit(
                f"replicate: the corpus has {corpus.splits.train.numel():,} training tokens, under "
                f"{CORPUS_MARGIN} x the {largest:,} the largest run reads; lower "
                "--steps/--workers/--batch-size"
            )
        print(
            f"corpus: {json.dumps(corpus.info)}; largest run reads {largest:,} tokens", flush=True
        )
        run_campaign(args, selected, corpus)
    print(f"report: {write_report(args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
