"""The run's store: an etcd cluster without a single point of failure, and a bound on each request.

A request that fails or does not answer within ``store_timeout_s`` cuts this
process off from the run: :func:`cut_off` turns it into :class:`StoreLost`,
one line (docs/reliability.md, "Cut off from the store").
"""

from __future__ import annotations

import datetime
import logging
import threading
from typing import Any

import torch

from autoloco_hf.errors import AutoLoCoError
from autoloco_hf.integrations.elastic.errors import StoreLost
from autoloco_hf.integrations.elastic.etcd_check import EtcdUnreachable, check_etcd

__all__ = ["ask", "cut_off", "etcd_store", "store_errors"]

logger = logging.getLogger("autoloco_hf")


class _NoAnswer(AutoLoCoError, TimeoutError):
    """A store request not done within ``store_timeout_s`` (a store error, not a round timeout)."""


def store_errors() -> tuple[type[BaseException], ...]:
    """What a store raises when it cannot be reached:
    python-etcd's errors, torch's network errors, sockets."""
    errors: tuple[type[BaseException], ...] = (torch.distributed.DistNetworkError, OSError)
    try:
        import etcd
    except ImportError:  # a TCPStore run needs no python-etcd
        return errors
    return (*errors, etcd.EtcdException)


# a wait that ran out: TCPStore raises DistStoreError, torch's EtcdStore LookupError
STORE_TIMEOUTS = (torch.distributed.DistStoreError, LookupError)


def cut_off(doing: str, err: BaseException) -> StoreLost:
    """The :class:`StoreLost` to raise when a store request failed with ``err`` while ``doing``."""
    first = str(err).splitlines()[0] if str(err) else ""
    cause = first if isinstance(err, _NoAnswer) else f"{type(err).__name__}: {first[:200]}"
    return StoreLost(
        f"live membership: the run's store failed while {doing} ({cause}); "
        "this process is cut off from the run and stops; the members that reach the store go on "
        "without it from their last boundary, and the same command takes it in again later"
    )


def ask(store: Any, timeout_s: float, request: str, *args: Any) -> Any:
    """``store.<request>(*args)``, bounded by ``timeout_s`` (else :class:`_NoAnswer`).

    A client cut off from the store's majority does not fail at once: python-etcd waits
    for each endpoint in turn, and a minority member holds a write until its own timeout.
    The request runs in a daemon thread; one that does not return in time is left behind
    (the process is about to end with :class:`StoreLost`).
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = getattr(store, request)(*args)
        except BaseException as err:  # handed to the caller's thread as it is
            outcome["error"] = err

    thread = threading.Thread(target=run, name=f"autoloco-store-{request}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        bound = f"store_timeout_s={timeout_s:g}"
        raise _NoAnswer(f"no answer to {request} within {bound}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# One etcd request to one member. Longer, a write held by a member
# whose leader died waits for etcd's own timeout (about 7 s) instead of
# going to the next member once the others have elected (about 1 s).
REQUEST_TIMEOUT_S = 2.0


def etcd_store(
    endpoints: str,
    run_id: str,
    timeout: datetime.timedelta,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> Any:
    """The store of a run on an etcd cluster (``"host:port,host:port,..."``,
    every member): no single point of failure.

    torch's ``EtcdStore`` over a ``python-etcd`` client that fails over between the members; the
    run's keys live under ``/autoloco-live/<run_id>``. Raises :class:`EtcdUnreachable` (one line
    naming every endpoint) when none answers; an endpoint that does not is named in a warning.

    ``request_timeout_s`` bounds one request to one member; the client then sends it to the next
    member. It is short because of the etcd leader: a write that a member forwarded to a leader that
    has just died is held by etcd for about 7 s, while the others elect a new leader in about 1 s.
    Waits for a key have their own timeout (``timeout``) and are not cut by it.
    """
    if request_timeout_s <= 0:
        raise ValueError(
            f"request_timeout_s={request_timeout_s:g}: must be above 0 (the default is "
            f"{REQUEST_TIMEOUT_S:g} s)"
        )
    import etcd
    from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore

    hosts, silent = [], []
    for endpoint in endpoints.split(","):
        host, _, port = endpoint.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"etcd endpoint {endpoint!r}: expected host:port, e.g. 10.0.0.1:2379")
        hosts.append((host, int(port)))
        try:
            check_etcd(endpoint.strip())
        except EtcdUnreachable as err:
            silent.append(str(err))
    # one line naming every endpoint; a start fails here, not after round_timeout_s
    if len(silent) == len(hosts):
        raise EtcdUnreachable(f"no etcd endpoint of {endpoints!r} answers: " + "; ".join(silent))
    # the client fails over to the others; a member lost is what the cluster is for
    for reason in silent:
        logger.warning("live membership: %s", reason)
    client = etcd.Client(
        host=tuple(hosts), protocol="http", allow_reconnect=True, read_timeout=request_timeout_s
    )
    return EtcdStore(client, f"/autoloco-live/{run_id}", timeout)
