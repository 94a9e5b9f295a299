"""How a closed round decides: the source, the slots it refuses, each member's place in it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch

from autoloco_hf.integrations.elastic.errors import JoinRefused
from autoloco_hf.state.checkpoint import config_differences

__all__ = ["Agreement", "Slot", "choose_source", "model_signature", "refusal"]

NO_BOUNDARY = -1  # a process that holds no boundary state (it has not trained in this run)


@dataclass(frozen=True)
class Agreement:
    """A formed round: this process's place in it and the
    boundary state every member goes on from."""

    round: int
    rank: int
    world_size: int
    members: list[str]
    state: dict[str, Any] | None  # the source's boundary state (None: no member had trained yet)
    # this process's own state at that boundary
    # (``attach(local_state=...)``; None if it does not hold that boundary)
    local_state: dict[str, Any] | None = None
    # the member whose boundary every member goes on from (its settings are the run's)
    source_rank: int = 0


@dataclass(frozen=True)
class Slot:
    """What one participant of a round wrote in its slot."""

    slot: int
    member_id: str
    boundary: int
    config: dict[str, Any]
    model: str


def model_signature(model: torch.nn.Module) -> str:
    """Names, shapes and dtypes of the parameters: two
    processes may only train together when these agree."""
    layout = [(name, list(p.shape), str(p.dtype)) for name, p in model.named_parameters()]
    return hashlib.sha256(json.dumps(layout).encode()).hexdigest()[:16]


def choose_source(slots: list[Slot], number: int, launch_size: int, member_id: str) -> Slot:
    """The slot every member goes on from: the newest
    boundary; at a launch, the first of those who agree.

    Before anyone trained, every boundary is the same, so arrival order would decide
    whose configuration is the run's: one misconfigured process that starts early
    would train alone and refuse the others. Instead the largest group of slots that
    agree decides, and only when it is a majority of ``launch_size`` (the launch's
    ``world_size``; 0 in a process that joined later: the number of slots).
    """
    trained = [s for s in slots if s.boundary != NO_BOUNDARY]
    if trained:
        return max(trained, key=lambda s: (s.boundary, -s.slot))
    groups: list[list[Slot]] = []
    for slot in slots:
        group = next((g for g in groups if refusal(slot, g[0]) is None), None)
        if group is None:
            groups.append([slot])
        else:
            group.append(slot)
    largest = max(groups, key=len)  # the first of equal size: the same for every participant
    world_size = launch_size or len(slots)
    if 2 * len(largest) <= world_size:
        one, other = largest[0], next(g for g in groups if g is not largest)[0]
        differences = config_differences(one.config, other.config)
        if differences:
            name, ours, theirs = differences[0]
            what = (
                f"field config.{name} is {ours!r} at {one.member_id}, "
                f"{theirs!r} at {other.member_id}"
            )
        else:
            what = (
                f"the models of {one.member_id} and {other.member_id} "
                "differ (names, shapes, dtypes)"
            )
        raise JoinRefused(
            f"{member_id} may not start the run (membership round {number}): no majority of "
            f"world_size={world_size} agrees ({len(largest)} of {len(slots)} process(es) do): "
            f"{what}; start every process with the same AutoLoCoConfig and model"
        )
    return largest[0]


def refusal(slot: Slot, source: Slot) -> str | None:
    """Why ``slot`` may not train with the ``source`` (one clause naming the field), or ``None``."""
    differences = config_differences(source.config, slot.config)
    if differences:
        name, run, theirs = differences[0]
        return (
            f"field config.{name}={theirs!r} but the run has {name}={run!r}: start it with "
            "the run's AutoLoCoConfig"
        )
    if slot.model != source.model:
        return (
            "its model's parameters (names, shapes, dtypes) differ from the run's: "
            "start it with the run's model"
        )
    return None
