"""Live membership's errors: a refused join, a change of members, a failed round, a lost store."""

from __future__ import annotations

from autoloco_hf.errors import AutoLoCoError

__all__ = ["JoinRefused", "MembershipChange", "RoundFailed", "StoreLost"]


class JoinRefused(AutoLoCoError, RuntimeError):
    """This process may not join the run: its configuration
    or model differs from the run's (one line)."""


class MembershipChange(AutoLoCoError, RuntimeError):
    """Raised by a training loop at a boundary where every
    member saw a process waiting to join: reform there."""


class RoundFailed(AutoLoCoError, RuntimeError):
    """A membership round did not form within ``round_timeout_s``
    (one line: the round and what was missing)."""


class StoreLost(RoundFailed, SystemExit):
    """The run's store failed or did not answer a request: this process is cut off (one line).

    Also a ``SystemExit``: left uncaught it ends the process with its one line on stderr and
    exit status 1, no traceback (docs/reliability.md, "Cut off from the store"). It is a
    ``RoundFailed`` for code that catches that.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = message  # what the interpreter prints when it ends the process with it
