"""Plain PyTorch loops over the workers of one process (docs/algorithm.md §8.4).

``local_workers``: ``LocalWorkers``, the replicas one after the other; ``batched_workers``:
the replicas (and several runs) stepped as one batched computation.
"""
