"""Comparing runs in Trine Studio, in a real browser (Debian's chromium driven by Playwright).

The demo runs directory of ``tests/e2e/conftest.py``'s ``studio`` fixture holds two real runs of the same
two-stage config (SFT then GRPO): ``arithmetic`` and ``arithmetic-b``, whose SFT stage is two steps longer
and whose GRPO learning rate is 3e-3 instead of 1e-3. The tests tick both on the runs page, open the
comparison, see one series per run on a chart and the GRPO stage of both starting at the same step, find
the differing keys of the configs and the evals side by side, switch to the time axis, and open the shared
link in a fresh page. Skipped, with the reason, where Playwright or /usr/bin/chromium is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - depends on the machine
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

if not Path("/usr/bin/chromium").exists():  # pragma: no cover - depends on the machine
    pytest.skip("no /usr/bin/chromium (apt-get install chromium)", allow_module_level=True)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def first_step(run_dir: Path, stage: str) -> int:
    return next(r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").open()) if r["stage"] == stage)


def chart(page, key: str):
    return page.locator(f'section.chart[data-keys="{key}"]')


def test_pick_two_runs_compare_them_and_share_the_link(page, browser, studio):
    url, demo = studio
    a, b = demo["done"].name, demo["variant"].name
    page.goto(f"{url}/#/")
    compare = page.locator("#compare")
    expect(compare).to_be_disabled()
    page.locator(f'tr[data-run="{a}"] input.pick').check()
    expect(compare).to_be_disabled()  # one run is not a comparison
    page.locator(f'tr[data-run="{b}"] input.pick').check()
    expect(compare).to_have_text("Compare 2 runs")
    compare.click()
    expect(page).to_have_url(f"{url}/#/compare?runs={a},{b}")
    expect(page.locator("table.compare-runs tbody tr")).to_have_count(2)
    expect(page.locator(f'table.compare-runs tr[data-run="{a}"] .badge')).to_have_text("finished")

    loss = chart(page, "trainer/loss")  # both runs train in both stages
    expect(loss.locator("canvas")).to_have_count(1)
    expect(loss).to_have_attribute("data-series", "2")
    expect(loss.locator(".u-legend")).to_contain_text(a)
    expect(loss.locator(".u-legend")).to_contain_text(b)
    reward = chart(page, "explorer/reward_mean")  # GRPO only: aligned, it starts at one step for both
    expect(reward).to_have_attribute("data-series", "2")
    grpo = httpx.get(f"{url}/api/compare", params={"runs": f"{a},{b}"}).json()["alignment"]["stages"][1]
    assert grpo["x_step"] == 5  # the longer SFT stage (arithmetic-b: 5 steps) ends there
    assert first_step(demo["done"], "grpo") == 4 and first_step(demo["variant"], "grpo") == 6
    assert int(reward.get_attribute("data-points")) == 3  # steps 6, 7, 8 on the common axis, for both runs

    diff = page.locator("table.config-diff")
    lr = diff.locator('tr[data-key="stages.1.trainer.lr"]')
    expect(lr.locator(f'td[data-run="{a}"]')).to_have_text("0.001")
    expect(lr.locator(f'td[data-run="{b}"]')).to_have_text("0.003")
    expect(diff.locator('tr[data-key="stages.0.tasks.total_steps"]')).to_have_count(1)
    expect(diff.locator('tr[data-key="stages.0.seed"]')).to_have_count(0)  # the same in both: hidden
    page.check("#all-keys")
    expect(diff.locator('tr[data-key="stages.0.seed"]')).to_have_count(1)
    expect(page).to_have_url(f"{url}/#/compare?runs={a},{b}&all=1")
    accuracy = page.locator('table.compare-evals tr[data-source="run"][data-metric="accuracy"]')
    expect(accuracy.locator(f'td.last[data-run="{a}"]')).to_be_visible()
    expect(accuracy.locator(f'td.last[data-run="{b}"]')).to_be_visible()

    page.check('input[name="axis"][value="time"]')
    expect(loss).to_have_attribute("data-axis", "time")
    expect(loss).to_have_attribute("data-series", "2")
    expect(page).to_have_url(f"{url}/#/compare?runs={a},{b}&x=time&all=1")
    page.select_option('select[aria-label="metric to plot"]', "trainer/grad_norm")
    page.click("text=Add chart")
    expect(chart(page, "trainer/grad_norm")).to_have_attribute("data-series", "2")
    shared = page.locator("input.share-link").input_value()
    assert shared == page.url and "plot=trainer%2Fgrad_norm" in shared

    fresh = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()  # someone else opens it
    try:
        fresh.goto(shared)
        expect(chart(fresh, "trainer/loss")).to_have_attribute("data-axis", "time")
        expect(chart(fresh, "trainer/loss")).to_have_attribute("data-series", "2")
        expect(chart(fresh, "trainer/grad_norm")).to_have_attribute("data-series", "2")
        expect(fresh.locator('input[name="axis"][value="time"]')).to_be_checked()
        expect(fresh.locator('table.config-diff tr[data-key="stages.0.seed"]')).to_have_count(1)
    finally:
        fresh.context.close()


def test_a_typed_link_with_an_unknown_run_or_one_run_says_what_is_wrong(page, studio):
    url, demo = studio
    page.goto(f"{url}/#/compare?runs={demo['done'].name},nosuchrun")
    expect(page.locator(".error-box")).to_contain_text("no run 'nosuchrun'")
    expect(page.locator("a", has_text="Back to the runs")).to_be_visible()
    page.goto(f"{url}/#/compare?runs={demo['done'].name}")
    expect(page.locator(".error-box")).to_contain_text("needs 2 to 8")


def test_a_failed_run_with_a_corrupt_line_is_compared_with_notes(page, studio):
    """The failed demo run stopped in its first stage: it is drawn there, and a corrupt metrics line is a
    note, not a blank page."""
    url, demo = studio
    a, failed = demo["done"].name, demo["failed"].name
    with (demo["failed"] / "metrics.jsonl").open("a") as f:
        f.write("{not json\n")
    page.goto(f"{url}/#/compare?runs={a},{failed}")
    expect(page.locator(".notes")).to_contain_text("not valid JSON")
    expect(page.locator(f'table.compare-runs tr[data-run="{failed}"] .badge')).to_have_text("failed")
    expect(chart(page, "trainer/loss")).to_have_attribute("data-series", "2")
    expect(chart(page, "explorer/reward_mean")).to_have_attribute("data-series", "1")  # it never reached GRPO
