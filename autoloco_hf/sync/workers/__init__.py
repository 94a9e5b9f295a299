"""Plain PyTorch loops over the workers of one process (docs/algorithm.md#simulation).

``local_workers``: ``LocalWorkers``, the replicas one after the other; ``batched_workers``:
the replicas (and several runs) stepped as one batched computation.
"""
