"""Citations of docs/algorithm.md use its stable anchors, and every anchor cited exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANCHOR = re.compile(r'<a id="([a-z0-9-]+)"></a>')
CITED = re.compile(r"algorithm\.md#([a-z0-9-]+)")
NUMBERED = re.compile(r"§\d")  # the old citation by section number, which renumbering breaks


def _tracked(*patterns: str) -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    return [ROOT / name for name in names if not name.startswith("results/")]


def test_every_section_has_one_anchor() -> None:
    text = (ROOT / "docs" / "algorithm.md").read_text()
    anchors = ANCHOR.findall(text)
    assert len(anchors) == len(set(anchors)), "an anchor is used twice"
    headings = [line for line in text.splitlines() if re.match(r"^#{2,4} \d", line)]
    assert len(anchors) >= len(headings), "a numbered section has no anchor"


def test_every_cited_anchor_exists_and_code_cites_no_section_number() -> None:
    anchors = set(ANCHOR.findall((ROOT / "docs" / "algorithm.md").read_text()))
    missing, numbered = [], []
    for path in _tracked("*.py", "*.md", "*.cfg", "*.yaml"):
        text = path.read_text()
        missing += [
            f"{path.relative_to(ROOT)}: #{slug}"
            for slug in CITED.findall(text)
            if slug not in anchors
        ]
        if path.suffix != ".md":
            numbered += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in NUMBERED.finditer(text)]
    in_docs = [
        a for a in re.findall(r"\(#([a-z0-9-]+)\)", (ROOT / "docs" / "algorithm.md").read_text())
    ]
    missing += [f"docs/algorithm.md: #{a}" for a in in_docs if a not in anchors]
    assert not missing, missing
    assert not numbered, numbered
