"""Trainer: micro-batch-independent gradients, batching/collation, LR schedule, checkpoints."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from trine.algorithms import PRESETS
from trine.config import TrainerConfig
from trine.models import load_model, load_tokenizer
from trine.models.shared_prompt import shared_pays
from trine.trainer import (
    Trainer,
    collate,
    forward_logprobs,
    list_checkpoints,
    load_states,
    lr_lambda,
    plan_micro_batches,
    save_checkpoint,
)
from trine.types import Experience

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# (prompt, response, reward, group): different prompt and response lengths, including a short
# sequence next to a long response (its row is mostly padding inside the logits window).
SPECS = [
    ("What is 2+3?", "5", 1.0, "a"),
    ("Hi", "hello there my friend, how are you today?", 0.0, "a"),
    ("A much longer prompt about many things and more", "ok", 1.0, "b"),
    ("x", "yes no", 0.5, "b"),
    ("Q", "1 2 3 4 5 6 7 8", 0.0, "a"),
]


@pytest.fixture(scope="module")
def experiences(tiny_model_dir, tokenizer) -> list[Experience]:
    """Rollout-like experiences whose behaviour logprobs are near (not at) the model's own."""
    model = load_model(tiny_model_dir)
    gen = torch.Generator().manual_seed(0)
    out = []
    for question, answer, reward, group in SPECS:
        prompt = tokenizer(question)["input_ids"]
        response = tokenizer(answer)["input_ids"]
        mask = [1] * len(response)
        if len(mask) > 2:
            mask[-2] = 0  # an observation token inside the response
        exp = Experience(
            tokens=prompt + response,
            prompt_length=len(prompt),
            action_mask=mask,
            reward=reward,
            group_id=group,
        )
        with torch.no_grad():
            logprobs, _ = forward_logprobs(model, collate([exp], [0], tokenizer.pad_token_id, "cpu"))
        noisy = logprobs[0] + 0.3 * torch.randn(logprobs.shape[1], generator=gen)
        exp.logprobs = (noisy * torch.tensor(mask)).tolist()
        exp.check()
        out.append(exp)
    return out


