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
_PUNKT_TAB_FILES = (
    "collocations.tab",
    "sent_starters.txt",
    "abbrev_types.txt",
    "ortho_context.tab",
)


class MissingLocalDataError(EvalInputError, FileNotFoundError):
    """A task has no local data where offline mode (or the user) requires it."""


def set_offline() -> None:
    """Make hub clients and NLTK fail fast instead of reaching for the network."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[var] = "1"
    import nltk  # 5 s to import: only when needed

    nltk.downloader._downloader._url = _NO_NLTK_INDEX


def resolve_local(
    path: str | os.PathLike | None, option: str, what: str, offline: bool
) -> Path | None:
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


PUNKT_TAB_COMMAND = "python -m nltk.downloader punkt_tab"


def punkt_tab_installed() -> bool:
    """Whether NLTK finds the official English ``punkt_tab``
    (the sentence splitter IFEval's scorer uses)."""
    import nltk  # 5 s to import: only when a task needs it

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        return False
    return True


def check_punkt_tab(approximate: bool) -> None:
    """Refuse to score IFEval / IFBench without the official
    splitter, unless ``approximate`` allows the empty one.

    Nothing is downloaded at run time: a result that may be published must not
    depend on whether the network was there. Raises
    :class:`EvalInputError` (one line, the command that fixes it).
    """
    if not approximate and not punkt_tab_installed():
        raise EvalInputError(
            "--tasks ifeval/ifbench: NLTK's punkt_tab (the official sentence splitter) is not "
            f"installed; run `{PUNKT_TAB_COMMAND}` once, or pass --approximate-punkt to score with "
            "an empty Punkt model (sentence counts can differ from the official scorer)"
        )


def ensure_punkt_tab(cache_dir: str | os.PathLike, approximate: bool) -> bool:
    """Make NLTK's English ``punkt_tab`` findable; returns whether it is the official one.

    IFEval and IFBench split sentences and words with NLTK. Without an installed
    copy (see :func:`check_punkt_tab`), and only when ``approximate`` allows it, write an empty
    Punkt parameter set (no learned abbreviations, so "Dr." ends a sentence) and warn.
    """
    import nltk

    check_punkt_tab(approximate)
    if punkt_tab_installed():
        return True
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
        "NLTK punkt_tab not installed: --approximate-punkt scores with an empty English Punkt "
        f"model in {english}; sentence counts can differ from the official "
        f"model ({PUNKT_TAB_COMMAND})",
        stacklevel=2,
    )
    return False
