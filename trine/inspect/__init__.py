"""Looking at runs and setups without changing them: ``trine check`` (:mod:`~trine.inspect.check`, its probes
in :mod:`~trine.inspect.probes`), the preflight checks of files a run will read
(:mod:`~trine.inspect.preflight`) and ``trine status`` (:mod:`~trine.inspect.report`)."""
