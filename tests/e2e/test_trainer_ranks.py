"""Trainer ranks on CPU: two gloo processes, each with its share of every step's micro-batches over FSDP2
shards, take the same steps as one process with the whole batch (:mod:`trine.trainer.ranks`)."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

import pytest
import torch

from tests.helpers import shifted_experiences
from trine.algorithms import PRESETS
from trine.config import TrainerConfig
from trine.models import load_model, load_tokenizer
from trine.models.export import rollout_state_dict
from trine.trainer import Trainer
from trine.trainer.policy import prepare_policy
from trine.types import Experience

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SETTINGS = TrainerConfig(lr=1e-3, grad_clip=1.0, micro_batch_tokens=24, mini_batches=2)


def _algorithm(name: str):
    if name == "grpo+kl-reward":  # reference logprobs and KL inside the rewards: assembled across ranks
        return PRESETS["grpo"].with_overrides(kl_coef=0.1, kl_mode="reward")
    return PRESETS[name]


def _batch(model_dir: str, name: str) -> list[Experience]:
    tokenizer = load_tokenizer(model_dir)
    rows = (
        shifted_experiences(load_model(model_dir), tokenizer, shift=-0.05) * 3
    )  # 9 rows: an odd number of micro-batches
    exps = [Experience(**{**vars(e), "info": dict(e.info)}) for e in rows]
    if name == "dpo":  # pairs: rows sharing a group, one chosen
        for i, e in enumerate(exps[:8]):
            e.group_id, e.info["chosen"] = f"pair-{i // 2}", i % 2 == 0
        exps = exps[:8]
    return exps


def _steps(model_dir: str, name: str, model, ref) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    tokenizer = load_tokenizer(model_dir)
    trainer = Trainer(
        model,
        _algorithm(name),
        SETTINGS,
        pad_token_id=tokenizer.pad_token_id,
        ref_model=ref,
        total_steps=2,
        seed=3,
    )
    metrics = [trainer.step(_batch(model_dir, name)) for _ in range(2)]
    return metrics, {k: v.clone() for k, v in rollout_state_dict(trainer.model).items()}


def _rank_main(rank: int, port: int, model_dir: str, name: str, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        ref = load_model(model_dir) if _algorithm(name).needs_ref else None
        metrics, weights = _steps(model_dir, name, prepare_policy(load_model(model_dir), fsdp=True), ref)
        plain = (
            {k: v.numpy() for k, v in weights.items()} if rank == 0 else None
        )  # by value, not shared memory
        queue.put((rank, metrics, plain))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("name", ["grpo", "grpo+kl-reward", "dpo"])
def test_two_ranks_take_the_one_process_steps(tiny_model_dir, name):
    ref = load_model(tiny_model_dir) if _algorithm(name).needs_ref else None
    alone, expected = _steps(str(tiny_model_dir), name, load_model(tiny_model_dir), ref)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    ranks = [ctx.Process(target=_rank_main, args=(r, port, str(tiny_model_dir), name, queue)) for r in (0, 1)]
    for p in ranks:
        p.start()
    results = dict((r, (m, w)) for r, m, w in (queue.get(timeout=180) for _ in ranks))
    for p in ranks:
        p.join(timeout=30)
    assert [p.exitcode for p in ranks] == [0, 0]
    (metrics0, weights), (metrics1, _) = results[0], results[1]
    timing = ("time/train_seconds", "trainer/tokens_per_second")
    assert [{k: v for k, v in m.items() if k not in timing} for m in metrics0] == [
        {k: v for k, v in m.items() if k not in timing} for m in metrics1
    ]  # every rank reports the whole step
    keys = ("trainer/loss", "trainer/grad_norm", "trainer/batch_size")
    for got, want in zip(metrics0, alone, strict=True):
        assert {k: got[k] for k in keys} == pytest.approx({k: want[k] for k in keys}, rel=1e-4, abs=1e-6)
    # Adam steps of lr 1e-3: summation order (ranks vs one process) may move a weight by a few 1e-5
    assert max(float((torch.from_numpy(weights[k]) - v).abs().max()) for k, v in expected.items()) < 1e-4
    assert os.environ.get("WORLD_SIZE") is None  # the parent never joined a group
