"""A damaged data file, in each format, under each entry
point: one line naming the file and the problem, exit 2.

The formats are Parquet, JSON (one array), JSON Lines and gzipped JSON Lines;
the damage is what a real copy suffers: bytes flipped mid-file, a file cut in
half, a line cut at character 40. The entry points are ``autoloco eval``, the
two recipes and their data helpers. Each command line runs once per format; the
case that once raced runs 5 times, started together: a reader thread alive at exit
once made ``autoloco eval`` abort (rc 134) after printing the right line, in 2 runs
of 4 (Parquet chats without messages).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from autoloco_evals.data_files import DataFileError, check_files, load_rows, scan_file
from autoloco_evals.runner import FIXTURES_DIR

ROOT = Path(__file__).resolve().parents[2]
RACE_RUNS = 5  # the case that once aborted at exit, started together


def rows(n: int = 400) -> list[dict]:
    """Documents long enough that a gzip of them spans several deflate blocks."""
    return [
        {"text": f"document {i} " + " ".join(f"w{(i * j) % 977}" for j in range(60))}
        for i in range(n)
    ]


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def flipped_gzip(path: Path) -> Path:
    """A gzip whose first deflate block header is overwritten: zlib itself refuses it."""
    data = bytearray(gzip.compress(jsonl(rows()).encode()))
    for k in range(12, 40):
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(zlib.error):  # the case is the one a user sees: zlib.error
        gzip.decompress(path.read_bytes())
    return path


def flipped_mid_gzip(path: Path) -> Path:
    """A gzip with bytes flipped in the middle: it
    decompresses to garbage lines, then fails its CRC."""
    data = bytearray(gzip.compress(jsonl(rows()).encode()))
    for k in range(len(data) // 2, len(data) // 2 + 16):
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def truncated_gzip(path: Path) -> Path:
    """A half-downloaded shard."""
    data = gzip.compress(jsonl(rows()).encode())
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(EOFError):
        gzip.decompress(path.read_bytes())
    return path


def cut_jsonl(path: Path) -> Path:
    """The last line cut at character 40 (a copy that stopped)."""
    text = jsonl(rows(3))
    path.write_text(
        text[: text.index("\n", text.index("\n") + 1) + 1] + json.dumps(rows(3)[2])[:40]
    )
    return path


def cut_json_array(path: Path) -> Path:
    text = json.dumps(rows(3), indent=1)
    path.write_text(text[: len(text) // 2])
    return path


def cut_parquet(path: Path) -> Path:
    pq.write_table(pa.Table.from_pylist(rows(50)), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def parquet_without(path: Path) -> Path:
    """Rows with a 'text' but no 'messages' column (the case that aborted)."""
    pq.write_table(pa.Table.from_pylist(rows(2_000)), path, row_group_size=100)
    return path


# case -> (writer, file name, texts the line must hold besides the file name)
DAMAGED = {
    "gzip, header bytes flipped": (
        flipped_gzip,
        "flipped.jsonl.gz",
        ["corrupt or cut short", "zlib"],
    ),
    "gzip, bytes flipped mid-file": (
        flipped_mid_gzip,
        "mid.jsonl.gz",
        ["corrupt or cut short", "CRC"],
    ),
    "gzip, cut in half": (truncated_gzip, "half.json.gz", ["corrupt or cut short", "EOFError"]),
    "jsonl, line cut at 40": (cut_jsonl, "cut.jsonl", ["line 3 column 41", "Unterminated string"]),
    "json array cut": (cut_json_array, "cut.json", ["not valid JSON", "line "]),
    "parquet cut in half": (cut_parquet, "half.parquet", ["not a readable Parquet file"]),
}


def one_line(done: subprocess.CompletedProcess, *texts: str) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert (
        len(lines) == 1 and "Traceback" not in done.stderr and "terminate called" not in done.stderr
    ), done.stderr
    for text in texts:
        assert text in lines[0], (text, lines[0])
    return lines[0]


@pytest.mark.parametrize("case", list(DAMAGED))
def test_the_check_names_file_line_and_problem(case, tmp_path):
    """The helpers every entry point calls (check_files
    before a run, load_rows when datasets fails)."""
    write, name, texts = DAMAGED[case]
    path = write(tmp_path / name)
    for call in (
        lambda: check_files([path], "--c4-path", ["text"], limit=2),
        lambda: load_rows([path], "--c4-path"),
    ):
        with pytest.raises(DataFileError) as err:
            call()
        message = str(err.value)
        assert message.startswith(f"--c4-path {path}: ") and "\n" not in message, message
        for text in texts:
            assert text in message, (text, message)


def test_a_healthy_file_is_read_to_its_end_and_counted(tmp_path):
    """The rows of a gzip, a JSON array, Parquet and text lines, counted as datasets counts them."""
    from datasets import load_dataset

    gz, array, table = tmp_path / "a.jsonl.gz", tmp_path / "a.json", tmp_path / "a.parquet"
    with gzip.open(gz, "wt") as f:
        f.write(jsonl(rows(30)) + "\n")  # a trailing blank line is no row
    array.write_text(json.dumps(rows(7)))
    pq.write_table(pa.Table.from_pylist(rows(11)), table)
    for path, kind in ((gz, "json"), (array, "json"), (table, "parquet")):
        scan = scan_file(path, "-", limit=3)
        theirs = load_dataset(kind, data_files=[str(path)], split="train")
        assert scan.rows == theirs.num_rows and scan.head == theirs.select(range(3)).to_list(), path


def run_cli(argv: list[str], runs: int = 1) -> list[subprocess.CompletedProcess]:
    """``argv`` run ``runs`` times, each a fresh process
    (started together: the exit is what is tested)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    procs = [
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env
        )
        for _ in range(runs)
    ]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    return done


