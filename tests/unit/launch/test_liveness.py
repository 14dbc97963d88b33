"""Liveness of the processes of an async run (:mod:`trine.launch.liveness`): status files written by hand
(a dead pid from a finished subprocess, heartbeats of chosen ages), read at chosen times; and the trainer's
step loop stopping once its explorers are gone."""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers import dead_pid
from trine.buffer import BufferTimeout
from trine.launch.liveness import ExplorersWatch, Patience, PeerGone, TrainerWatch, look
from trine.modes import asynchronous
from trine.modes.asynchronous import trainer_steps
from trine.status import HEARTBEAT_SECONDS, MIN_HEARTBEAT_SECONDS, Heartbeat, beat_interval, write_status

HOST = socket.gethostname()
NOW = 1_700_000_000.0
"""The time the tests look at the files (unix seconds)."""


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def running(directory: Path, pid: int, beat: float, host: str = HOST) -> Path:
    """A status file as a live (or killed) process's heartbeat leaves it."""
    directory.mkdir(parents=True, exist_ok=True)
    write_status(directory, "running", pid=pid, host=host, step=3, heartbeat=iso(beat), started_at=iso(beat))
    return directory


def ended(directory: Path, state: str, at: float, **details: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    write_status(directory, state, pid=os.getpid(), host=HOST, step=3, ended_at=iso(at), **details)
    return directory


def test_look_tells_alive_dead_hung_ended_and_absent(tmp_path):
    gone_pid = dead_pid()
    alive = look(running(tmp_path / "a", os.getpid(), NOW - 2), "the trainer", 10, now=NOW)
    assert (alive.state, alive.why, alive.last_sign) == ("alive", "running, last heartbeat 2s ago", NOW - 2)
    assert alive.label() == f"the trainer (pid {os.getpid()} on {HOST})"
    killed = look(running(tmp_path / "k", gone_pid, NOW - 3), "the trainer", 10, now=NOW)
    assert killed.state == "dead" and killed.why == "its process no longer exists; last heartbeat 3s ago"
    hung = look(running(tmp_path / "h", os.getpid(), NOW - 11), "explorer 0", 10, now=NOW)
    assert hung.state == "dead" and hung.why.startswith("no heartbeat for 11s (hung, frozen")
    assert (
        look(tmp_path / "h", "explorer 0", None, now=NOW).state == "alive"
    )  # wait_timeout None: never stale
    remote = look(running(tmp_path / "r", gone_pid, NOW - 1, host="elsewhere"), "explorer 1", 10, now=NOW)
    assert remote.state == "alive"  # a pid is checked only on the host that wrote it: the heartbeat decides
    failed = look(
        ended(tmp_path / "f", "failed", NOW - 5, error="ValueError: bad\nmore"), "explorer 1", 10, NOW
    )
    assert (failed.state, failed.why, failed.last_sign) == (
        "failed",
        "it ended failed (ValueError: bad)",
        NOW - 5,
    )
    assert look(tmp_path / "none", "the trainer", 10).state == "absent"
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "status.json").write_text('{"state": "runn')
    torn = look(tmp_path / "torn", "the trainer", 10)
    assert torn.state == "absent" and "status.json cannot be read" in torn.why


def test_patience_counts_from_the_newest_sign_of_life_or_its_own_start(tmp_path):
    gone_pid = dead_pid()
    old = look(running(tmp_path / "o", gone_pid, NOW - 100), "the trainer", 10, now=NOW)
    fresh = look(running(tmp_path / "f", gone_pid, NOW - 4), "the trainer", 10, now=NOW)
    late_start = Patience(10, since=NOW - 3)
    assert late_start.silent_for([old], now=NOW) == 3 and not late_start.over([old], now=NOW)
    assert late_start.over([old], now=NOW + 7)  # waited 10s since it started looking
    early_start = Patience(10, since=NOW - 100)
    assert early_start.silent_for([old, fresh], now=NOW) == 4 and not early_start.over([fresh], now=NOW)
    assert early_start.over([old, fresh], now=NOW + 6)
    alive = look(running(tmp_path / "a", os.getpid(), NOW), "explorer 0", 10, now=NOW)
    assert not early_start.over([old, alive], now=NOW + 9)
    assert not Patience(None, since=0).over([old], now=NOW)  # wait_timeout None: forever


def test_an_explorer_gives_up_on_a_killed_trainer_after_wait_timeout(tmp_path):
    gone_pid = dead_pid()
    running(tmp_path, gone_pid, NOW - 1)  # killed a second after its last heartbeat
    watch = TrainerWatch(tmp_path, 10, index=1, count=2, since=NOW - 30)
    assert watch.check(now=NOW) is None and watch.check(now=NOW + 8.9) is None and watch.gone is None
    said = watch.check(now=NOW + 9)
    assert said == watch.gone
    assert said.startswith(f"the trainer (pid {gone_pid} on {HOST}) is gone: its process no longer exists")
    assert "waited 10s for a trainer to come back (sync.wait_timeout: 10s)" in said
    assert f"start `trine train CONFIG` on {tmp_path} (it resumes" in said
    assert "`trine explore CONFIG --explorer-id 1 --explorers 2`" in said


def test_an_explorer_goes_on_with_a_restarted_trainer(tmp_path):
    gone_pid = dead_pid()
    running(tmp_path, gone_pid, NOW - 8)
    watch = TrainerWatch(tmp_path, 10, index=0, count=1, since=NOW - 30)
    assert watch.check(now=NOW) is None
    running(tmp_path, os.getpid(), NOW + 1)  # restarted within the window: a new pid, a fresh heartbeat
    assert watch.check(now=NOW + 5) is None and watch.check(now=NOW + 10) is None
    running(tmp_path, os.getpid(), NOW - 20)  # alive but no heartbeat for longer than wait_timeout: hung
    assert "no heartbeat for 30s" in watch.check(now=NOW + 10)


