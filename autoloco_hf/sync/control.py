"""The control message: the few scalars every worker sends next to its pseudo-gradient (spec 2, 5.3).

At every boundary each worker contributes one :class:`ControlMessage`, packed
into a flat float64 tensor; the communicator returns the element-wise sums
(added in worker order, so the simulation and ``N`` processes agree bit for
bit, spec 8.4) and every worker's row. :class:`ControlRound` reads both back.

Each field is declared either :func:`summed` (a statistic added over workers:
squared norms, tokens, losses) or :func:`agreed` (a value every worker must
hold identically, such as the interval it just executed). Adding a field is
one line: packing, unpacking, summing and the agreement check follow from the
declaration. Agreement is checked on every worker's own value (min and max over
the rows), not on a sum, so it names the field and the range that disagrees.

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
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

_REDUCE = "reduce"
_SUM = "sum"
_AGREE = "agree"


def summed(default: float = 0.0) -> Any:
    """A control field added over all workers."""
    return dataclasses.field(default=default, metadata={_REDUCE: _SUM})


def agreed(default: float = 0.0) -> Any:
    """A control field that must be identical on every worker (else :class:`WorkerDisagreement`)."""
    return dataclasses.field(default=default, metadata={_REDUCE: _AGREE})


class WorkerDisagreement(RuntimeError):
    """Workers executed different intervals: their controllers diverged (spec 5.3, last paragraph)."""


@dataclass(frozen=True)
class ControlMessage:
    """One worker's scalars of one synchronization, packed as float64 in field order."""

    sq_norm: float = summed()  # ||Delta^i||^2 of the local pseudo-gradient (0 if non-finite)
    tokens: float = summed()  # non-padding input tokens consumed in the interval
    loss_sum: float = summed()  # sum of per-step training losses (0 if non-finite)
    loss_count: float = summed()  # steps whose losses are in loss_sum
    nonfinite: float = summed()  # 1 when the pseudo-gradient or a loss was NaN/inf
    start_step: float = agreed()  # first step of the interval just executed
    h_step: float = agreed()  # its executed length

    WIDTH: ClassVar[int]  # number of packed float64 values, set below

    def pack(self) -> torch.Tensor:
        """The flat float64 tensor sent in the collective."""
        return torch.tensor([getattr(self, f.name) for f in dataclasses.fields(self)], dtype=torch.float64)

    @classmethod
    def unpack(cls, packed: torch.Tensor) -> "ControlMessage":
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
    def from_rows(cls, sums: torch.Tensor, rows: torch.Tensor) -> "ControlRound":
        """Build from the communicator's float64 sums and ``(num_workers, WIDTH)`` rows."""
        workers = tuple(ControlMessage.unpack(row) for row in rows)
        if not workers:
            raise ValueError("a control round needs at least one worker's message")
        common = {name: getattr(workers[0], name) for name in ControlMessage.agreed_fields()}
        return cls(dataclasses.replace(ControlMessage.unpack(sums), **common), workers)

    def ranges(self, name: str) -> tuple[float, float]:
        """``(min, max)`` of field ``name`` over the workers."""
        values = [getattr(w, name) for w in self.workers]
        return min(values), max(values)

    def check_agreement(self) -> None:
        """Raise :class:`WorkerDisagreement` naming every agreed field whose value differs between workers."""
        spread = {name: self.ranges(name) for name in ControlMessage.agreed_fields()}
        differing = {name: lo_hi for name, lo_hi in spread.items() if lo_hi[0] != lo_hi[1]}
        if differing:
            detail = ", ".join(f"{name} from {lo:g} to {hi:g}" for name, (lo, hi) in differing.items())
            raise WorkerDisagreement(
                f"workers disagree on the interval they executed ({detail} over {len(self.workers)} workers). "
                "Every worker must run the same config, LR schedule and total_steps; restart from the last "
                "checkpoint."
            )