def _trainer(model_dir, tokenizer, **kwargs) -> Trainer:
    """A GRPO trainer; ``kwargs``: ``trainer`` config fields (over lr=1, eps=1, no clipping) and plain arguments."""
    fields = {"lr": 1.0, "eps": 1.0, "grad_clip": 0.0}
    fields.update({k: v for k, v in kwargs.items() if k in TrainerConfig.model_fields})
    args = {k: v for k, v in kwargs.items() if k not in TrainerConfig.model_fields}
    settings = TrainerConfig(**fields)
    return Trainer(
        load_model(model_dir), PRESETS["grpo"], settings, pad_token_id=tokenizer.pad_token_id, **args
    )


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_gradient_and_update_do_not_depend_on_the_micro_batch_split(tiny_model_dir, tokenizer, experiences):
    # AdamW with eps=1 makes the first update ~ lr * g / (|g| + 1): close to linear in the gradient,
    # so equal updates mean equal gradients (with eps=1e-8 tiny gradients would be sign-amplified).
    lengths = [len(e.tokens) for e in experiences]
    results = {}
    for budget in (10**6, 1):
        trainer = _trainer(tiny_model_dir, tokenizer, micro_batch_tokens=budget)
        before = _state(trainer.model)
        grads: dict[str, torch.Tensor] = {}
        step_optimizer = trainer._optimizer_step

        def record(trainer=trainer, grads=grads, step_optimizer=step_optimizer):
            grads.update(
                {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
            )
            return step_optimizer()

        trainer._optimizer_step = record
        metrics = trainer.step(experiences)
        results[budget] = (grads, _state(trainer.model), metrics)
        assert trainer.version == 1
    assert len(plan_micro_batches(lengths, 1)) == len(experiences)
    assert len(plan_micro_batches(lengths, 10**6)) == 1

    (g_big, w_big, m_big), (g_small, w_small, m_small) = results[10**6], results[1]
    assert g_big.keys() == g_small.keys() and len(g_big) > 0
    assert max(float(g.abs().max()) for g in g_big.values()) > 1e-2
    for name in g_big:
        torch.testing.assert_close(g_small[name], g_big[name], atol=1e-6, rtol=1e-4, msg=name)
    assert _max_diff(w_big, before) > 1e-2  # the step really moved the weights
    assert _max_diff(w_big, w_small) < 1e-6
    for key in ("trainer/loss", "trainer/clipfrac", "trainer/approx_kl", "trainer/entropy"):
        assert m_small[key] == pytest.approx(m_big[key], abs=1e-5), key
    assert 0.0 < m_big["trainer/clipfrac"] < 1.0  # both clipped and unclipped tokens were exercised
    assert m_big["trainer/padding_fraction"] > 0.0 and m_small["trainer/padding_fraction"] == 0.0


def test_step_requires_rewards_and_counts_empty_batches(tiny_model_dir, tokenizer, experiences):
    trainer = _trainer(tiny_model_dir, tokenizer)
    assert trainer.step([]) == {"trainer/empty_batch": 1.0} and trainer.version == 1
    pending = Experience.from_dict({**experiences[0].to_dict(), "reward": None})
    with pytest.raises(ValueError, match="no reward yet"):
        trainer.step([pending, experiences[1]])


def test_experiences_of_a_failed_trajectory_stay_out_of_the_loss(tiny_model_dir, tokenizer, experiences):
    """An env/tool/reward failure is stored with its status and excluded: the update equals the one
    without those rows (configurable with trainer.train_statuses)."""
    failed = [
        Experience.from_dict({**e.to_dict(), "status": "reward_error", "reward": 5.0, "id": f"x{i}"})
        for i, e in enumerate(experiences[:2])
    ]
    clean, mixed = _trainer(tiny_model_dir, tokenizer), _trainer(tiny_model_dir, tokenizer)
    clean.step(list(experiences))
    metrics = mixed.step(list(experiences) + failed)
    assert metrics["trainer/excluded_status"] == 2.0 and metrics["trainer/batch_size"] == len(experiences)
    assert _max_diff(_state(clean.model), _state(mixed.model)) == 0.0
    everything = _trainer(tiny_model_dir, tokenizer, train_statuses=["ok", "reward_error"])
    assert "trainer/excluded_status" not in everything.step(list(experiences) + failed)
    only_failed = _trainer(tiny_model_dir, tokenizer).step(failed)
    assert only_failed == {"trainer/empty_batch": 1.0, "trainer/excluded_status": 2.0}


def test_the_step_reports_the_mean_reward_of_the_rollouts_it_trained_on(
    tiny_model_dir, tokenizer, experiences
):
    """``trainer/reward_mean``: the trainer's own view of the batch's rewards (the step line shows it where
    the explorer is another process), over the rollouts it kept; rows excluded by status do not count."""
    failed = Experience.from_dict(
        {**experiences[0].to_dict(), "status": "reward_error", "reward": 9.0, "id": "f"}
    )
    metrics = _trainer(tiny_model_dir, tokenizer).step(list(experiences) + [failed])
    assert metrics["trainer/reward_mean"] == pytest.approx(sum(r for _, _, r, _ in SPECS) / len(SPECS))
    sft = [Experience.from_dict({**e.to_dict(), "kind": "sft", "reward": None}) for e in experiences]
    sft_trainer = Trainer(load_model(tiny_model_dir), PRESETS["sft"], pad_token_id=tokenizer.pad_token_id)
    assert "trainer/reward_mean" not in sft_trainer.step(sft)  # supervised rows carry no reward


def test_plan_micro_batches_respects_the_budget_and_buckets_by_length():
    lengths = [10, 3, 9, 2, 4, 11]
    # sorted: 11 10 9 4 3 2. Three micro-batches are needed under budget 22; 11 10 | 9 | 4 3 2 processes
    # 2*11 + 9 + 3*4 = 43 padded tokens (the greedy 11 10 | 9 4 | 3 2 would take 22 + 18 + 6 = 46).
    assert plan_micro_batches(lengths, 22, overhead_tokens=128) == [[5, 0], [2], [4, 1, 3]]
    # with no launch overhead every sequence is its own micro-batch: no padding at all
    assert plan_micro_batches(lengths, 22, overhead_tokens=0) == [[5], [0], [2], [4], [1], [3]]
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 50, (40,), generator=gen).tolist()
    for budget in (1, 30, 64, 200, 10_000):
        plan = plan_micro_batches(lengths, budget)
        assert sorted(i for batch in plan for i in batch) == list(range(40))
        previous_min = math.inf
        for batch in plan:
            width = max(lengths[i] for i in batch)
            assert len(batch) == 1 or len(batch) * width <= budget
            assert width <= previous_min  # longest first: each batch holds similar lengths
            previous_min = min(lengths[i] for i in batch)


