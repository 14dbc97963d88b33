"""Trine vs TRL GRPO on the same tiny model, prompts and settings (CPU, 2 threads).

Both sides: the tiny-5m model (first warmed up with 300 Trine SFT steps so rewards are not all zero),
the same tokenizer and chat template, single-digit addition prompts, 4 prompts x 8 samples per step,
max 32 new tokens, temperature 1, top-k off, no KL, one optimizer step per batch, token-mean loss
(TRL's ``loss_type="dapo"``), the same learning rate, constant schedule, fused AdamW (TRL's default).

1. Step time: blocks of steps alternate TRL, Trine, TRL, Trine ... (the first step of each block is
   a warm-up); medians per step, from the SFT'd model (short answers) and from the random model
   (responses run to the 32-token limit). Target: Trine <= 0.5x TRL.
   Every block runs in a fresh process (``--worker``): torch's OpenMP runtime keeps a thread team
   per thread that ever ran parallel ops, and the other side's leftover teams slowed both sides
   by 20-50% when they shared one process.
2. Accuracy per wall-clock: each side trains for the same wall-clock budget; both final models are
   evaluated by the same code (avg@8 at temperature 1 and greedy accuracy on all 100 sums), averaged
   over `--seeds` independent runs (one 60 s RL run moves by several points from seed to seed).
   Target: Trine at least as accurate.

Needs the ``bench`` extra (``pip install -e ".[bench]"``). Usage:
python benchmarks/vs_trl.py [--budget 60] [--rounds 3] [--block 5] [--seeds 3] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import CACHE, ROOT, markdown_table, median, report, threads, tiny_model

from trine.config import validate_dict
from trine.loop import run as trine_run

DATA = ROOT / "examples" / "arithmetic" / "data"
LR = 5e-4


def trine_config(model: Path, run_dir: Path, steps: int, mode: str = "sync", seed: int = 0) -> dict:
    cfg = {
        "name": "bench",
        "run_dir": str(run_dir),
        "seed": seed,
        "num_threads": 2,
        "resume": False,
        "model": {"path": str(model)},
        "tasks": {
            "batch_size": 4 if mode == "sync" else 16,
            "total_steps": steps,
            "train": {
                "path": str(DATA / "train.jsonl"),
                "repeat": 8,
                "reward": "exact_match",
                "sampling": {"temperature": 1.0, "top_k": 0, "max_tokens": 32},
            },
        },
        "algorithm": {"name": "grpo" if mode == "sync" else "sft"},
        "trainer": {
            "lr": LR if mode == "sync" else 3e-3,
            "grad_clip": 1.0,
            # TRL's default optimizer is HF's "adamw_torch_fused": the same kernel on both sides
            "fused_adamw": mode == "sync",
            "save_every": 0,
            "keep_checkpoints": 1,
        },
        "eval": {"at_start": False},
        "monitor": {"sinks": ["jsonl"], "plot": False},
        "mode": mode,
    }
    return cfg


def run_trine(model: Path, steps: int, seed: int = 0) -> tuple[list[float], Path]:
    """GRPO for ``steps``; returns per-step seconds and the final checkpoint directory."""
    run_dir = Path(tempfile.mkdtemp(prefix="trine-bench-"))
    stages, errors = validate_dict(trine_config(model, run_dir, steps, seed=seed))
    assert not errors, errors
    trine_run(stages)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ckpt = sorted((run_dir / "checkpoints").iterdir())[-1]
    return [r["time/step_seconds"] for r in rows if "time/step_seconds" in r], ckpt


def run_trl(model: Path, steps: int, budget: float | None = None, seed: int = 0) -> tuple[list[float], Path]:
    """TRL GRPOTrainer for ``steps`` (or until ``budget`` seconds); per-step seconds and saved model."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in (DATA / "train.jsonl").read_text().splitlines()]
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]} for r in rows]
    )

    def reward(completions, answer, **_):
        return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.start = self.tick = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            self.times.append(now - self.tick)
            self.tick = now
            if budget is not None and now - self.start >= budget:
                control.should_training_stop = True

    out = Path(tempfile.mkdtemp(prefix="trl-bench-"))
    args = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=32,
        learning_rate=LR,
        lr_scheduler_type="constant",
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=seed,
        max_grad_norm=1.0,
        disable_dropout=True,
        bf16=False,
        dataloader_num_workers=0,
    )
    clock = Clock()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model),
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(model),
        callbacks=[clock],
    )
    clock.start = clock.tick = time.perf_counter()
    trainer.train()
    trainer.save_model(str(out / "final"))
    trainer.processing_class.save_pretrained(str(out / "final"))
    return clock.times, out / "final"


def in_process(
    side: str, model: Path, steps: int, budget: float | None = None, seed: int = 0
) -> tuple[list[float], Path]:
    """``run_trl`` / ``run_trine`` in a fresh Python process; returns (per-step seconds, final model)."""
    out = Path(tempfile.mkdtemp(prefix="bench-worker-")) / "result.json"
    cmd = [sys.executable, __file__, "--worker", side, "--model", str(model), "--steps", str(steps)]
    cmd += ["--out", str(out), "--seed", str(seed)] + (
        ["--budget", str(budget)] if budget is not None else []
    )
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    return result["times"], Path(result["final"])


