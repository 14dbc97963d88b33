"""Trine vs TRL GRPO on the same tiny model, prompts and settings (CPU, 2 threads).

Both sides: the tiny-5m model (first warmed up with 300 Trine SFT steps so rewards are not all zero),
the same tokenizer and chat template, single-digit addition prompts, 4 prompts x 8 samples per step,
max 32 new tokens, temperature 1, top-k off, no KL, one optimizer step per batch, token-mean loss
(TRL's ``loss_type="dapo"``), the same learning rate, constant schedule, fused AdamW (TRL's default),
float32, no gradient (activation) checkpointing.

Every TRL ``GRPOConfig`` default that changes the work or the math, checked against trl 1.16.0 /
transformers 5.23.0 (``python -c "from trl import GRPOConfig; print(GRPOConfig(output_dir='x',
use_cpu=True, bf16=False))"``); the script sets each one explicitly so a new TRL default cannot move the
comparison, and :func:`check_trl_args` fails if the resolved value differs:

====================================  ======================  ==================  ============================
setting                               TRL default             set here (TRL)      Trine (this script)
====================================  ======================  ==================  ============================
gradient/activation_checkpointing     **True**                False               none (not implemented)
bf16                                  **True** (not fp16)     False               float32 (``dtype: auto``, CPU)
loss_type                             dapo (token-mean)       dapo                ``loss_agg: token-mean``
beta (KL coef)                        0.0                     0.0                 ``kl_coef: 0`` (grpo preset)
epsilon / epsilon_high                0.2 / None (= 0.2)      0.2 / 0.2           ``clip_low/high: 0.2``
importance_sampling_level             token                   token               ppo_clip, per token
num_iterations / steps_per_generation 1 / 1                   1 / 1               ``update_epochs 1``, sync
scale_rewards                         group (std + 1e-4)      group               group std (unbiased) + 1e-6
mask_truncated_completions            False                   False               truncated rows trained
top_entropy_quantile / entropy_coef   1.0 / 0.0               1.0 / 0.0           ``entropy_coef: 0``
temperature / top_p / top_k / min_p   1.0 / 1.0 / 0 / None    1.0 / 1.0 / 0 / -   1.0 / 1.0 / 0 (no min_p)
repetition_penalty                    1.0                     1.0                 none
max_completion_length                 **512**                 32                  ``max_tokens: 32``
per_device_train_batch_size           **8**                   32                  4 tasks x ``repeat: 8``
num_generations / generation batch    8 / 8                   8 / 32 (derived)    8 / 32
gradient_accumulation_steps           1                       1                   one micro-batch (8192 tok)
learning_rate                         **1e-6**                5e-4                ``lr: 5e-4``
lr_scheduler_type / warmup_steps      **linear** / 0          constant / 0        constant / 0
optim                                 adamw_torch_fused       adamw_torch_fused   ``fused_adamw: true``
adam_beta1 / beta2 / epsilon          0.9 / 0.999 / 1e-8      same                same (trainer defaults)
weight_decay                          0.0                     0.0                 0.0
max_grad_norm                         1.0                     1.0                 ``grad_clip: 1.0``
disable_dropout                       False                   True                no-op: tiny-5m has no dropout
torch_compile / use_liger_kernel      False / False           False / False       no compile
use_vllm / transformers paging        False / False           False / False       Trine's HFEngine (KV cache)
logging_steps / disable_tqdm          **10** / False          1 / True            jsonl sink only, every step
save_strategy                         **steps** (500)         no                  ``save_every: 0`` (final only)
report_to / log_completions           none / False            none / False        no W&B / MLflow / TB
eval_strategy                         no                      no                  ``eval.at_start: false``
shuffle_dataset / seed                True / 42               True / seed         shuffled / ``seed``
====================================  ======================  ==================  ============================

Not matched exactly: the advantage epsilon (1e-4 vs 1e-6; with 0/1 rewards a non-zero group std is
>= 0.35, so < 0.03% apart), and Trine's ``time/step_seconds`` excludes its jsonl write while TRL's
callback clock includes its per-step log (both small next to a 0.2 s step).

1. Step time: blocks of steps alternate TRL, Trine, Trine per-sample, TRL, ... (the first step of each
   block is a warm-up); medians per step, from the SFT'd model (short answers) and from the random model
   (responses run to the 32-token limit). Target: Trine <= 0.5x TRL. "Trine" is the default config,
   whose ``trainer.shared_prompt: auto`` runs each group's prompt once for its 8 responses; "Trine
   per-sample" sets ``shared_prompt: false`` (the forward TRL also runs: the prompt once per sample),
   and the update-only seconds (``time/train_seconds``) of both show what the arrangement saves.
   Every block runs in a fresh process (``--worker``): torch's OpenMP runtime keeps a thread team
   per thread that ever ran parallel ops, and the other side's leftover teams slowed both sides
   by 20-50% when they shared one process.
2. Accuracy per wall-clock: each side trains for the same wall-clock time. Trine runs first, for
   ``budget / its median step time`` steps; TRL then gets exactly the seconds Trine actually spent in
   its GRPO steps (it stops when its clock passes them), so neither side gets more time (an earlier
   version gave TRL the nominal budget while Trine's fixed step count overshot it by ~10%); the
   seconds each side actually trained are reported; both final models are evaluated by the same code (avg@8 at temperature 1
   and greedy accuracy on all 100 sums), for `--seeds` independent runs (one 60 s RL run moves by
   several points from seed to seed). Reported per seed, with the mean, std, min and max of the
   difference and the number of seeds on which Trine is ahead. Target: Trine at least as accurate.

Needs the ``bench`` extra (``pip install -e ".[bench]"``). Usage:
python benchmarks/vs_trl.py [--budget 60] [--rounds 3] [--block 5] [--seeds 3] [--no-write]
Smoke check: python benchmarks/vs_trl.py --budget 5 --seeds 1 --rounds 1 --block 3 --no-write
Step times only: python benchmarks/vs_trl.py --seeds 0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import CACHE, ROOT, alternate, markdown_table, median, report, threads, timed, tiny_model

from trine.config import validate_dict
from trine.loop import run as trine_run

DATA = ROOT / "examples" / "arithmetic" / "data"
LR = 5e-4


def trine_config(
    model: Path, run_dir: Path, steps: int, mode: str = "sync", seed: int = 0, shared_prompt: object = "auto"
) -> dict:
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
            # each group's prompt runs once for its 8 responses ("auto", the default) or once per sample
            "shared_prompt": shared_prompt,
        },
        "eval": {"at_start": False},
        "monitor": {"sinks": ["jsonl"], "plot": False},
        "mode": mode,
    }
    return cfg


def run_trine(
    model: Path, steps: int, seed: int = 0, shared_prompt: object = "auto"
) -> tuple[list[float], Path, list[float]]:
    """GRPO for ``steps``; returns per-step seconds, the final checkpoint directory and per-step seconds
    of the update alone (``time/train_seconds``)."""
    run_dir = Path(tempfile.mkdtemp(prefix="trine-bench-"))
    stages, errors = validate_dict(
        trine_config(model, run_dir, steps, seed=seed, shared_prompt=shared_prompt)
    )
    assert not errors, errors
    trine_run(stages)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ckpt = sorted((run_dir / "checkpoints").iterdir())[-1]
    train = [r["time/train_seconds"] for r in rows if "time/train_seconds" in r]
    return [r["time/step_seconds"] for r in rows if "time/step_seconds" in r], ckpt, train


# What the TRL side sets (see the module docstring for TRL's defaults and Trine's equivalents).
TRL_SETTINGS: dict[str, object] = {
    "use_cpu": True,
    "bf16": False,
    "per_device_train_batch_size": 32,
    "num_generations": 8,
    "steps_per_generation": 1,
    "gradient_accumulation_steps": 1,
    "max_completion_length": 32,
    "learning_rate": LR,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "optim": "adamw_torch_fused",
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-8,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "repetition_penalty": 1.0,
    "beta": 0.0,
    "epsilon": 0.2,
    "epsilon_high": 0.2,
    "importance_sampling_level": "token",
    "num_iterations": 1,
    "loss_type": "dapo",
    "scale_rewards": "group",
    "mask_truncated_completions": False,
    "top_entropy_quantile": 1.0,
    "torch_compile": False,
    "use_liger_kernel": False,
    "shuffle_dataset": True,
    "use_vllm": False,
    "logging_steps": 1,
    "disable_tqdm": True,
    "save_strategy": "no",
    "report_to": "none",
    "log_completions": False,
    "disable_dropout": True,
    "dataloader_num_workers": 0,
}


def trl_settings(config_cls: type) -> dict[str, object]:
    """``TRL_SETTINGS`` plus checkpointing off under the name this transformers version uses.

    transformers 5 renamed ``gradient_checkpointing`` to ``activation_checkpointing`` (the old name is a
    deprecated alias); TRL defaults it to True, which recomputes every activation in the backward pass.
    """
    names = {f.name for f in dataclasses.fields(config_cls)}
    key = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {**TRL_SETTINGS, key: False}


def check_trl_args(args: object) -> None:
    """Fail when a resolved TRL setting differs from what the comparison assumes."""
    want = {**TRL_SETTINGS, "gradient_checkpointing": False, "generation_batch_size": 32}
    want.pop("report_to")
    got = {key: getattr(args, key) for key in want}
    got = {k: getattr(v, "value", v) for k, v in got.items()}  # enums (optim, schedule, ...) -> str
    wrong = {k: (got[k], v) for k, v in want.items() if got[k] != v}
    if wrong:
        raise RuntimeError(f"TRL resolved settings differ from the benchmark's (got, wanted): {wrong}")


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

        def on_train_begin(self, args, state, control, **kw):
            self.start = self.tick = time.perf_counter()  # the trainer's construction is not a step

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter()
            self.times.append(now - self.tick)
            self.tick = now
            if budget is not None and sum(self.times) >= budget:  # time in steps, as Trine's is counted
                control.should_training_stop = True

    out = Path(tempfile.mkdtemp(prefix="trl-bench-"))
    args = GRPOConfig(output_dir=str(out), max_steps=steps, seed=seed, **trl_settings(GRPOConfig))
    check_trl_args(args)
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


SIDES = ("trl", "trine", "trine-per-sample")
"""Worker sides: TRL, Trine as configured by default (``shared_prompt: auto``), Trine with the per-sample
forward (``shared_prompt: false``, the arrangement before issue 27)."""


def in_process(
    side: str, model: Path, steps: int, budget: float | None = None, seed: int = 0
) -> tuple[list[float], Path, list[float]]:
    """``run_trl`` / ``run_trine`` in a fresh Python process; returns (per-step seconds, final model,
    Trine's per-step update seconds, empty for TRL)."""
    out = Path(tempfile.mkdtemp(prefix="bench-worker-")) / "result.json"
    cmd = [sys.executable, __file__, "--worker", side, "--model", str(model), "--steps", str(steps)]
    cmd += ["--out", str(out), "--seed", str(seed)] + (
        ["--budget", str(budget)] if budget is not None else []
    )
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    result = json.loads(out.read_text())
    return result["times"], Path(result["final"]), result["train"]


def worker(side: str, model: Path, steps: int, budget: float | None, out: Path, seed: int) -> None:
    threads(2)
    if side == "trl":
        times, final = run_trl(model, steps, budget, seed)
        train: list[float] = []
    else:
        shared = "auto" if side == "trine" else False
        times, final, train = run_trine(model, steps, seed, shared_prompt=shared)
    out.write_text(json.dumps({"times": times, "final": str(final), "train": train}))


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


def spread(diffs: list[float]) -> str:
    """``+mean (std s, min a, max b; Trine ahead on k/n seeds)`` of per-seed differences (points)."""
    std = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    ahead = sum(d > 0 for d in diffs)
    return (
        f"{statistics.fmean(diffs):+.1f} pts (std {std:.1f}, min {min(diffs):+.1f}, max {max(diffs):+.1f}; "
        f"Trine ahead on {ahead}/{len(diffs)} seeds)"
    )


def step_times(start: Path, base: Path, rounds: int, block: int) -> tuple[list[list[object]], float]:
    """Alternating fresh-process blocks per side (TRL, Trine, Trine with the per-sample forward); table
    rows and Trine's median s/step after SFT."""
    rows, trine_after_sft = [], 0.0
    for label, model in (("after SFT (short answers)", start), ("random init (32-token responses)", base)):
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        train: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(rounds):
            for side in SIDES:
                step, _, update = in_process(side, model, block)
                times[side] += step[1:]
                train[side] += update[1:]
        trl, trine, per_sample = (median(times[side]) for side in SIDES)
        trine_after_sft = trine_after_sft or trine
        rows.append([f"s/step, {label}", f"{trl:.3f}", f"{trine:.3f}", f"{trine / trl:.2f}x", "≤ 0.5x"])
        rows.append(
            [
                f"s/step, {label}, Trine per-sample forward (shared_prompt: false)",
                f"{trl:.3f}",
                f"{per_sample:.3f}",
                f"{per_sample / trl:.2f}x",
                "-",
            ]
        )
        shared_train, sample_train = median(train["trine"]), median(train["trine-per-sample"])
        rows.append(
            [
                f"Trine update s/step ({label}): per-sample → shared prompt",
                "-",
                f"{sample_train:.3f} → {shared_train:.3f}",
                f"{shared_train / sample_train:.2f}x",
                "-",
            ]
        )
    return rows, trine_after_sft


def update_ab(model: Path, rounds: int) -> list[list[object]]:
    """Trine's update alone (``Trainer.step``), per-sample forward vs shared prompt, alternating step by
    step in this one process (less exposed to a busy machine than the fresh-process blocks), on batches
    shaped like the benchmark's: 4 chat prompts x 8 responses, each the answer and EOS, or 32 tokens."""
    from trine.algorithms import PRESETS
    from trine.config import TrainerConfig
    from trine.models import load_model, load_tokenizer
    from trine.trainer import Trainer
    from trine.types import Experience

    tok = load_tokenizer(model)
    tasks = [json.loads(line) for line in (DATA / "train.jsonl").read_text().splitlines()[:4]]
    rng = random.Random(0)
    rows = []
    for label, long in (("answer + EOS", False), ("32-token responses", True)):
        exps = []
        for group, task in enumerate(tasks):
            chat = [{"role": "user", "content": task["question"]}]
            prompt = tok(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))[
                "input_ids"
            ]
            for k in range(8):
                answer = tok(task["answer"])["input_ids"] + [tok.eos_token_id]
                resp = [rng.randrange(3, len(tok)) for _ in range(32)] if long else answer
                exps.append(
                    Experience(prompt + resp, len(prompt), [1] * len(resp), logprobs=[-1.0] * len(resp),
                               reward=float(k % 2), group_id=str(group))
                )  # fmt: skip
        trainers = {
            shared: Trainer(
                load_model(model),
                PRESETS["grpo"],
                TrainerConfig(lr=LR, fused_adamw=True, shared_prompt=shared),
                pad_token_id=tok.pad_token_id,
            )
            for shared in (False, True)
        }
        times = alternate(
            {shared: (lambda t=t, e=exps: timed(lambda: t.step(e))) for shared, t in trainers.items()},
            rounds,
            2,
        )
        before, after = median(times[False]), median(times[True])
        rows.append(
            [
                f"Trine update s/step, one process ({label}, prompt {exps[0].prompt_length} "
                "tokens): per-sample → shared prompt",
                "-",
                f"{before:.3f} → {after:.3f}",
                f"{after / before:.2f}x",
                "-",
            ]
        )
    return rows


