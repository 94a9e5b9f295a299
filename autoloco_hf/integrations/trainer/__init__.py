"""What only the Trainer uses: the callback and the pieces beneath it (resume, pacing, arguments).

Modules: ``callback`` (``AutoLoCoCallback``), ``internals`` (the Trainer behaviour
it relies on beyond the callback contract), ``collectives`` (the Trainer's own
collectives end within ``sync_timeout_s``), ``pacing`` (budget pacing under the
Trainer), ``resume`` (which checkpoint or boundary a run resumes from), ``arguments``
(``AutoLoCoArguments``), ``log_levels`` (AutoLoCo's console lines at the
Trainer's levels) and ``live`` (``train_live``: the Trainer on live membership).
"""
