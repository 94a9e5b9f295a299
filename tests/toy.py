"""What the engine tests leave out when they compare two runs' interval records.

The toy model and its data are in :mod:`autoloco_hf.toy.pattern`.
"""

from __future__ import annotations

# IntervalRecord fields that measure wall time: never equal between two runs
TIMING_FIELDS = {
    "seconds",
    "sync_seconds",
    "controller_seconds",
    "encode_seconds",
    "collective_seconds",
    "decode_seconds",
}
