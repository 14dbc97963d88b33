"""Weight sync through a directory: the trainer publishes versions, explorer processes load them.

For a ``trine train`` process and ``trine explore`` processes that share only the run directory.
They may start in any order and be killed (``kill -9``) at any moment; the directory is the protocol:

- ``v00000007/`` is published version 7: ``model.safetensors`` (the model's state dict on CPU, each
  tensor shared under several names, e.g. tied embeddings, stored once) and ``meta.json`` (version,
  time, a unique publication ``id``, the state-dict ``keys`` in order, the ``aliases`` of shared
  tensors, the ``files`` with their sizes and a ``sha`` of that list). Only such complete
  directories are ever visible under a ``v<digits>`` name: a version is written into
  ``v00000007.tmp/``, flushed to disk, and renamed into place (atomic on one file system).
- re-publishing a version that exists (a trainer restarted from a checkpoint) writes the new one,
  swaps it with the old one in one step (Linux; elsewhere the old one is renamed away to
  ``v00000007.old`` and the new one renamed in), then deletes the old one.
- after each publish, versions older than the newest ``keep`` are retired (renamed to ``*.old``
  first, so a scan never sees a half-deleted version, then deleted), and so are versions *newer*
  than the one just published: they were left by a trainer that died after publishing them and was
  restarted from an earlier checkpoint, so the weights they hold belong to no future of the run.
- ``*.tmp`` and ``*.old`` left by a killed trainer are deleted by the next publish (there is one
  trainer per run directory, so none of them is being written).

Readers (:meth:`PublishedWeights.latest`, :meth:`PublishedWeights.pull`) take no lock: a version
that is retired or replaced while it is being read fails the read (file gone) or is detected (the
publication ``id`` in ``meta.json`` changed between before and after the read), and the read is
retried on what is published then.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from trine.models.export import rollout_state_dict
from trine.models.protocol import RolloutModel
from trine.sync.base import check_fits, split_aliases

WEIGHTS_FILE = "model.safetensors"
META_FILE = "meta.json"

_PUBLISHED = re.compile(r"^v(\d+)$")
_LEFTOVER = re.compile(r"^v\d+\.(tmp|old)$")
log = logging.getLogger("trine")


class _Replaced(Exception):
    """A published version changed or vanished while it was being read; read again."""


def version_name(version: int) -> str:
    """The directory name of published ``version``: ``v00000007``."""
    return f"v{version:08d}"


class PublishedWeights:
    """Weight sync through ``directory``: ``push`` publishes versions atomically (trainer process),
    ``pull`` loads them into a rollout model (explorer processes, any number, started in any order).

    ``keep`` published versions stay on disk (older ones are deleted); waiting readers look for a
    new version every ``poll_interval`` seconds and log that they wait every ``log_every`` seconds.
    ``load=False``: the reader's engine is remote and loads its own weights (``model.engine: openai``
    sampling from ``trine serve`` on the run): ``pull`` only waits until ``version`` is published.
    """

    def __init__(
        self,
        directory: str | Path,
        keep: int = 2,
        poll_interval: float = 0.2,
        log_every: float = 10.0,
        load: bool = True,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}: at least 1 published version must stay on disk; use keep >= 1.")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval={poll_interval}: must be > 0 seconds, e.g. 0.2.")
        if log_every <= 0:
            raise ValueError(f"log_every={log_every}: must be > 0 seconds, e.g. 10.")
        self.directory = Path(directory)
        self.keep = keep
        self.poll_interval = poll_interval
        self.log_every = log_every
        self.load = load
        self.seconds = 0.0
        self._closed = threading.Event()

    # ----------------------------------------------------------------- trainer side
    def push(self, model: nn.Module, version: int) -> None:
        """Publish ``model``'s current weights as ``version`` (replacing a published ``version``),
        then retire versions older than the newest ``keep`` and any newer than ``version``."""
        start = time.perf_counter()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._clean_leftovers()
        final = self.directory / version_name(version)
        tmp = final.with_name(final.name + ".tmp")
        tmp.mkdir()
        try:
            _write_version(model, version, tmp)
            self._publish(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._rotate(version)
        self.seconds += time.perf_counter() - start

    def _publish(self, tmp: Path, final: Path) -> None:
        """Rename the finished ``tmp`` to ``final``. An existing ``final`` is swapped with ``tmp`` in
        one step where the OS can (Linux), else renamed away first (``final`` is missing for an
        instant: readers see the previous version meanwhile); then it is deleted."""
        old = None
        if final.exists():
            if _exchange(tmp, final):
                old = tmp
            else:
                old = final.with_name(final.name + ".old")
                os.rename(final, old)
                os.rename(tmp, final)
        else:
            os.rename(tmp, final)
        _fsync(self.directory)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _rotate(self, version: int) -> None:
        """Retire published versions older than the newest ``keep`` (up to ``version``) and newer ones."""
        published = self.published()
        upto = [v for v in published if v <= version]
        keep = set(upto[-self.keep :]) | {version}
        for v in published:
            if v not in keep:
                path = self.directory / version_name(v)
                retired = path.with_name(path.name + ".old")
                try:
                    os.rename(path, retired)
                except FileNotFoundError:
                    continue
                shutil.rmtree(retired, ignore_errors=True)

    def _clean_leftovers(self) -> None:
        """Delete ``*.tmp`` / ``*.old`` directories (a trainer killed while publishing left them)."""
        for entry in self.directory.iterdir():
            if _LEFTOVER.match(entry.name):
                log.info("deleting %s left by an interrupted publish", entry)
                shutil.rmtree(entry, ignore_errors=True)

    # ----------------------------------------------------------------- explorer side
    def published(self) -> list[int]:
        """The complete published versions, oldest first (``*.tmp``, ``*.old``, no ``meta.json``: skipped)."""
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            match = _PUBLISHED.match(entry.name)
            if match and os.path.isfile(os.path.join(entry.path, META_FILE)):
                found.append(int(match.group(1)))
        return sorted(found)

    def latest(self) -> int | None:
        """The newest complete published version (None: nothing published yet)."""
        published = self.published()
        return published[-1] if published else None

    def pull(self, engine: RolloutModel, version: int, timeout: float | None = None) -> None:
        """Load published ``version`` into ``engine`` (nothing if it already samples it).

        If ``version`` is not published, the newest published version above it is loaded instead
        (``version`` was retired meanwhile); if there is none either, waits for it, up to ``timeout``
        seconds (None: forever), then raises :class:`TimeoutError`. :meth:`close` ends the wait
        (TimeoutError too)."""
        if engine.policy_version == version:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        waited_from = time.monotonic()
        while True:
            chosen = self._choose(version)
            if chosen is not None:
                if engine.policy_version == chosen or not self.load:
                    return
                start = time.perf_counter()
                state = self._read(chosen)
                if state is not None:
                    check_fits(engine, state)  # before anything is copied: never half loaded
                    engine.load_weights(state, chosen)
                    self.seconds += time.perf_counter() - start
                    return
                continue  # changed while read: look again at what is published now
            what = f"weights version {version}"
            self._wait_a_little(deadline, waited_from, what, f"within {timeout}s")

    def wait_for_first(self, timeout: float | None = None) -> int:
        """Wait until some version is published (an explorer started before the trainer) and return
        the newest; :class:`TimeoutError` after ``timeout`` seconds (None: forever) or on :meth:`close`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waited_from = time.monotonic()
        while (latest := self.latest()) is None:
            self._wait_a_little(deadline, waited_from, "the first weights version", f"within {timeout}s")
        return latest

    def _choose(self, version: int) -> int | None:
        """``version`` if published, else the newest published version above it, else None."""
        published = self.published()
        if version in published:
            return version
        newer = [v for v in published if v > version]
        return newer[-1] if newer else None

    def _read(self, version: int) -> dict[str, Tensor] | None:
        """The state dict of published ``version``, or None if it vanished or was replaced meanwhile."""
        path = self.directory / version_name(version)
        try:
            return _read_version(path)
        except (_Replaced, FileNotFoundError, NotADirectoryError):
            return None

    def _wait_a_little(self, deadline: float | None, waited_from: float, what: str, within: str) -> None:
        """Sleep one poll interval (less near ``deadline``), logging every ``log_every`` seconds;
        TimeoutError past ``deadline`` or once closed."""
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise TimeoutError(
                f"{what} was not published in {self.directory} {within}; the trainer may not be "
                f"running: start `trine train` on this run directory, or raise the timeout."
            )
        waited = now - waited_from
        step = self.poll_interval if deadline is None else min(self.poll_interval, deadline - now)
        if int(waited / self.log_every) != int((waited + step) / self.log_every):
            log.info("waiting for the trainer to publish weights in %s (%d s)", self.directory, waited + step)
        if self._closed.wait(step):
            raise TimeoutError(f"stopped waiting for {what} in {self.directory}: weight sync was closed.")

    # ----------------------------------------------------------------- checkpoints, shutdown
    def state_dict(self) -> dict[str, Any]:
        """The directory and the newest published version (informative: the directory is the state)."""
        return {"directory": str(self.directory), "latest": self.latest()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (the published versions are on disk); checks the state's shape."""
        if not isinstance(state, dict) or "directory" not in state:
            raise ValueError(
                f"published-weights state {state!r} lacks 'directory'; pass what state_dict() returned."
            )

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Release every waiting :meth:`pull` / :meth:`wait_for_first` (they raise TimeoutError)."""
        self._closed.set()


# --------------------------------------------------------------------- files of one version
def _write_version(model: nn.Module, version: int, path: Path) -> None:
    """Write ``model``'s state dict (CPU copies, shared tensors once) and ``meta.json`` into ``path``."""
    from safetensors.torch import save_file

    tensors, aliases, keys = _cpu_state(model)
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"version": str(version)})
    _fsync(path / WEIGHTS_FILE)
    files = {WEIGHTS_FILE: (path / WEIGHTS_FILE).stat().st_size}
    listing = json.dumps({"files": files, "keys": keys, "aliases": aliases}, sort_keys=True)
    meta = {
        "version": version,
        "time": time.time(),
        "id": uuid.uuid4().hex,
        "keys": keys,
        "aliases": aliases,
        "files": files,
        "sha": hashlib.sha256(listing.encode()).hexdigest(),
    }
    (path / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    _fsync(path / META_FILE)
    _fsync(path)


def _cpu_state(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str], list[str]]:
    """(CPU copies of the distinct tensors, {alias key: stored key}, all keys in state-dict order).

    Keys whose tensors are the same view of the same memory (tied weights) are stored once; the
    copies share no memory, as safetensors requires."""
    state = rollout_state_dict(model)
    distinct, aliases = split_aliases(state)
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in distinct.items()}
    return tensors, aliases, list(state)