def test_collate_left_pads_and_right_aligns_the_response():
    exps = [
        Experience(
            tokens=[5, 6, 7, 8],
            prompt_length=2,
            action_mask=[1, 0],
            logprobs=[-1.0, 0.0],
            info={"temperature": 0.5},
        ),
        Experience(
            tokens=[9, 10, 11, 12, 13, 14],
            prompt_length=3,
            action_mask=[1, 1, 1],
            logprobs=[-0.1, -0.2, -0.3],
        ),
        Experience(tokens=[20, 21], prompt_length=2, action_mask=[], logprobs=[], info={"temperature": 0.0}),
    ]
    batch = collate(exps, [1, 0, 2], pad_id=0, device="cpu")
    assert batch.rows == [1, 0, 2]
    assert batch.input_ids.tolist() == [[9, 10, 11, 12, 13, 14], [0, 0, 5, 6, 7, 8], [0, 0, 0, 0, 20, 21]]
    assert batch.attention_mask.tolist() == [[1] * 6, [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3], [0, 0, 0, 0, 0, 1]]
    assert batch.targets.tolist() == [[12, 13, 14], [6, 7, 8], [0, 20, 21]]  # last R columns
    assert batch.action_mask.tolist() == [[1, 1, 1], [0, 1, 0], [0, 0, 0]]
    expected_old = torch.tensor([[-0.1, -0.2, -0.3], [0.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(batch.old_logprobs, expected_old)
    assert batch.temperature.flatten().tolist() == [1.0, 0.5, 1.0]  # greedy rows train at T=1
    assert (batch.num_tokens, batch.padded_tokens) == (12, 18)
    exps[0].logprobs = None
    assert collate(exps, [0, 1], pad_id=0, device="cpu").old_logprobs is None
    with pytest.raises(ValueError, match="prompt_length=0"):
        collate([Experience(tokens=[1, 2], prompt_length=0, action_mask=[1, 1])], [0], 0, "cpu")


def test_lr_schedule_warmup_then_cosine():
    f = lr_lambda("cosine", warmup_steps=2, total_steps=10, min_lr_ratio=0.1)
    assert [f(0), f(1), f(2)] == pytest.approx([0.5, 1.0, 1.0])
    assert f(6) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # halfway: 0.55
    assert f(4) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25)))
    assert f(10) == pytest.approx(0.1) and f(50) == pytest.approx(0.1)
    constant = lr_lambda("constant", warmup_steps=4, total_steps=10, min_lr_ratio=0.1)
    assert [constant(s) for s in (0, 3, 4, 9)] == pytest.approx([0.25, 1.0, 1.0, 1.0])
    assert lr_lambda("cosine", 0, None, 0.0)(7) == 1.0  # no known length: constant


def test_trainer_lr_follows_the_schedule(tiny_model_dir, tokenizer, experiences):
    trainer = _trainer(tiny_model_dir, tokenizer, lr=0.1, lr_schedule="cosine", warmup_steps=2, total_steps=4)
    lrs = [trainer.step(experiences[:2])["trainer/lr"] for _ in range(4)]
    # the LR each step trained with: warmup 0.5, 1, then cosine from 1 (progress 0) to 0.5 (progress 1/2)
    assert lrs == pytest.approx([0.05, 0.1, 0.1, 0.05], abs=1e-9)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)  # the next one


