"""From the workers' progress to one checked average: contributions, agreement, ``D_t``, ``C_t``.

The engine owns one :class:`Aggregation` and calls it at every boundary (or
fragment). It holds only what does not change during a run (config,
communicator, pacer, layout, outer state, residuals), and takes the interval's
counters as arguments, so it keeps no state of its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from autoloco_hf.algorithm.stats import interval_statistics
from autoloco_hf.sync.communicators.base import AverageResult, Communicator, Traffic
from autoloco_hf.sync.control import ControlMessage, ControlRound, config_fingerprint
from autoloco_hf.sync.engine.interval_state import Aggregate, IntervalCounters
from autoloco_hf.sync.outer import OuterOptimizer, flatten_fp32

if TYPE_CHECKING:
    from autoloco_hf.algorithm.policies import NextInterval
    from autoloco_hf.config import AutoLoCoConfig
    from autoloco_hf.sync.engine.fragments import Fragment
    from autoloco_hf.sync.engine.layout import SyncLayout
    from autoloco_hf.sync.pacing import Pacer
    from autoloco_hf.wire.codec import ErrorFeedback

__all__ = ["Aggregation", "Collected", "sum_collected"]


@dataclass(frozen=True)
class Collected:
    """One completed collective's control round and squared mean norm, over every rank of every
    worker.

    The whole model's at a boundary, or one fragment's (docs/algorithm.md#fragments):
    squared norms and counts add up over fragments.
    """

    control: ControlRound
    mean_sq_norm: float
    mean_nonfinite: bool
    traffic: Traffic

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.control.state_dict(),
            "mean_sq_norm": self.mean_sq_norm,
            "mean_nonfinite": self.mean_nonfinite,
            "traffic": asdict(self.traffic),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Collected:
        control = ControlRound.from_state(state)
        traffic = Traffic(**state["traffic"])
        mean_sq_norm, mean_nonfinite = float(state["mean_sq_norm"]), bool(state["mean_nonfinite"])
        return cls(control, mean_sq_norm, mean_nonfinite, traffic)


class Aggregation:
    """The stages of a boundary that build and check the average
    (docs/algorithm.md#interval-statistics, 5.2-5.3)."""

    def __init__(
        self,
        config: AutoLoCoConfig,
        comm: Communicator,
        pacer: Pacer,
        layout: SyncLayout,
        outer: OuterOptimizer,
        worker_params: Sequence[Sequence[torch.Tensor]],
        error_feedback: Sequence[ErrorFeedback],
    ) -> None:
        self.config = config
        self.comm = comm
        self.pacer = pacer
        self.layout = layout
        self.outer = outer
        self.worker_params = worker_params
        self.error_feedback = error_feedback
        self.fingerprint = config_fingerprint(config)

    def contributions(
        self,
        interval: NextInterval,
        counters: IntervalCounters,
        step: int,
        index: int,
        starts: Sequence[torch.Tensor] | None = None,
        fragment: Fragment | None = None,
        counted: bool = True,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each local worker's pseudo-gradient and packed control message (see the engine's)."""
        deltas, messages = [], []
        weights = self.pacer.weights(
            counters.steps, counters.worker_lr_mass, counters.lr_mass, self.comm
        )  # fmt: skip
        for i, params in enumerate(self.worker_params):
            if fragment is not None:
                piece = self.layout.fragment_pieces[fragment.index]
                delta = self.outer.pseudo_gradient(params, piece)
            elif starts is None:
                delta = self.outer.pseudo_gradient(params)
            # eager overlap: the local progress of the interval (docs/algorithm.md#eager-update)
            else:
                delta = starts[i] - flatten_fp32(params, self.outer.device, self.outer.shard)
            sq_norm = float(torch.linalg.vector_norm(delta, dtype=torch.float64)) ** 2
            finite = math.isfinite(sq_norm) and math.isfinite(counters.loss_sum[i])
            # keep the codec and the collective well defined; the flag skips the step
            if not finite:
                delta.zero_()
            # the communicator's plain mean becomes the weighted one
            # (docs/algorithm.md#pacing-weights)
            elif weights is not None:
                delta.mul_(weights.delta[i])
                sq_norm *= weights.sq_norm[i]
            # D_t uses the local pseudo-gradient before encoding
            # (docs/algorithm.md#interval-statistics)
            if finite and self.error_feedback:
                delta = self._compensate(i, delta, fragment)
            deltas.append(delta)
            message = self._control_message(
                interval, counters, step, index, i, sq_norm, finite, counted
            )  # fmt: skip
            messages.append(message.pack())
        return deltas, messages

    def check_agreement(self, sums: torch.Tensor, rows: torch.Tensor) -> None:
        """Stop unless every worker closed the same interval with the same config
        (docs/algorithm.md#phases, #pacing-bad-input)."""
        control = ControlRound.from_rows(sums, rows)
        labels = self.comm.worker_labels()
        control.check_agreement(labels)
        self.pacer.check_counts(control.workers, labels)

    def collect(self, result: AverageResult) -> Collected:
        """The control round of one collective (agreement checked) and ``||mean||^2``, all ranks."""
        control = ControlRound.from_rows(result.scalar_sums, result.scalar_rows)
        control.check_agreement(self.comm.worker_labels())
        # this shard's sums (and its part of ||mean||^2) -> every rank's of every worker, so
        # that all ranks see the whole model's D_t, C_t and the same tokens and losses
        # (identity when unsharded)
        mean_part = [
            float(torch.linalg.vector_norm(result.mean, dtype=torch.float64)) ** 2,
            float(not bool(torch.isfinite(result.mean).all())),
        ]
        summed = self.comm.sum_over_shards(
            torch.cat([control.totals.pack(), torch.tensor(mean_part, dtype=torch.float64)])
        )
        agreed = {name: getattr(control.totals, name) for name in ControlMessage.agreed_fields()}
        totals = dataclasses.replace(ControlMessage.unpack(summed[:-2]), **agreed)
        mean_sq_norm, mean_nonfinite = summed[-2:].tolist()
        control = dataclasses.replace(control, totals=totals)
        return Collected(control, mean_sq_norm, mean_nonfinite != 0, result.traffic)

    def combine(
        self, parts: Sequence[Collected], lr_mass: float, mean: torch.Tensor | None
    ) -> Aggregate:  # fmt: skip
        """``D_t``, ``C_t`` and validity from the collectives of one interval (one per fragment)."""
        part = sum_collected(parts)
        totals = part.control.totals
        num_workers = self.comm.num_workers
        stats = interval_statistics(
            totals.sq_norm, part.mean_sq_norm, num_workers, lr_mass, self.config.eps
        )  # fmt: skip
        mean_loss = totals.loss_sum / max(totals.loss_count, 1.0)
        all_finite = totals.nonfinite == 0
        valid = all_finite and stats.finite and math.isfinite(mean_loss) and not part.mean_nonfinite
        return Aggregate(
            mean, part.control, stats, mean_loss, all_finite, valid, part.traffic,
            totals.anchor_sq_norm / num_workers, totals.anchor_lr_mass,
        )  # fmt: skip

    def whole_workers(self, workers: Sequence[ControlMessage]) -> list[ControlMessage]:
        """Every worker's message as the whole worker's, the same on every rank
        (docs/algorithm.md#pacing-with-overlap).

        A worker of several ranks that each sync a shard sees only its own rank's row of every
        other worker. Its ranks take the same steps; its tokens are the sum over its ranks and its
        seconds the slowest rank's, so all ranks (and all workers) record the same counts and adopt
        the same shares: a node is as fast as its slowest rank. One all-gather of a few numbers
        inside the worker.
        """
        if self.comm.shards_per_worker == 1:
            return list(workers)
        tokens = torch.tensor([w.tokens for w in workers], dtype=torch.float64)
        seconds = torch.tensor([w.busy_seconds for w in workers], dtype=torch.float64)
        tokens = self.comm.sum_over_shards(tokens)
        seconds = self.comm.max_over_shards(seconds)
        return [
            dataclasses.replace(w, tokens=t, busy_seconds=b)
            for w, t, b in zip(workers, tokens.tolist(), seconds.tolist())
        ]

    def _control_message(
        self,
        interval: NextInterval,
        counters: IntervalCounters,
        step: int,
        index: int,
        worker: int,
        sq_norm: float,
        finite: bool,
        counted: bool,
    ) -> ControlMessage:
        """What ``worker`` tells the others about the interval; ``counted=False``: no tokens."""
        anchors = counters.anchor_sq_norms
        anchor = anchors[worker] if anchors is not None and counted else 0.0
        return ControlMessage(
            sq_norm=sq_norm if finite else 0.0,
            tokens=float(counters.tokens[worker]) if counted else 0.0,
            loss_sum=counters.loss_sum[worker] if finite and counted else 0.0,
            loss_count=float(counters.steps[worker]) if counted else 0.0,
            nonfinite=0.0 if finite else 1.0,
            anchor_sq_norm=anchor if finite and math.isfinite(anchor) else 0.0,
            anchor_lr_mass=counters.anchor_lr_mass if counted else 0.0,
            step=float(step),
            interval_index=float(index),
            start_step=float(interval.start_step),
            h_step=float(interval.h_step),
            h_tok=float(interval.h_tok),
            config_fingerprint=self.fingerprint,
            inner_steps=float(counters.steps[worker]) if counted else 0.0,
            busy_seconds=counters.busy_seconds[worker] if counted else 0.0,
        )

    def _compensate(
        self, worker: int, delta: torch.Tensor, fragment: Fragment | None
    ) -> torch.Tensor:  # fmt: skip
        """``delta`` plus the worker's residual (of ``fragment``'s part): what the wire drops
        (docs/algorithm.md#error-feedback)."""
        layout = self.layout
        if fragment is None:
            segments, offset = layout.shard_segment_sizes, 0
        else:
            segments = layout.fragment_segment_sizes[fragment.index]
            offset = layout.fragment_pieces[fragment.index][0] - layout.shard[0]
        codec = self.comm.codec(segments)
        return self.error_feedback[worker].apply(codec, delta, self.comm.num_workers, offset)


def sum_collected(parts: Sequence[Collected]) -> Collected:
    """The fragments' collected sums added in fragment order; the agreed fields of the last.

    The last fragment closed the interval, so its agreed fields are the interval's.
    """
    if len(parts) == 1:
        return parts[0]
    last = parts[-1]
    agreed = {name: getattr(last.control.totals, name) for name in ControlMessage.agreed_fields()}

    def add(messages: Sequence[ControlMessage]) -> ControlMessage:
        total = messages[0].pack()
        for message in messages[1:]:
            total = total + message.pack()
        return dataclasses.replace(ControlMessage.unpack(total), **agreed)

    workers = tuple(add(column) for column in zip(*(p.control.workers for p in parts)))
    sums = {k: sum(getattr(p.traffic, k) for p in parts) for k in asdict(last.traffic)}
    traffic = Traffic(**sums)
    return Collected(
        ControlRound(add([p.control.totals for p in parts]), workers),
        sum((p.mean_sq_norm for p in parts[1:]), parts[0].mean_sq_norm),
        any(p.mean_nonfinite for p in parts),
        traffic,
    )
