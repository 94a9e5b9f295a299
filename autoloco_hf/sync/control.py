"""The control message: the few scalars every worker sends next to its pseudo-gradient
(docs/algorithm.md#interval-statistics, #phases).

At every boundary each worker contributes one :class:`ControlMessage`, packed
into a flat float64 tensor; the communicator returns the element-wise sums
(added in worker order, so the simulation and ``N`` processes agree bit for
bit, docs/algorithm.md#simulation) and every worker's row. :class:`ControlRound` reads both back.

Each field is declared either :func:`summed` (a statistic added over workers:
squared norms, tokens, losses) or :func:`agreed` (a value every worker must
hold identically, such as the interval it just executed). Adding a field is
one line: packing, unpacking, summing and the agreement check follow from the
declaration. Agreement is checked on every worker's own value (its row), not on
a sum, so it names the field and shows each worker's value.

The agreed fields are the decisions every worker must have taken identically
(docs/algorithm.md#phases, last paragraph): the step and interval index of the
boundary, the interval just executed (its start and its step and token-
equivalent horizons, i.e. the horizon decided at the previous boundary), and a
fingerprint of the configuration. Communicators check them as soon as the
control messages have arrived, before the model-sized payload, so a mismatch
stops every worker at that boundary with the same error instead of pairing
mismatched collectives.

Example::

    >>> import torch
    >>> messages = [ControlMessage(tokens=5.0, h_step=4.0), ControlMessage(tokens=7.0, h_step=4.0)]
    >>> rows = torch.stack([m.pack() for m in messages])
    >>> round_ = ControlRound.from_rows(rows.sum(0), rows)
    >>> round_.totals.tokens, round_.totals.h_step
    (12.0, 4.0)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from autoloco_hf.errors import AutoLoCoError

_REDUCE = "reduce"
_SUM = "sum"
_AGREE = "agree"


def summed(default: float = 0.0) -> Any:
    """A control field added over all workers."""
    return dataclasses.field(default=default, metadata={_REDUCE: _SUM})


def agreed(default: float = 0.0) -> Any:
    """A control field that must be identical on every worker (else :class:`WorkerDisagreement`)."""
    return dataclasses.field(default=default, metadata={_REDUCE: _AGREE})


class WorkerDisagreement(AutoLoCoError, RuntimeError):
    """Workers executed different intervals: their controllers
    diverged (docs/algorithm.md#phases, last paragraph)."""


# Settings a worker may choose for itself without changing what the workers compute together
LOCAL_SETTINGS = ("outer_on_cpu", "sync_timeout_s", "snapshot_dir")


def config_fingerprint(config: Any) -> float:
    """52 bits of a SHA-256 of the configuration (minus
    :data:`LOCAL_SETTINGS`), exact in a float64."""
    values = {k: v for k, v in config.to_dict().items() if k not in LOCAL_SETTINGS}
    digest = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()
    return float(int(digest[:13], 16))


@dataclass(frozen=True)
class ControlMessage:
    """One worker's scalars of one synchronization, packed as float64 in field order."""

    sq_norm: float = summed()  # ||Delta^i||^2 of the local pseudo-gradient (0 if non-finite)
    tokens: float = summed()  # non-padding input tokens consumed in the interval
    loss_sum: float = summed()  # sum of per-step training losses (0 if non-finite)
    loss_count: float = summed()  # steps whose losses are in loss_sum
    nonfinite: float = summed()  # 1 when the pseudo-gradient or a loss was NaN/inf
    # ||theta_t - theta^i||^2 at the rule's boundary request
    # (docs/algorithm.md#rule-plugins; else 0)
    anchor_sq_norm: float = summed()
    # optimizer steps the worker took in the interval (budget pacing: its share)
    inner_steps: float = summed()
    # the time it spent on them (virtual on a simulated clock): its speed
    busy_seconds: float = summed()
    anchor_lr_mass: float = agreed()  # the LR mass of those h_ref steps (0 when not measured)
    step: float = agreed()  # the optimizer step that closed the interval
    interval_index: float = agreed()  # intervals closed before this one
    start_step: float = agreed()  # first step of the interval just executed
    h_step: float = agreed()  # its executed length: the horizon decided at the previous boundary
    h_tok: float = agreed()  # its token-equivalent horizon (docs/algorithm.md#token-mapper)
    config_fingerprint: float = agreed()  # config_fingerprint() of the worker's AutoLoCoConfig

    WIDTH: ClassVar[int]  # number of packed float64 values, set below

    def pack(self) -> torch.Tensor:
        """The flat float64 tensor sent in the collective."""
        return torch.tensor(
            [getattr(self, f.name) for f in dataclasses.fields(self)], dtype=torch.float64
        )

    @classmethod
    def unpack(cls, packed: torch.Tensor) -> ControlMessage:
        """Inverse of :meth:`pack` (also reads a row or the sums of several packed messages)."""
        values = packed.reshape(-1).tolist()
        if len(values) != cls.WIDTH:
            raise ValueError(f"a packed ControlMessage has {cls.WIDTH} values, got {len(values)}")
        return cls(*values)

    @classmethod
    def agreed_fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata[_REDUCE] == _AGREE)