def test_checkpoint_round_trip_gives_an_identical_next_step(tiny_model_dir, tokenizer, experiences, tmp_path):
    kwargs = dict(
        lr=0.01, eps=1e-8, grad_clip=1.0, lr_schedule="cosine", warmup_steps=1, total_steps=4, mini_batches=2
    )
    first = _trainer(tiny_model_dir, tokenizer, **kwargs)
    first.step(experiences)
    root = tmp_path / "checkpoints"
    path = save_checkpoint(
        root,
        1,
        model=first.model,
        tokenizer=tokenizer,
        trainer_state=first.state_dict(),
        loop_state={"step": 1, "stage": "main"},
    )
    assert path == root / "step_1" and list_checkpoints(root) == [path]
    trainer_state, loop_state = load_states(path)
    assert loop_state["step"] == 1 and loop_state["stage"] == "main" and "rng" in loop_state

    second = _trainer(path, load_tokenizer(path), **kwargs)
    assert _max_diff(_state(second.model), _state(first.model)) == 0.0  # exact round trip
    second.load_state_dict(trainer_state)
    assert second.version == first.version == 1

    a, b = first.step(experiences), second.step(experiences)
    assert a["trainer/lr"] == b["trainer/lr"] and a["trainer/loss"] == pytest.approx(b["trainer/loss"])
    assert _max_diff(_state(first.model), _state(second.model)) < 1e-6
    # a fresh trainer (fresh optimizer state, schedule and shuffle RNG) would have stepped differently
    fresh = _trainer(path, tokenizer, **kwargs)
    fresh.step(experiences)
    assert _max_diff(_state(fresh.model), _state(first.model)) > 1e-4


class _TinyModel(torch.nn.Module):
    """Stands in for an HF model: save_pretrained writes a small weights file."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))

    def save_pretrained(self, path) -> None:
        torch.save(self.state_dict(), path / "weights.pt")


def test_checkpoints_ignore_tmp_dirs_and_keep_prunes_old_ones(tokenizer, tmp_path):
    root = tmp_path / "ckpt"
    model = _TinyModel()
    for step in (1, 2, 10, 3):
        save_checkpoint(
            root, step, model=model, tokenizer=tokenizer, trainer_state={"step": step}, loop_state={}, keep=3
        )
    assert [p.name for p in list_checkpoints(root)] == ["step_2", "step_3", "step_10"]  # numeric order
    (root / "step_99.tmp").mkdir()  # a crash in the middle of writing step 99
    (root / "step_x").mkdir()
    assert [p.name for p in list_checkpoints(root)] == ["step_2", "step_3", "step_10"]
    save_checkpoint(root, 11, model=model, tokenizer=tokenizer, trainer_state={}, loop_state={}, keep=1)
    assert [p.name for p in list_checkpoints(root)] == ["step_11"]
    assert not (root / "step_11.tmp").exists() and (root / "step_11" / "weights.pt").is_file()
    assert (root / "step_11" / "tokenizer.json").is_file()
    assert list_checkpoints(tmp_path / "nothing") == []


def test_a_teacher_scores_the_responses_on_the_trainer_side(tiny_model_dir, tokenizer, experiences):
    """On-policy distillation: the trainer fills ``info["teacher_logprobs"]`` (an input of the loss,
    like ``ref_logprobs``) with the teacher's logprobs of each response, and trains on them."""
    from trine.models.batching import response_logprobs

    teacher = load_model(tiny_model_dir).requires_grad_(False)
    exps = copy.deepcopy(experiences)
    for e in exps:
        e.info.pop("teacher_logprobs", None)
    trainer = Trainer(
        load_model(tiny_model_dir), PRESETS["distill"], pad_token_id=tokenizer.pad_token_id, teacher=teacher
    )
    metrics = trainer.step(exps)
    expected = response_logprobs(
        teacher,
        [(e.tokens[: e.prompt_length], e.response_tokens) for e in exps],
        pad_id=tokenizer.pad_token_id,
    )
    assert [e.info["teacher_logprobs"] for e in exps] == expected
    assert trainer.version == 1 and math.isfinite(metrics["trainer/loss"])


