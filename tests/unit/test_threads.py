"""The torch threads of a process (:mod:`trine.threads`): ``auto`` from the free cores, the warning for an
explicit count on busy cores, one place that sets them, and ``num_threads`` in the config."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import trine
from trine.config import RunConfig
from trine.threads import SHARE_ENV, choose, local_processes, resumed_note, threads_for, use_threads

PACKAGE = Path(trine.__file__).resolve().parent


@pytest.mark.parametrize(
    ("cores", "load", "processes", "count"),
    [
        (2, 1.3, 1, 1),  # the busy 2-core machine of issue 23
        (2, 0.1, 1, 2),  # idle but for background noise: all of it
        (2, 0.6, 1, 1),  # 1.4 free cores round to 1
        (2, 5.0, 1, 1),  # more load than cores: still 1
        (16, 0.2, 1, 16),
        (16, 4.0, 3, 4),  # 12 free cores among the trainer and 2 explorers
        (2, 0.0, 3, 1),  # fewer cores than processes: 1 each
        (1, 0.0, 1, 1),
    ],
)
def test_auto_takes_the_free_cores_divided_among_the_run_s_processes(cores, load, processes, count):
    assert choose("auto", processes, cores=cores, load=load).count == count


def test_auto_says_what_it_chose_and_why():
    chosen = choose("auto", cores=2, load=1.3)
    assert chosen.line == "threads: 1 (2 cores, load 1.3; set num_threads=N to override)"
    assert chosen.warning is None
    shared = choose("auto", 3, cores=16, load=4.0)
    assert shared.line == (
        "threads: 4 (16 cores, load 4.0, shared by 3 processes of this run; set num_threads=N to override)"
    )


def test_an_explicit_count_is_kept_and_warned_about_only_on_oversubscribed_cores():
    fine = choose(2, cores=2, load=0.1)
    assert (fine.count, fine.warning) == (2, None)
    assert fine.line == "threads: 2 (num_threads: 2; 2 cores, load 0.1)"
    busy = choose(2, cores=2, load=1.3)
    assert busy.count == 2  # used as given: the warning names the fix, nothing is rewritten
    assert busy.warning == (
        "warning: num_threads: 2 oversubscribes this machine (2 cores, load 1.3 from other work), which can "
        "make CPU steps many times slower; set num_threads=1 (or num_threads: auto, which picks from the "
        "free cores at every start)"
    )
    shared = choose(4, 3, cores=8, load=0.0)  # 12 threads on 8 idle cores
    assert shared.warning is not None and shared.warning.startswith("warning: num_threads: 4 × 3 processes")
    assert "set num_threads=3" in shared.warning
    assert choose(1, cores=2, load=9.0).warning is None  # 1 is the floor: nothing better to suggest


def test_the_run_s_processes_on_this_machine_come_from_the_launcher_or_torchrun():
    assert local_processes({}) == 1
    assert local_processes({"LOCAL_WORLD_SIZE": "2"}) == 2
    assert local_processes({SHARE_ENV: "3", "LOCAL_WORLD_SIZE": "2"}) == 3
    with pytest.raises(ValueError, match=rf"{SHARE_ENV}='0': expected a whole number >= 1"):
        local_processes({SHARE_ENV: "0"})


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_use_threads_applies_the_choice_and_says_it(restore_threads, monkeypatch):
    monkeypatch.delenv(SHARE_ENV, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    said: list[str] = []
    assert use_threads(1, said.append) == 1 == torch.get_num_threads()
    assert len(said) == 1 and said[0].startswith("threads: 1 (num_threads: 1;")
    said.clear()
    count = use_threads("auto", said.append, processes=1)
    assert count == torch.get_num_threads() >= 1
    assert re.fullmatch(
        rf"threads: {count} \(\d+ cores?, load \d+\.\d; set num_threads=N to override\)", said[0]
    )


def test_threads_for_restores_the_previous_count(restore_threads):
    torch.set_num_threads(1)
    with threads_for(2, say=lambda _: None) as count:
        assert count == 2 == torch.get_num_threads()
    assert torch.get_num_threads() == 1


def test_ray_actors_share_the_cores_of_their_node():
    from trine.distributed.launch import _local

    # bundle 0: trainer (+ buffer writer), 1-3: explorers; two nodes
    assert _local({0: "10.0.0.1", 1: "10.0.0.1", 2: "10.0.0.2", 3: "10.0.0.1"}) == {0: 3, 1: 3, 2: 1, 3: 3}


def test_a_resume_with_another_count_says_so():
    assert resumed_note(None, 2, "step_4") is None  # a checkpoint from before the count was recorded
    assert resumed_note(2, 2, "step_4") is None
    assert resumed_note(2, 1, "step_4") == (
        "threads: step_4 was written with 2 threads, this run uses 1: CPU results can differ from an "
        "uninterrupted run; set num_threads=2 to match"
    )


def test_only_trine_threads_sets_torch_threads_and_every_torch_entry_uses_it():
    setters = sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "set_num_threads(" in p.read_text()
    )
    assert setters == ["threads.py"]
    for entry in (
        "rundir.py",
        "inspect/check.py",
        "launch/bench.py",
        "launch/processes.py",
        "launch/serve.py",
    ):
        text = (PACKAGE / entry).read_text()
        assert "use_threads(" in text or "threads_for(" in text, entry
    assert "SHARE_ENV" in (PACKAGE / "distributed" / "actors.py").read_text()  # the node's share, passed down


def _validate(**top):
    data = PACKAGE.parent / "examples" / "arithmetic" / "data" / "train.jsonl"
    return RunConfig.model_validate({"tasks": {"total_steps": 1, "train": {"path": str(data)}}, **top})


def test_num_threads_is_auto_by_default_a_count_when_given_and_nothing_else():
    from pydantic import ValidationError

    from trine.config import _format

    assert RunConfig.model_fields["num_threads"].default == "auto"
    assert _validate(num_threads=3).num_threads == 3
    for bad in (None, 0, "4", 2.0, True, "max"):
        with pytest.raises(ValidationError) as err:
            _validate(num_threads=bad)
        messages = [_format(e, "") for e in err.value.errors()]
        assert messages == [
            f"num_threads: {bad!r} is not a thread count; expected an integer >= 1 or auto (the free cores, "
            "the default): write e.g. num_threads: 1, or remove the key"
        ], bad


def test_roles_get_their_own_cores_and_explorers_share_theirs():
    from trine.threads import cores_text, parse_cores, role_cores

    assert role_cores([0, 1], 2) == {"trainer": [0], "explorer": [1]}  # 2 cores: one each, explorers share
    assert role_cores(list(range(8)), 3) == {"trainer": [0, 1, 2, 3], "explorer": [4, 5, 6, 7]}
    assert role_cores([5], 2) == {"trainer": [5], "explorer": [5]}  # one core: everyone shares it
    assert parse_cores("0,2-4") == [0, 2, 3, 4] and cores_text([0, 2, 3, 4]) == "0,2-4"
    with pytest.raises(ValueError, match=r"TRINE_CORES='x': expected CPU ids such as 0, 1-3"):
        parse_cores("x")


def test_a_launcher_gives_each_role_its_cores_and_the_process_pins_itself_to_them(tmp_path):
    """``trine run`` with ``launch: processes`` (:func:`role_environments`) on this machine's cores, and a
    child process started with the explorers' environment: pinned to their cores, with its threads from
    them, and saying so."""
    import json
    import os
    import subprocess
    import sys

    from trine.launch.processes import role_environments
    from trine.threads import CORES_ENV, parse_cores, role_cores

    mine = sorted(os.sched_getaffinity(0))
    env = role_environments(2)
    roles = role_cores(mine, 2)
    assert parse_cores(env["explorer"][CORES_ENV]) == roles["explorer"]
    assert env["explorer"][SHARE_ENV] == ("2" if len(mine) > 1 else "3")
    child = (
        "import json, os; from trine.threads import use_threads, about; n = use_threads('auto', say=lambda s: None);"
        "print(json.dumps({'n': n, 'affinity': sorted(os.sched_getaffinity(0)), 'about': about(n)}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", child], env=env["explorer"], capture_output=True, text=True, check=True
    )
    said = json.loads(out.stdout)
    assert said["affinity"] == roles["explorer"] and said["n"] >= 1
    assert said["about"] == {"threads": said["n"], "cores": env["explorer"][CORES_ENV]}