def accuracy_runs(start: Path, budget: float, seeds: int, trine_steps: int) -> list[dict[str, dict]]:
    """One GRPO run per side and seed for about ``budget`` seconds (TRL: Trine's actual seconds); per seed ``{side: {metric: value}}``
    with the final model's eval metrics plus ``steps`` and ``seconds`` (time spent in GRPO steps)."""
    results = []
    for seed in range(seeds):
        per_side = {}
        times, final, _ = in_process("trine", start, trine_steps, budget=None, seed=seed)
        per_side["trine"] = {**evaluate(final), "steps": len(times), "seconds": sum(times)}
        # TRL gets the seconds Trine actually trained, not the nominal budget: equal wall-clock
        times, final, _ = in_process("trl", start, 10_000, budget=sum(times), seed=seed)
        per_side["trl"] = {**evaluate(final), "steps": len(times), "seconds": sum(times)}
        results.append(per_side)
    return results


METRICS = (("eval/eval/avg@8", "avg@8 (T=1)"), ("eval/eval/accuracy", "greedy accuracy"))


def accuracy_tables(results: list[dict[str, dict]], before: dict, budget: float) -> tuple[list, str]:
    """Summary rows for the main table and a per-seed markdown table."""
    rows = []
    for key, name in METRICS:
        trl = [100 * r["trl"][key] for r in results]
        trine = [100 * r["trine"][key] for r in results]
        rows.append(
            [
                f"{name} after {budget:.0f} s of GRPO, mean of {len(results)} seeds "
                f"(start {100 * before[key]:.1f}%)",
                f"{statistics.fmean(trl):.1f}%",
                f"{statistics.fmean(trine):.1f}%",
                spread([b - a for a, b in zip(trl, trine)]),
                "≥ +0 on every seed",
            ]
        )
    for key, name in (("steps", "GRPO steps in the budget (mean)"), ("seconds", "seconds in GRPO steps")):
        trl, trine = (statistics.fmean(r[side][key] for r in results) for side in ("trl", "trine"))
        fmt = ".0f" if key == "steps" else ".1f"
        rows.append([name, f"{trl:{fmt}}", f"{trine:{fmt}}", f"{trine / max(1e-9, trl):.2f}x", "-"])
    head = ["seed"] + [f"{side} {name}" for _, name in METRICS for side in ("TRL", "Trine")]
    head += ["TRL steps (s)", "Trine steps (s)"]
    per_seed = []
    for seed, r in enumerate(results):
        cells: list[object] = [seed]
        for key, _ in METRICS:
            cells += [f"{100 * r['trl'][key]:.1f}%", f"{100 * r['trine'][key]:.1f}%"]
        cells += [f"{r[s]['steps']} ({r[s]['seconds']:.1f})" for s in ("trl", "trine")]
        per_seed.append(cells)
    return rows, markdown_table(head, per_seed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=60.0, help="wall-clock seconds of GRPO per side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block", type=int, default=5, help="steps per timing block")
    parser.add_argument(
        "--seeds", type=int, default=3, help="accuracy runs per side (seeds 0..n-1); 0: step times only"
    )
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
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
    rows, trine_s = step_times(start, base, args.rounds, args.block)
    rows += update_ab(start, 5 * args.rounds)
    acc_rows, per_seed = [], ""
    if args.seeds > 0:
        before = evaluate(start)
        results = accuracy_runs(start, args.budget, args.seeds, max(1, int(args.budget / trine_s)))
        acc_rows, per_seed = accuracy_tables(results, before, args.budget)
        per_seed = (
            "\n\nPer seed (accuracy after the budget; steps and seconds spent in GRPO steps):\n\n" + per_seed
        )
    table = markdown_table(["measure", "TRL", "Trine", "ratio / diff", "target"], rows + acc_rows)
    report(
        "Trine vs TRL GRPO (tiny-5m, CPU, 2 threads)",
        table + per_seed,
        f"4 prompts x 8 samples, max 32 new tokens, lr {LR}, no KL, TRL loss_type=dapo, fp32, fused AdamW, "
        "gradient checkpointing off on both sides (TRL's default is on); medians of "
        f"{args.rounds} alternating blocks of {args.block} steps (first step of each block dropped), "
        "each block in a fresh process.",
        write=not args.no_write,
    )
    torch.set_num_threads(2)


if __name__ == "__main__":
    main()
