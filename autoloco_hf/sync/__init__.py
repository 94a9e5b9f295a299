"""Where bytes move: the wire codec and its accounting, communicators (simulated, process group, shard by
shard), the control message, the FP32 outer optimizer, the interval engine and its records, checkpoints, and the
plain loop over local workers. Imports the algorithm and torch, never transformers."""
