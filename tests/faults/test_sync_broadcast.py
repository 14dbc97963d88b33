"""BroadcastSender / BroadcastReceiver: the trainer's weights over one torch.distributed group (gloo here)
to explorer processes, each a spawned process with a real HFEngine on a tiny-1m model (or a bare receiver).

Two explorer processes live for the whole module (starting one costs seconds); each test gives them
commands (join a sender, pull a version, close). Tests that kill or stop an explorer start their own.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

from trine.models import init_model, load_model, load_tokenizer
from trine.models.engine import HFEngine
from trine.sync import BroadcastReceiver, BroadcastSender, broadcast
from trine.sync.broadcast import ANSWER, JOINS
from trine.sync.collective import buckets, resolve_backend
from trine.sync.rendezvous import read_address, recorded_address, write_address

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CTX = mp.get_context("spawn")


# -- the explorer process --------------------------------------------------------------------------
class _ExplorerSide:
    """What runs in an explorer process: an engine (None: a bare receiver) and its receiver."""

    def __init__(self, model_dir: str | None) -> None:
        self.engine = _engine(model_dir) if model_dir else None
        self.receiver: BroadcastReceiver | None = None

    def join(self, address: str, name: str, timeout: float) -> None:
        if self.receiver is not None:
            self.receiver.close()
        self.receiver = BroadcastReceiver(address, name, backend="gloo", timeout=timeout)

    def pull(self, version: int, timeout: float) -> tuple[int, dict[str, np.ndarray]]:
        self.receiver.pull(self.engine, version, timeout)
        return self.engine.policy_version, _state(self.engine.model)

    def pull_failing(self, version: int, timeout: float) -> tuple[str, bool, int | None]:
        """(the error of pulling ``version``, whether the engine's weights are unchanged, latest received)."""
        before = _state(self.engine.model)
        try:
            self.receiver.pull(self.engine, version, timeout)
        except Exception as err:
            after = _state(self.engine.model)
            unchanged = all(np.array_equal(before[k], after[k]) for k in before)
            return f"{type(err).__name__}: {err}", unchanged, self.receiver.latest()
        raise AssertionError(f"pulling version {version} into this engine did not fail")

    def wait_latest(self, version: int, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while (self.receiver.latest() or -1) < version and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.receiver.latest()

    def close(self) -> float:
        start = time.monotonic()
        self.receiver.close()
        return time.monotonic() - start

    def tied(self) -> bool:
        """Whether the engine's output head still shares the embedding after loading (sent once)."""
        return self.engine.model.lm_head.weight is self.engine.model.model.embed_tokens.weight

    def thread_ended(self, within: float) -> bool:
        self.receiver._thread.join(within)
        return not self.receiver._thread.is_alive()

    def model(self, model_dir: str) -> None:
        self.engine.close()
        self.engine = _engine(model_dir)


def _engine(model_dir: str) -> HFEngine:
    return HFEngine(load_model(model_dir), load_tokenizer(model_dir))


def _state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def _explorer_main(model_dir: str | None, commands, results) -> None:
    """Run commands ``(name, *args)`` on an :class:`_ExplorerSide` until ``("exit",)``."""
    torch.set_num_threads(1)
    side = _ExplorerSide(model_dir)
    results.put(("ok", os.getpid()))
    while (command := commands.get())[0] != "exit":
        try:
            results.put(("ok", getattr(side, command[0])(*command[1:])))
        except Exception as err:  # reported to the test, which fails on it
            results.put(("error", f"{type(err).__name__}: {err}"))


class Explorer:
    """The test's handle on an explorer process."""

    def __init__(self, model_dir: Path | None) -> None:
        self.commands, self.results = CTX.Queue(), CTX.Queue()
        args = (None if model_dir is None else str(model_dir), self.commands, self.results)
        self.process = CTX.Process(target=_explorer_main, args=args, daemon=True)
        self.process.start()

    def ready(self) -> Explorer:
        self.answer(60)
        return self

    def ask(self, *command, timeout: float = 60):
        self.commands.put(command)
        return self.answer(timeout)

    def answer(self, timeout: float):
        status, value = self.results.get(timeout=timeout)
        if status != "ok":
            raise AssertionError(f"the explorer process failed: {value}")
        return value

    def stop(self) -> None:
        if self.process.is_alive():
            self.commands.put(("exit",))
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model("tiny-1m", tmp_path_factory.mktemp("models") / "tiny-1m", seed=0)


@pytest.fixture(scope="module")
def explorers(model_dir: Path):
    pair = [Explorer(model_dir), Explorer(model_dir)]
    try:
        yield [e.ready() for e in pair]
    finally:
        for e in pair:
            e.stop()


# -- helpers of the trainer side ------------------------------------------------------------------
def _trainer_model(model_dir: Path) -> torch.nn.Module:
    return load_model(model_dir)


def _step(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Change every weight (a stand-in for a training step); returns the new state dict's copy."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.01)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_identical(received: dict[str, np.ndarray], expected: dict[str, torch.Tensor]) -> None:
    assert list(received) == list(expected)
    for key, value in expected.items():
        assert torch.equal(torch.from_numpy(received[key]), value), f"{key} differs"


def _wait_joined(sender: BroadcastSender, n: int, timeout: float = 30) -> None:
    """Wait until the sender's group holds ``n`` explorers."""
    deadline = time.monotonic() + timeout
    while len(sender.members) != n:
        assert time.monotonic() < deadline, f"{n} explorers did not join within {timeout}s: {sender.members}"
        time.sleep(0.02)


def _sender(bucket_mb: float = 64, timeout: float = 10) -> BroadcastSender:
    return BroadcastSender("127.0.0.1", 0, bucket_mb=bucket_mb, backend="gloo", timeout=timeout)


def _trainer_sends(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """(group size, rank sent to, bytes) of every version the trainer sends, from now on."""
    sends: list[tuple[int, int, int]] = []
    real = broadcast.relay

    def counting(group, pieces, up, down, timeout):
        if up is None:
            sends.append((group.size(), down, sum(p.numel() * p.element_size() for p in pieces)))
        return real(group, pieces, up, down, timeout)

    monkeypatch.setattr(broadcast, "relay", counting)
    return sends


def _distinct_bytes(model: torch.nn.Module) -> int:
    """Bytes of the state dict with the tied head counted once."""
    tensors = {v.data_ptr(): v for v in model.state_dict().values()}
    return sum(v.numel() * v.element_size() for v in tensors.values())


# -- tests -----------------------------------------------------------------------------------------
def test_bad_settings_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match="expected host:port"):
        BroadcastReceiver("localhost", "explorer-0", backend="gloo")
    with pytest.raises(ValueError, match="bucket_mb=0"):
        BroadcastSender("127.0.0.1", 0, bucket_mb=0, backend="gloo")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs CUDA.*use gloo or auto"):
            resolve_backend("nccl")
        assert resolve_backend("auto") == "gloo"


@pytest.mark.slow  # explorer processes
@pytest.mark.parametrize("bucket_mb", [64, 0.01], ids=["one-bucket", "many-buckets"])
def test_an_explorer_receives_bit_identical_weights(explorers, model_dir, bucket_mb):
    explorer = explorers[0]
    model = _trainer_model(model_dir)
    layout = [[k, str(v.dtype), list(v.shape)] for k, v in model.state_dict().items()]
    count = len(buckets(layout, int(bucket_mb * 2**20)))  # and pieces of at most a bucket
    assert count == 1 if bucket_mb == 64 else count > 20
    sender = _sender(bucket_mb)
    base = 10 if bucket_mb == 64 else 20  # versions the explorer's engine has not loaded yet
    try:
        explorer.ask("join", sender.address, "explorer-0", 10.0)
        _wait_joined(sender, 1)
        for version in (base + 1, base + 2):  # the second one with the layout already in the store
            expected = _step(model, version)
            sender.push(model, version)
            loaded, received = explorer.ask("pull", version, 30.0)
            assert loaded == version
            _assert_identical(received, expected)
        layout = sender.current.layout
        assert layout.aliases == {"lm_head.weight": "model.embed_tokens.weight"}  # the tied head: once
        assert "lm_head.weight" not in [name for name, _, _ in layout.tensors] and explorer.ask("tied")
        assert sender.metrics() == {
            "sync/receivers": 1.0,
            "sync/broadcast_failures": 0.0,
            "sync/regroups": 1.0,
        }
        assert sender.latest() == base + 2 and sender.seconds > 0
    finally:
        sender.close()
        explorer.ask("close")


@pytest.mark.slow  # explorer processes
def test_one_group_carries_every_push_and_the_trainer_sends_each_version_once(
    explorers, model_dir, monkeypatch
):
    model = _trainer_model(model_dir)
    sender = _sender()
    sends = _trainer_sends(monkeypatch)
    try:
        for i, explorer in enumerate(explorers):
            explorer.ask("join", sender.address, f"explorer-{i}", 10.0)
        _wait_joined(sender, 2)
        regroups = sender.metrics()["sync/regroups"]
        for version in (81, 82, 83):
            expected = _step(model, version)
            sender.push(model, version)
            for explorer in explorers:  # both hold it once push returned
                assert explorer.ask("wait_latest", version, 0.0) == version
                loaded, received = explorer.ask("pull", version, 30.0)
                assert loaded == version
                _assert_identical(received, expected)
        # three ranks; each version leaves the trainer once, for rank 1, which forwards it to rank 2
        assert sends == [(3, 1, _distinct_bytes(model))] * 3
        # membership unchanged: the group formed when the second explorer came is the one every push used
        assert sender.metrics() == {
            "sync/receivers": 2.0,
            "sync/broadcast_failures": 0.0,
            "sync/regroups": regroups,
        }
    finally:
        sender.close()
        for explorer in explorers:
            explorer.ask("close")


@pytest.mark.slow  # explorer processes
def test_a_killed_or_hung_explorer_costs_the_trainer_a_bounded_wait_and_the_others_nothing(
    explorers, model_dir
):
    timeout = 3.0
    doomed = [Explorer(None), Explorer(None)]  # to be killed (SIGKILL) and hung (SIGSTOP)
    model = _trainer_model(model_dir)
    sender = _sender(timeout=timeout)
    try:
        for i, explorer in enumerate(explorers + [d.ready() for d in doomed]):
            explorer.ask("join", sender.address, f"explorer-{i}", timeout)
            _wait_joined(sender, i + 1)  # in this order down the route: the doomed ones last
        expected = _step(model, 31)
        sender.push(model, 31)
        for explorer in explorers:
            _assert_identical(explorer.ask("pull", 31, 30.0)[1], expected)
        for d in doomed:
            assert d.ask("wait_latest", 31, 30.0) == 31

        os.kill(doomed[0].process.pid, signal.SIGKILL)
        os.kill(doomed[1].process.pid, signal.SIGSTOP)
        doomed[0].process.join(10)
        for version in (32, 33):  # 32 fails (within timeout), 33 regroups (within ANSWER) and is delivered
            expected = _step(model, version)
            start = time.monotonic()
            sender.push(model, version)
            took = time.monotonic() - start
            assert took < timeout + min(ANSWER, timeout) + 3, f"a push took {took:.1f}s"
        assert sender.metrics()["sync/receivers"] == 2.0
        assert sender.metrics()["sync/broadcast_failures"] == 2.0
        for explorer in explorers:
            loaded, received = explorer.ask("pull", 33, 30.0)
            assert loaded == 33
            _assert_identical(received, expected)

        os.kill(doomed[1].process.pid, signal.SIGCONT)  # the hung one wakes up: it joins again by itself
        assert doomed[1].ask("wait_latest", 33, 30.0) == 33
        _wait_joined(sender, 3)
        assert sender.metrics()["sync/broadcast_failures"] == 2.0
    finally:
        sender.close()
        for explorer in explorers:
            explorer.ask("close")
        for d in doomed:
            d.process.kill()
            d.process.join(10)


@pytest.mark.slow  # explorer processes
def test_a_late_joiner_gets_the_newest_version_at_once_alone_then_every_push(
    explorers, model_dir, monkeypatch
):
    early, late = explorers
    model = _trainer_model(model_dir)
    sender = _sender()
    sends = _trainer_sends(monkeypatch)
    try:
        start = time.monotonic()
        sender.push(model, 40)  # nobody listens: returns at once
        assert time.monotonic() - start < 1.0 and sends == []
        early.ask("join", sender.address, "early", 10.0)
        assert early.ask("pull", 40, 30.0)[0] == 40  # joined after the push: gets it without a new one
        for version in (41, 42):
            expected = _step(model, version)
            sender.push(model, version)
        late.ask("join", sender.address, "late", 10.0)
        loaded, received = late.ask("pull", 42, 30.0)
        assert loaded == 42 and sender.latest() == 42
        _assert_identical(received, expected)
        assert sends[-1][1:] == (2, _distinct_bytes(model)), "the catch-up goes to the late joiner only"
        expected = _step(model, 43)
        sender.push(model, 43)
        for explorer in explorers:
            loaded, received = explorer.ask("pull", 43, 30.0)
            assert loaded == 43
            _assert_identical(received, expected)
        assert sends[-1] == (3, 1, _distinct_bytes(model)) and len(sends) == 5
    finally:
        sender.close()
        for explorer in explorers:
            explorer.ask("close")


@pytest.mark.slow  # explorer processes
def test_an_explorer_with_another_model_gets_a_clear_error_and_keeps_its_weights(
    explorers, model_dir, tiny_model_dir
):
    explorer = explorers[0]
    sender = _sender()
    try:
        explorer.ask("model", str(tiny_model_dir))  # tiny-0.5m: some shapes match, most do not
        explorer.ask("join", sender.address, "explorer-0", 10.0)
        sender.push(_trainer_model(model_dir), 51)
        error, unchanged, latest = explorer.ask("pull_failing", 51, 30.0)
        assert latest == 51  # the transfer itself worked; loading is refused
        assert "do not fit this explorer's model" in error and "same model.path" in error
        assert "shapes differ" in error and "mlp" in error and "unexpected" in error
        assert unchanged, "a refused version must not leave the model half loaded"
    finally:
        sender.close()
        explorer.ask("close")
        explorer.ask("model", str(model_dir))


@pytest.mark.slow  # explorer processes
def test_dead_joiners_do_not_hold_up_the_next_one(explorers, model_dir):
    """One that took a slot and died before giving its name costs nothing; one that gave its name and
    died before answering costs the next generation at most ANSWER seconds (and counts as lost)."""
    import torch.distributed as dist

    explorer = explorers[1]
    sender = _sender(timeout=10)
    try:
        host, port = sender.address.rsplit(":", 1)
        ghost = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
        ghost.add(JOINS, 1)
        named = int(ghost.add(JOINS, 1))
        ghost.set(f"trine/join/{named}", json.dumps({"name": "ghost", "host": "nowhere"}))
        time.sleep(0.2)  # the trainer now asks the named ghost to answer
        start = time.monotonic()
        explorer.ask("join", sender.address, "explorer-1", 10.0)
        _wait_joined(sender, 1)
        sender.push(_trainer_model(model_dir), 61)
        assert explorer.ask("pull", 61, 30.0)[0] == 61
        took = time.monotonic() - start
        assert took < ANSWER + 4.0, f"the join took {took:.1f}s: it waited for a dead joiner's timeout"
        assert sender.metrics()["sync/broadcast_failures"] == 1.0 and sender.members == ["explorer-1"]
    finally:
        sender.close()
        explorer.ask("close")


def _both_sides_then_exit(model_dir: str, results) -> None:
    """A process with a sender and a receiver: push, receive, close both, and return (= exit)."""
    torch.set_num_threads(1)
    sender = _sender(timeout=5)
    receiver = BroadcastReceiver(sender.address, "explorer-0", backend="gloo", timeout=5)
    sender.push(load_model(model_dir), 1)
    receiver.wait_for_first(30)
    start = time.monotonic()
    receiver.close()
    sender.close()
    results.put(time.monotonic() - start)


@pytest.mark.slow  # explorer processes
def test_close_is_prompt_on_both_sides_and_no_thread_outlives_it(explorers, model_dir):
    explorer = explorers[0]
    sender = _sender()
    explorer.ask("join", sender.address, "explorer-0", 10.0)
    model = _trainer_model(model_dir)
    sender.push(model, 71)
    assert explorer.ask("pull", 71, 30.0)[0] == 71
    assert explorer.ask("close") < 1.0
    assert explorer.ask("thread_ended", 5.0), "the receiver's thread outlived close()"
    start = time.monotonic()
    sender.push(model, 72)  # the explorer said it left: no waiting for its answer
    assert time.monotonic() - start < min(ANSWER, 2.0)
    assert sender.metrics()["sync/receivers"] == 0.0 and sender.metrics()["sync/broadcast_failures"] == 0.0
    start = time.monotonic()
    sender.close()
    assert time.monotonic() - start < 1.0
    sender._worker.join(5)
    assert not sender._worker.is_alive()

    results = CTX.Queue()
    process = CTX.Process(target=_both_sides_then_exit, args=(str(model_dir), results))
    process.start()
    assert results.get(timeout=60) < 2.0
    start = time.monotonic()
    process.join(15)
    assert process.exitcode == 0 and time.monotonic() - start < 10, "the process did not exit promptly"


def _trainer_until_killed(model_dir: str, directory: str, ready) -> None:
    """A trainer process: listen on a free port, record it as ``trine train`` does, push version 1, and
    wait to be killed."""
    torch.set_num_threads(1)
    sender = _sender(timeout=5)
    write_address(Path(directory), sender.address)
    sender.push(load_model(model_dir), 1)
    ready.put(sender.address)
    time.sleep(600)


@pytest.mark.slow  # a trainer process
def test_an_explorer_follows_a_restarted_trainer_to_its_new_port(model_dir, tmp_path):
    """The trainer is killed with SIGKILL and started again: it listens on another free port and records
    it; the explorer (joined through the recorded address) finds it there and gets its next versions."""
    ready = CTX.Queue()
    first = CTX.Process(target=_trainer_until_killed, args=(str(model_dir), str(tmp_path), ready))
    first.start()
    engine, receiver, second = _engine(str(model_dir)), None, None
    try:
        old = ready.get(timeout=180)  # spawn + torch imports, on a loaded machine
        receiver = BroadcastReceiver(
            read_address(tmp_path, 5), "explorer-0", backend="gloo", timeout=2,
            find=lambda: recorded_address(tmp_path),
        )  # fmt: skip
        receiver.pull(engine, 1, 30)
        os.kill(first.pid, signal.SIGKILL)
        first.join(10)
        second = _sender(timeout=5)
        assert second.address != old
        write_address(tmp_path, second.address)
        model = _trainer_model(model_dir)
        expected = _step(model, 2)
        second.push(model, 2)
        receiver.pull(engine, 2, 60)  # a late joiner of the new trainer: gets its newest version
        _assert_identical(_state(engine.model), expected)
        expected = _step(model, 3)
        second.push(model, 3)
        receiver.pull(engine, 3, 30)
        _assert_identical(_state(engine.model), expected)
        assert f"{receiver.host}:{receiver.port}" == second.address
    finally:
        if first.is_alive():
            first.kill()
        for side in (receiver, second):
            if side is not None:
                side.close()


def test_an_explorer_without_a_trainer_times_out_naming_the_last_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    receiver = BroadcastReceiver(f"127.0.0.1:{port}", "explorer-0", backend="gloo", timeout=0.5)
    try:
        with pytest.raises(TimeoutError, match=rf"127.0.0.1:{port} within 3.0s.*Last error: "):
            receiver.wait_for_first(3.0)
    finally:
        receiver.close()
    receiver._thread.join(5)
    assert not receiver._thread.is_alive()


# -- NCCL ------------------------------------------------------------------------------------------
def _nccl_explorer(address: str, model_dir: str, results) -> None:
    torch.cuda.set_device(1)  # NCCL cannot put both ranks on one GPU
    receiver = BroadcastReceiver(address, "explorer-0", backend="nccl", timeout=60)
    engine = HFEngine(load_model(model_dir, device="cuda:1"), load_tokenizer(model_dir))
    receiver.pull(engine, 1, timeout=120)
    results.put((engine.policy_version, _state(engine.model)))
    receiver.close()


@pytest.mark.slow  # explorer processes
@pytest.mark.gpu
def test_nccl_push_reaches_an_explorer_on_another_gpu(model_dir):
    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs the two ranks on two GPUs ('Duplicate GPU detected' on one)")
    torch.cuda.set_device(0)
    model = load_model(model_dir, device="cuda:0")
    expected = {k: v.cpu() for k, v in _step_on_gpu(model).items()}
    sender = BroadcastSender("127.0.0.1", 0, bucket_mb=1, backend="nccl", timeout=60)
    results = CTX.Queue()
    process = CTX.Process(target=_nccl_explorer, args=(sender.address, str(model_dir), results))
    process.start()
    try:
        _wait_joined(sender, 1, timeout=120)
        sender.push(model, 1)
        loaded, received = results.get(timeout=180)
        assert loaded == 1
        _assert_identical(received, expected)
        assert sender.metrics()["sync/broadcast_failures"] == 0
    finally:
        sender.close()
        process.join(30)
        if process.is_alive():
            process.kill()


def _step_on_gpu(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_threads_of_closed_senders_do_not_pile_up():
    """Every sender of this module was closed: none of their threads may still run."""
    deadline = time.monotonic() + 10
    while any(t.name.startswith("trine-broadcast") for t in threading.enumerate()):
        if time.monotonic() > deadline:
            names = [t.name for t in threading.enumerate() if t.name.startswith("trine-broadcast")]
            raise AssertionError(f"threads still running: {names}")
        time.sleep(0.1)
