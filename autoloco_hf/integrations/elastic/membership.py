"""Survivors that do not restart: membership rounds on a
shared store, a new process group in process.

docs/reliability.md, "Live membership". The outer state changes only at
boundaries, so a boundary is the only place where who trains must be agreed.
A *round* is one membership of the run; round ``r`` is formed on the store
under ``autoloco/round<r>/``:

1. every participant takes a slot (``add(count, 1)``) and writes what it brings:
   its id, the step of the last boundary state it holds (``-1``: none, a new
   process), the run's configuration and a signature of its model;
2. the round closes when the slots reach what a closer expects, or stop coming
   for ``settle_s``. Only a member of round ``r - 1`` may close round ``r`` (the
   initial members close round 0), so a process left out of a round cannot
   start a group of its own: there is one line of rounds, and a store whose
   writes are linearizable (etcd needs a majority for each) has one truth. The
   first closer to draw ticket 1 writes the slot count; a slot beyond it waits
   for the next round;
3. every participant reads the same slots and computes the same result
   (:mod:`autoloco_hf.integrations.elastic.agreement`): the *source* is the
   slot holding the newest boundary; a slot whose configuration or model
   differs from the source's is refused (:class:`JoinRefused`, one line naming
   the field) and the others go on without it; the ranks are the remaining
   slots in order;
4. the default process group is replaced (destroyed, then initialized on a
   store prefix of the round), and the source broadcasts its boundary state:
   ``theta_t``, outer momentum, controller and token mapper, and the caller's
   extra state (its LR scheduler). Every member goes on from it with its own
   AdamW state; a new process gets the outer state from a live peer, not from a file.

A lost peer surfaces at a boundary as :class:`PeerLostError`; the caller then
calls :meth:`LiveMembership.reform`, builds a new engine on the new group and
resumes it at the agreed boundary (at most the interval the fault cut is
redone). A process that wants in calls :meth:`LiveMembership.join`; the members
see it at their next boundary (a one-element ``MAX`` all-reduce, so all of them
see it at the same boundary) and reform with it.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from autoloco_hf.config import AutoLoCoConfig
from autoloco_hf.errors import AutoLoCoError
from autoloco_hf.integrations.elastic.agreement import (
    NO_BOUNDARY,
    Agreement,
    Slot,
    choose_source,
    model_signature,
    refusal,
)
from autoloco_hf.integrations.elastic.errors import JoinRefused, RoundFailed
from autoloco_hf.integrations.elastic.store import STORE_TIMEOUTS, ask, cut_off, store_errors
from autoloco_hf.state.checkpoint import config_json
from autoloco_hf.state.records import IntervalRecord
from autoloco_hf.sync.communicators import peer_lost
from autoloco_hf.sync.engine.engine import IntervalEngine
from autoloco_hf.sync.snapshot import check_snapshot_support, host_copy

__all__ = ["LiveMembership"]

logger = logging.getLogger("autoloco_hf")

PREFIX = "autoloco/"


class _GroupFailed(AutoLoCoError):
    """A closed round's process group did not form (a
    participant ended, or the store failed meanwhile)."""


class LiveMembership:
    """Membership rounds for one process (one worker: ``ranks_per_worker = 1``, no overlap).

    Args:
        store: a ``torch.distributed.Store`` every process reaches and that
            outlives any of them: the ``EtcdStore`` of an etcd cluster (no single
            point of failure) or a ``TCPStore`` on a host that is not a worker.
        member_id: this process's name in rounds and messages (e.g. ``"<host>-<pid>"``).
        config: the run's configuration; a process with another one is refused.
        model: the worker's model; a process with another layout is refused.
        settle_s: a closer waits this long for more slots once they stop coming, and twice this
            long after the close for each slot to say it is alive. After a loss it closes at once
            when all members but one are in; a survivor that reaches its failing collective more
            than ``settle_s`` after the first (a loaded machine, a slower worker) is left out and
            taken in at the next boundary, so give ``settle_s`` above that skew. Round 0, the
            launch, waits for all ``world_size`` processes up to ``round_timeout_s / 2`` instead.
        round_timeout_s: the bound on forming one round. It must outlast a round whose group set-up
            fails (up to ``config.sync_timeout_s``) and the next one: at least
            ``2 * sync_timeout_s + 6 * settle_s``, and that (at least 120 s) when not given.
        backend: the process-group backend of every round.
        store_timeout_s: the bound on one store request (``add``, ``set``, ``check``, ``get``;
            not a wait, which its round's deadline bounds). A request that fails or does not
            complete within it raises :class:`StoreLost`: a process cut off from the store's
            majority (its etcd client tries the other endpoints in turn, and its own minority
            member cannot commit a write) ends within ``sync_timeout_s + store_timeout_s`` of
            the first boundary it reaches (docs/reliability.md). It must outlast a healthy
            client's failover from a lost member to a live one (default 30 s; ``etcd_store``
            waits ``request_timeout_s``, 2 s, for a member before it tries the next).
    """

    def __init__(
        self,
        store: Any,
        member_id: str,
        config: AutoLoCoConfig,
        model: torch.nn.Module,
        *,
        settle_s: float = 2.0,
        round_timeout_s: float | None = None,
        backend: str = "gloo",
        store_timeout_s: float = 30.0,
    ) -> None:
        if config.ranks_per_worker != 1:
            raise ValueError(
                f"config.ranks_per_worker={config.ranks_per_worker}: live membership keeps one "
                "process per worker; use ranks_per_worker=1 or the restart "
                "path (docs/reliability.md)"
            )
        if settle_s <= 0:
            raise ValueError(f"settle_s={settle_s:g}: must be above 0 (the default is 2 s)")
        if store_timeout_s <= 0:
            why = "must be above 0 (the default is 30 s)"
            raise ValueError(f"store_timeout_s={store_timeout_s:g}: {why}")
        # each try closes (settle_s), confirms (2 settle_s)
        # and sets up its group (up to sync_timeout_s)
        needed = 2 * config.sync_timeout_s + 6 * settle_s
        if round_timeout_s is None:
            round_timeout_s = max(120.0, needed)
        elif round_timeout_s < needed:
            raise ValueError(
                f"round_timeout_s={round_timeout_s:g} with "
                f"config.sync_timeout_s={config.sync_timeout_s:g} and settle_s={settle_s:g}: a "
                "round must outlast a failed group set-up and its retry; give round_timeout_s >= "
                f"{needed:g} (2 * sync_timeout_s + 6 * settle_s), or leave it out"
            )
        self.store = store
        self.member_id = member_id
        self.config = config
        self.settle_s = settle_s
        self.round_timeout_s = round_timeout_s
        self.backend = backend
        self.store_timeout_s = store_timeout_s
        self._config_json = config_json(config)
        self._model = model_signature(model)
        self.round = NO_BOUNDARY  # the round this process is a member of
        self.world_size = 0
        # start()'s world_size: at the launch, a majority of it decides the run
        self._launch_size = 0
        self._state: dict[str, Any] | None = None  # host copy of the last boundary state
        self._boundary = NO_BOUNDARY
        self._extra_state: Callable[[], dict[str, Any]] | None = None
        self._local_state: Callable[[], dict[str, Any]] | None = None
        # host copy of this process's own state at the last boundary
        self._local: dict[str, Any] | None = None
        self.join_pending = False  # set at a boundary where every member saw a process waiting
        self.agreement: Agreement | None = None  # the last round this process entered

    # ------------------------------------------------------------------ entering the run
    def start(self, world_size: int) -> Agreement:
        """Form round 0 with the run's first ``world_size`` processes (each calls this once).

        A process started after round 0 closed is taken in at the members' next boundary, as by
        :meth:`join`: the launch and later processes run the same command.
        """
        self._launch_size = world_size
        try:
            deadline = time.monotonic() + self.round_timeout_s
            agreement = self._attempt(0, may_close=True, expected=world_size, deadline=deadline)
        except store_errors() as err:
            raise cut_off("forming membership round 0", err) from None
        # a slot too many: the run takes it in later
        return agreement if agreement is not None else self.join()

    def join(self) -> Agreement:
        """Wait for a round that admits this process (the
        members take it in at their next boundary)."""
        try:
            return self._join()
        except store_errors() as err:
            raise cut_off("waiting to join", err) from None

    def _join(self) -> Agreement:
        deadline = time.monotonic() + self.round_timeout_s
        number = self._latest() + 1
        while True:
            agreement = self._attempt(
                number, may_close=self.round == number - 1, expected=None, deadline=deadline
            )
            if agreement is not None:
                return agreement
            number = max(number + 1, self._latest() + 1)

    def reform(self, lost: Sequence[int] = (), refused: Sequence[int] = ()) -> Agreement:
        """After a lost peer (``lost``: the ranks the error names, maybe more than
        were lost), after members were refused (``refused``: those ranks, alive but
        out) or at a boundary with ``join_pending``.

        Every reachable member calls this; the new round's members go on from the agreed boundary.
        """
        try:
            return self._reform(lost, refused)
        except store_errors() as err:
            raise cut_off(f"forming membership round {self.round + 1}", err) from None

    def _reform(self, lost: Sequence[int], refused: Sequence[int]) -> Agreement:
        if self.join_pending:
            waiting = int(self._ask("add", self._key(self.round + 1, "count"), 0))
            expected: int | None = self.world_size + waiting
        elif refused:
            expected = self.world_size - len(refused)
        elif lost:
            # at most all but one survive: close as soon as they are in (gloo often cannot say
            # which peer is gone); fewer, after settle_s without a new slot
            expected = self.world_size - 1
        else:
            expected = None
        deadline = time.monotonic() + self.round_timeout_s
        number = self.round + 1
        while True:
            agreement = self._attempt(
                number, may_close=self.round == number - 1, expected=expected, deadline=deadline
            )
            if agreement is not None:
                return agreement
            # left out (a late slot: wait to be taken in like
            # a new process) or the round's group failed
            number, expected = max(number + 1, self._latest() + 1), None

    # ------------------------------------------------------------------ while training
    def attach(
        self,
        engine: IntervalEngine,
        extra_state: Callable[[], dict[str, Any]] | None = None,
        local_state: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """Keep a host copy of ``engine``'s boundary state at
        every boundary and look for waiting processes.

        ``extra_state`` adds the caller's shared state (its LR scheduler's ``state_dict()``),
        returned to every member in :attr:`Agreement.state` under its own keys. ``local_state`` is
        this process's own state to restore with the boundary (its optimizer's ``state_dict()``: a
        redone interval then starts from the AdamW moments of its start, not from ones that already
        saw its steps), kept in host memory (one more copy of it) and returned in
        :attr:`Agreement.local_state`, never sent.
        """
        check_snapshot_support(engine)
        self._extra_state = extra_state
        self._local_state = local_state
        self._keep(engine)
        engine.listeners.append(lambda record: self._at_boundary(engine, record))

    def _keep(self, engine: IntervalEngine) -> None:
        state = {"engine": engine.boundary_state()}
        if self._extra_state is not None:
            state.update(self._extra_state())
        self._state, self._boundary = host_copy(state), engine.step
        self._local = host_copy(self._local_state()) if self._local_state is not None else None

    def _at_boundary(self, engine: IntervalEngine, record: IntervalRecord) -> None:
        import torch.distributed as dist

        self._keep(engine)
        try:
            waiting = torch.tensor([float(self._ask("add", self._key(self.round + 1, "count"), 0))])
        except store_errors() as err:
            raise cut_off(f"looking for joining processes at step {engine.step}", err) from None
        try:  # every member must decide alike: the largest count any of them saw
            dist.all_reduce(waiting, op=dist.ReduceOp.MAX)
        except RuntimeError as err:
            others = [r for r in range(self.world_size) if r != dist.get_rank()]
            raise peer_lost(
                err, "the check for joining processes", dist.get_rank(), others, None
            ) from err
        self.join_pending = bool(waiting.item() > 0)

    # ------------------------------------------------------------------ one round
    def _ask(self, request: str, *args: Any) -> Any:
        """``self.store.<request>(*args)`` within ``store_timeout_s`` (:func:`~.store.ask`)."""
        return ask(self.store, self.store_timeout_s, request, *args)

    def _key(self, number: int, name: str) -> str:
        return f"{PREFIX}round{number}/{name}"

    def _latest(self) -> int:
        key = f"{PREFIX}latest"
        self.store.wait([key], datetime.timedelta(seconds=self.round_timeout_s))
        return int(self._ask("get", key))

    def _attempt(
        self, number: int, *, may_close: bool, expected: int | None, deadline: float
    ) -> Agreement | None:
        """Round ``number``, or ``None``: left out of it, or
        its group failed to form (the caller tries the next).

        A participant that ends between the round's close and its group's set-up (or an etcd member
        lost while the group's ranks meet on the store) fails the set-up for all: each raises within
        the group's timeout. The participants then hold a closed round, so each may close the next
        one, which forms without the lost.
        """
        try:
            return self._form(number, may_close=may_close, expected=expected, deadline=deadline)
        except _GroupFailed as err:
            if number == 0:  # a launch whose group fails must not end as fewer workers training on
                cause = "a process ended while it set up"
                if self.backend == "gloo":
                    cause += (
                        ", or gloo picked an interface the other hosts cannot reach (in "
                        "namespaces and containers the host name often resolves to 127.0.0.1): "
                        "set GLOO_SOCKET_IFNAME to the interface the hosts share"
                    )
                raise RoundFailed(
                    f"membership round 0 (the launch): its process group did not form ({err}); "
                    f"likely {cause}; launch again"
                ) from err
            if time.monotonic() >= deadline:
                raise RoundFailed(
                    f"membership round {number}: its process group did not form ({err}) and "
                    f"round_timeout_s={self.round_timeout_s:g} is spent; the run may be over"
                ) from err
            logger.warning(
                "membership round %d: its process group did not form (%s); forming the next",
                number,
                err,
            )
            return None

    def _form(
        self, number: int, *, may_close: bool, expected: int | None, deadline: float
    ) -> Agreement | None:
        """Take part in round ``number``; ``None`` if this
        process was left out of it (a slot too late)."""
        me = int(self._ask("add", self._key(number, "count"), 1))
        info = {
            "id": self.member_id,
            "boundary": self._boundary,
            "config": self._config_json,
            "model": self._model,
        }
        self._ask("set", self._key(number, f"slot{me}"), json.dumps(info))
        closed_key = self._key(number, "closed")
        if may_close:
            self._close(number, me, expected, deadline)
        size = self._wait_closed(number, closed_key, deadline)
        if me > size:
            return None
        # alive after the close: this slot counts
        self._ask("set", self._key(number, f"ready{me}"), "1")
        if may_close:
            self._confirm(number, size)
        confirmed = self._wait_confirmed(number, deadline)
        if me not in confirmed:  # too slow to confirm: taken in at a later round like a new process
            return None
        if number == 0 and len(confirmed) < self._launch_size:
            raise RoundFailed(
                f"membership round 0 (the launch) has {len(confirmed)} of "
                f"world_size={self._launch_size} processes after waiting {self._quiet_s(0):g} s "
                "(round_timeout_s / 2): start the missing ones, or launch all with "
                f"world_size={len(confirmed)}; none trains as if the launch had worked"
            )
        slots = [self._read_slot(number, s, deadline) for s in confirmed]
        return self._enter(number, me, slots)

    def _close(self, number: int, me: int, expected: int | None, deadline: float) -> None:
        count_key, closed_key = self._key(number, "count"), self._key(number, "closed")
        count, changed = me, time.monotonic()
        # the launch's processes reach round 0 after their imports, seconds
        # apart on a loaded machine: wait for all of them up to half of
        # round_timeout_s, not settle_s (which is for survivors of a fault)
        quiet_s = self._quiet_s(number)
        while not self._ask("check", [closed_key]):
            now = time.monotonic()
            latest = int(self._ask("add", count_key, 0))
            if latest != count:
                count, changed = latest, now
            if (
                (expected is not None and count >= expected)
                or now - changed >= quiet_s
                or now > deadline
            ):
                if int(self._ask("add", self._key(number, "ticket"), 1)) == 1:
                    self._ask("set", closed_key, str(count))
                return
            time.sleep(0.02)

    def _quiet_s(self, number: int) -> float:
        """How long a closer waits for slots that stop coming."""
        return self.round_timeout_s / 2 if number == 0 else self.settle_s

    def _confirm(self, number: int, size: int) -> None:
        """Write which closed slots are alive: those that
        said so before none did for ``2 * settle_s``.

        A slot whose process died or hung after taking it (a joiner waits a whole interval for
        the close) does not count, so it costs the others ``2 * settle_s`` after the last
        confirmation (at the launch, the launch then fails), not a failed group set-up or a
        round's timeout. A live participant too slow to confirm is taken in at the next boundary
        like a new process. The first closer to draw ticket 1 writes the list, so every
        participant reads the same one.
        """
        ready = [self._key(number, f"ready{slot}") for slot in range(1, size + 1)]
        # a loaded machine delays a live participant by
        # seconds: the window starts again at each confirmation
        window_s = 2 * self.settle_s
        alive, changed = [], time.monotonic()
        while True:
            slots = enumerate(ready, start=1)
            now_alive = [slot for slot, key in slots if self._ask("check", [key])]
            if now_alive != alive:
                alive, changed = now_alive, time.monotonic()
            if len(alive) == size or time.monotonic() - changed >= window_s:
                break
            time.sleep(0.02)
        if int(self._ask("add", self._key(number, "confirm_ticket"), 1)) == 1:
            self._ask("set", self._key(number, "confirmed"), json.dumps(alive))

    def _wait_confirmed(self, number: int, deadline: float) -> list[int]:
        key = self._key(number, "confirmed")
        try:
            self.store.wait(
                [key], datetime.timedelta(seconds=max(0.1, deadline - time.monotonic()))
            )
        except STORE_TIMEOUTS as err:
            raise RoundFailed(
                f"membership round {number} closed but no closer said which slots are alive within "
                f"round_timeout_s={self.round_timeout_s:g} ({type(err).__name__}); "
                "the run may be over"
            ) from err
        return json.loads(self._ask("get", key))

    def _wait_closed(self, number: int, key: str, deadline: float) -> int:
        try:
            self.store.wait(
                [key], datetime.timedelta(seconds=max(0.1, deadline - time.monotonic()))
            )
        except STORE_TIMEOUTS as err:
            raise RoundFailed(
                f"membership round {number} did not close within "
                f"round_timeout_s={self.round_timeout_s:g}: no member of the run reached the store "
                f"({type(err).__name__}); the run may be over"
            ) from err
        return int(self._ask("get", key))

    def _read_slot(self, number: int, slot: int, deadline: float) -> Slot:
        key = self._key(number, f"slot{slot}")
        try:
            self.store.wait(
                [key], datetime.timedelta(seconds=max(0.1, deadline - time.monotonic()))
            )
        except STORE_TIMEOUTS as err:
            raise RoundFailed(
                f"membership round {number}: the store lost slot {slot}'s record "
                f"({type(err).__name__}) though it confirmed; the run may be over"
            ) from err
        info = json.loads(self._ask("get", key))
        return Slot(slot, info["id"], int(info["boundary"]), info["config"], info["model"])

    def _enter(self, number: int, me: int, slots: list[Slot]) -> Agreement:
        import torch.distributed as dist

        mine = next(s for s in slots if s.slot == me)
        source = choose_source(slots, number, self._launch_size, self.member_id)
        accepted = [s for s in slots if refusal(s, source) is None]
        reason = refusal(mine, source)
        if reason is not None:
            raise JoinRefused(
                f"{self.member_id} may not join the run (membership round {number}): {reason}"
            )
        for slot in slots:
            if slot not in accepted:
                logger.warning(
                    "membership round %d: %s refused: %s",
                    number,
                    slot.member_id,
                    refusal(slot, source),
                )
        rank, size = accepted.index(mine), len(accepted)
        if dist.is_initialized():
            dist.destroy_process_group()
        # a participant of a closed round: it may close the next one if this one fails
        self.round = number
        timeout = datetime.timedelta(seconds=self.config.sync_timeout_s or self.round_timeout_s)
        store = dist.PrefixStore(self._key(number, "group/"), self.store)
        state = None
        try:
            dist.init_process_group(
                self.backend, store=store, rank=rank, world_size=size, timeout=timeout
            )
            if source.boundary != NO_BOUNDARY:
                box = [self._state if source.slot == me else None]
                dist.broadcast_object_list(box, src=accepted.index(source))
                state = box[0]
        # gloo / the store (DistError is a RuntimeError)
        except (RuntimeError, LookupError, ValueError) as err:
            if dist.is_initialized():
                dist.destroy_process_group()
            raise _GroupFailed(
                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            ) from err
        self.world_size, self.join_pending = size, False
        if rank == 0:
            self._ask("set", f"{PREFIX}latest", str(number))
        logger.info(
            "membership round %d: %d member(s) %s, going on from step %s",
            number,
            size,
            [s.member_id for s in accepted],
            source.boundary if state else 0,
        )
        local = self._local if state is not None and mine.boundary == source.boundary else None
        members = [s.member_id for s in accepted]
        self.agreement = Agreement(
            number, rank, size, members, state, local, source_rank=accepted.index(source)
        )
        return self.agreement
