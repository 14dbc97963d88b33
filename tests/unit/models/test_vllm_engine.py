"""``model.engine: vllm`` (:mod:`trine.models.vllm_engine`, :mod:`trine.models.vllm_requests`).

On any machine: the missing-extra error, that importing the engine imports neither vllm nor torch, Trine's
requests as vLLM arguments, vLLM outputs (shaped as vLLM's ``RequestOutput``) as Trine completions with the
real tokenizer, the ``vllm.LLM`` arguments built from a real tiny model, and the ``model.vllm`` config.

With vllm and a CUDA GPU (``@pytest.mark.gpu``): sampling a tiny model, logprob parity with the trainer's
recomputation (plain and top-k / top-p truncated), reproducible seeds, in-place weight loads, sleep / wake_up.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from tests.helpers import write_arithmetic_config
from trine import registry
from trine.build import engine_weights, section_kwargs
from trine.config import extras as config_extras
from trine.config import read_yaml, validate_dict
from trine.config.engines import RESERVED_ENGINE_ARGS
from trine.config.rollout import ExplorerConfig, ModelConfig, VLLMConfig
from trine.models import load_model, load_tokenizer
from trine.models.vllm_engine import VLLMEngine
from trine.models.vllm_requests import (
    INSTALL,
    completions,
    import_vllm,
    llm_kwargs,
    request_seed,
    sampling_kwargs,
)
from trine.types import SamplingParams

HAS_VLLM = importlib.util.find_spec("vllm") is not None


# ----------------------------------------------------------------- without vllm
@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here: the missing-extra error cannot happen")
def test_without_vllm_the_engine_says_how_to_install_it(tokenizer):
    with pytest.raises(ImportError, match=r'pip install -e "\.\[vllm\]"') as err:
        VLLMEngine(None, tokenizer)
    assert "model.engine: hf" in str(err.value)
    with pytest.raises(ImportError, match=r'"\.\[vllm\]"'):
        import_vllm()
    assert INSTALL == 'pip install -e ".[vllm]"'


def test_importing_the_engine_imports_neither_vllm_nor_torch():
    code = "import sys, trine.models.vllm_engine; print(sorted({'vllm', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_requests_become_vllm_sampling_arguments():
    plain = sampling_kwargs(SamplingParams(temperature=0.7, max_tokens=12, n=3), seed=5)
    assert plain == {
        "n": 3, "temperature": 0.7, "top_p": 1.0, "top_k": -1, "max_tokens": 12, "stop": None,
        "stop_token_ids": None, "seed": 5, "ignore_eos": False, "logprobs": 0, "include_stop_str_in_output": True,
    }  # fmt: skip
    params = SamplingParams(top_k=20, top_p=0.9, stop=["\n"], stop_token_ids=[7], seed=11, ignore_eos=True)
    given = sampling_kwargs(params, seed=5)
    assert (
        given["top_k"] == 20 and given["top_p"] == 0.9 and given["seed"] == 11
    )  # the request's own seed wins
    assert given["stop"] == ["\n"] and given["stop_token_ids"] == [7] and given["ignore_eos"] is True


def test_request_seeds_are_a_reproducible_stream():
    seeds = [request_seed(0, i) for i in range(1000)]
    assert seeds == [request_seed(0, i) for i in range(1000)]
    assert len(set(seeds)) == 1000 and all(0 <= s < 2**62 for s in seeds)
    assert not set(seeds) & {request_seed(1, i) for i in range(1000)}  # another stream, other seeds


@dataclass
class Logprob:  # vllm.logprobs.Logprob's fields that Trine reads
    logprob: float
    rank: int | None = None


@dataclass
class Choice:  # vllm.outputs.CompletionOutput's fields that Trine reads
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    text: str = ""


@dataclass
class Output:  # vllm.outputs.RequestOutput
    outputs: list[Choice] = field(default_factory=list)


def _choice(index: int, ids: list[int], finish: str = "stop") -> Choice:
    return Choice(index, ids, [{t: Logprob(-0.5 * (i + 1))} for i, t in enumerate(ids)], finish)


def test_vllm_outputs_become_completions(tokenizer):
    a, b = tokenizer("12+3=15", add_special_tokens=False)["input_ids"], [tokenizer.eos_token_id]
    output = Output([_choice(1, b, "stop"), _choice(0, a, "length")])  # vLLM may list samples in any order
    first, second = completions([1, 2, 3], output, tokenizer, version=4)
    assert first.response_ids == a and first.text == "12+3=15" and first.finish_reason == "length"
    assert first.logprobs == [-0.5 * (i + 1) for i in range(len(a))]
    assert second.response_ids == b and second.text == "" and second.finish_reason == "stop"  # eos is special
    assert first.prompt_ids == [1, 2, 3] and first.policy_version == second.policy_version == 4
    assert first.token_versions is None


def test_vllm_outputs_without_what_training_needs_are_refused(tokenizer):
    with pytest.raises(RuntimeError, match="finish_reason='abort'.*retried"):
        completions([1], Output([_choice(0, [5], "abort")]), tokenizer, 0)
    with pytest.raises(RuntimeError, match="no logprob per sampled token \\(none"):
        completions([1], Output([Choice(0, [5, 6], None, "stop")]), tokenizer, 0)
    wrong = Choice(0, [5], [{9: Logprob(-1.0)}], "stop")
    with pytest.raises(RuntimeError, match="lack the sampled token 5"):
        completions([1], Output([wrong]), tokenizer, 0)


@pytest.mark.skipif(not HAS_VLLM, reason=f"needs vllm ({INSTALL}); no GPU needed")
def test_conversions_fit_vllms_own_classes(tokenizer):
    """Trine's arguments build a real ``vllm.SamplingParams``; vLLM's real output classes (both logprob
    containers) convert to completions."""
    from vllm import SamplingParams as VSamplingParams
    from vllm import TokensPrompt
    from vllm.logprobs import FlatLogprobs
    from vllm.logprobs import Logprob as VLogprob
    from vllm.outputs import CompletionOutput, RequestOutput

    greedy = VSamplingParams(**sampling_kwargs(SamplingParams(temperature=0.0, max_tokens=5), seed=3))
    assert greedy.temperature == 0.0 and greedy.logprobs == 0 and greedy.seed == 3 and greedy.top_k in (0, -1)
    full = SamplingParams(temperature=0.9, top_k=20, top_p=0.8, n=4, stop=["x"], stop_token_ids=[3], seed=2)
    sampled = VSamplingParams(**sampling_kwargs(full, seed=3))
    assert (sampled.n, sampled.top_k, sampled.top_p, sampled.seed, sampled.stop) == (4, 20, 0.8, 2, ["x"])
    assert TokensPrompt(prompt_token_ids=[1, 2])["prompt_token_ids"] == [1, 2]
    ids = tokenizer("7*8=56", add_special_tokens=False)["input_ids"]
    as_dicts = [{t: VLogprob(-0.25, rank=1)} for t in ids]
    flat = FlatLogprobs()
    flat.extend(as_dicts)
    outputs = [
        CompletionOutput(i, "ignored", ids, None, lp, finish_reason="stop")
        for i, lp in enumerate([as_dicts, flat])
    ]
    output = RequestOutput("r", None, [9], None, outputs[::-1], finished=True)
    for c in completions([9], output, tokenizer, 1):
        assert c.response_ids == ids and c.logprobs == [-0.25] * len(ids) and c.text == "7*8=56"


def test_llm_arguments_come_from_the_policy(tiny_model_dir, tokenizer):
    model = load_model(tiny_model_dir, dtype="float32")
    settings = dict(VLLMConfig(max_model_len=512, engine_args={"max_num_seqs": 64}).model_dump())
    settings.pop("sleep_level")  # read by the engine, not vllm.LLM
    kwargs = llm_kwargs(model, tokenizer, None, settings.pop("dtype"), 3, trust_remote_code=False, **settings)
    assert kwargs["model"] == str(tiny_model_dir) and kwargs["tokenizer"] == str(tiny_model_dir)
    assert kwargs["dtype"] == "float32"  # auto: what the trainer computes in
    assert kwargs["seed"] == 3 and kwargs["tensor_parallel_size"] == 1
    assert kwargs["logprobs_mode"] == "processed_logprobs" and kwargs["max_num_seqs"] == 64
    assert kwargs["max_model_len"] == 512 and kwargs["gpu_memory_utilization"] == 0.5
    assert "max_model_len" not in llm_kwargs(model, tokenizer, None, "bfloat16", 0, max_model_len=None)
    assert llm_kwargs(None, tokenizer, str(tiny_model_dir), "auto", 0)["dtype"] == "auto"
    with pytest.raises(ValueError, match="not a model directory.*path="):
        llm_kwargs(None, tokenizer, str(tiny_model_dir / "nowhere"), "auto", 0)
    with pytest.raises(ValueError, match=r"sets \['logprobs_mode'\], which Trine sets itself"):
        llm_kwargs(model, tokenizer, None, "auto", 0, engine_args={"logprobs_mode": "raw_logprobs"})


# ----------------------------------------------------------------- config
@pytest.fixture
def vllm_engine_name(monkeypatch):
    """``model.engine: vllm`` resolves to :class:`VLLMEngine` (a no-op once ``trine.models.ENGINES`` lists it),
    and validation finds vllm installed (these tests check the vllm settings, on any machine)."""
    monkeypatch.setitem(registry._extra.setdefault("engine", {}), "vllm", VLLMEngine)
    real = config_extras.installed
    monkeypatch.setattr(config_extras, "installed", lambda module: module == "vllm" or real(module))


def _errors(tmp_path, model_dir, model: dict) -> list[str]:
    path = write_arithmetic_config(tmp_path, model_dir, "c", {"model": model})
    return validate_dict(read_yaml(path), base_dir=path.parent)[1]


def test_vllm_config(tmp_path, tiny_model_dir, vllm_engine_name):
    good = {
        "engine": "vllm",
        "vllm": {"gpu_memory_utilization": 0.3, "sleep_level": 2, "enable_sleep_mode": True},
    }
    assert _errors(tmp_path, tiny_model_dir, good) == []
    assert _errors(tmp_path, tiny_model_dir, {"engine": "vllm"}) == []  # every field has a default
    (stray,) = _errors(tmp_path, tiny_model_dir, {"vllm": {"enforce_eager": True}})
    assert "model.vllm is read only by model.engine: vllm (engine is 'hf')" in stray and "remove it" in stray
    (cpu,) = _errors(tmp_path, tiny_model_dir, {"engine": "vllm", "device": "cpu"})
    assert "samples on a CUDA GPU but model.device is 'cpu'" in cpu and "model.engine: hf" in cpu
    (own,) = _errors(tmp_path, tiny_model_dir, {"engine": "vllm", "vllm": {"engine_args": {"seed": 1}}})
    assert "model.vllm.engine_args sets ['seed'], which Trine sets itself" in own
    (share,) = _errors(tmp_path, tiny_model_dir, {"engine": "vllm", "vllm": {"gpu_memory_utilization": 1.5}})
    assert "model.vllm.gpu_memory_utilization: 1.5 is out of range; expected a number > 0 and <= 1" in share
    (level,) = _errors(tmp_path, tiny_model_dir, {"engine": "vllm", "vllm": {"sleep_level": 3}})
    assert "sleep_level" in level


def test_vllm_weights_are_copied_in_and_sleep_mode_needs_the_sync_loop(
    tmp_path, tiny_model_dir, vllm_engine_name
):
    """vLLM holds its own weights: the default sync is ``copy``, ``shared`` is refused; sleeping while the
    trainer steps fits only mode sync, and level 2 (weights dropped) only with new weights every step."""
    from trine.config import load_config

    vllm = {"model": {"engine": "vllm", "vllm": {"enable_sleep_mode": True}}}
    (cfg,) = load_config(write_arithmetic_config(tmp_path, tiny_model_dir, "ok", vllm))
    assert cfg.sync_method == "copy" and engine_weights(cfg) == "copy"  # its table entry says so

    def errors(*extra: dict) -> list[str]:
        path = write_arithmetic_config(tmp_path, tiny_model_dir, "c", vllm, *extra)
        return validate_dict(read_yaml(path), base_dir=path.parent)[1]

    (shared,) = errors({"sync": {"method": "shared"}})
    assert "holds its own copy of the weights" in shared and "sync.method: copy" in shared
    (overlap,) = errors({"mode": "async"})
    assert "only mode sync does (mode is 'async'" in overlap
    (level,) = errors({"model": {"vllm": {"sleep_level": 2}}, "sync": {"sync_interval": 2}})
    assert "sync.sync_interval is 2: set it to 1 or use sleep_level: 1" in level


def test_each_engine_s_table_entry_says_where_its_weights_live():
    from trine.models.engine import HFEngine
    from trine.models.openai_engine import OpenAIEngine

    assert (HFEngine.weights, VLLMEngine.weights, OpenAIEngine.weights) == ("given", "copy", "server")
    assert not hasattr(HFEngine, "from_config")  # built by the constructor convention (trine.models.protocol)


def test_every_vllm_setting_reaches_the_engine(tiny_model_dir):
    assert set(section_kwargs(VLLMConfig(), VLLMEngine)) == set(VLLMConfig.model_fields)
    assert not RESERVED_ENGINE_ARGS & {"sleep_level", "max_num_seqs"}

    class Built(VLLMEngine):  # what from_config passes, without vllm
        def __init__(self, *args, **kwargs):
            self.args, self.kwargs = args, kwargs

    vllm = VLLMConfig(gpu_memory_utilization=0.3, enable_sleep_mode=True, engine_args={"max_num_seqs": 4})
    section = ModelConfig(path=str(tiny_model_dir), engine="vllm", dtype="bfloat16", vllm=vllm)
    built = Built.from_config(None, "tok", section, ExplorerConfig(max_batch_size=5), 7)
    assert built.args == (None, "tok") and built.kwargs == {
        **vllm.model_dump(),
        "dtype": "bfloat16",  # vllm.dtype auto with no loaded policy to ask: model.dtype
        "max_batch_size": 5,
        "seed": 7,
        "path": str(tiny_model_dir),
        "trust_remote_code": False,
    }
    plain = Built.from_config(None, "tok", section.model_copy(update={"vllm": None}), ExplorerConfig(), 0)
    assert plain.kwargs["gpu_memory_utilization"] == VLLMConfig().gpu_memory_utilization


# ----------------------------------------------------------------- on a GPU with vllm
def on_gpu(test):
    """Run ``test`` only where vllm is installed and torch sees a CUDA GPU (the ``gpu`` marker's rule)."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_VLLM, reason=f"needs vllm ({INSTALL})")(test))


@pytest.fixture(scope="module")
def vllm_setup(tmp_path_factory):
    """One engine for the module (building one takes tens of seconds) over a tiny-1m policy in bf16, that
    policy in fp32 on the GPU (the trainer's side), and another seed's model (new weights to load)."""
    from trine.models import init_model

    root = tmp_path_factory.mktemp("vllm")
    path, other = init_model("tiny-1m", root / "a", seed=0), init_model("tiny-1m", root / "b", seed=1)
    tok = load_tokenizer(path)
    engine = VLLMEngine(
        None, tok, path=str(path), dtype="bfloat16", seed=0, gpu_memory_utilization=0.25, max_model_len=512,
        enforce_eager=True, enable_sleep_mode=True,
    )  # fmt: skip
    try:
        yield engine, tok, load_model(path, device="cuda"), load_model(other, device="cuda")
    finally:
        engine.close()
        engine.close()  # idempotent


def _prompts(tok) -> list[list[int]]:
    texts = ["12+30=", "Alice sees", "The cat", "7*8="]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _sample(engine, prompts, params: SamplingParams):
    async def run():
        return await asyncio.gather(*(engine.generate(p, params) for p in prompts))

    return asyncio.run(run())


def _gap(engine, tok, model, params: SamplingParams) -> float:
    """Mean |engine logprob - ``model``'s recomputation| over sampled tokens, top-k / top-p replayed as the
    trainer does (:func:`trine.models.batching.forward_logprobs`)."""
    import torch

    from trine.models.batching import collate, forward_logprobs
    from trine.types import Experience

    info = {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p}
    exps = [
        Experience(tokens=c.prompt_ids + c.response_ids, prompt_length=len(c.prompt_ids),
                   action_mask=[1] * len(c.response_ids), logprobs=c.logprobs, reward=0.0, info=dict(info))
        for samples in _sample(engine, _prompts(tok), params) for c in samples
    ]  # fmt: skip
    batch = collate(exps, list(range(len(exps))), tok.pad_token_id, "cuda")
    with torch.no_grad():
        logprobs, _ = forward_logprobs(model, batch)
    mask = batch.action_mask.bool()
    return (logprobs[mask] - batch.old_logprobs[mask]).abs().mean().item()


def _greedy(engine, tok) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    return [r[0].response_ids for r in engine.generate_batch([(p, params) for p in _prompts(tok)])]


@on_gpu
def test_vllm_generates_token_in_token_out(vllm_setup):
    engine, tok, _, _ = vllm_setup
    prompts = _prompts(tok)
    results = _sample(engine, prompts, SamplingParams(temperature=1.0, max_tokens=8, n=3))
    assert [len(r) for r in results] == [3] * len(prompts)
    for prompt, samples in zip(prompts, results):
        for c in samples:
            assert c.prompt_ids == prompt and 1 <= len(c.response_ids) <= 8
            assert len(c.logprobs) == len(c.response_ids) and all(lp <= 0 for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length") and c.policy_version == engine.policy_version
            assert c.finish_reason == "length" or c.response_ids[-1] == tok.eos_token_id
    fixed = SamplingParams(max_tokens=6, ignore_eos=True, seed=42)
    ids = [[c.response_ids for c in r] for r in _sample(engine, prompts, fixed)]
    assert ids == [[c.response_ids for c in r] for r in _sample(engine, prompts, fixed)]  # a request seed
    plain = [(p, SamplingParams(max_tokens=6, ignore_eos=True)) for p in prompts]
    state = engine.state_dict()
    with engine.seeded(7):
        first = engine.generate_batch(plain)
    assert engine.state_dict() == state  # seeded() left the training stream where it was
    with engine.seeded(7):
        again = engine.generate_batch(plain)
    assert [c.response_ids for r in first for c in r] == [c.response_ids for r in again for c in r]


@on_gpu
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (20, 1.0), (0, 0.9)])
def test_vllm_logprobs_match_the_trainers_recomputation(vllm_setup, top_k, top_p):
    """The bf16 engine against the fp32 trainer, top-k / top-p truncation replayed (trine.models.sampling)."""
    engine, tok, policy, _ = vllm_setup
    gap = _gap(
        engine, tok, policy, SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, max_tokens=16, n=4)
    )
    assert gap < 0.05, f"mean |engine - trainer| logprob = {gap:.4f}"


