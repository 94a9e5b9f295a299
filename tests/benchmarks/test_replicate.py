"""Smoke run of benchmarks/campaigns/replicate.py at a tiny scale: run folders, resume, report,
refusals; and the no-repeat sampler."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autoloco_hf.toy.text import DisjointWindowSampler

ROOT = Path(__file__).resolve().parents[2]


def load_replicate():
    spec = importlib.util.spec_from_file_location(
        "replicate", ROOT / "benchmarks" / "campaigns" / "replicate.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_disjoint_sampler_never_repeats_a_window_and_stops_when_used_up():
    tokens = torch.arange(64 * 10)
    sampler = DisjointWindowSampler(tokens, seq_len=8, batch_size=2, num_workers=3, seed=1)
    assert sampler.capacity_steps() == 80 // 6
    seen = []
    for _ in range(sampler.capacity_steps()):
        batches = sampler.next_batches()
        assert len(batches) == 3 and all(b["input_ids"].shape == (2, 8) for b in batches)
        seen += [int(w[0]) for b in batches for w in b["input_ids"]]
    assert len(seen) == len(set(seen)) == 78
    with pytest.raises(RuntimeError, match="corpus exhausted"):
        sampler.next_batches()
    again = DisjointWindowSampler(
        tokens, seq_len=8, batch_size=2, num_workers=3, seed=1
    ).next_batches()
    assert torch.equal(
        again[0]["input_ids"],
        DisjointWindowSampler(tokens, 8, 2, 3, seed=1).next_batches()[0]["input_ids"],
    )


@pytest.mark.slow
def test_tiny_campaign_runs_resumes_and_reports(tmp_path, capsys):
    replicate = load_replicate()
    out, cache = tmp_path / "runs", tmp_path / "cache"
    argv = [
        "--out",
        str(out),
        "--steps",
        "10",
        "--workers",
        "2",
        "--seeds",
        "0,1",
        "--only",
        "table1,table8",
        "--max-docs",
        "30",
        "--vocab",
        "300",
        "--val-windows",
        "16",
        "--cache-dir",
        str(cache),
        "--quiet",
    ]
    assert replicate.main(argv) == 0
    first = capsys.readouterr().out
    names = [
        "ddp",
        "diloco",
        "diloco_mu07",
        "autoloco",
        "autoloco_descent",
        "autoloco_probe",
        "qsr",
        "linear",
    ]
    for seed in (0, 1):
        for name in names:
            summary = json.loads(
                (out / "table1" / f"seed{seed}" / name / "summary.json").read_text()
            )
            assert (
                summary["seed"] == seed and summary["table"] == "table1" and summary["steps"] == 10
            )
            assert len(summary["git_commit"]) >= 40 and summary["val_loss"] > 0
            assert summary["corpus"]["train_tokens"] > 4 * summary["train_tokens_per_step"] * 10
        norm = json.loads(
            (out / "table8" / f"seed{seed}" / "autoloco_norm" / "summary.json").read_text()
        )
        assert norm["config"]["normalize_pseudo_grad"] is True
        for name, rule in (
            ("autoloco", "paper"),
            ("autoloco_descent", "descent"),
            ("autoloco_probe", "descent"),
        ):
            ran = json.loads((out / "table1" / f"seed{seed}" / name / "summary.json").read_text())
            assert ran["config"]["controller"] == rule
        options = ran["config"]["rule_options"]
        assert options["start_probe"] == 1.85 and options["gain"] == 0.9
        descent_norm = json.loads(
            (out / "table8" / f"seed{seed}" / "autoloco_norm_descent" / "summary.json").read_text()
        )
        assert descent_norm["config"]["normalize_pseudo_grad"] is True
    assert first.count("done ") == 22

    stamp = (out / "table1" / "seed0" / "autoloco" / "summary.json").stat().st_mtime_ns
    assert replicate.main(argv) == 0  # everything finished: nothing is trained again
    assert "done " not in capsys.readouterr().out
    assert (out / "table1" / "seed0" / "autoloco" / "summary.json").stat().st_mtime_ns == stamp

    tables = (out / "report" / "tables.md").read_text()
    for heading in ("## table1", "## table8", "## table2", "## targets"):
        assert heading in tables
    assert "| autoloco | 2 | 2 |" in tables and "autoloco - diloco_mu07 (2 paired seeds)" in tables
    assert "AutoLoCo syncs <= 0.73x" in tables and "INT8 + AutoLoCo" in tables
    assert (out / "report" / "table1" / "loss_vs_step.png").stat().st_size > 1000


def test_the_committed_tables_regenerate_from_the_committed_runs(tmp_path, monkeypatch):
    """Every number in results/tables.md comes from the run folders under results/replicate."""
    replicate = load_replicate()
    monkeypatch.chdir(ROOT)
    argv = ["--out", "results/replicate", "--report-only", "--report-dir", str(tmp_path)]
    replicate.write_report(replicate.parse_args(argv))
    regenerated = (tmp_path / "tables.md").read_text()
    assert regenerated == (ROOT / "results" / "tables.md").read_text()
    assert "| autoloco | 8 |" in regenerated  # the tables have rows


def test_refusals_exit_with_a_message(tmp_path):
    replicate = load_replicate()
    with pytest.raises(SystemExit) as err:
        replicate.parse_args(["--only", "table3"])
    assert err.value.code == 2
    with pytest.raises(SystemExit, match="under 4 x"):
        replicate.main(
            [
                "--out",
                str(tmp_path / "r"),
                "--steps",
                "100000",
                "--only",
                "table1",
                "--max-docs",
                "5",
                "--vocab",
                "300",
                "--cache-dir",
                str(tmp_path / "c"),
                "--quiet",
            ]
        )


# One campaign: build (or read) the corpus cache, rewrite it
# many times, read it back; print the tokens' digest.
CACHE_WRITER = (
    """
