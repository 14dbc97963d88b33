"""The torch CPU threads of a process, decided and applied in one place: :func:`use_threads`.

``num_threads: auto`` (the default) takes the cores this process may use (its CPU affinity), minus the
load of other work (the 1-minute load average, read at start, before this process has added to it),
divided among the run's own torch processes on this machine (:func:`local_processes`), rounded to the
nearest whole thread and at least 1. Too many threads on busy cores is the expensive mistake: on a
2-core machine whose cores were busy, SFT steps took 5.2 s with 2 threads and 0.48 s with 1.

An explicit ``num_threads: N`` is used as given; when the load says the cores are oversubscribed (auto
would choose fewer) a warning names the count to set instead.

**Roles get their own cores.** ``trine run`` with ``launch: processes`` gives the trainer and the explorers
cores of their own (:func:`role_cores`: the trainer the first half, the explorers the rest, shared among
them) through :data:`CORES_ENV`; each process pins itself to its role's cores
(``os.sched_setaffinity``) and takes its threads from them, so a busy explorer never takes a core from the
trainer's step and adding an explorer only divides the explorers' cores (on 2 cores: the trainer on core
0 with 1 thread, every explorer on core 1 with 1 thread). ``trine status`` shows each process's threads
and cores.

Every process that runs torch calls :func:`use_threads` once at its start (``trine run``/``train`` in
:meth:`trine.rundir.RunDir.open`, ``trine explore``, ``trine serve``; ``trine bench`` and ``trine check``
through :func:`threads_for`); a launcher that starts several of them on one machine tells each how many
they are through :data:`SHARE_ENV`. Nothing else in trine calls ``torch.set_num_threads``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

SHARE_ENV = "TRINE_LOCAL_PROCESSES"
"""Environment variable a launcher sets in each torch process it starts: how many processes of the run
(trainer ranks and explorers) share this machine, whose free cores ``num_threads: auto`` divides among
them. Set by ``trine run`` with ``launch: processes`` (the trainer and ``explorer.instances`` explorers)
and by the Ray driver (the run's actors on the same node). Unset: torchrun's ``LOCAL_WORLD_SIZE``, else 1."""

CORES_ENV = "TRINE_CORES"
"""Environment variable a launcher sets in each process it starts: the CPU ids of its role (``0``, ``1-3``,
``0,2``), to which :func:`use_threads` pins the process before it counts the free cores. Set by ``trine
run`` with ``launch: processes`` (:func:`role_cores`); unset: the process may use any core it has."""

Setting = int | Literal["auto"]
"""A ``num_threads`` value."""


@dataclass(frozen=True)
class Threads:
    """What :func:`choose` decided."""

    count: int
    """The torch threads to use."""
    line: str
    """One line saying what was chosen and why."""
    warning: str | None = None
    """Set when an explicit count oversubscribes the cores, with the count to use instead."""


def machine() -> tuple[int, float]:
    """``(cores, load)``: the cores this process may use (its CPU affinity; all of them where the platform
    has none) and the 1-minute load average (0.0 where the platform has none)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows; a system without /proc/loadavg
        load = 0.0
    return cores, load


def parse_cores(text: str) -> list[int]:
    """CPU ids from ``0``, ``1-3`` or ``0,2-3`` (the :data:`CORES_ENV` format)."""
    out: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            out += range(int(first), int(last or first) + 1)
    except ValueError:
        out = []
    if not out or min(out) < 0:
        raise ValueError(
            f"environment variable {CORES_ENV}={text!r}: expected CPU ids such as 0, 1-3 or 0,2-3; unset it to "
            "let the process use any core"
        )
    return sorted(set(out))


def cores_text(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5`` (the :data:`CORES_ENV` format)."""
    runs: list[list[int]] = []
    for c in sorted(cores):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def role_cores(cores: list[int], explorers: int) -> dict[str, list[int]]:
    """The cores of the trainer and of the ``explorers`` explorer processes of one machine: the trainer
    the first half (at least one), the explorers the rest, all of them on the same ones (one core: everyone
    shares it). ``{"trainer": [...], "explorer": [...]}``."""
    if len(cores) < 2:
        return {"trainer": list(cores), "explorer": list(cores)}
    half = len(cores) // 2
    return {"trainer": list(cores[:half]), "explorer": list(cores[half:])}


def pin(environ: Mapping[str, str] = os.environ) -> list[int] | None:
    """Pin this process to the cores :data:`CORES_ENV` names (where the platform can); returns them, or
    None when it is unset."""
    text = environ.get(CORES_ENV)
    if not text:
        return None
    cores = parse_cores(text)
    if hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cores)
        except OSError as err:
            raise ValueError(
                f"environment variable {CORES_ENV}={text!r}: this process cannot run on those CPUs ({err}); "
                "unset it, or name CPUs this machine has"
            ) from err
    return cores


def about(count: int, environ: Mapping[str, str] = os.environ) -> dict[str, int | str]:
    """What a process's ``status.json`` records about its threads: ``{"threads": count}``, and ``"cores"``
    (``1-3``) when it was pinned to its role's cores (``trine status`` shows both)."""
    cores = environ.get(CORES_ENV)
    return {"threads": count, **({"cores": cores} if cores else {})}


def local_processes(environ: Mapping[str, str] = os.environ) -> int:
    """How many torch processes of this run share this machine: :data:`SHARE_ENV`, else torchrun's
    ``LOCAL_WORLD_SIZE`` (the trainer ranks on this machine), else 1."""
    for name in (SHARE_ENV, "LOCAL_WORLD_SIZE"):
        value = environ.get(name)
        if value is None:
            continue
        if not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"environment variable {name}={value!r}: expected a whole number >= 1 (the run's torch "
                f"processes on this machine); unset it, or set it to e.g. {name}=1"
            )
        return int(value)
    return 1


def choose(
    setting: Setting, processes: int = 1, cores: int | None = None, load: float | None = None
) -> Threads:
    """The torch threads of one of ``processes`` processes of a run on a machine with ``cores`` cores (this
    process's) and a 1-minute load average ``load`` from other work (both read from the OS when None), for
    ``num_threads`` ``setting`` (``"auto"`` or a count)."""
    if cores is None or load is None:
        found = machine()
        cores = found[0] if cores is None else cores
        load = found[1] if load is None else load
    free = max(cores - load, 0.0)
    fair = max(1, int(free / processes + 0.5))
    shared = f", shared by {processes} processes of this run" if processes > 1 else ""
    where = f"{cores} core{'s' if cores != 1 else ''}, load {load:.1f}{shared}"
    if setting == "auto":
        return Threads(fair, f"threads: {fair} ({where}; set num_threads=N to override)")
    line = f"threads: {setting} (num_threads: {setting}; {where})"
    if setting <= fair:
        return Threads(setting, line)
    each = f" × {processes} processes of this run" if processes > 1 else ""
    warning = (
        f"warning: num_threads: {setting}{each} oversubscribes this machine ({cores} cores, load {load:.1f} "
        f"from other work), which can make CPU steps many times slower; set num_threads={fair} "
        "(or num_threads: auto, which picks from the free cores at every start)"
    )
    return Threads(setting, line, warning)


def resumed_note(recorded: int | None, count: int, checkpoint: str) -> str | None:
    """What to say when a run resumes from ``checkpoint``, written with ``recorded`` threads (None: not
    recorded), with ``count`` threads: None when they agree."""
    if recorded is None or recorded == count:
        return None
    return (
        f"threads: {checkpoint} was written with {recorded} threads, this run uses {count}: CPU results can "
        f"differ from an uninterrupted run; set num_threads={recorded} to match"
    )


def say_now(text: str) -> None:
    """Print a line at once (the default ``say``: beside the run's other lines, even through a pipe), in one
    write: ``print`` writes the text and the newline apart when output is unbuffered (``PYTHONUNBUFFERED``),
    and the trainer's and an explorer's lines, printed at the same moment into one pipe, ran together."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def use_threads(
    setting: Setting, say: Callable[[str], None] | None = None, processes: int | None = None
) -> int:
    """Decide this process's torch threads (:func:`choose`; ``processes`` defaults to
    :func:`local_processes`), apply them (``torch.set_num_threads``) and ``say`` (default: print) the
    line and any warning; returns the count."""
    import torch

    total, machine_load = machine()  # before pinning: all the cores this process was given
    pinned = pin()
    cores = load = None
    if pinned is not None:  # this role's cores, and their share of the load of other work
        cores, load = len(pinned), machine_load * len(pinned) / max(total, 1)
    chosen = choose(setting, local_processes() if processes is None else processes, cores, load)
    if pinned is not None:
        chosen = Threads(
            chosen.count, f"{chosen.line} [pinned to cores {cores_text(pinned)}]", chosen.warning
        )
    torch.set_num_threads(chosen.count)
    say = say or say_now
    say(chosen.line)
    if chosen.warning:
        say(chosen.warning)
    return chosen.count


@contextmanager
def threads_for(setting: Setting, say: Callable[[str], None] | None = None) -> Iterator[int]:
    """:func:`use_threads` for the ``with`` block, restoring the previous count after (``trine bench`` and
    ``trine check`` as the run would: CPU results can depend on the thread count)."""
    import torch

    before = torch.get_num_threads()
    try:
        yield use_threads(setting, say)
    finally:
        torch.set_num_threads(before)