def worker(side: str, model: Path, steps: int, budget: float | None, out: Path, seed: int) -> None:
    threads(2)
    times, final = run_trl(model, steps, budget, seed) if side == "trl" else run_trine(model, steps, seed)
    out.write_text(json.dumps({"times": times, "final": str(final)}))


def evaluate(model_dir: Path) -> dict[str, float]:
    from trine.explorer import Explorer
    from trine.models import load_model, load_tokenizer
    from trine.models.engine import HFEngine
    from trine.tasks import TaskSet

    engine = HFEngine(load_model(model_dir), load_tokenizer(model_dir), seed=0)
    tasks = list(
        TaskSet(str(DATA / "eval.jsonl"), name="eval", sampling={"temperature": 1.0, "max_tokens": 32})
    )
    return Explorer(engine).evaluate(tasks, name="eval", k=8, greedy=True, seed=1)


def sft_start(base: Path) -> Path:
    """A shared starting point: tiny-5m after 300 Trine SFT steps on the addition rows (~13% avg@8,
    18% greedy: the answer format is learnt and there is room for GRPO to improve)."""
    path = CACHE / "tiny-5m-sft300"
    if not (path / "config.json").exists():
        run_dir = Path(tempfile.mkdtemp(prefix="trine-sft-"))
        stages, errors = validate_dict(trine_config(base, run_dir, 300, mode="train"))
        assert not errors, errors
        trine_run(stages)
        shutil.copytree(sorted((run_dir / "checkpoints").iterdir())[-1], path, dirs_exist_ok=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=60.0, help="wall-clock seconds of GRPO per side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block", type=int, default=5, help="steps per timing block")
    parser.add_argument(
        "--seeds", type=int, default=3, help="accuracy runs per side (seeds 0..n-1), averaged"
    )
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--worker", choices=["trl", "trine"], help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:  # one block of one side, in this fresh process
        budget = args.budget if args.worker == "trl" else None
        worker(args.worker, args.model, args.steps, budget, args.out, args.seed)
        return
    threads(2)
    base = tiny_model("tiny-5m")
    start = sft_start(base)
    rows = []
    medians = {}
    for label, model in (("after SFT (short answers)", start), ("random init (32-token responses)", base)):
        times: dict[str, list[float]] = {"trl": [], "trine": []}
        for _ in range(args.rounds):
            times["trl"] += in_process("trl", model, args.block)[0][1:]
            times["trine"] += in_process("trine", model, args.block)[0][1:]
        trl, trine = median(times["trl"]), median(times["trine"])
        medians[label] = (trl, trine)
        rows.append([f"s/step, {label}", f"{trl:.3f}", f"{trine:.3f}", f"{trine / trl:.2f}x", "≤ 0.5x"])

    _, trine_s = medians["after SFT (short answers)"]
    trine_steps = max(1, int(args.budget / trine_s))
    before = evaluate(start)
    evals: dict[str, list[dict[str, float]]] = {"trl": [], "trine": []}
    steps: dict[str, list[int]] = {"trl": [], "trine": []}
    for seed in range(args.seeds):  # one 60 s RL run is noisy: average independent runs
        for side in ("trl", "trine"):
            n = 10_000 if side == "trl" else trine_steps
            times, final = in_process(
                side, start, n, budget=args.budget if side == "trl" else None, seed=seed
            )
            evals[side].append(evaluate(final))
            steps[side].append(len(times))
    per_seed = []
    for key, name in (("eval/eval/avg@8", "avg@8 (T=1)"), ("eval/eval/accuracy", "greedy accuracy")):
        trl_acc, trine_acc = (statistics.fmean(e[key] for e in evals[side]) for side in ("trl", "trine"))
        rows.append(
            [
                f"{name} after {args.budget:.0f} s of GRPO, mean of {args.seeds} seeds (start {100 * before[key]:.1f}%)",
                f"{100 * trl_acc:.1f}%",
                f"{100 * trine_acc:.1f}%",
                f"{trine_acc - trl_acc:+.3f}",
                "≥ +0",
            ]
        )
        per_seed.append(
            f"{name} per seed: TRL "
            + ", ".join(f"{100 * e[key]:.0f}%" for e in evals["trl"])
            + "; Trine "
            + ", ".join(f"{100 * e[key]:.0f}%" for e in evals["trine"])
        )
    trl_steps, trine_steps_done = (statistics.fmean(steps[side]) for side in ("trl", "trine"))
    rows.append(
        [
            "GRPO steps in the budget (mean)",
            f"{trl_steps:.0f}",
            f"{trine_steps_done:.0f}",
            f"{trine_steps_done / max(1, trl_steps):.1f}x",
            "-",
        ]
    )
    table = markdown_table(["measure", "TRL", "Trine", "ratio / diff", "target"], rows)
    report(
        "Trine vs TRL GRPO (tiny-5m, CPU, 2 threads)",
        table,
        f"4 prompts x 8 samples, max 32 new tokens, lr {LR}, no KL, TRL loss_type=dapo; medians of "
        f"{args.rounds} alternating blocks of {args.block} steps (first step of each block dropped), "
        "each block in a fresh process. " + "; ".join(per_seed) + ".",
        write=not args.no_write,
    )
    torch.set_num_threads(2)


if __name__ == "__main__":
    main()
