"""Live membership: survivors of a lost peer and joining processes go on in process, on a store.

Modules: ``membership`` (``LiveMembership``: the rounds), ``agreement`` (what a
closed round decides: the source, the refusals, ``Agreement``), ``store`` (the
etcd store and the bound on each request), ``errors`` (what a caller catches),
``process_group`` (accelerate on the new group) and ``etcd_check`` (does an etcd
endpoint answer). Used by the Trainer and by plain Accelerate loops alike:
docs/reliability.md.
"""
