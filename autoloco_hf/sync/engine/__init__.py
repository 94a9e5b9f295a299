"""The interval engine and what it is made of
(docs/algorithm.md#interval-statistics to #horizon-rule, #fragments).

``engine``: ``IntervalEngine`` and the blocking schedule; ``contract``: what any engine
and any sync schedule offer; ``interval_state``: the small state types of one interval;
``aggregation``, ``measurements``, ``invalid_intervals``, ``layout``, ``fragments``: the
helpers the engine owns. The schedules that drive it live in ``autoloco_hf.sync.schedules``.
"""