def test_an_explorer_waits_for_a_trainer_that_never_ran_or_that_ended_before_it_started(tmp_path):
    watch = TrainerWatch(tmp_path, 10, index=0, count=1, since=NOW)
    assert watch.check(now=NOW + 1000) is None  # no status.json: the wait for the first weights decides
    ended(tmp_path, "finished", NOW - 50, reason="done")
    assert watch.check(now=NOW + 1000) is None  # the run is over: the explorer ends without an error
    ended(tmp_path, "stopped", NOW - 50, reason="interrupted; run again to resume")
    assert watch.check(now=NOW + 9) is None  # waits wait_timeout from its own start for a restart
    assert "is gone: it ended stopped (interrupted; run again to resume)" in watch.check(now=NOW + 10)


def test_the_trainer_gives_up_once_every_explorer_is_gone(tmp_path):
    gone_pid = dead_pid()
    zero = running(tmp_path / "explorers" / "0", gone_pid, NOW - 2)
    ended(tmp_path / "explorers" / "1", "failed", NOW - 1, error="RuntimeError: boom")
    (tmp_path / "explorers" / "2").mkdir()  # no status.json: never got as far as its first heartbeat
    watch = ExplorersWatch(tmp_path, 10, since=NOW - 60)
    assert [s.name for s in watch.seen(now=NOW)] == ["explorer 0", "explorer 1"]
    assert watch.check(now=NOW + 8.9) is None
    said = watch.check(now=NOW + 9)
    assert said.startswith(
        f"every explorer is gone and no batch arrived: explorer 0 (pid {gone_pid} on {HOST}): its process no "
        f"longer exists; last heartbeat 11s ago; explorer 1 (pid {os.getpid()} on {HOST}): it ended failed "
        "(RuntimeError: boom). The trainer waited 10s for one to come back (sync.wait_timeout: 10s)"
    )
    assert "`trine explore CONFIG --explorer-id I --explorers N`" in said and "`trine train CONFIG`" in said
    running(zero, os.getpid(), NOW + 5)  # explorer 0 restarted in time
    assert watch.check(now=NOW + 9) is None
    assert watch.summary(now=NOW + 9).startswith(f"explorer 0 (pid {os.getpid()} on {HOST}): running")


def test_the_trainer_keeps_waiting_when_an_explorer_finished_or_none_wrote_a_status(tmp_path):
    gone_pid = dead_pid()
    watch = ExplorersWatch(tmp_path, 10, since=NOW - 60)
    assert watch.check(now=NOW) is None and watch.summary(now=NOW) == ""
    running(tmp_path / "explorers" / "0", gone_pid, NOW - 50)
    ended(tmp_path / "explorers" / "1", "finished", NOW - 50, reason="its tasks ran out")
    assert watch.check(now=NOW) is None  # as today: a batch may still come; wait_timeout per batch decides
    assert "explorer 1 (pid" in watch.summary(now=NOW) and "it ended finished (its tasks ran out)" in (
        watch.summary(now=NOW)
    )


def test_heartbeats_come_often_enough_for_wait_timeout():
    assert beat_interval(None) == beat_interval(600) == HEARTBEAT_SECONDS
    assert beat_interval(8) == 2.0 and beat_interval(0.1) == MIN_HEARTBEAT_SECONDS


def test_a_busy_process_keeps_its_heartbeat_fresh(tmp_path):
    beat = Heartbeat(tmp_path, step=0, interval=0.25)
    try:
        time.sleep(2.5)  # a long step: no beat() from the loop, the daemon thread keeps beating
        assert look(tmp_path, "the trainer", stale_after=2.0).state == "alive"
    finally:
        beat.end("finished")


def test_the_trainer_stops_when_its_explorers_are_gone(tmp_path, monkeypatch):
    gone_pid = dead_pid()
    monkeypatch.setattr(asynchronous, "POLL_SECONDS", 0.1)
    running(tmp_path / "explorers" / "0", gone_pid, time.time() - 30)
    cfg = SimpleNamespace(
        run_path=tmp_path,
        sync=SimpleNamespace(wait_timeout=0.35),
        buffer=SimpleNamespace(end_after_idle=None),
    )

    def consume(timeout: float) -> dict:  # nothing arrives
        time.sleep(timeout)
        raise BufferTimeout("nothing")

    trainer = SimpleNamespace(
        sync=SimpleNamespace(push=lambda model, version: None),
        trainer=SimpleNamespace(model=None),
        version=0,
        batch_size=4,
        consume=consume,
    )
    stage = SimpleNamespace(trainer=trainer, cfg=cfg, step=0, total_steps=5)
    with pytest.raises(PeerGone, match=rf"explorer 0 \(pid {gone_pid} on .*\): its process no longer exists"):
        next(trainer_steps(stage))
    (tmp_path / "explorers" / "0" / "status.json").unlink()  # no explorer known: today's message
    with pytest.raises(TimeoutError, match="is `trine explore` running on this run dir"):
        next(trainer_steps(stage))
    (tmp_path / "explorers" / "0" / "status.json").write_text(json.dumps({"state": "finished"}))
    with pytest.raises(TimeoutError, match="the explorers: explorer 0: it ended finished"):
        next(trainer_steps(stage))