def _read_version(path: Path) -> dict[str, Tensor]:
    """The state dict published in ``path``; :class:`_Replaced` if it changed while being read."""
    from safetensors.torch import load_file

    meta = json.loads((path / META_FILE).read_text())
    try:
        stored = load_file(str(path / WEIGHTS_FILE))
    except (OSError, RuntimeError) as err:  # safetensors reports a vanished file as a RuntimeError
        _same_publication(path, meta)  # replaced or retired meanwhile: _Replaced, the reader retries
        if (path / WEIGHTS_FILE).exists():
            raise
        raise ValueError(
            f"published weights {path} lack {WEIGHTS_FILE}; the directory was changed by hand: "
            f"delete it and let the trainer publish again."
        ) from err
    _same_publication(path, meta)
    missing = [k for k in meta["keys"] if k not in stored and meta["aliases"].get(k) not in stored]
    if missing:
        raise ValueError(
            f"published weights {path} lack tensors {missing[:5]} listed in its {META_FILE}; the "
            f"directory was changed by hand: delete it and let the trainer publish again."
        )
    return {k: stored[meta["aliases"].get(k, k)] for k in meta["keys"]}


def _same_publication(path: Path, meta: dict[str, Any]) -> None:
    """:class:`_Replaced` unless ``path`` still holds the publication ``meta`` describes."""
    try:
        again = json.loads((path / META_FILE).read_text())
    except FileNotFoundError as err:
        raise _Replaced(str(path)) from err
    if again["id"] != meta["id"]:
        raise _Replaced(str(path))


def _exchange(a: Path, b: Path) -> bool:
    """Swap directories ``a`` and ``b`` atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where
    the OS or file system cannot, and nothing was changed."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not Linux, or a libc older than glibc 2.28
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _fsync(path: Path) -> None:
    """Flush a file or directory to disk, so that a rename never publishes data still in memory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
