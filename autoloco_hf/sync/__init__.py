"""Where bytes move: the communicators (simulated, process group, shard by shard), the control message, the
FP32 outer optimizer, the interval engine and its schedules, snapshots, and the loops over local workers.
The wire formats live in ``autoloco_hf.wire``, the state file and records in ``autoloco_hf.state``.
Imports the algorithm and torch, never transformers."""
