"""Trine Studio in a real browser: Debian's chromium, headless, driven by Playwright.

One studio (the ``studio``, ``browser`` and ``page`` fixtures of ``tests/e2e/conftest.py``) serves a runs
directory built by ``scripts/studio_screenshots.py``'s :func:`build_demo`: a real short arithmetic run
(SFT then GRPO, SQL buffer, evaluations) with a two-turn tool trajectory and a pending experience added to
its buffer and a pair + a rating posted to its annotation queue, a second real run, a "live" run (status
running with this process's pid) whose metrics.jsonl the tests append to while the page is open, and a
failed run. Skipped, with the reason, where Playwright or /usr/bin/chromium is missing. The comparison
page's tests are in ``test_studio_compare_browser.py``.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - depends on the machine
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():  # pragma: no cover - depends on the machine
    pytest.skip("no /usr/bin/chromium (apt-get install chromium)", allow_module_level=True)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def beat(run_dir: Path) -> None:
    """Refresh the live run's heartbeat, as its heartbeat thread would (stale after 60 s)."""
    status = json.loads((run_dir / "status.json").read_text())
    status["heartbeat"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (run_dir / "status.json").write_text(json.dumps(status))


def steps_in(lines: list[str]) -> set[int]:
    return {json.loads(line)["step"] for line in lines if line.strip()}


def type_value(page, line: int, value: str) -> None:
    """Select the value of the key on ``line`` (1-based) in the config editor and type ``value``."""
    lines = page.input_value("#yaml").split("\n")
    start = sum(len(text) + 1 for text in lines[: line - 1]) + lines[line - 1].index(":") + 2
    end = sum(len(text) + 1 for text in lines[:line]) - 1
    page.eval_on_selector("#yaml", f"t => {{ t.focus(); t.setSelectionRange({start}, {end}); }}")
    page.keyboard.type(value)


def points(page, title: str) -> int:
    return int(page.get_attribute(f'section.chart[data-title="{title}"]', "data-points"))


def test_runs_page_and_finished_run(page, studio):
    url, demo = studio
    beat(demo["live"])
    page.goto(f"{url}/#/")
    done = page.locator('tr[data-run="arithmetic"]')
    expect(done.locator(".badge")).to_have_text("finished")
    expect(done).to_contain_text("sft → grpo")
    expect(page.locator('tr[data-run="live"] .badge')).to_have_text("running")
    expect(page.locator('tr[data-run="crashed"] .badge')).to_have_text("failed")
    expect(page.locator('tr[data-run="crashed"] .why')).to_contain_text("out of memory")
    done.locator("a.run-name").click()
    expect(page).to_have_url(f"{url}/#/run/arithmetic")
    for title in ("Reward", "Eval accuracy", "Loss", "Response length", "Throughput (tokens/s)"):
        chart = page.locator(f'section.chart[data-title="{title}"]')
        expect(chart.locator("canvas")).to_have_count(1)
        expect(chart).not_to_have_attribute("data-values", "0")
    steps = steps_in((demo["done"] / "metrics.jsonl").read_text().splitlines())
    assert points(page, "Loss") == len(steps)
    evals = httpx.get(f"{url}/api/runs/arithmetic/evals").json()["rows"]
    expect(page.locator("table.evals tbody tr")).to_have_count(len(evals))
    assert len(evals) >= 2
    page.locator("details.config summary").click()
    expect(page.locator("details.config pre")).to_contain_text("stage: grpo")
    page.select_option('select[aria-label="metric to plot"]', "trainer/grad_norm")
    page.click("text=Add chart")
    expect(page.locator('section.chart[data-title="trainer/grad_norm"] canvas')).to_have_count(1)


def test_live_run_curve_grows_and_bad_lines_show_a_note(page, studio):
    url, demo = studio
    beat(demo["live"])
    live = demo["live"] / "metrics.jsonl"
    kept = live.read_text().splitlines(keepends=True)
    rest = (demo["done"] / "metrics.jsonl").read_text().splitlines(keepends=True)[len(kept) :]
    assert len(rest) > 2, "the live run should start with part of the metrics missing"
    page.goto(f"{url}/#/run/live")
    expect(page.locator(".run-header .badge")).to_have_text("running")
    loss = page.locator('section.chart[data-title="Loss"]')
    expect(loss.locator("canvas")).to_have_count(1)
    expect(loss).to_have_attribute("data-points", str(len(steps_in(kept))))
    with live.open("a") as f:
        f.writelines(rest[:2])
        f.write("{not json\n")
    expect(loss).to_have_attribute("data-points", str(len(steps_in(kept + rest[:2]))))
    expect(page.locator(".notes")).to_contain_text("not valid JSON")
    with live.open("a") as f:
        f.writelines(rest[2:])
    everything = str(len(steps_in(kept + rest)))
    expect(loss).to_have_attribute("data-points", everything)
    expect(page.locator('section.chart[data-title="Reward"]')).to_have_attribute("data-points", everything)


def test_filter_and_sort_experiences(page, studio):
    url, _demo = studio
    api = f"{url}/api/runs/arithmetic/experiences"
    everything = httpx.get(api, params={"limit": 1}).json()["total"]
    rewarded = httpx.get(api, params={"limit": 1, "reward_min": 0.5}).json()["total"]
    assert 0 < rewarded < everything
    page.goto(f"{url}/#/run/arithmetic/experiences")
    total = page.locator(".summary .total")
    expect(total).to_have_attribute("data-total", str(everything))
    expect(page.locator("table.experiences tbody tr")).to_have_count(min(50, everything))
    page.fill('input[name="reward_min"]', "0.5")
    expect(total).to_have_attribute("data-total", str(rewarded))
    expect(page).to_have_url(f"{url}/#/run/arithmetic/experiences?reward_min=0.5")
    rewards = [float(r) for r in page.locator("table.experiences td.reward").all_inner_texts()]
    assert rewards and min(rewards) >= 0.5
    page.fill('input[name="reward_min"]', "")
    page.select_option('select[name="status"]', "pending")
    expect(total).to_have_attribute("data-total", "1")
    page.select_option('select[name="status"]', "")
    page.click("th.sortable")  # reward, high to low
    expect(page.locator("th.sortable")).to_contain_text("↓")
    first = page.locator("table.experiences td.reward").first
    expect(first).to_have_text("1")
    page.click("text=Next →")
    expect(page.locator(".pager")).to_contain_text("page 2 of")


def test_one_experience_shows_tokens_and_observations(page, studio):
    url, demo = studio
    page.goto(f"{url}/#/run/arithmetic/experience/{demo['multi_turn']}")
    expect(page.locator(".tokens .tok-prompt").first).to_be_visible()
    observations = page.locator(".seg-observation .tok-observation")
    expect(observations.first).to_be_visible()
    assert "[calculator] 42" in "".join(observations.all_inner_texts())
    expect(page.locator(".seg-observation .seg-label")).to_have_text("observation")
    model = page.locator(".tok-model")
    assert model.count() > 5
    coloured = model.first.evaluate("el => getComputedStyle(el).backgroundColor")
    assert coloured not in ("rgba(0, 0, 0, 0)", "transparent")
    page.check('input[value="advantage"]')
    expect(page.locator(".tokens")).to_have_attribute("data-mode", "advantage")
    model.first.hover()
    expect(page.locator(".inspector")).to_contain_text("logprob")
    expect(page.locator(".turns .turn")).to_have_count(4)
    expect(page.locator(".reward-parts")).to_contain_text("format")
    page.locator("table.group a", has_text="tools-1").click()
    expect(page).to_have_url(f"{url}/#/run/arithmetic/experience/tools-1")
    expect(page.locator("ol.steps li")).to_have_count(2)


def test_fix_a_config_error(page, studio):
    url, _demo = studio
    page.goto(f"{url}/#/config?template=run:arithmetic")
    validity = page.locator("#validity")
    expect(validity).to_have_attribute("data-ok", "true")
    expect(page.locator("#start")).to_be_enabled()
    expect(page.locator("#run-name")).to_have_value("arithmetic-2")  # a fresh name, not the template's
    lines = page.input_value("#yaml").split("\n")
    line = next(i for i, s in enumerate(lines) if s.strip().startswith("lr:")) + 1
    good = lines[line - 1].split(":", 1)[1].strip()
    type_value(page, line, "fast")
    expect(validity).to_have_attribute("data-ok", "false")
    expect(page.locator(".gutter .ln.err")).to_have_attribute("data-line", str(line))
    expect(page.locator(f'.inline-error[data-line="{line}"]')).to_contain_text("number")
    expect(page.locator(f'ul.errors li[data-line="{line}"]')).to_contain_text("trainer.lr")
    expect(page.locator("#start")).to_be_disabled()
    page.locator(f'ul.errors li[data-line="{line}"]').click()  # puts the cursor there: the docs panel
    expect(page.locator(".docs .doc-path")).to_contain_text("trainer.lr")
    expect(page.locator(".docs")).to_contain_text("learning rate")
    type_value(page, line, good)
    expect(validity).to_have_attribute("data-ok", "true")
    expect(page.locator(".gutter .ln.err")).to_have_count(0)
    expect(page.locator("#start")).to_be_enabled()
    page.fill("#run-name", "arithmetic")  # the template's own run: refused, with a free name to use
    page.click("#start")
    refusal = page.locator(".start-result .error-box")
    expect(refusal).to_contain_text("already exists")
    expect(refusal).to_contain_text("e.g. 'arithmetic-2'")
    expect(page.locator("#started-link")).to_have_count(0)


def test_answer_an_annotation_batch_reaches_the_buffer(page, studio):
    url, demo = studio
    page.goto(f"{url}/#/run/arithmetic/annotate")
    expect(page.locator('.counts [data-count="open"]')).to_contain_text("2")
    page.fill("#annotator-token", demo["annotator_token"])
    page.click("text=Use token")
    expect(page.locator("#annotator-name")).to_have_text("tess")
    page.click("#get-batch")
    expect(page.locator(".item")).to_have_count(2)
    prompt = page.locator('.item[data-kind="pair"] .prompt')  # the chat, role by role, no template markup
    expect(prompt.locator('.message[data-role="user"]')).to_have_count(1)
    expect(prompt).not_to_contain_text("<|im_start|>")
    page.click('.item[data-kind="pair"] button[data-choice="b"]')
    expect(page.locator("#submit-batch")).to_contain_text("1/2")
    page.click('.item[data-kind="rate"] button[data-rating="4"]')
    page.click("#submit-batch")
    expect(page.locator("#submit-result")).to_contain_text("2 answered")
    expect(page.locator('.counts [data-count="landed"]')).to_contain_text("2")
    pending = httpx.get(f"{url}/api/runs/arithmetic/experiences/{demo['pending']}").json()["experience"]
    assert pending["reward"] == 4.0 and pending["status"] == "ready"
    with sqlite3.connect(demo["done"] / "buffer.db") as db:
        rows = db.execute("SELECT id FROM preferences ORDER BY id").fetchall()
    assert [r[0].rsplit("-", 1)[1] for r in rows] == ["chosen", "rejected"]
    page.reload()
    expect(page.locator("#annotator-name")).to_have_text("tess")  # the token stays in this browser
    page.click("#get-batch")
    expect(page.locator(".annotate-message")).to_contain_text("Nothing open")


def test_a_conflicting_answer_keeps_nothing_and_names_the_item(page, studio):
    from trine.feedback.queue import AnnotationQueue, Item, queue_url

    url, demo = studio
    queue = AnnotationQueue(queue_url(demo["done"]))
    queue.post([Item(kind="rate", prompt="2+2=", responses=[{"text": "4"}], scale=(0, 5))], timeout=3600)
    queue.close()
    page.goto(f"{url}/#/run/arithmetic/annotate")
    page.fill("#annotator-token", demo["annotator_token"])
    page.click("text=Use token")
    page.click("#get-batch")
    item = page.locator(".item")
    expect(item).to_have_count(1)
    item_id = item.get_attribute("data-item")
    answer = {"answers": [{"item": item_id, "rating": 1}]}  # the same annotator, from another tab
    headers = {"X-Annotator-Token": demo["annotator_token"]}
    assert (
        httpx.post(f"{url}/api/runs/arithmetic/annotations/answer", json=answer, headers=headers).status_code
        == 200
    )
    page.click('.item button[data-rating="5"]')
    page.click("#submit-batch")
    expect(page.locator(".annotate-message")).to_contain_text("Nothing was kept")
    expect(page.locator(f'.item.conflict[data-item="{item_id}"] .error-box')).to_be_visible()
    answered = [
        i for i in httpx.get(f"{url}/api/runs/arithmetic/annotations").json()["recent"] if i["id"] == item_id
    ]
    assert answered and answered[0]["answer"] == {"rating": 1.0}


def test_a_real_run_watched_live_then_finished(page, studio, tiny_model_dir):
    """A real `trine run` (SQL buffer) started in the studio's runs directory: the runs page and the run's
    page show it running with its curve growing, its experiences page lists rows while it explores, and
    the same pages show it finished with every row once it is done, with no reload of the run page."""
    import subprocess
    import sys

    from tests.helpers import write_arithmetic_config

    url, demo = studio
    runs = Path(demo["runs"])
    config = write_arithmetic_config(
        runs.parent,
        tiny_model_dir,
        "watched",
        # 150 steps: about 10 s of training on 2 cores, several of the page's 3-second polls
        {"run_dir": str(runs / "watched"), "num_threads": 1, "tasks": {"total_steps": 150}},
        {"tasks": {"train": {"sampling": {"max_tokens": 8}}}},
        {"buffer": {"storage": "sql"}, "trainer": {"save_every": 0}},
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "trine.cli", "run", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        page.goto(f"{url}/#/")
        expect(page.locator('tr[data-run="watched"] .badge')).to_have_text("running", timeout=60_000)
        page.goto(f"{url}/#/run/watched")
        expect(page.locator(".run-header .badge")).to_have_text("running")
        loss = page.locator('section.chart[data-title="Loss"]')
        expect(loss.locator("canvas")).to_have_count(1, timeout=30_000)
        first = points(page, "Loss")
        page.wait_for_function(  # the curve grows while the run trains, with no reload
            f"() => Number(document.querySelector('section.chart[data-title=\"Loss\"]').dataset.points) > {first}",
            timeout=60_000,
        )
        page.goto(f"{url}/#/run/watched/experiences")
        total = page.locator(".summary .total")
        expect(total).not_to_have_attribute("data-total", "0", timeout=30_000)
        assert proc.wait(timeout=240) == 0, proc.stdout.read().decode()
        page.goto(f"{url}/#/run/watched")
        expect(page.locator(".run-header .badge")).to_have_text("finished", timeout=15_000)
        expect(loss).to_have_attribute("data-points", "150", timeout=15_000)
        page.goto(f"{url}/#/run/watched/experiences")
        everything = httpx.get(f"{url}/api/runs/watched/experiences", params={"limit": 1}).json()["total"]
        assert everything == 150 * 4 * 4  # total_steps × batch_size × repeat, each stored once
        expect(total).to_have_attribute("data-total", str(everything))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
