"""Where bytes move, in floors that import downwards only (``.importlinter`` checks them).

* ``workers/``: the loops over local workers (one after the other, or batched);
* ``schedules/``: when the engine's stages run (delayed, eager, streaming), the DDP
  gradient-averaging engine, and ``make_engine``, which picks one from a config;
* ``snapshot``: the boundary snapshots of the engine's shared state;
* ``engine/``: the interval engine, its contract, its state types and helpers;
* ``communicators/``, ``control``, ``outer``, ``pacing``: the collectives, the control
  message, the FP32 outer optimizer, and the pacing of workers of unequal speed.

The wire formats live in ``autoloco_hf.wire``, the state file and records in ``autoloco_hf.state``.
Imports the algorithm and torch, never transformers."""
