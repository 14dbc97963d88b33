"""Fixtures of the end-to-end tests: an arithmetic config writer and the SFT warm-up checkpoint, the
studio's demo runs directory served over HTTP with a browser on it (the browser tests), and the hook that
marks every test here ``slow`` (plain helpers, such as ``trine_process`` and ``run_crashing_after_step``,
are in :mod:`tests.helpers`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers import EXAMPLE, write_arithmetic_config, write_config


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here runs the real loop, real processes or a CLI run: all are ``slow`` (DESIGN §6), so
    ``pytest -m "not slow"`` (the development loop) leaves the whole directory out."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def arithmetic_config(tmp_path, tiny_model_dir):
    """Write an arithmetic config (GRPO by default) with ``overrides`` merged in; returns its path."""

    def make(overrides: dict | None = None, name: str = "run") -> Path:
        return write_arithmetic_config(tmp_path, tiny_model_dir, name, overrides)

    return make


@pytest.fixture(scope="session")
def sft_start(tmp_path_factory):
    """tiny-1m after the main job's SFT warm-up (200 steps at a constant 3e-3): ~20-30% avg@8, room to
    learn. Trained once per session, also when pytest-xdist runs the tests in several workers."""
    from tests.helpers import shared_once

    def train(root: Path) -> Path:
        from trine.config import load_config
        from trine.loop import run

        cfg = {
            "name": "sft",
            "run_dir": str(root / "run"),
            "seed": 0,
            "num_threads": 1,
            "mode": "train",
            "model": {"path": str(root / "model"), "init_preset": "tiny-1m"},
            "algorithm": {"name": "sft"},
            "tasks": {
                "batch_size": 16,
                "total_steps": 200,
                "train": {"path": str(EXAMPLE / "data" / "train.jsonl")},
            },
            "trainer": {"lr": 3e-3},
            "eval": {"at_start": False},
            "monitor": {"sinks": ["jsonl"], "plot": False},
        }
        run(load_config(write_config(root / "sft.yaml", cfg)))
        return root / "run" / "checkpoints" / "step_200"

    return shared_once(tmp_path_factory, "sft-start", train)


STUDIO_DEMO = Path(__file__).resolve().parents[2] / "scripts" / "studio_screenshots.py"


def _studio_demo_module():
    spec = importlib.util.spec_from_file_location("studio_screenshots", STUDIO_DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def studio(tmp_path_factory, tiny_model_dir):
    """The studio's demo runs directory (``scripts/studio_screenshots.py``'s ``build_demo``: two small real
    runs, a live one, a failed one) served by the studio, once per session; yields ``(url, demo dict)``.
    Its annotator (``demo["annotator_token"]``) is called tess."""
    from trine.studio.server import background
    from trine.studio.settings import StudioSettings

    demo_module = _studio_demo_module()
    root = tmp_path_factory.mktemp("studio_browser")
    demo = demo_module.build_demo(root, tiny_model_dir, sft=3, grpo=3, every=3)
    demo["chromium"] = demo_module.CHROMIUM
    demo["chromium_args"] = demo_module.CHROMIUM_ARGS
    settings = StudioSettings(runs_dir=demo["runs"], annotators={demo["annotator_token"]: "tess"}, root=root)
    with background(settings) as url:
        yield url, demo


@pytest.fixture(scope="module")
def browser(studio):
    """Debian's chromium, headless, driven by Playwright (the test modules skip where either is missing)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=studio[1]["chromium"], headless=True, args=studio[1]["chromium_args"]
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser, studio):
    """A fresh 1280x800 page; fails the test on an uncaught JavaScript error."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
