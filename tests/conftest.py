"""Shared pytest fixtures (the tiny model, its tokenizer, an engine) and the ``gpu`` marker's skip rule.

Plain helpers (experience factories, config writers) are in :mod:`tests.helpers`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # xdist: each worker (and its children) keeps to one OpenMP thread
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # two teams of two spin on two cores: many times slower

from tests.helpers import GOOD_ROWS, Receiver


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``@pytest.mark.gpu`` tests where torch sees no CUDA device (CPU-only machines, CI)."""
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``tiny-0.5m`` model + tokenizer built once per test session (HF format, float32, seed 0).

    Treat it as read-only: copy it (``shutil.copytree``) before changing anything inside.
    """
    from trine.models.tiny import init_model

    return init_model("tiny-0.5m", tmp_path_factory.mktemp("models") / "tiny-0.5m", seed=0)


@pytest.fixture
def project(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """``tmp_path`` with a copy of the tiny model in ``model/`` (a test may damage it) and a good two-row
    taskset ``good.jsonl`` (:data:`tests.helpers.GOOD_ROWS`)."""
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "model")
    (tmp_path / "good.jsonl").write_text(GOOD_ROWS)
    return tmp_path


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    """The tiny model's tokenizer (``load_tokenizer``), loaded once per session: do not change it (copy the
    model directory and load another one to try a chat template or special tokens)."""
    from trine.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path):
    """The tiny model (float32, CPU, eval mode), loaded once per test module: a module's tests may load
    new weights into it or train it, so no module sees another's changes."""
    from trine.models import load_model

    return load_model(tiny_model_dir, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def engine(model, tokenizer):
    """An ``HFEngine`` (seed 0) over the module's :func:`model`, closed after the module."""
    from trine.models.engine import HFEngine

    engine = HFEngine(model, tokenizer, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's tiny-model tests on one torch CPU thread (restored afterwards).

    A 0.5M-parameter model gains nothing from intra-op parallelism, and with two OpenMP threads on
    a two-core machine that is busy with anything else each tiny matmul can stall for milliseconds
    (sampling 16 tokens went from 0.03 s to 2-5 s), which makes timeout-based tests flaky.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A local webhook recording what is POSTed to it (:class:`tests.helpers.Receiver`)."""
    r = Receiver()
    yield r
    r.close()
