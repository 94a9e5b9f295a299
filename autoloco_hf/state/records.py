"""Per-interval records and run totals (docs/algorithm.md#accounting).

Every number the controller saw and every decision it took is written, one
JSON object per interval, so a run can be debugged and compared afterwards
(`autoloco report`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from autoloco_hf.algorithm.rules.decisions import Assessment, Decision, Phase

if TYPE_CHECKING:
    from autoloco_hf.algorithm.correction import OuterCorrection
    from autoloco_hf.algorithm.policies import NextInterval
    from autoloco_hf.algorithm.rules.decisions import RuleDecision
    from autoloco_hf.algorithm.stats import IntervalStatistics
    from autoloco_hf.sync.pacing import PaceReport

# What AutoLoCoCallback leaves in a Trainer's output_dir
# besides the interval records, for `autoloco report`.
TRAINER_SUMMARY_FILENAME = "autoloco_summary.json"
TRAINER_STEPS_FILENAME = "autoloco_steps.jsonl"


@dataclass
class IntervalRecord:
    """One synchronization."""

    index: int
    start_step: int
    h_tok: int
    h_step: int
    h_ref: int
    stretched: bool  # lengthened so that a delayed merge landed inside it (no decision taken on it)
    lr_mass: float  # Lambda_t measured while the interval ran
    lr_mass_preview: float  # Lambda(s_t, H_step) previewed at its start
    lr_mass_base: float  # Lambda(s_t, H_ref)
    rho: float
    mu: float  # mu_t
    eta: float  # eta_t^out
    drift_energy: float  # D_t
    coherence: float  # C_t
    normalized_drift: float  # d_t
    disagreement: float  # V_t
    mean_loss: float
    tokens: int  # global non-padding tokens of the interval
    outer_step_applied: bool
    assessment: str
    decision: str
    phase: str
    next_h_tok: int | None
    next_h_step: int | None
    z_drift: float | None
    z_coherence: float | None
    seconds: float  # wall time of the interval, sync included
    sync_seconds: float
    controller_seconds: float
    payload_bytes: int  # logical payload of this sync at the wire dtype (per worker)
    wire_bytes: int  # bytes this worker sent
    encode_seconds: float
    collective_seconds: float
    decode_seconds: float
    # d at the rule's boundary displacement request (docs/algorithm.md#rule-plugins)
    anchor_normalized_drift: float | None = None
    # p of D ~ Lambda^p from that anchor to the end (2 ballistic, 1 diffusive)
    drift_exponent: float | None = None
    # what the rule's in-interval probe measured (docs/algorithm.md#descent-rule, #rule-plugins)
    probe_exponent: float | None = None
    # each worker's part of the interval, in worker order (docs/algorithm.md#pacing)
    worker_steps: list[int] | None = None
    worker_tokens: list[int] | None = None
    worker_seconds: list[float] | None = None  # time on its steps (virtual on a simulated clock)
    # below straggler_fraction of the median speed for long enough
    stragglers: list[str] | None = None
    idle_workers: list[str] | None = None  # took no step: contributed nothing
    # each worker's label (index, rank, host), where its seconds are recorded
    worker_labels: list[str] | None = None

    @classmethod
    def build(
        cls,
        *,
        index: int,
        interval: NextInterval,
        lr_mass: float,
        stats: IntervalStatistics,
        mean_loss: float,
        tokens: float,
        correction: OuterCorrection,
        applied: bool,
        decision: RuleDecision | None,
        following: NextInterval | None,
        seconds: float,
        sync_seconds: float,
        controller_seconds: float,
        payload_bytes: int,
        traffic: CollectiveCost,
        anchor_normalized_drift: float | None = None,
        drift_exponent: float | None = None,
        probe_exponent: float | None = None,
        workers: Sequence[Any] = (),
        pace: PaceReport | None = None,
        timed: bool = False,
        labels: Sequence[str] = (),
    ) -> IntervalRecord:
        """The record of one synchronization; a fixed-horizon
        policy (no ``decision``) records ``fixed``.

        ``timed``: record each worker's seconds and ``labels`` (budget pacing, or a virtual clock).
        """
        return cls(
            index=index,
            start_step=interval.start_step,
            h_tok=interval.h_tok,
            h_step=interval.h_step,
            h_ref=interval.h_ref,
            stretched=interval.stretched,
            lr_mass=lr_mass,
            lr_mass_preview=interval.lr_mass,
            lr_mass_base=interval.lr_mass_base,
            rho=correction.rho,
            mu=correction.momentum,
            eta=correction.outer_lr,
            drift_energy=stats.drift_energy,
            coherence=stats.coherence,
            normalized_drift=stats.normalized_drift,
            disagreement=stats.disagreement,
            mean_loss=mean_loss,
            tokens=int(round(tokens)),
            outer_step_applied=applied,
            assessment=decision.assessment if decision else Assessment.FIXED,
            decision=decision.decision if decision else Decision.FIXED,
            phase=decision.phase if decision else Phase.FIXED,
            next_h_tok=following.h_tok if following else None,
            next_h_step=following.h_step if following else None,
            z_drift=decision.z_drift if decision else None,
            z_coherence=decision.z_coherence if decision else None,
            seconds=seconds,
            sync_seconds=sync_seconds,
            controller_seconds=controller_seconds,
            payload_bytes=payload_bytes,
            wire_bytes=traffic.wire_bytes,
            encode_seconds=traffic.encode_seconds,
            collective_seconds=traffic.collective_seconds,
            decode_seconds=traffic.decode_seconds,
            anchor_normalized_drift=anchor_normalized_drift,
            drift_exponent=drift_exponent,
            probe_exponent=probe_exponent,
            worker_steps=[int(w.inner_steps) for w in workers] or None,
            worker_tokens=[int(w.tokens) for w in workers] or None,
            # wall-clock seconds differ from run to run:
            # recorded where speeds matter (or are virtual)
            worker_seconds=[w.busy_seconds for w in workers] or None if timed else None,
            stragglers=pace.stragglers if pace else None,
            idle_workers=pace.idle if pace else None,
            worker_labels=list(labels) or None if timed else None,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), allow_nan=True)


@dataclass(frozen=True)
class WorkerShare:
    """One worker's part of one interval: what the report (and a Trainer's log) shows per worker
    (docs/algorithm.md#stragglers)."""

    label: str
    steps: int  # its inner steps
    tokens: int
    seconds: float | None  # its time on them; None where the run did not time its workers
    straggler: bool
    idle: bool


def worker_shares(record: IntervalRecord | Mapping[str, Any]) -> list[WorkerShare]:
    """Each worker's part of ``record`` (an
    :class:`IntervalRecord` or its JSON object), in worker order.

    Empty for a record without per-worker counts (written before they were
    recorded). A record without ``worker_labels`` names its workers
    ``worker i``, as simulated runs did before labels carried rank and host.
    """
    values = vars(record) if isinstance(record, IntervalRecord) else record
    steps, tokens = values.get("worker_steps"), values.get("worker_tokens")
    if not steps or not tokens:
        return []
    labels = values.get("worker_labels") or [f"worker {i}" for i in range(len(steps))]
    seconds = values.get("worker_seconds") or [None] * len(steps)
    stragglers, idle = set(values.get("stragglers") or ()), set(values.get("idle_workers") or ())
    return [
        WorkerShare(label, int(n), int(t), s, label in stragglers, label in idle)
        for label, n, t, s in zip(labels, steps, tokens, seconds)
    ]


class CollectiveCost(Protocol):
    """What one collective cost (``communicators.Traffic``;
    an :class:`IntervalRecord` has the same fields)."""

    wire_bytes: int
    encode_seconds: float
    collective_seconds: float
    decode_seconds: float


@dataclass
class RunTotals:
    """Accumulated accounting of a run (docs/algorithm.md#accounting)."""

    steps: int = 0
    tokens: int = 0
    syncs: int = 0
    payload_tensors: int = 0  # full-model tensors sent per worker
    payload_bytes: int = 0  # logical payload per worker at the wire dtype
    wire_bytes: int = 0  # bytes actually sent by this worker
    sync_seconds: float = 0.0
    controller_seconds: float = 0.0
    encode_seconds: float = 0.0
    collective_seconds: float = 0.0
    decode_seconds: float = 0.0
    skipped_outer_steps: int = 0

    def add(self, record: IntervalRecord) -> None:
        """Account one interval's synchronization."""
        self.tokens += record.tokens
        self.controller_seconds += record.controller_seconds
        self.skipped_outer_steps += not record.outer_step_applied
        self.add_sync(record.payload_bytes, record, record.sync_seconds)

    def add_sync(self, payload_bytes: int, traffic: CollectiveCost, seconds: float) -> None:
        """Account one full-model collective (an interval's,
        or a DDP step's gradient all-reduce)."""
        self.syncs += 1
        self.payload_tensors += 1
        self.payload_bytes += payload_bytes
        self.wire_bytes += traffic.wire_bytes
        self.sync_seconds += seconds
        self.encode_seconds += traffic.encode_seconds
        self.collective_seconds += traffic.collective_seconds
        self.decode_seconds += traffic.decode_seconds

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class JsonlWriter:
    """Writes interval records to a JSONL file.

    The file is replaced at the first write, not when the writer is built, so a
    run that resumes can first :meth:`restore` the history its checkpoint holds
    (dropping lines logged after that checkpoint) and then append.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._mode = "w"

    def restore(self, records: list[IntervalRecord]) -> None:
        """Rewrite the file with exactly ``records`` (the
        history of the checkpoint being resumed)."""
        with open(self.path, "w") as f:
            f.writelines(record.to_json() + "\n" for record in records)
        self._mode = "a"

    def write(self, record: IntervalRecord) -> None:
        with open(self.path, self._mode) as f:
            f.write(record.to_json() + "\n")
        self._mode = "a"


def read_jsonl(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
