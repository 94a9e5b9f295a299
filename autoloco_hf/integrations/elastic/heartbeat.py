"""Who of a round is still alive: a counter each member moves, read by a closer after a loss.

A survivor learns of a lost peer at its next collective. On a loaded machine, or with workers of
unequal speed, that can be seconds after the first survivor did, longer than ``settle_s``. A closer
that waited only ``settle_s`` formed the next round without it: the late survivor sat out a whole
interval and the round after took it back in (docs/reliability.md, "Live membership"). So every
member moves its counter while it lives, and a closer after a loss waits for the members of the
last round whose counters still move; a dead or stopped process stops its counter, which costs the
closer ``window_s`` once.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Heartbeat", "Pulses"]

logger = logging.getLogger("autoloco_hf")

# how long stopping waits for a store request in flight (one to a live store takes milliseconds)
JOIN_TIMEOUT_S = 5.0


class Heartbeat:
    """A daemon thread that writes a count to ``key`` on ``store`` every ``period_s`` until
    :meth:`stop`.

    One plain ``set`` a beat, not an ``add``: on etcd an ``add`` is a compare-and-swap of three
    requests, and the store every process of the run shares, whose rounds form on it, should stay
    quiet. A store error ends the
    thread quietly: the training thread meets the same store on its own requests and reports it
    there, in one line. At the process's exit the thread is stopped and joined before the
    interpreter finalizes: a daemon thread still inside a store request then aborts the process
    ("terminate called without an active exception", exit code -6).
    """

    def __init__(self, store: Any, key: str, period_s: float) -> None:
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, args=(store, key, period_s), name="autoloco-heartbeat", daemon=True
        )
        self._thread.start()
        atexit.register(self._join_at_exit)

    def _beat(self, store: Any, key: str, period_s: float) -> None:
        count = 0
        while not self._stopped.wait(period_s):
            count += 1
            try:
                store.set(key, str(count))
            except Exception as err:  # the training thread reports a store failure itself
                logger.debug("live membership: heartbeat %s stopped (%s)", key, err)
                return

    def stop(self) -> None:
        """End the thread (after the store request in flight, if any), without waiting for it."""
        self._stopped.set()

    def _join_at_exit(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=JOIN_TIMEOUT_S)


class Pulses:
    """A closer's view of the heartbeats of ``keys`` (member id -> its counter's key).

    A member beats while its counter changed within the last ``window_s``; one not yet seen to
    change counts as beating until ``window_s`` has passed since the first look. Reads only: a
    ``check`` and a ``get``.
    """

    def __init__(self, ask: Callable[..., Any], keys: dict[str, str], window_s: float) -> None:
        self._ask, self._keys, self._window_s = ask, keys, window_s
        started = time.monotonic()
        self._last: dict[str, tuple[int | None, float]] = {m: (None, started) for m in keys}

    @property
    def members(self) -> list[str]:
        return list(self._keys)

    def beating(self, members: Iterable[str]) -> list[str]:
        """Those of ``members`` (ids in ``keys``) whose counters still move."""
        now, alive = time.monotonic(), []
        for member in members:
            key = self._keys[member]
            value = int(self._ask("get", key)) if self._ask("check", [key]) else 0
            last, since = self._last[member]
            if last is not None and value != last:
                since = now
            self._last[member] = (value, since)
            if now - since < self._window_s:
                alive.append(member)
        return alive
