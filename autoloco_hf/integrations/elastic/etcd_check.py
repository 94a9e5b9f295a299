"""Does an etcd endpoint answer, with the v2 API torch elastic's ``etcd-v2`` rendezvous needs?
One line if not.

    python -m autoloco_hf.integrations.elastic.etcd_check ETCD1:2379 && \\
        torchrun --rdzv-backend etcd-v2 --rdzv-endpoint ETCD1:2379 ...

torchrun's own error for an etcd that does not answer is a traceback ending in "The connection to
etcd has failed. See inner exception for details.", without the endpoint; this check names it, and
says whether nothing answered or an etcd without the v2 API did (etcd 3.4 serves it only with
``--enable-v2=true``). On success it prints the cluster's client URLs, one line.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from autoloco_hf.errors import AutoLoCoError

__all__ = ["EtcdUnreachable", "check_etcd"]


class EtcdUnreachable(AutoLoCoError, RuntimeError):
    """The etcd endpoint does not answer, or not with the v2 API (one line naming it)."""


def check_etcd(endpoint: str, timeout_s: float = 5.0) -> list[str]:
    """The client URLs of every member of the cluster behind
    ``endpoint`` (``host:port``, as given to torchrun)."""
    url = f"http://{endpoint}/v2/members"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            members = json.load(response)["members"]
    except urllib.error.HTTPError as err:
        raise EtcdUnreachable(
            f"etcd endpoint {endpoint} answered {url} with HTTP {err.code}: it does not serve the "
            "v2 API that torchrun --rdzv-backend etcd-v2 needs; start every member with "
            "--enable-v2=true (docs/hf.md)"
        ) from None
    # refused, unreachable, timed out, not etcd's JSON
    except (OSError, ValueError, KeyError) as err:
        reason = getattr(err, "reason", err)
        raise EtcdUnreachable(
            f"etcd endpoint {endpoint} did not answer within {timeout_s:g} s ({reason}): start the "
            "etcd cluster (docs/hf.md) or pass a live member's host:port as --rdzv-endpoint"
        ) from None
    return [u for member in members for u in member.get("clientURLs", [])]


def main(argv: list[str]) -> int:
    if not argv:
        print(
            "usage: python -m autoloco_hf.integrations.elastic.etcd_check "
            "HOST:PORT [HOST:PORT ...]",
            file=sys.stderr,
        )
        return 2
    try:
        for endpoint in argv:
            print(f"etcd endpoint {endpoint}: cluster {' '.join(check_etcd(endpoint))}")
    except EtcdUnreachable as err:
        print(f"EtcdUnreachable: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