def test_kl_to_frozen_reference_grows_after_updates_and_pulls_back(tiny_model_dir, experiences):
    """kl_coef > 0: k3 KL to the frozen reference is 0 before any update, then positive; a larger
    coefficient keeps the policy closer to the reference."""
    kls = {}
    for coef in (0.0, 5.0):
        model = load_model(tiny_model_dir)
        ref = load_model(tiny_model_dir).requires_grad_(False)
        algo = PRESETS["grpo"].with_overrides(kl_coef=max(coef, 1e-12))
        trainer = Trainer(model, algo, TrainerConfig(lr=1e-2, grad_clip=0), pad_token_id=0, ref_model=ref)
        first = trainer.step(experiences)
        assert first["trainer/kl"] == pytest.approx(0.0, abs=1e-7)
        for _ in range(4):
            last = trainer.step(experiences)
        kls[coef] = last["trainer/kl"]
    assert kls[0.0] > 0
    assert kls[5.0] < kls[0.0]


def test_trainer_without_reference_refuses_kl(tiny_model_dir, experiences):
    model = load_model(tiny_model_dir)
    trainer = Trainer(model, PRESETS["grpo"].with_overrides(kl_coef=0.1), pad_token_id=0)
    with pytest.raises(ValueError, match="no reference model"):
        trainer.step(experiences)


def test_several_optimizer_steps_per_batch(tiny_model_dir, tokenizer, experiences):
    """mini_batches x update_epochs optimizer steps (and LR-schedule steps) per training step, one version."""
    trainer = _trainer(tiny_model_dir, tokenizer, lr=0.05, mini_batches=2, update_epochs=2, grad_clip=0)
    metrics = trainer.step(experiences)
    assert trainer.scheduler.last_epoch == 4
    adam_steps = {int(s["step"]) for s in trainer.optimizer.state.values()}
    assert adam_steps == {4}
    assert trainer.version == 1
    assert metrics["trainer/grad_norm"] > 0


def test_kl_as_reward_penalty_with_adaptive_coefficient(tiny_model_dir, experiences):
    """kl_mode=reward subtracts β·KL from the rewards (no loss term); kl_target moves β: the behaviour
    logprobs differ from the reference, so the observed KL exceeds a tiny target and β grows."""
    model = load_model(tiny_model_dir)
    ref = load_model(tiny_model_dir).requires_grad_(False)
    algo = PRESETS["grpo"].with_overrides(kl_coef=0.5, kl_mode="reward", kl_target=1e-6, kl_horizon=10.0)
    trainer = Trainer(model, algo, TrainerConfig(lr=1e-3, grad_clip=0), pad_token_id=0, ref_model=ref)
    metrics = trainer.step(experiences)
    assert metrics["trainer/kl_in_reward"] > 0
    assert "trainer/kl" not in metrics  # no KL loss term in reward mode
    # e = clip(KL/target - 1, -0.2, 0.2) = 0.2 -> β = 0.5 * (1 + 0.2 * 5 samples / 10)
    assert trainer.kl_coef == pytest.approx(0.5 * (1 + 0.2 * len(experiences) / 10.0))
    assert metrics["trainer/kl_coef"] == pytest.approx(trainer.kl_coef)
    assert trainer.state_dict()["kl_coef"] == trainer.kl_coef


def test_ppo_returns_are_the_outcome_reward_for_outcome_only_rollouts(tiny_model_dir, experiences):
    """With γ = λ = 1 the critic's GAE targets equal the outcome reward at every action token, and the
    policy advantages follow the reward (not zeros from absent token rewards)."""
    from trine.trainer.critic import Critic, ValueModel

    model = load_model(tiny_model_dir)
    algo = PRESETS["ppo"].with_overrides(advantage_args={"gamma": 1.0, "lam": 1.0, "whiten": False})
    trainer = Trainer(model, algo, pad_token_id=0, critic=Critic(ValueModel.from_policy(model), lr=1e-3))
    from trine.trainer.sums import StepSums

    minis = trainer._prepare(experiences, StepSums())
    for batch in (b for mbs, _ in minis for b in mbs):
        mask = batch.action_mask.bool()
        for row, exp_index in enumerate(batch.rows):
            returns = batch.extras["returns"][row][mask[row]]
            assert torch.allclose(returns, torch.full_like(returns, experiences[exp_index].reward))
            # zero-initialised critic: advantages = returns - 0
            adv = batch.extras["advantages"][row][mask[row]]
            assert torch.allclose(adv, returns)
    metrics = trainer.step(experiences)
    assert metrics["trainer/value_loss"] > 0