@on_gpu
def test_vllm_loads_new_weights_in_place(vllm_setup):
    engine, tok, policy, other = vllm_setup
    before = _greedy(engine, tok)
    engine.load_weights({k: v.cpu() for k, v in other.state_dict().items()}, version=3)  # from CPU tensors
    assert engine.policy_version == 3 and _greedy(engine, tok) != before
    params = SamplingParams(temperature=1.0, max_tokens=16, n=4)
    assert _gap(engine, tok, other, params) < 0.05 < _gap(engine, tok, policy, params)  # it samples `other`
    engine.load_weights(policy.state_dict(), version=4)  # from GPU tensors
    assert engine.policy_version == 4 and _greedy(engine, tok) == before


@on_gpu
def test_vllm_sleeps_and_wakes_up(vllm_setup):
    import torch

    engine, tok, policy, _ = vllm_setup
    before = _greedy(engine, tok)
    free = torch.cuda.mem_get_info()[0]
    engine.sleep(level=1)
    assert engine.asleep and torch.cuda.mem_get_info()[0] > free  # its memory went back to the GPU
    with pytest.raises(RuntimeError, match="asleep.*wake_up"):
        _greedy(engine, tok)
    engine.wake_up()
    assert not engine.asleep and _greedy(engine, tok) == before
    engine.sleep(level=2)  # the colocated step: weights discarded, the trainer's come back before waking
    with pytest.raises(RuntimeError, match="level-2 sleep needs new weights first"):
        engine.wake_up()
    engine.load_weights(policy.state_dict(), version=engine.policy_version + 1)
    engine.wake_up()
    assert _greedy(engine, tok) == before


@on_gpu
def test_a_colocated_sync_run_sleeps_the_engine_around_each_step(tmp_path, tiny_model_dir):
    """The real loop with vLLM on the trainer's GPU: ``enable_sleep_mode`` (level 2, weights dropped while
    the trainer steps) runs to the end: every step's new weights reach the sleeping engine before it wakes
    (``wake_up`` refuses otherwise)."""
    import json

    from trine.config import load_config
    from trine.loop import run

    overrides = {
        "model": {"engine": "vllm", "device": "cuda", "vllm": {"enable_sleep_mode": True, "sleep_level": 2,
                                                              "gpu_memory_utilization": 0.3}},
        "tasks": {"total_steps": 3},
    }  # fmt: skip
    run(load_config(write_arithmetic_config(tmp_path, tiny_model_dir, "colocated", overrides)))
    rows = [json.loads(line) for line in (tmp_path / "colocated" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["trainer/version"] == 3.0 and all(r["trainer/grad_norm"] >= 0 for r in rows)
    assert json.loads((tmp_path / "colocated" / "status.json").read_text())["state"] == "finished"
