"""Screenshots of every Trine Studio page for docs/studio.md, taken from a real demo runs directory.

Usage: python scripts/studio_screenshots.py [--out docs/images] [--keep DIR]

Builds a runs directory in a temporary folder (or DIR with --keep): a real short arithmetic run (an SFT
warm-up then GRPO, SQL buffer, evaluations) plus a two-turn trajectory with an observation and a pending
experience in its buffer, a second real run of the same config with a longer warm-up and a higher GRPO
learning rate (the comparison's other run), a "live" run whose status says running and whose metrics are
partly written, a run that failed with an error, and a batch of annotation items in the finished run's queue. Serves it with the studio and writes
``studio_<page>.png`` (1280x800, Debian's chromium driven by Playwright) for each page.

:func:`build_demo` is also what the studio's browser tests (tests/e2e/test_studio_browser.py) run on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "arithmetic" / "data"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ANNOTATOR_TOKEN = "demo-annotator-token"
VARIANT = "arithmetic-b"
"""The demo's second real run: a longer SFT warm-up and a higher GRPO learning rate."""


def write_config(
    root: Path, runs: Path, model: Path, name: str, sft: int, grpo: int, every: int, grpo_lr: float = 1e-3
) -> Path:
    """A two-stage arithmetic config (SFT warm-up, then GRPO) with a SQL buffer; returns its path."""
    sampling = {"temperature": 1.0, "max_tokens": 6}
    train = {"path": str(DATA / "train.jsonl"), "reward": "exact_match", "repeat": 4, "sampling": sampling}
    evals = {
        "name": "addition",
        "path": str(DATA / "eval.jsonl"),
        "reward": "exact_match",
        "sampling": sampling,
    }
    sft_stage = {"stage": "sft", "mode": "train", "algorithm": {"name": "sft"}, "eval": {"every": 0}}
    grpo_stage = {"stage": "grpo", "algorithm": {"name": "grpo"}}
    config = {
        "name": name,
        "run_dir": str(runs / name),
        "seed": 0,
        "num_threads": 2,
        "model": {"path": str(model)},
        "tasks": {"batch_size": 8, "train": train, "eval": [evals]},
        "eval": {"every": every, "k": 2},
        "buffer": {"storage": "sql"},
        "monitor": {"sinks": ["jsonl"], "plot": False},
        "stages": [
            {**sft_stage, "tasks": {"total_steps": sft}, "trainer": {"lr": 3e-3}},
            {**grpo_stage, "tasks": {"total_steps": grpo}, "trainer": {"lr": grpo_lr}},
        ],
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def two_turn(tokenizer, group: str, step: int, reward: float):
    """A tool-style trajectory: model tokens, an observation (action_mask 0), model tokens again."""
    from trine.types import Experience

    prompt = tokenizer.encode("What is 12+30? Use the calculator.\n")
    parts = [("calc(12+30)", 1), ("\n[calculator] 42\n", 0), ("The answer is 42.", 1)]
    response, mask = [], []
    for text, is_action in parts:
        ids = tokenizer.encode(text)
        response += ids
        mask += [is_action] * len(ids)
    logprobs = [(-0.1 - 0.35 * (i % 5)) if m else 0.0 for i, m in enumerate(mask)]
    info = {"batch": step, "finish_reason": "stop", "response": "The answer is 42.",
            "reward_parts": {"accuracy": reward, "format": 0.5}}  # fmt: skip
    return Experience(
        tokens=prompt + response, prompt_length=len(prompt), action_mask=mask, logprobs=logprobs,
        reward=reward, task_id="tools/12+30", group_id=group, run_id="trajectory-tools-0", step=step,
        policy_version=3, info=info, id=f"{group}-{step}",
    )  # fmt: skip


def add_buffer_rows(run_dir: Path, tokenizer) -> dict:
    """Put a two-step tool trajectory and one pending experience into the run's own SQL buffer."""
    from trine.buffer.inspect import open_run_buffer
    from trine.types import Experience

    buffer = open_run_buffer(run_dir)
    prompt = tokenizer.encode("7+8=")
    answer = tokenizer.encode("15")
    pending = Experience(
        tokens=prompt + answer, prompt_length=len(prompt), action_mask=[1] * len(answer),
        logprobs=[-0.4] * len(answer), reward=None, task_id="human/7+8", group_id="human/7+8@0",
        info={"batch": 99, "finish_reason": "stop", "response": "15"}, id="pending-human-0",
    )  # fmt: skip
    buffer.put([two_turn(tokenizer, "tools", 0, 1.0), two_turn(tokenizer, "tools", 1, 0.0), pending])
    buffer.close()
    return {"multi_turn": "tools-0", "pending": "pending-human-0"}


def post_items(run_dir: Path, tokenizer, pending: str) -> list[str]:
    """One pair (two responses of a group of the run) and one rating (the pending experience)."""
    from trine.buffer.inspect import read_rows
    from trine.feedback.queue import AnnotationQueue, Item, queue_url

    groups: dict[str, list] = {}
    for exp, _status in read_rows(run_dir) or []:
        if exp.kind == "rollout" and exp.task_id.startswith("train/"):
            groups.setdefault(exp.group_id, []).append(exp)
    a, b = next(
        (g[0], other) for g in groups.values() for other in g[1:]
        if other.info.get("response") != g[0].info.get("response")
    )  # fmt: skip
    from trine.models.chat import readable_prompt

    prompt, messages = readable_prompt(tokenizer, a.tokens[: a.prompt_length])  # as `trine annotate pairs`
    pair = Item(
        kind="pair",
        prompt=prompt,
        responses=[
            {"text": e.info.get("response", ""), "experience_id": e.id, "tokens": e.tokens[e.prompt_length :]}
            for e in (a, b)
        ],
        meta={
            "task_id": a.task_id,
            "group_id": a.group_id,
            "prompt_tokens": a.tokens[: a.prompt_length],
            "await_rewards": False,
            **({"messages": messages} if messages else {}),
        },
    )
    rate = Item(
        kind="rate", prompt="7+8=", responses=[{"text": "15", "experience_id": pending}], scale=(0, 5)
    )
    queue = AnnotationQueue(queue_url(run_dir))
    queue.post([pair, rate], timeout=3600)
    queue.close()
    return [pair.id, rate.id]


def make_live(runs: Path, done: Path, name: str = "live", fraction: float = 0.5) -> Path:
    """A run that looks alive (status running with this process's pid and a fresh heartbeat) holding the
    first ``fraction`` of the finished run's metrics lines; a test appends the rest."""
    live = runs / name
    live.mkdir()
    shutil.copy(done / "config.yaml", live / "config.yaml")
    lines = (done / "metrics.jsonl").read_text().splitlines(keepends=True)
    keep = max(1, int(len(lines) * fraction))
    (live / "metrics.jsonl").write_text("".join(lines[:keep]))
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    step = json.loads(lines[keep - 1])["step"] if keep else 0
    status = {"state": "running", "step": step, "pid": os.getpid(), "host": socket.gethostname(),
              "started_at": now, "heartbeat": now}  # fmt: skip
    (live / "status.json").write_text(json.dumps(status))
    return live


def make_failed(runs: Path, done: Path, name: str = "crashed") -> Path:
    """A run that failed after a few steps (its status carries the error, as ``trine run`` records it)."""
    failed = runs / name
    failed.mkdir()
    shutil.copy(done / "config.yaml", failed / "config.yaml")
    lines = (done / "metrics.jsonl").read_text().splitlines(keepends=True)[:4]
    (failed / "metrics.jsonl").write_text("".join(lines))
    error = "RuntimeError: simulated crash for the demo (out of memory at step 4); lower trainer.micro_batch_tokens"
    status = {"state": "failed", "step": json.loads(lines[-1])["step"], "error": error}
    (failed / "status.json").write_text(json.dumps(status))
    return failed


def build_demo(
    root: Path, model: Path, *, sft: int = 30, grpo: int = 20, every: int = 5, live: float = 0.5
) -> dict:
    """Build the demo runs directory under ``root/runs``; returns names, ids and paths (see module doc)."""
    from trine.config import load_config
    from trine.loop import run
    from trine.models.loading import load_tokenizer

    runs = root / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    config = write_config(root, runs, model, "arithmetic", sft, grpo, every)
    run(load_config(config))
    done = runs / "arithmetic"
    other = write_config(root, runs, model, VARIANT, sft + 2, grpo, every, grpo_lr=3e-3)
    run(load_config(other))
    tokenizer = load_tokenizer(str(model))
    ids = add_buffer_rows(done, tokenizer)
    items = post_items(done, tokenizer, ids["pending"])
    live_dir = make_live(runs, done, fraction=live)
    failed = make_failed(runs, done)
    return {
        "runs": runs,
        "done": done,
        "variant": runs / VARIANT,
        "live": live_dir,
        "failed": failed,
        "items": items,
        "annotator_token": ANNOTATOR_TOKEN,
        **ids,
    }


def screenshots(url: str, out: Path, demo: dict) -> list[Path]:
    """Open each page at 1280x800 and write out/studio_<page>.png."""
    from playwright.sync_api import sync_playwright

    run = demo["done"].name
    pages = [
        ("runs", "#/", "table.runs-table"),
        ("run", f"#/run/{run}", 'section.chart[data-title="Eval accuracy"] canvas'),
        ("live", f"#/run/{demo['live'].name}", "section.chart canvas"),
        ("experiences", f"#/run/{run}/experiences?order=-reward", "table.experiences"),
        ("experience", f"#/run/{run}/experience/{demo['multi_turn']}", ".seg-observation"),
        ("config", f"#/config?template=run:{run}", "#validity[data-ok]"),
        ("annotate", f"#/run/{run}/annotate", ".item"),
        ("compare", f"#/compare?runs={run},{demo['variant'].name}", 'section.chart[data-series="2"] canvas'),
    ]
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{url}/")
        page.evaluate(f"localStorage.setItem('trine.annotatorToken', '{ANNOTATOR_TOKEN}')")
        for name, fragment, ready in pages:
            page.goto(f"{url}/{fragment}")
            if name == "config":
                page.wait_for_selector(ready)
                break_config(page)
                ready = '#validity[data-ok="false"]'
            if name == "annotate":
                page.click("#get-batch")
                page.wait_for_selector(ready)
                page.click('.item[data-kind="pair"] button[data-choice="a"]')
            page.wait_for_selector(ready)
            page.wait_for_timeout(600)
            path = out / f"studio_{name}.png"
            page.screenshot(path=str(path))
            written.append(path)
        browser.close()
    return written


def break_config(page) -> None:
    """Put two mistakes into the config editor (an out-of-range lr, a typo'd key) near the top."""
    text = page.input_value("#yaml")
    lines = text.split("\n")
    lr = next(i for i, line in enumerate(lines) if line.strip().startswith("lr:"))
    lines[lr] = lines[lr].split(":")[0] + ": -0.001"
    seed = next(i for i, line in enumerate(lines) if line.strip().startswith("seed:"))
    lines[seed] = lines[seed].replace("seed:", "sed:")
    page.fill("#yaml", "\n".join(lines))
    page.wait_for_selector('#validity[data-ok="false"]')
    page.eval_on_selector(".editor-scroll", f"(e) => {{ e.scrollTop = {max(0, lr - 12)} * 20; }}")
    position = sum(len(line) + 1 for line in lines[:lr]) + len(lines[lr]) - 2
    page.eval_on_selector(
        "#yaml",
        f"(t) => {{ t.setSelectionRange({position}, {position}); t.dispatchEvent(new Event('click')); }}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--keep", type=Path, default=None, help="build the demo here and keep it")
    args = parser.parse_args(argv)
    from trine.models.tiny import init_model
    from trine.studio.app import StudioSettings
    from trine.studio.server import background

    root = args.keep or Path(tempfile.mkdtemp(prefix="trine-studio-demo-"))
    model = init_model("tiny-1m", root / "model", seed=0, overwrite=True)
    demo = build_demo(root, model, live=0.8)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = StudioSettings(runs_dir=demo["runs"], annotators={ANNOTATOR_TOKEN: "ada"}, root=root)
    with background(settings) as url:
        for path in screenshots(url, args.out, demo):
            print(path)
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