def test_fused_adamw_option_tracks_the_unfused_update(tiny_model_dir, tokenizer, experiences):
    plain = _trainer(tiny_model_dir, tokenizer, lr=1e-3, eps=1e-8)
    fused = _trainer(tiny_model_dir, tokenizer, lr=1e-3, eps=1e-8, fused_adamw=True)
    assert fused.optimizer.defaults["fused"] is True and not plain.optimizer.defaults["fused"]
    for _ in range(3):
        plain.step(experiences)
        fused.step(experiences)
    moved = _max_diff(_state(fused.model), _state(load_model(tiny_model_dir)))
    assert moved > 1e-4
    assert _max_diff(_state(fused.model), _state(plain.model)) < 1e-5  # same rule, other rounding


def test_the_trainer_reads_none_of_the_explorer_side_flags():
    """Dynamic sampling, overlong shaping, expert rows and rollout arguments are the explorer side's:
    no module of ``trine/trainer`` names those fields of the algorithm record."""
    import ast
    from pathlib import Path

    import trine.trainer
    from trine.algorithms import EXPLORER_FIELDS

    found = []
    for path in sorted(Path(trine.trainer.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "value", None)
            if isinstance(name, str) and name in EXPLORER_FIELDS:
                found.append(f"{path.name}:{node.lineno} {name}")
    assert not found, f"the trainer branches on explorer-side algorithm fields: {found}"


def _same_prompts(experiences: list[Experience]) -> list[Experience]:
    """Two GRPO groups: every response of ``experiences`` after the first's prompt, and after the third's."""
    out = []
    for group, source in (("p", experiences[0]), ("q", experiences[2])):
        prompt = source.tokens[: source.prompt_length]
        for e in experiences:
            out.append(
                Experience(
                    tokens=prompt + e.response_tokens,
                    prompt_length=len(prompt),
                    action_mask=e.action_mask,
                    logprobs=e.logprobs,
                    reward=e.reward,
                    group_id=group,
                )
            )
    return out


@pytest.mark.parametrize("budget", [10**6, 40])
def test_shared_prompt_step_matches_the_per_sample_step(tiny_model_dir, tokenizer, experiences, budget):
    """The shared-prompt forward (each group's prompt run once, its gradient summed over the group's
    responses) gives the per-sample step's gradients, update and metrics, also when a small budget cuts
    the micro-batches (kept group-aligned)."""
    grouped = _same_prompts(experiences)
    results = {}
    for shared in (False, True):
        trainer = _trainer(
            tiny_model_dir,
            tokenizer,
            shared_prompt=shared,
            micro_batch_tokens=budget,
            recompute_logprobs=True,
        )
        plan, on = trainer._micro_plan(grouped)
        assert on is shared
        if shared and budget < 100:  # several micro-batches, a prompt in several of them
            assert len(plan) > 1 and max(len(mb) for mb in plan) > 1
        grads: dict[str, torch.Tensor] = {}
        step_optimizer = trainer._optimizer_step

        def record(trainer=trainer, grads=grads, step_optimizer=step_optimizer):
            grads.update({n: p.grad.clone() for n, p in trainer.model.named_parameters()})
            return step_optimizer()

        trainer._optimizer_step = record
        metrics = trainer.step(grouped)
        results[shared] = (grads, _state(trainer.model), metrics)
    (g, w, m), (g_s, w_s, m_s) = results[False], results[True]
    assert max(float(x.abs().max()) for x in g.values()) > 1e-2
    for name in g:
        torch.testing.assert_close(g_s[name], g[name], atol=1e-5, rtol=1e-4, msg=name)
    assert _max_diff(w_s, w) < 1e-5
    for key in ("trainer/loss", "trainer/clipfrac", "trainer/approx_kl", "trainer/entropy"):
        assert m_s[key] == pytest.approx(m[key], abs=1e-5), key


def test_shared_prompt_auto_runs_it_where_it_saves_tokens(tiny_model_dir, tokenizer, experiences):
    from trine.trainer.policy import prepare_policy

    trainer = _trainer(tiny_model_dir, tokenizer)
    assert trainer.shared_prompt == "auto"
    assert trainer._micro_plan(_same_prompts(experiences))[1] is True
    assert trainer._micro_plan(experiences)[1] is False  # five different prompts: nothing to share
    model = load_model(tiny_model_dir)
    prepare_policy(model, gradient_checkpointing=True)
    with pytest.raises(ValueError, match="shared_prompt: true, but gradient checkpointing is on"):
        Trainer(model, PRESETS["grpo"], TrainerConfig(shared_prompt=True), pad_token_id=0)
    assert Trainer(model, PRESETS["grpo"], TrainerConfig(), pad_token_id=0).shared_prompt is False
    with pytest.raises(ValueError, match="shared_prompt: true with trainer.fsdp"):
        TrainerConfig(shared_prompt=True, fsdp=True)


def test_dpo_pairs_and_teacher_scores_run_each_prompt_once_with_the_same_numbers(
    tiny_model_dir, tokenizer, experiences
):
    """DPO's pairs (chosen and rejected after one prompt) and a teacher scoring GRPO groups take the
    shared-prompt forward like the policy step: the same gradients and logprobs as per sample."""
    pairs = []
    for k, source in enumerate(e for e in experiences if e.prompt_length >= 2):
        prompt = source.tokens[: source.prompt_length]
        for chosen, other in ((True, source), (False, experiences[(k + 1) % len(experiences)])):
            pairs.append(
                Experience(
                    tokens=prompt + other.response_tokens,
                    prompt_length=len(prompt),
                    action_mask=other.action_mask,
                    group_id=f"pair:{k}",
                    info={"chosen": chosen},
                )
            )
    assert len(pairs) >= 6 and shared_pays([e.tokens[: e.prompt_length] for e in pairs], [1] * len(pairs), True)
    grads = {}
    for shared in (False, True):
        settings = TrainerConfig(lr=1.0, eps=1.0, grad_clip=0.0, shared_prompt=shared)
        trainer = Trainer(
            load_model(tiny_model_dir),
            PRESETS["dpo"],
            settings,
            pad_token_id=tokenizer.pad_token_id,
            ref_model=load_model(tiny_model_dir),
        )
        step_optimizer, seen = trainer._optimizer_step, {}

        def record(trainer=trainer, seen=seen, step_optimizer=step_optimizer):
            seen.update({n: p.grad.clone() for n, p in trainer.model.named_parameters()})
            return step_optimizer()

        trainer._optimizer_step = record
        trainer.step(pairs)
        grads[shared] = seen
    assert max(float(g.abs().max()) for g in grads[False].values()) > 1e-3
    for name, g in grads[False].items():
        torch.testing.assert_close(grads[True][name], g, atol=1e-5, rtol=1e-4, msg=name)

    grouped = _same_prompts(experiences)
    scored = {}
    for shared in (False, "auto"):
        trainer = _trainer(
            tiny_model_dir, tokenizer, shared_prompt=shared, teacher=load_model(tiny_model_dir)
        )
        rows = [Experience(e.tokens, e.prompt_length, e.action_mask, group_id=e.group_id) for e in grouped]
        trainer._score_with_teacher(rows)
        scored[shared] = [e.info["teacher_logprobs"] for e in rows]
    assert [len(s) for s in scored["auto"]] == [e.response_length for e in grouped]
    for a, b in zip(scored["auto"], scored[False], strict=True):
        assert a == pytest.approx(b, abs=1e-5)
