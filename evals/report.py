"""Markdown comparison of runs in the paper's Table 6 layout (rows = runs)."""

from __future__ import annotations

import json
from pathlib import Path

from autoloco_hf.usage import markdown_table

# (score key, header, is a percentage); NLL stays in nats per token.
COLUMNS = (
    ("nll_chat", "Test NLL (chat)", False),
    ("nll_c4", "NLL (C4)", False),
    ("ifeval", "IFEval", True),
    ("ifbench", "IFBench", True),
    ("mmlu_pro", "MMLU-Pro", True),
    ("bbh", "BBH", True),
    ("humaneval_plus", "HumanEval+", True),
)


def load_records(paths: list[str | Path]) -> list[dict]:
    return [json.loads(Path(p).read_text()) for p in paths]


def scores_table(records: list[dict]) -> str:
    """One row per run; only the columns some run has; '-' where a run lacks one."""
    columns = [c for c in COLUMNS if any(c[0] in r["scores"] for r in records)]
    rows = []
    for record in records:
        cells = [record["run"]]
        for key, _, percent in columns:
            value = record["scores"].get(key)
            cells.append(
                "-" if value is None else f"{100 * value:.2f}" if percent else f"{value:.4f}"
            )
        rows.append(cells)
    headers = ["Run"] + [header for _, header, _ in columns]
    return markdown_table(headers, rows, align=["---"] + ["---:"] * len(columns)) + "\n"
