"""DAPO's overlong shaping and dynamic sampling with refill (``trine.explorer.shaping.shape_batch``), driven by
plain settings and a ``draw_more`` callable as the explorer side passes them."""

from __future__ import annotations

import itertools

from trine.explorer.shaping import shape_batch
from trine.types import Experience

_ids = itertools.count()


def group(*rewards: float, length: int = 2) -> list[Experience]:
    """One group of rollouts of a fresh task with these rewards and ``length`` response tokens."""
    gid = f"g{next(_ids)}"
    return [Experience([1] * (1 + length), 1, [1] * length, reward=r, group_id=gid) for r in rewards]


def test_without_dynamic_sampling_only_overlong_shaping_applies():
    exps = group(1.0, 0.0, length=4) + group(1.0, 1.0, length=2)
    metrics: dict[str, float] = {}

    def never(n: int) -> list[Experience] | None:
        raise AssertionError("no refill without dynamic sampling")

    out = shape_batch(exps, metrics, max_tokens=4, batch_size=2, draw_more=never, overlong_buffer=0.5)
    assert out is exps and metrics == {}
    assert [e.reward for e in out] == [0.0, -1.0, 1.0, 1.0]  # the 4-token responses hit max_tokens


def test_dynamic_sampling_drops_uniform_groups_and_refills_until_the_batch_is_full():
    exps = group(1.0, 0.0) + group(1.0, 1.0) + group(0.0, 0.0)
    asked: list[int] = []
    draws = iter([group(0.0, 0.0), group(1.0, 0.0) + group(0.0, 1.0)])

    def draw_more(n: int) -> list[Experience] | None:
        asked.append(n)
        return next(draws)

    metrics = {"explorer/x": 1.0}
    out = shape_batch(exps, metrics, max_tokens=8, batch_size=3, draw_more=draw_more, dynamic_sampling=True)
    assert asked == [2, 2] and len(out) == 6
    assert metrics == {
        "explorer/x": 1.0,
        "dapo/kept_groups": 3.0,
        "dapo/dropped_all_correct": 1.0,
        "dapo/dropped_all_wrong": 2.0,
        "dapo/extra_draws": 2.0,
    }


def test_refill_stops_at_max_extra_draws_or_when_tasks_run_out():
    metrics: dict[str, float] = {}
    shape_batch(
        group(1.0, 1.0),
        metrics,
        max_tokens=8,
        batch_size=2,
        draw_more=lambda n: group(0.0, 0.0),
        dynamic_sampling=True,
        max_extra_draws=3,
    )
    assert metrics["dapo/extra_draws"] == 3.0 and metrics["dapo/kept_groups"] == 0.0
    shape_batch(
        group(1.0, 0.0), metrics, max_tokens=8, batch_size=2, draw_more=lambda n: None, dynamic_sampling=True
    )
    assert metrics["dapo/extra_draws"] == 0.0 and metrics["dapo/kept_groups"] == 1.0
