"""What starts processes and servers around the loop: explorer and trainer processes
(:mod:`~trine.launch.processes`), ``trine serve`` (:mod:`~trine.launch.serve`), ``trine bench``
(:mod:`~trine.launch.bench`); Ray lives in :mod:`trine.distributed`. Which launcher runs is decided by the
config's plan (:attr:`trine.config.RunConfig.plan`)."""
