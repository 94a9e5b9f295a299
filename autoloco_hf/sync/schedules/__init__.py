"""When the engine's stages run, and which engine a config
gets (docs/algorithm.md#baselines, 11, 12).

``overlap``: the delayed and eager schedules; ``streaming``: the fragment schedule;
``gradient_averaging``: the DDP baseline engine; ``factory``: ``make_engine``, the one
place that maps a config to its engine and schedule.
"""
