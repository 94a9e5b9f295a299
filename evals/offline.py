"""Offline mode and local-data checks.

Every benchmark reads a hub dataset by default; each can be pointed at a local
file instead. In offline mode a task without a local copy must fail at once,
naming the option to set, rather than wait on a network that is not there.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from .errors import EvalInputError

# Unreachable on purpose: nltk.download() fetches its index on every call, even
# for installed data (IFBench's checkers call it per response).
_NO_NLTK_INDEX = "file:///nonexistent/autoloco-evals-offline/index.xml"
_PUNKT_TAB_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")


class MissingLocalDataError(EvalInputError, FileNotFoundError):
    """A task has no local data where offline mode (or the user) requires it."""


def set_offline() -> None:
    """Make hub clients and NLTK fail fast instead of reaching for the network."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[var] = "1"
    import nltk  # 5 s to import: only when needed

    nltk.downloader._downloader._url = _NO_NLTK_INDEX


def resolve_local(path: str | os.PathLike | None, option: str, what: str, offline: bool) -> Path | None:
    """Return the local path for a task, or None to use the hub default.

    Raises MissingLocalDataError naming ``option`` when the path does not exist,
    or when offline mode has no path at all.
    """
    if path is None:
        if offline:
            raise MissingLocalDataError(
                f"--offline: no local data for {what}; pass {option} PATH "
                f"(or --data-dir DIR holding it under its default name)"
            )
        return None
    resolved = Path(path).expanduser().resolve()
    if not resolved.exists():
        raise MissingLocalDataError(f"{option}: {resolved} does not exist ({what})")
    return resolved


def ensure_punkt_tab(cache_dir: str | os.PathLike, offline: bool) -> None:
    """Make NLTK's English ``punkt_tab`` findable, downloading it only when online.

    IFEval and IFBench split sentences and words with NLTK. Without an
    installed or downloadable copy, write an empty Punkt parameter set (no
    learned abbreviations, so "Dr." ends a sentence) and warn: install the
    official one with ``python -m nltk.downloader punkt_tab`` for paper-exact
    sentence counts.
    """
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        return
    except LookupError:
        if not offline and nltk.download("punkt_tab", quiet=True):
            return
    root = Path(cache_dir)
    english = root / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True, exist_ok=True)
    for name in _PUNKT_TAB_FILES:
        (english / name).touch()
    # IFBench checks for the legacy `punkt` directory too before downloading it.
    (root / "tokenizers" / "punkt").mkdir(exist_ok=True)
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    warnings.warn(
        f"NLTK punkt_tab not installed: using an empty English Punkt model in {english}; "
        "sentence counts can differ from the official model (python -m nltk.downloader punkt_tab)",
        stacklevel=2,
    )
