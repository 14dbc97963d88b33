"""The explorer side of the loop (DESIGN §1): tasks → workflows → experiences → buffer.

- :mod:`~trine.explorer.runner`: :class:`Explorer` runs workflows concurrently (timeout, retry, skip);
- :mod:`~trine.explorer.failures`: the failed-answer rule that stops a run (``max_skip_ratio``);
- :mod:`~trine.explorer.side`: :class:`ExplorerSide`, the one produce pipeline (feedback → shaping →
  operators → expert rows → put) that batch producers and the stream both call;
- :mod:`~trine.explorer.shaping`: DAPO dynamic sampling and overlong shaping;
- :mod:`~trine.explorer.streaming`: the streaming explorer of mode async;
- :mod:`~trine.explorer.pacing`: the one pacing rule (the staleness bound, counted in rows);
- :mod:`~trine.explorer.evaluator`: evaluation on the eval tasksets.

Names are resolved lazily, so importing the package imports no workflow.
"""

from trine.registry import lazy_exports

_EXPORTS = {
    "Explorer": "trine.explorer.runner",
    "SkipRatioError": "trine.explorer.failures",
    "rollout_returns": "trine.explorer.runner",
    "ExplorerSide": "trine.explorer.side",
    "ExpertRows": "trine.explorer.side",
    "Shaping": "trine.explorer.side",
    "Evaluator": "trine.explorer.evaluator",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
