"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest


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
