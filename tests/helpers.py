"""Plain helpers shared by every test tier: experience factories, config writers, jsonl readers and a
``trine`` child process (fixtures live in the conftests).

Import them as ``from tests.helpers import exp, write_config``: pytest puts the repository root on
``sys.path`` (``pythonpath = ["."]`` in pyproject.toml), however and wherever it is started.
"""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from trine.types import Experience

ROOT = Path(__file__).resolve().parents[1]
"""The repository."""

EXAMPLE = ROOT / "examples" / "arithmetic"
"""The main job's example directory (its shipped arithmetic tasksets)."""

GOOD_ROWS = '{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n'
"""A good two-row taskset (jsonl): the ``good.jsonl`` of the ``project`` fixture."""


def exp(
    i: int = 0,
    *,
    reward: float | None = 1.0,
    version: int = 0,
    tokens: list[int] | None = None,
    prompt_length: int = 1,
    action_mask: list[int] | None = None,
    task_id: str | None = None,
    info: dict[str, Any] | None = None,
    **fields: Any,
) -> Experience:
    """Experience number ``i``: tokens ``[1, 2, 3]`` (a one-token prompt, two trained response tokens),
    ``reward`` (None: pending), ``policy_version=version``, task ``t{i}`` and ``info={"i": i}`` (what
    :func:`ids` reads back). Any other :class:`Experience` field by keyword (``run_id``, ``group_id``,
    ``logprobs``, ``kind``, ...)."""
    return Experience(
        tokens=[1, 2, 3] if tokens is None else tokens,
        prompt_length=prompt_length,
        action_mask=[1, 1] if action_mask is None else action_mask,
        reward=reward,
        task_id=f"t{i}" if task_id is None else task_id,
        policy_version=version,
        info={"i": i} if info is None else info,
        **fields,
    )


def pending(exp_id: str, response: tuple[int, ...] = (5, 6), **fields: Any) -> Experience:
    """A pending experience (no reward yet) with id ``exp_id``: prompt ``[1, 2, 3]``, then ``response``,
    every response token trained; any other :class:`Experience` field by keyword."""
    tokens = [1, 2, 3, *response]
    return Experience(tokens=tokens, prompt_length=3, action_mask=[1] * len(response), id=exp_id, **fields)


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (what a float32 column gives back)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def ids(exps: list[Experience]) -> list[int]:
    """The numbers ``i`` of experiences made by :func:`exp`, in order."""
    return [e.info["i"] for e in exps]


def write_config(path: Path, data: dict[str, Any] | None = None, /, **sections: Any) -> Path:
    """Write ``data`` with ``sections`` (top-level keys) added as YAML into ``path``; returns ``path``.

    ``write_config(tmp_path / "config.yaml", buffer={"storage": "sql"})``
    """
    import yaml

    path.write_text(yaml.safe_dump({**(data or {}), **sections}))
    return path


def write_arithmetic_config(tmp_path: Path, model_dir: Path, name: str, *overrides: dict | None) -> Path:
    """Write a tiny GRPO config over the shipped arithmetic data into ``tmp_path/<name>.yaml`` (run
    directory ``tmp_path/<name>``) with each of ``overrides`` merged in, in order; returns its path."""
    from trine.config import merge

    data = {
        "name": name,
        "run_dir": str(tmp_path / name),
        "seed": 0,
        "num_threads": 2,
        "model": {"path": str(model_dir)},
        "tasks": {
            "batch_size": 4,
            "total_steps": 6,
            "train": {
                "path": str(EXAMPLE / "data" / "train.jsonl"),
                "repeat": 4,
                "sampling": {"temperature": 1.0, "max_tokens": 4},
            },
        },
        "trainer": {"lr": 1e-3},
        "eval": {"at_start": False},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    for extra in overrides:
        data = merge(data, extra or {})
    return write_config(tmp_path / f"{name}.yaml", data)


def dead_pid() -> int:
    """The pid of a process that has ended (and was reaped): a run whose process is gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def jsonl_rows(path: Path) -> list[dict]:
    """The JSON objects of a ``.jsonl`` file, one a line, blank lines skipped (FileNotFoundError when the
    file is missing)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def read_metrics(run_dir: Path) -> list[dict]:
    """The lines of ``run_dir/metrics.jsonl`` (FileNotFoundError when the run wrote none)."""
    return jsonl_rows(Path(run_dir) / "metrics.jsonl")


def _default_signals() -> None:
    """In the child before exec: SIGINT and SIGTERM unblocked and at their defaults, as in a terminal.
    A child inherits ignored signals and the signal mask of the thread that starts it, and after some
    tests the test process's no longer are the defaults (a SIGINT was then never delivered)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def trine(*args: str, **kwargs: Any) -> subprocess.Popen:
    """``python -m trine.cli ARGS`` as a child process in the repository, in its own session (a kill of
    its process group reaches any child it started), output piped, SIGINT and SIGTERM at their defaults;
    ``kwargs`` go to :class:`subprocess.Popen`."""
    return subprocess.Popen(
        [sys.executable, "-m", "trine.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_default_signals,
        **kwargs,
    )