ControlMessage.WIDTH = len(dataclasses.fields(ControlMessage))


@dataclass(frozen=True)
class ControlRound:
    """All workers' control messages of one synchronization.

    ``totals`` holds the sums of the summed fields and the common value of the
    agreed ones; ``workers`` every worker's own message, in worker order.
    """

    totals: ControlMessage
    workers: tuple[ControlMessage, ...]

    @classmethod
    def from_rows(cls, sums: torch.Tensor, rows: torch.Tensor) -> ControlRound:
        """Build from the communicator's float64 sums and ``(num_workers, WIDTH)`` rows."""
        workers = tuple(ControlMessage.unpack(row) for row in rows)
        if not workers:
            raise ValueError("a control round needs at least one worker's message")
        common = {name: getattr(workers[0], name) for name in ControlMessage.agreed_fields()}
        return cls(dataclasses.replace(ControlMessage.unpack(sums), **common), workers)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"totals": self.totals.pack(), "rows": torch.stack([w.pack() for w in self.workers])}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> ControlRound:
        """The round :meth:`state_dict` stored (its totals as stored, not summed again)."""
        workers = tuple(ControlMessage.unpack(row) for row in state["rows"])
        return cls(ControlMessage.unpack(state["totals"]), workers)

    def ranges(self, name: str) -> tuple[float, float]:
        """``(min, max)`` of field ``name`` over the workers."""
        values = [getattr(w, name) for w in self.workers]
        return min(values), max(values)

    def check_agreement(self, labels: Sequence[str] | None = None) -> None:
        """Raise :class:`WorkerDisagreement` naming every
        agreed field that differs, with each worker's value.

        ``labels`` name the workers in the message (default ``worker 0``, ``worker 1``, ...).
        """
        labels = (
            list(labels)
            if labels is not None
            else [f"worker {i}" for i in range(len(self.workers))]
        )
        differing = [
            name for name in ControlMessage.agreed_fields() if len(set(self._values(name))) > 1
        ]
        if differing:
            detail = "; ".join(
                f"{name}: "
                + ", ".join(
                    f"{label}={_show(name, v)}" for label, v in zip(labels, self._values(name))
                )
                for name in differing
            )
            raise WorkerDisagreement(
                f"workers disagree at a synchronization ({detail}). Every worker must run the same "
                "AutoLoCoConfig, LR schedule, max_steps and checkpoint; restart all of them from "
                "the last checkpoint with one configuration (docs/reliability.md)."
            )

    def _values(self, name: str) -> list[float]:
        return [getattr(w, name) for w in self.workers]


def _show(name: str, value: float) -> str:
    return f"{int(value):013x}" if name == "config_fingerprint" else f"{value:g}"
