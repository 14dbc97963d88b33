"""Ray adapters (DESIGN §2): the only package that imports ray, and only inside functions.

- :mod:`trine.distributed.plan`: the resource plan (actors, bundles, feasibility) printed at start;
- :mod:`trine.distributed.actors`: the trainer, explorer and buffer-writer actors (the objects of
  ``trine train`` / ``trine explore``, in Ray workers);
- :mod:`trine.distributed.launch`: the driver of ``trine run`` with ``cluster.backend: ray``.
"""
