"""Tests for task scheduling: selectors, weighted mixes of tasksets, the online curriculum, build_scheduler."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from trine.tasks import (
    SCHEDULERS,
    SELECTORS,
    CurriculumScheduler,
    MixedScheduler,
    TaskScheduler,
    TaskSet,
    build_scheduler,
)
from trine.tasks.mixed import allocate
from trine.types import Task


def make_tasks(n: int, prefix: str = "t", repeat: int = 1, **raw_columns) -> list[Task]:
    """``n`` tasks ``prefix/i``; ``raw_columns`` maps a row field to a list of values."""
    return [
        Task(
            task_id=f"{prefix}/{i}",
            question=str(i),
            repeat=repeat,
            taskset=prefix,
            raw={key: values[i] for key, values in raw_columns.items()},
        )
        for i in range(n)
    ]


def ids(batch: list[Task]) -> list[str]:
    return [t.task_id for t in batch]


def index(batch: list[Task]) -> list[int]:
    return [int(t.task_id.split("/")[1]) for t in batch]


# -- selectors ----------------------------------------------------------------------------------------


def test_selector_names_and_legacy_shuffle_switch():
    assert set(SELECTORS) == {"sequential", "shuffle", "random", "easy_to_hard"}
    tasks = make_tasks(12)
    assert index(TaskScheduler(tasks, selector="sequential").next_batch(12)) == list(range(12))
    assert index(TaskScheduler(tasks, shuffle=False).next_batch(12)) == list(range(12))
    legacy = TaskScheduler(tasks, seed=5, epochs=2)  # shuffle=True default == selector="shuffle"
    named = TaskScheduler(tasks, seed=5, epochs=2, selector="shuffle")
    assert [ids(legacy.next_batch(5)) for _ in range(5)] == [ids(named.next_batch(5)) for _ in range(5)]
    assert named.selector == "shuffle" and TaskScheduler(tasks, shuffle=False).selector == "sequential"
    with pytest.raises(ValueError, match="unknown selector 'shufle'.*'easy_to_hard'"):
        TaskScheduler(tasks, selector="shufle")
    with pytest.raises(ValueError, match="shuffle=False contradicts selector='random'"):
        TaskScheduler(tasks, shuffle=False, selector="random")


def test_shuffle_is_a_fresh_permutation_per_epoch():
    s = TaskScheduler(make_tasks(10), selector="shuffle", seed=3, epochs=3)
    epochs = [index(s.next_batch(10)) for _ in range(3)]
    assert all(sorted(e) == list(range(10)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2] and list(range(10)) not in epochs


def test_random_draws_with_replacement_seeded():
    tasks = make_tasks(20)
    a = TaskScheduler(tasks, selector="random", seed=1, epochs=3)
    draws = [index(a.next_batch(20)) for _ in range(3)]
    assert all(len(d) == 20 for d in draws) and a.exhausted and a.next_batch(5) == []
    assert all(max(Counter(d).values()) > 1 for d in draws)  # repeats within an epoch
    assert all(len(set(d)) < 20 for d in draws)  # so some task is missing from it
    assert draws == [index(TaskScheduler(tasks, selector="random", seed=1).next_batch(20))] + draws[1:]
    assert index(TaskScheduler(tasks, selector="random", seed=2).next_batch(20)) != draws[0]


def test_easy_to_hard_orders_by_difficulty_with_seeded_ties():
    levels = [3, 1, 2, 1, 3, 1, 2, 1, 1, 1, 1, 1]  # eight tasks tie at difficulty 1
    tasks = make_tasks(12, level=levels)
    s = TaskScheduler(tasks, selector="easy_to_hard", difficulty_key="level", seed=0, epochs=2)
    first, second = index(s.next_batch(12)), index(s.next_batch(12))
    for order in (first, second):
        assert [levels[i] for i in order] == sorted(levels)
        assert sorted(order) == list(range(12))
    easy = [i for i, level in enumerate(levels) if level == 1]
    assert first[:8] != second[:8] and sorted(first[:8]) == easy  # ties reshuffled per epoch
    again = TaskScheduler(tasks, selector="easy_to_hard", difficulty_key="level", seed=0)
    assert index(again.next_batch(12)) == first
    other = TaskScheduler(tasks, selector="easy_to_hard", difficulty_key="level", seed=9)
    assert index(other.next_batch(12))[:8] != first[:8]
    hard_first = TaskScheduler(tasks, selector="easy_to_hard", difficulty_key="level", descending=True)
    assert [levels[i] for i in index(hard_first.next_batch(12))] == sorted(levels, reverse=True)


def test_easy_to_hard_errors_name_the_problem():
    with pytest.raises(ValueError, match="set difficulty_key="):
        TaskScheduler(make_tasks(3), selector="easy_to_hard")
    rows = make_tasks(2, level=[1, 2]) + [Task(task_id="t/2", question="2", raw={"other": 0})]
    with pytest.raises(ValueError, match=r"task 't/2' has no field 'level'.*row keys: \['other'\]"):
        TaskScheduler(rows, selector="easy_to_hard", difficulty_key="level")
    with pytest.raises(ValueError, match="task 't/1' holds None in field 'level'"):
        TaskScheduler(make_tasks(2, level=[1, None]), selector="easy_to_hard", difficulty_key="level")
    with pytest.raises(ValueError, match="task 't/0' holds 'easy' in field 'level'"):
        TaskScheduler(make_tasks(1, level=["easy"]), selector="easy_to_hard", difficulty_key="level")
    with pytest.raises(ValueError, match="difficulty_key='level' is only used by selector 'easy_to_hard'"):
        TaskScheduler(make_tasks(2, level=[1, 2]), difficulty_key="level")
    with pytest.raises(ValueError, match="descending=True only applies"):
        TaskScheduler(make_tasks(2), descending=True)


# -- weighted mix -------------------------------------------------------------------------------------


def mix(weights: dict[str, float], sizes: dict[str, int], epochs=None, seed: int = 0) -> MixedScheduler:
    children = {
        name: TaskScheduler(make_tasks(sizes[name], prefix=name), seed=i, epochs=epochs)
        for i, name in enumerate(weights)
    }
    return MixedScheduler(children, weights, seed=seed)


def test_allocate_gives_floor_or_ceil_of_each_quota_and_sums_to_n():
    rng = random.Random(0)
    weights = {"a": 0.7, "b": 0.2, "c": 0.1}
    totals = Counter()
    for _ in range(2000):
        counts = allocate(7, weights, rng)  # quotas 4.9, 1.4, 0.7
        assert sum(counts.values()) == 7
        assert counts["a"] in (4, 5) and counts["b"] in (1, 2) and counts["c"] in (0, 1)
        totals.update(counts)
    assert totals["a"] / 14000 == pytest.approx(0.7, abs=0.01)
    assert totals["c"] / 14000 == pytest.approx(0.1, abs=0.01)
    assert allocate(4, {"a": 2.0, "b": 1.0, "c": 1.0}, rng) == {"a": 2, "b": 1, "c": 1}


@pytest.mark.parametrize(("batch_size", "tolerance"), [(8, 0.03), (1, 0.08)])
def test_mixed_proportions_follow_weights(batch_size, tolerance):
    s = mix({"a": 0.7, "b": 0.3}, {"a": 50, "b": 50})
    drawn = [t.taskset for _ in range(400 // batch_size) for t in s.next_batch(batch_size)]
    assert len(drawn) == 400
    assert drawn.count("a") / 400 == pytest.approx(0.7, abs=tolerance)
    assert s.counts == {"a": drawn.count("a"), "b": drawn.count("b")}
    if batch_size == 8:  # every batch holds floor or ceil of its 5.6 quota, interleaved
        s2 = mix({"a": 0.7, "b": 0.3}, {"a": 50, "b": 50})
        batches = [[t.taskset for t in s2.next_batch(8)] for _ in range(20)]
        assert all(b.count("a") in (5, 6) for b in batches)
        assert any(b != sorted(b) and b != sorted(b, reverse=True) for b in batches)


def test_exhausted_child_drops_out_and_others_fill_the_batch():
    s = mix({"a": 0.5, "b": 0.5}, {"a": 5, "b": 40}, epochs=1, seed=2)
    assert s.num_tasks == 45 and s.total_batches(10) == 5 and s.remaining() == 45
    batches = [s.next_batch(10) for _ in range(5)]
    assert [len(b) for b in batches] == [10, 10, 10, 10, 5]
    every = [t.task_id for b in batches for t in b]
    assert sorted(every) == sorted([f"a/{i}" for i in range(5)] + [f"b/{i}" for i in range(40)])
    assert s.exhausted and s.next_batch(10) == [] and s.remaining() == 0
    assert all(child.exhausted for child in s.schedulers.values())
    endless = mix({"a": 0.5, "b": 0.5}, {"a": 3, "b": 3}, epochs=None)
    assert endless.total_batches(4) is None and endless.remaining() is None


def test_feedback_is_routed_to_the_owning_taskset():
    s = mix({"a": 1.0, "b": 1.0}, {"a": 4, "b": 4})
    s.feedback(["a/1", "b/2", "a/3"], {"pass_rate": [0.25, 1.0, None]})
    s.feedback(["b/2"], [{"pass_rate": 0.0}])
    assert s.schedulers["a"].task_stats("a/1")["pass_rate"] == 0.25
    assert s.task_stats("b/2")["pass_rate_mean"] == 0.5 and s.task_stats("a/3") == {}
    with pytest.raises(ValueError, match=r"\['c/0'\], which are in none of the tasksets \['a', 'b'\]"):
        s.feedback(["c/0"], {"pass_rate": [1.0]})
    with pytest.raises(ValueError, match="one value per task id"):
        s.feedback(["a/0", "b/0"], {"pass_rate": [1.0]})


def test_mixed_settings_errors():
    children = {"a": TaskScheduler(make_tasks(2, prefix="a")), "b": TaskScheduler(make_tasks(2, prefix="a"))}
    with pytest.raises(ValueError, match="task id 'a/0' is in both taskset 'a' and 'b'"):
        MixedScheduler(children, {"a": 1, "b": 1})
    children["b"] = TaskScheduler(make_tasks(2, prefix="b"))
    with pytest.raises(
        ValueError, match=r"weights are given for \['a'\] but the schedulers are \['a', 'b'\]"
    ):
        MixedScheduler(children, {"a": 1})
    with pytest.raises(ValueError, match=r"weights \{'b': 0\} are not finite numbers > 0"):
        MixedScheduler(children, {"a": 1, "b": 0})


# -- online curriculum --------------------------------------------------------------------------------


def simulate(scheduler: CurriculumScheduler, truth: dict[str, float], rounds: int, rng: random.Random):
    """Run ``rounds`` batches of 16, feeding back Bernoulli outcomes; the true pass rates picked per round."""
    picked = []
    for _ in range(rounds):
        batch = scheduler.next_batch(16)
        assert len(set(ids(batch))) == 16  # distinct tasks within a batch
        picked.append([truth[t.task_id] for t in batch])
        rates = [sum(rng.random() < truth[t.task_id] for _ in range(t.repeat)) / t.repeat for t in batch]
        scheduler.feedback(ids(batch), {"pass_rate": rates})
    return picked


def test_curriculum_moves_picked_pass_rates_towards_target():
    rng = random.Random(0)
    tasks = make_tasks(200, prefix="s", repeat=8)
    truth = {t.task_id: rng.betavariate(4, 1) for t in tasks}  # mostly easy: mean p ~ 0.8
    s = CurriculumScheduler(tasks, target_pass_rate=0.5, seed=1, epochs=None)
    picked = simulate(s, truth, rounds=60, rng=rng)

    def gap(rows):
        values = [p for row in rows for p in row]
        return sum(abs(p - 0.5) for p in values) / len(values), sum(values) / len(values)

    uniform_gap, uniform_mean = gap([list(truth.values())])
    first_gap, first_mean = gap(picked[:10])
    last_gap, last_mean = gap(picked[-10:])
    assert first_gap > 0.6 * uniform_gap  # it starts (nearly) uniform: nothing is known yet
    assert last_gap < 0.6 * uniform_gap and last_gap < first_gap - 0.1
    assert last_mean < first_mean - 0.1 and abs(last_mean - 0.5) < abs(uniform_mean - 0.5) / 2


def test_curriculum_estimates_prior_evidence_and_forgetting():
    tasks = make_tasks(4, repeat=4)
    s = CurriculumScheduler(tasks, prior_pass_rate=0.5, prior_strength=2.0, forgetting=0.5, epochs=None)
    assert s.estimate("t/0") == 0.5  # the prior
    s.feedback(["t/0", "t/1"], {"pass_rate": [1.0, [0, 0, 1, 0]]})  # a rate, or per-rollout outcomes
    assert s.estimate("t/0") == pytest.approx(5 / 6)  # Beta(1 + 4, 1 + 0)
    assert s.estimate("t/1") == pytest.approx(2 / 6)  # Beta(1 + 1, 1 + 3)
    s.next_batch(2)  # one step: half the evidence is forgotten -> Beta(1 + 2, 1)
    assert s.estimate("t/0") == pytest.approx(3 / 4)
    assert s.task_stats("t/1")["pass_rate"] == 0.25
    with pytest.raises(ValueError, match=r"pass_rate=1.5 for task 't/2'; expected a share in \[0, 1\]"):
        s.feedback(["t/2"], {"pass_rate": [1.5]})
    with pytest.raises(ValueError, match="target_pass_rate=1.0"):
        CurriculumScheduler(tasks, target_pass_rate=1.0)
    with pytest.raises(ValueError, match="forgetting=2"):
        CurriculumScheduler(tasks, forgetting=2)


def test_curriculum_epochs_bound_the_tasks_handed_out():
    s = CurriculumScheduler(make_tasks(5), epochs=2)
    assert s.total_batches(4) == 3
    assert [len(s.next_batch(4)) for _ in range(4)] == [4, 4, 2, 0] and s.exhausted
    assert all(len(set(ids(CurriculumScheduler(make_tasks(5)).next_batch(5)))) == 5 for _ in range(3))


# -- resume -------------------------------------------------------------------------------------------


def outcome(task_id: str, round_: int) -> float:
    """A deterministic pass rate in {0, 0.25, ..., 1} (the same in every process)."""
    return (sum(map(ord, task_id)) * (round_ + 3)) % 5 / 4


def play(scheduler, rounds: int, start: int = 0) -> list[list[str]]:
    """Hand out batches of 6 and feed back deterministic pass rates; the ids of each batch."""
    out = []
    for r in range(start, start + rounds):
        batch = scheduler.next_batch(6)
        out.append(ids(batch))
        if batch:
            scheduler.feedback(ids(batch), {"pass_rate": [outcome(t.task_id, r) for t in batch]})
    return out


def fresh(kind: str):
    levels = [i % 4 for i in range(15)]
    if kind == "random":
        return TaskScheduler(make_tasks(15), selector="random", seed=4, epochs=3)
    if kind == "easy_to_hard":
        return TaskScheduler(
            make_tasks(15, level=levels), selector="easy_to_hard", difficulty_key="level", epochs=3
        )
    if kind == "curriculum":
        return CurriculumScheduler(make_tasks(15, repeat=4), seed=4, epochs=3)
    return MixedScheduler(
        {
            "a": CurriculumScheduler(make_tasks(9, prefix="a", repeat=4), seed=1, epochs=2),
            "b": TaskScheduler(make_tasks(7, prefix="b"), selector="shuffle", seed=2, epochs=2),
        },
        {"a": 0.6, "b": 0.4},
        seed=3,
    )


@pytest.mark.parametrize("kind", ["random", "easy_to_hard", "curriculum", "mixed"])
def test_resume_gives_identical_batches(kind):
    original = fresh(kind)
    play(original, 3)
    state = json.loads(json.dumps(original.state_dict()))  # plain JSON round trip
    resumed = fresh(kind)
    resumed.load_state_dict(state)
    rest = play(original, 6, start=3)
    assert play(resumed, 6, start=3) == rest
    assert rest[-1] == [] and original.exhausted and resumed.exhausted
    assert play(fresh(kind), 9)[3:] == rest  # and equal to an uninterrupted run


def test_resume_with_other_settings_is_refused():
    state = fresh("mixed").state_dict()
    other = MixedScheduler(dict(fresh("mixed").schedulers), {"a": 0.5, "b": 0.5}, seed=3)
    with pytest.raises(ValueError, match="saved with weights="):
        other.load_state_dict(state)
    with pytest.raises(
        ValueError, match="saved with selector='random' but this scheduler has selector='shuffle'"
    ):
        TaskScheduler(make_tasks(15), seed=4, epochs=3).load_state_dict(fresh("random").state_dict())
    with pytest.raises(ValueError, match="no 'curriculum' entry"):
        fresh("curriculum").load_state_dict(
            TaskScheduler(make_tasks(15), seed=4, selector="sequential").state_dict()
        )


# -- build_scheduler ----------------------------------------------------------------------------------


def taskset(name: str, n: int) -> TaskSet:
    return TaskSet.from_rows(
        [{"question": f"{name}{i}", "answer": "x", "level": i % 3} for i in range(n)], name=name
    )


def test_build_scheduler_one_taskset():
    math_set = taskset("math", 6)
    plain = build_scheduler([math_set], seed=7, epochs=2)
    assert type(plain) is TaskScheduler and plain.selector == "shuffle" and plain.seed == 7
    ordered = build_scheduler([math_set], selector="easy_to_hard", difficulty_key="level")
    assert [t.raw["level"] for t in ordered.next_batch(6)] == [0, 0, 1, 1, 2, 2]
    assert build_scheduler([math_set], shuffle=False).selector == "sequential"
    curriculum = build_scheduler([math_set], curriculum={"target_pass_rate": 0.3}, epochs=None)
    assert isinstance(curriculum, CurriculumScheduler) and curriculum.target_pass_rate == 0.3


def test_build_scheduler_mixes_several_tasksets():
    sets = [taskset("math", 30), taskset("code", 10)]
    by_size = build_scheduler(sets, seed=1)
    assert isinstance(by_size, MixedScheduler) and by_size.weights == {"math": 30.0, "code": 10.0}
    assert [child.seed for child in by_size.schedulers.values()] == [1, 2]
    listed = build_scheduler(sets, weights=[1, 3], epochs=None, curriculum={})
    assert listed.weights == {"math": 1, "code": 3}
    assert all(isinstance(child, CurriculumScheduler) for child in listed.schedulers.values())
    drawn = Counter(t.taskset for _ in range(25) for t in listed.next_batch(8))
    assert drawn == {"math": 50, "code": 150}
    assert build_scheduler(sets, weights={"math": 2, "code": 1}).weights == {"math": 2, "code": 1}


def test_build_scheduler_errors():
    sets = [taskset("math", 3), taskset("code", 3)]
    with pytest.raises(ValueError, match=r"weights=\[1\] has 1 entries for 2 tasksets"):
        build_scheduler(sets, weights=[1])
    with pytest.raises(ValueError, match=r"taskset name\(s\) \['math'\] are used more than once"):
        build_scheduler([sets[0], taskset("math", 2)])
    with pytest.raises(ValueError, match="curriculum is set.*selector='random'"):
        build_scheduler(sets, selector="random", curriculum={})
    with pytest.raises(ValueError, match=r"unknown curriculum argument\(s\) \['temperature'\]"):
        build_scheduler(sets, curriculum={"temperature": 0.1})
    with pytest.raises(ValueError, match="no tasksets"):
        build_scheduler([])
    assert SCHEDULERS == {
        "default": TaskScheduler,
        "curriculum": CurriculumScheduler,
        "mixed": MixedScheduler,
    }