def bad_model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # loading it would fail with another message
    return model


CHAT, C4 = str(FIXTURES_DIR / "chat.jsonl"), str(FIXTURES_DIR / "c4.jsonl")


def entry_points(tmp_path: Path, path: Path, chat: bool) -> dict[str, tuple[list[str], str]]:
    """Each command line with ``path`` as its evaluation or
    training data, and the option its line names."""
    model = bad_model(tmp_path)
    evaluate = [sys.executable, "-m", "autoloco_evals", str(model), "--tasks", "nll", "--offline"]
    evaluate += (
        ["--c4-path", C4, "--chat-path", str(path)]
        if chat
        else ["--c4-path", str(path), "--chat-path", CHAT]
    )
    runs = ["--output-dir", str(tmp_path / "runs")]
    return {
        "autoloco eval": (
            evaluate + ["--out", str(tmp_path / "out")],
            "--chat-path" if chat else "--c4-path",
        ),
        "pretrain_c4.py": (
            [
                sys.executable,
                "recipes/pretrain_c4.py",
                "--train-files",
                str(path),
                "--val-files",
                C4,
                *runs,
            ],
            "--train-files",
        ),
        "sft_ultrachat.py": (
            [
                sys.executable,
                "recipes/sft_ultrachat.py",
                "--train-files",
                str(path),
                "--test-files",
                CHAT,
                *runs,
            ],
            "--train-files",
        ),
    }


# one damaged file of each format; (case, given to autoloco
# eval as --chat-path rather than --c4-path)
CLI_CASES = {
    "gzip": ("gzip, bytes flipped mid-file", False),
    "jsonl": ("jsonl, line cut at 40", False),
    "json": ("json array cut", True),
    "parquet": ("parquet cut in half", True),
}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", list(CLI_CASES))
def test_each_command_says_one_line(fmt, tmp_path):
    case, chat = CLI_CASES[fmt]
    write, name, texts = DAMAGED[case]
    path = write(tmp_path / name)
    for argv, option in entry_points(tmp_path, path, chat).values():
        for done in run_cli(argv):
            one_line(done, f"{option} {path}: ", *texts)
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()  # nothing written


@pytest.mark.slow
def test_parquet_chats_without_messages_exit_2_five_times_in_a_row(tmp_path):
    """The line, then exit 2: no ``terminate called without an active exception`` (rc 134)."""
    path = parquet_without(tmp_path / "test_sft.parquet")
    for entry, (argv, option) in entry_points(tmp_path, path, chat=True).items():
        if entry == "pretrain_c4.py":  # it reads 'text': this file is fine for it
            continue
        for done in run_cli(argv, RACE_RUNS):
            one_line(done, f"{option} {path}: ", "no 'messages' field", "'text'")