import hashlib, importlib.util, sys, time
spec = importlib.util.spec_from_file_location("replicate", sys.argv[1])
replicate = importlib.util.module_from_spec(spec)
sys.modules["replicate"] = replicate
spec.loader.exec_module(replicate)
cache, go = sys.argv[2], float(sys.argv[3])
time.sleep(max(0.0, go - time.time()))  # both processes start writing at the same moment
corpus = replicate.load_corpus(cache, 300, 5)
folder = next(p for p in replicate.Path(cache).iterdir() if p.is_dir())
tokens = dict(train=corpus.splits.train.int(), val=corpus.splits.val.int(), info=corpus.info)
for _ in range(40):
    replicate.write_cache(folder, corpus.tokenizer, tokens)
again = replicate.load_corpus(cache, 300, 5)
"""
    # the script's last line, split where it is over 100 characters (the text is unchanged)
    "print(hashlib.sha256(again.splits.train.numpy().tobytes()"
    " + again.splits.val.numpy().tobytes()).hexdigest())\n"
)


@pytest.mark.slow
def test_campaigns_started_together_share_the_corpus_cache(tmp_path):
    """Two writers of one cache (was: FileNotFoundError on the
    shared tokens.pt.tmp) both finish and read equal tokens."""
    import time

    go = time.time() + 8  # past both imports of torch and transformers
    argv = [
        sys.executable,
        "-c",
        CACHE_WRITER,
        str(ROOT / "benchmarks" / "campaigns" / "replicate.py"),
        str(tmp_path),
        str(go),
    ]
    writers = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    done = [writer.communicate(timeout=300) for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], [err[-2000:] for _, err in done]
    digests = {out.strip() for out, _ in done}
    assert len(digests) == 1 and len(digests.pop()) == 64
    folder = next(tmp_path.iterdir())
    assert sorted(p.name for p in folder.iterdir()) == ["tokenizer", "tokens.pt"], (
        "no partial files are left"
    )
