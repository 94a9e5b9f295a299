"""The pure algorithm (docs/algorithm.md#interval-statistics to #baselines): statistics, token
mapper, outer correction, horizon rule, interval policies and whole-run previews. Plain Python: no
torch.distributed, no transformers, so every rule is testable with scripted numbers in milliseconds
(tests/algorithm/test_purity.py keeps it so)."""
