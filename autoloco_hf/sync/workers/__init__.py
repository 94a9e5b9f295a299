"""Plain PyTorch loops over the workers of one process (docs/algorithm.md#simulation).

``replicas``: the workers' models and optimizers, stepped one after the other or as one
batched computation; ``local_workers``: ``LocalWorkers``, one run's loop over them;
``batched_workers``: several runs stepped as one batched computation.
"""
