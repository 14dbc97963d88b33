"""Every registry kind keeps its plugin contract (DESIGN §2, "Extension by name or import path").

For each kind in ``trine.registry.BUILTINS`` a minimal plugin of that kind is written into a file and
loaded with ``registry.load_plugin``, exactly as ``--plugin path.py`` loads it. Then

- **validates**: a config naming the plugin passes ``trine.config.load_config``, and a misspelled name
  fails with a "did you mean" and the ``--plugin`` hint (for kinds a config can name);
- **runs**: the plugin is exercised by the code Trine runs it with (``evaluate_reward``, a real
  ``Explorer`` on the tiny model, a ``Trainer`` step, ``open_buffer``, ``build_pipeline``,
  ``build_monitor``, ...), not called by hand.

**Adding a registry kind** means adding one function here: decorate it with ``@contract("kind")``; it
gets a :class:`Contract` (``load`` a plugin source, ``config`` / ``rejects`` dotted overrides, the tiny
model's directory and a tmp path). ``test_every_registry_kind_has_a_contract`` fails until it exists.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
import torch

from tests.helpers import write_config
from trine import registry
from trine.config import ConfigError, RunConfig, load_config
from trine.types import Experience, Task

if TYPE_CHECKING:
    from trine.models.protocol import RolloutModel

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass
class Contract:
    """What a contract case works with: a scratch directory, the tiny model, and a config over a two-row
    taskset (``1+1=`` -> 2, ``2+2=`` -> 4; batch size 2, ``repeat`` 2, 3 tokens per sample)."""

    kind: str
    tmp: Path
    model_dir: Path

    def load(self, source: str) -> ModuleType:
        """Write ``source`` into ``plugin_<kind>.py`` and load it as ``--plugin`` does."""
        path = self.tmp / f"plugin_{self.kind}.py"
        path.write_text(textwrap.dedent(source))
        registry.load_plugin(path)
        return sys.modules[f"trine_plugin_{path.stem}"]

    def _config_file(self) -> Path:
        tasks = self.tmp / "tasks.jsonl"
        tasks.write_text('{"question": "1+1=", "answer": "2"}\n{"question": "2+2=", "answer": "4"}\n')
        base = {
            "name": "contract",
            "run_dir": str(self.tmp / "run"),
            "model": {"path": str(self.model_dir)},
            "tasks": {
                "total_steps": 1,
                "batch_size": 2,
                "train": {"path": str(tasks), "repeat": 2, "sampling": {"max_tokens": 3}},
            },
            "monitor": {"sinks": ["jsonl"], "plot": False},
        }
        return write_config(self.tmp / "config.yaml", base)

    def config(self, *overrides: str) -> RunConfig:
        """The validated config with ``key=value`` overrides (as on the command line)."""
        (stage,) = load_config(self._config_file(), list(overrides))
        return stage

    def rejects(self, misspelled: str, *overrides: str) -> None:
        """The config with ``overrides`` fails on ``misspelled`` with a hint and the ``--plugin`` fix."""
        with pytest.raises(ConfigError) as err:
            load_config(self._config_file(), list(overrides))
        message = str(err.value)
        assert f"unknown {self.kind} {misspelled!r}" in message and "Did you mean" in message, message
        assert "--plugin path.py" in message, message


CONTRACTS: dict[str, Callable[[Contract], None]] = {}


def contract(kind: str) -> Callable[[Callable[[Contract], None]], Callable[[Contract], None]]:
    """Register the contract case of registry kind ``kind``."""

    def wrap(fn: Callable[[Contract], None]) -> Callable[[Contract], None]:
        assert kind not in CONTRACTS, f"two contract cases for kind {kind!r}"
        CONTRACTS[kind] = fn
        return fn

    return wrap


@contextmanager
def registry_snapshot() -> Iterator[None]:
    """Whatever is registered inside is gone afterwards (``registry._extra`` and plugin modules)."""
    extra = {kind: dict(table) for kind, table in registry._extra.items()}
    modules = set(sys.modules)
    try:
        yield
    finally:
        registry._extra.clear()
        registry._extra.update(extra)
        for name in set(sys.modules) - modules:
            if name.startswith("trine_plugin_"):
                del sys.modules[name]


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    """Plugins registered by a test do not leak into other tests."""
    with registry_snapshot():
        yield


def test_every_registry_kind_has_a_contract():
    missing = sorted(set(registry.BUILTINS) - set(CONTRACTS))
    assert not missing, (
        f"registry kind(s) {missing} have no plugin contract; add a function decorated "
        "@contract(kind) to tests/unit/test_plugin_contracts.py (see its module docstring)"
    )
    unknown = sorted(set(CONTRACTS) - set(registry.BUILTINS))
    assert not unknown, f"contract cases for {unknown}, which are not in registry.BUILTINS; remove them"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One ``test_plugin_contract[kind]`` per case (collected after every case below is defined)."""
    if "kind" in metafunc.fixturenames:
        metafunc.parametrize("kind", sorted(CONTRACTS))


def test_plugin_contract(kind: str, tmp_path: Path, tiny_model_dir: Path):
    CONTRACTS[kind](Contract(kind, tmp_path, tiny_model_dir))


def test_registry_snapshot_removes_what_a_plugin_registered(tmp_path: Path):
    with registry_snapshot():
        Contract("reward", tmp_path, tmp_path).load("""
            import trine
            trine.register("reward", "contract_probe")(lambda response, task: 0.0)
        """)
        assert "contract_probe" in registry.builtins("reward")
        assert "trine_plugin_plugin_reward" in sys.modules
    assert "contract_probe" not in registry.builtins("reward")
    assert "trine_plugin_plugin_reward" not in sys.modules


# -- helpers ----------------------------------------------------------------------------------------


def rollouts(model_dir: Path, n: int = 4) -> list[Experience]:
    """``n`` short rollout-like experiences in two groups with rewards 1, 0, 1, 0, ..."""
    from trine.models import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    out = []
    for i in range(n):
        prompt = tokenizer(f"What is {i}+1?")["input_ids"]
        response = tokenizer(f" {i + 1} ok")["input_ids"]
        out.append(
            Experience(
                tokens=prompt + response,
                prompt_length=len(prompt),
                action_mask=[1] * len(response),
                logprobs=[-2.0] * len(response),
                reward=float(i % 2 == 0),
                group_id=f"g{i // 2}",
                task_id=f"t{i // 2}",
            )
        )
    return out


def train_one_step(cfg: RunConfig, model_dir: Path) -> tuple[dict[str, float], float]:
    """One ``Trainer.step`` with the algorithm ``cfg`` builds: its metrics and how far the weights moved."""
    from trine import build
    from trine.config import TrainerConfig
    from trine.models import load_model, load_tokenizer
    from trine.trainer import Trainer

    algorithm = build.build_algorithm(cfg)
    algorithm.check_args()
    model = load_model(model_dir)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(
        model, algorithm, TrainerConfig(lr=1e-2), pad_token_id=load_tokenizer(model_dir).pad_token_id
    )
    metrics = trainer.step(rollouts(model_dir))
    moved = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))
    assert trainer.version == 1
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
    return metrics, moved


def hf_engine(model_dir: Path) -> RolloutModel:
    """The built-in engine over the tiny model (seeded)."""
    from trine.models import load_model, load_tokenizer
    from trine.models.engine import HFEngine

    return HFEngine(load_model(model_dir), load_tokenizer(model_dir), seed=0)


def explore(
    engine: RolloutModel, cfg: RunConfig, version: int = 1
) -> tuple[list[Experience], dict[str, float]]:
    """One batch of ``cfg``'s train taskset through a real :class:`~trine.explorer.Explorer` on ``engine``."""
    from trine import build
    from trine.explorer import Explorer

    explorer = Explorer(engine)
    try:
        return explorer.explore(list(build.build_taskset(cfg.tasks.train)), batch_index=0, version=version)
    finally:
        explorer.close()
        engine.close()


# -- one contract per kind --------------------------------------------------------------------------


@contract("reward")
def reward_contract(c: Contract) -> None:
    c.load("""
        import trine

        @trine.register("reward", "contract_reward")
        def contract_reward(response, task, bonus=0.0):
            return {"match": float(response.strip() == str(task.answer)), "bonus": bonus}
    """)
    cfg = c.config("tasks.train.reward=contract_reward", "tasks.train.reward_args={bonus: 0.5}")
    c.rejects("contract_rewrd", "tasks.train.reward=contract_rewrd")
    with pytest.raises(ConfigError, match="'bonsu'"):  # plugin arguments are checked against its signature
        c.config("tasks.train.reward=contract_reward", "tasks.train.reward_args={bonsu: 0.5}")

    from trine.rewards import evaluate_reward

    fn = registry.resolve("reward", cfg.tasks.train.reward)
    task = Task(task_id="t", question="1+1=", answer="2")
    assert evaluate_reward(fn, " 2", task, cfg.tasks.train.reward_args) == (1.5, {"match": 1.0, "bonus": 0.5})
    assert evaluate_reward(fn, "3", task, cfg.tasks.train.reward_args) == (0.5, {"match": 0.0, "bonus": 0.5})


@contract("workflow")
def workflow_contract(c: Contract) -> None:
    c.load("""
        import trine
        from trine.workflows import completion_experience

        @trine.register("workflow", "contract_workflow")
        class ContractWorkflow:
            def __init__(self, reward, tag: str = ""):
                self.reward, self.tag = reward, tag

            async def run(self, task, model):
                params = task.sampling.replace(n=task.repeat)
                out = []
                for c in await model.chat(task.messages(), params):
                    total, parts = await self.reward(c.text, task)
                    exp = completion_experience(c, total, parts, params.temperature)
                    exp.info["tag"] = self.tag
                    out.append(exp)
                return out
    """)
    cfg = c.config("tasks.train.workflow=contract_workflow", "tasks.train.workflow_args={tag: hello}")
    c.rejects("contract_workflw", "tasks.train.workflow=contract_workflw")

    experiences, metrics = explore(hf_engine(c.model_dir), cfg, version=3)
    assert len(experiences) == 2 * cfg.tasks.train.repeat == 4  # two rows in the taskset
    assert len({e.task_id for e in experiences}) == 2 and len({e.group_id for e in experiences}) == 2
    assert all(
        e.policy_version == 3 and e.reward is not None and e.info["tag"] == "hello" for e in experiences
    )
    assert metrics["explorer/skipped"] == 0 and "explorer/reward_mean" in metrics, metrics


@contract("algorithm")
def algorithm_contract(c: Contract) -> None:
    c.load("""
        import trine
        from trine import Algorithm

        trine.register("algorithm", "contract_algo")(
            Algorithm(name="contract_algo", advantage="grpo", loss="pg", paper="a contract test")
        )
    """)
    cfg = c.config("algorithm.name=contract_algo")
    c.rejects("contract_alg", "algorithm.name=contract_alg")
    metrics, moved = train_one_step(cfg, c.model_dir)
    assert moved > 0 and "trainer/loss" in metrics, metrics


@contract("advantage")
def advantage_contract(c: Contract) -> None:
    c.load("""
        import trine

        @trine.register("advantage", "contract_advantage")
        def contract_advantage(rewards, group_ids, *, scale=1.0, **_):
            advantages = scale * (rewards - rewards.mean())
            return advantages, {"contract_scale": float(scale)}
    """)
    cfg = c.config("algorithm.advantage=contract_advantage", "algorithm.advantage_args={scale: 2.0}")
    c.rejects("contract_advantag", "algorithm.advantage=contract_advantag")
    with pytest.raises(ConfigError, match="'scael'"):
        c.config("algorithm.advantage=contract_advantage", "algorithm.advantage_args={scael: 2.0}")
    metrics, moved = train_one_step(cfg, c.model_dir)
    assert moved > 0 and metrics["trainer/contract_scale"] == 2.0, metrics


@contract("loss")
def loss_contract(c: Contract) -> None:
    c.load("""
        import trine

        @trine.register("loss", "contract_loss")
        def contract_loss(logprobs, old_logprobs, advantages, action_mask, *, normalizer, weight=1.0, **_):
            adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
            loss = -(weight * adv * logprobs * action_mask).sum() / normalizer
            return loss, {"contract_weight": float(weight)}
    """)
    cfg = c.config("algorithm.loss=contract_loss", "algorithm.loss_args={weight: 0.5}")
    c.rejects("contract_los", "algorithm.loss=contract_los")
    with pytest.raises(ConfigError, match="'wieght'"):
        c.config("algorithm.loss=contract_loss", "algorithm.loss_args={wieght: 0.5}")
    metrics, moved = train_one_step(cfg, c.model_dir)
    assert moved > 0 and metrics["trainer/contract_weight"] == 0.5, metrics


@contract("storage")
def storage_contract(c: Contract) -> None:
    c.load("""
        import trine
        from trine.buffer import BufferTimeout

        @trine.register("storage", "contract_storage")
        class ListStorage:
            def __init__(self, rules, capacity: int = 100):
                self.rules, self.capacity, self.rows, self.batches = rules, capacity, [], []

            def put(self, experiences):  # one explored batch: remember its size
                self.rows = (self.rows + list(experiences))[-self.capacity:]
                self.batches.append(len(experiences))

            def get(self, n, *, min_version=None, current_version=None, timeout=None):
                size = n if n is not None else (self.batches[0] if self.batches else None)
                if size is None:
                    raise BufferTimeout("no explored batch arrived")
                if len(self.rows) < size:
                    raise BufferTimeout(f"{len(self.rows)} of {size} experiences")
                if n is None:
                    self.batches.pop(0)
                out, self.rows = self.rows[:size], self.rows[size:]
                return out

            def set_rewards(self, rewards):
                pending = [e for e in self.rows if e.reward is None and e.id in rewards]
                for e in pending:
                    e.reward = float(rewards[e.id])
                return len(pending)

            def batches_waiting(self):
                return len(self.batches)

            def metrics(self):
                return {"buffer/size": float(len(self.rows))}

            def state_dict(self):
                return {"rows": list(self.rows), "batches": list(self.batches)}

            def load_state_dict(self, state):
                self.rows, self.batches = list(state["rows"]), list(state.get("batches", []))

            def close(self):
                self.rows, self.batches = [], []
    """)
    cfg = c.config("buffer.storage=contract_storage", "buffer.storage_args={capacity: 3}")
    c.rejects("contract_storag", "buffer.storage=contract_storag")

    from trine.buffer import Buffer, BufferTimeout, open_buffer

    buffer = open_buffer(cfg.buffer, c.tmp / "run")
    assert isinstance(buffer, Buffer) and buffer.rules.sampler == cfg.buffer.sampler
    exps = rollouts(c.model_dir)
    buffer.put(exps)
    assert buffer.metrics() == {"buffer/size": 3.0}  # capacity from storage_args
    state = buffer.state_dict()
    assert buffer.get(2, current_version=0, timeout=0.1) == exps[1:3]
    with pytest.raises(BufferTimeout):
        buffer.get(2, current_version=0, timeout=0.1)
    buffer.load_state_dict(state)
    assert buffer.get(3, current_version=0, timeout=0.1) == exps[1:]
    buffer.close()


@contract("operator")
def operator_contract(c: Contract) -> None:
    c.load("""
        import trine
        from trine.buffer import Operator

        @trine.register("operator", "contract_scale")
        class ScaleRewards(Operator):
            name = "contract_scale"

            def __init__(self, factor: float = 2.0):
                self.factor = factor

            def apply(self, experiences):
                for e in experiences:
                    e.reward = self.factor * e.reward
                return experiences, {"scaled": len(experiences)}
    """)
    cfg = c.config("buffer.operators=[{name: contract_scale, factor: 3.0}]")
    c.rejects("contract_scal", "buffer.operators=[{name: contract_scal}]")

    from trine.buffer import build_pipeline

    pipeline = build_pipeline(cfg.buffer.operators)
    kept, metrics = pipeline(rollouts(c.model_dir), step=0)
    assert [e.reward for e in kept] == [3.0, 0.0, 3.0, 0.0]
    assert (
        metrics["operators/contract_scale/scaled"] == 4.0 and metrics["operators/contract_scale/out"] == 4.0
    )


@contract("monitor")
def monitor_contract(c: Contract) -> None:
    module = c.load("""
        import trine

        @trine.register("monitor", "contract_sink")
        class ListSink:
            logged = []

            def log(self, metrics, step):
                self.logged.append((step, dict(metrics)))

            def close(self):
                self.logged.append("closed")
    """)
    cfg = c.config("monitor.sinks=[jsonl, contract_sink]")
    c.rejects("contract_snk", "monitor.sinks=[contract_snk]")

    from trine.monitor import build_monitor

    monitor = build_monitor(cfg.monitor.sinks, c.tmp / "run", total_steps=1, config={}, resume_step=0)
    monitor.log({"trainer/loss": 0.5}, step=1)
    monitor.close()
    assert module.ListSink.logged == [(1, {"trainer/loss": 0.5}), "closed"]
    assert (c.tmp / "run" / "metrics.jsonl").is_file()


@contract("model_preset")
def model_preset_contract(c: Contract) -> None:
    c.load("""
        import trine

        trine.register("model_preset", "contract-tiny")(
            dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
        )
    """)
    path = c.tmp / "new_model"
    cfg = c.config(f"model.path={path}", "model.init_preset=contract-tiny")
    c.rejects("contract-tny", f"model.path={path}", "model.init_preset=contract-tny")

    from trine import build

    model, _ = build.load_policy(cfg)  # a registered preset builds (it used to validate, then fail)
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 1


@contract("generator")
def generator_contract(c: Contract) -> None:
    c.load("""
        import trine

        @trine.register("generator", "contract_rows")
        def rows(size=2, seed=0):
            return [{"question": f"{seed % 7 + i}+1=", "answer": str(seed % 7 + i + 1)} for i in range(size)]
    """)
    cfg = c.config(
        "tasks.train.path=null", "tasks.train.generator=contract_rows", "tasks.train.generator_args={size: 3}"
    )
    c.rejects("contract_row", "tasks.train.path=null", "tasks.train.generator=contract_row")
    from trine.build import build_taskset

    taskset = build_taskset(cfg.tasks.train)  # what the run builds: rows seeded from the taskset's name
    assert len(taskset) == 3 and taskset[0].raw["answer"] == str(int(taskset[0].raw["question"][:-3]) + 1)


@contract("scheduler")
def scheduler_contract(c: Contract) -> None:
    c.load("""
        import trine

        @trine.register("scheduler", "contract_scheduler")
        class RoundRobin:
            def __init__(self, tasks, seed=0):
                self.tasks, self.position, self.stats = list(tasks), 0, {}

            def next_batch(self, n):
                batch = [self.tasks[(self.position + i) % len(self.tasks)] for i in range(n)]
                self.position += n
                return batch

            def feedback(self, task_ids, stats):
                for task_id, rate in zip(task_ids, stats["pass_rate"]):
                    self.stats[task_id] = rate

            def total_batches(self, batch_size):
                return None

            def state_dict(self):
                return {"position": self.position}

            def load_state_dict(self, state):
                self.position = state["position"]
    """)
    # No config key names a scheduler (build_task_scheduler calls trine.tasks.build_scheduler, which
    # picks its class itself), so there is no config to validate: the registry's own check is what a
    # key would get. Reported; when a key exists, check it with c.config / c.rejects like the others.
    problem = registry.check("scheduler", "contract_schedular")
    assert problem and "Did you mean 'contract_scheduler'?" in problem and "--plugin path.py" in problem

    tasks = [Task(task_id=f"t{i}", question=f"{i}+1=", answer=str(i + 1)) for i in range(3)]
    scheduler = registry.resolve("scheduler", "contract_scheduler")(tasks, seed=0)
    batch = scheduler.next_batch(2)  # what the loop does each step, then the pass-rate feedback
    scheduler.feedback([t.task_id for t in batch], {"pass_rate": [1.0, 0.5]})
    assert scheduler.stats == {"t0": 1.0, "t1": 0.5}
    state = scheduler.state_dict()
    assert [t.task_id for t in scheduler.next_batch(2)] == ["t2", "t0"]
    scheduler.load_state_dict(state)
    assert [t.task_id for t in scheduler.next_batch(1)] == ["t2"]


# The two kinds issue 10 adds (engine, environment) were written against the code in progress.


@contract("engine")
def engine_contract(c: Contract) -> None:
    c.load("""
        import contextlib

        import trine
        from trine.models.chat import encode_prompt
        from trine.types import Completion

        @trine.register("engine", "contract_engine")
        class FixedAnswerEngine:
            \"\"\"Answers every prompt with " 2": the whole RolloutModel protocol, no sampling.\"\"\"

            def __init__(self, model, tokenizer, *, max_batch_size=256, seed=0):
                self.tokenizer, self.policy_version, self.seeds = tokenizer, 0, []

            async def generate(self, prompt_ids, params):
                response = self.tokenizer(" 2")["input_ids"][: params.max_tokens]
                return [
                    Completion(list(prompt_ids), response, [-0.5] * len(response), " 2", "stop")
                    for _ in range(params.n)
                ]

            async def chat(self, messages, params):
                return await self.generate(encode_prompt(self.tokenizer, messages), params)

            def load_weights(self, state_dict, version):
                self.policy_version = version

            @contextlib.contextmanager
            def seeded(self, seed):
                self.seeds.append(seed)
                yield

            def state_dict(self):
                return {"policy_version": self.policy_version}

            def load_state_dict(self, state):
                self.policy_version = state["policy_version"]

            def close(self):
                pass
    """)
    cfg = c.config("model.engine=contract_engine")
    c.rejects("contract_engin", "model.engine=contract_engin")

    from trine import build
    from trine.models import RolloutModel, load_model, load_tokenizer

    # build's own route from model.engine to an engine (a private helper of build.py today)
    engine = build._engine(cfg, load_model(c.model_dir), load_tokenizer(c.model_dir))
    assert isinstance(engine, RolloutModel)
    experiences, metrics = explore(engine, cfg)
    assert [e.reward for e in experiences] == [1.0, 1.0, 0.0, 0.0]  # " 2" is right for 1+1 only
    assert all(e.logprobs == [-0.5] * len(e.logprobs) for e in experiences)
    assert metrics["explorer/reward_mean"] == 0.5, metrics


@contract("environment")
def environment_contract(c: Contract) -> None:
    c.load("""
        import trine

        @trine.register("environment", "contract_env")
        class CountdownEnv:
            \"\"\"Async Environment: the episode ends after `length` steps, reward 1 on the last one.\"\"\"

            def __init__(self, length: int = 2):
                self.length, self.steps = length, 0

            async def reset(self, task):
                self.steps = 0
                return f"Say anything {self.length} times. Task: {task.question}"

            async def step(self, action):
                self.steps += 1
                done = self.steps >= self.length
                return f"{self.length - self.steps} to go", float(done), done, {"success": done}

            def state_hash(self):
                return str(self.steps)
    """)
    workflow = ["tasks.train.workflow=step_wise", "tasks.train.repeat=1"]
    cfg = c.config(*workflow, "tasks.train.workflow_args={env: contract_env, env_args: {length: 2}}")
    c.rejects("contract_evn", *workflow, "tasks.train.workflow_args={env: contract_evn}")

    experiences, _ = explore(hf_engine(c.model_dir), cfg)
    assert len(experiences) == 4  # 2 tasks x 1 episode x 2 steps
    assert [e.info["env_state_hash"] for e in experiences] == ["0", "1", "0", "1"]
    assert [e.info["step_reward"] for e in experiences] == [0.0, 1.0, 0.0, 1.0]
    assert all(e.info["episode_return"] == 1.0 and e.info["success"] for e in experiences)


@contract("tool")
def tool_contract(c: Contract) -> None:
    c.load("""
        import trine

        @trine.register("tool", "contract_tool")
        def double(x: int) -> int:
            \"\"\"Twice a number.

            Args:
                x: the number
            \"\"\"
            return 2 * x
    """)
    workflow = [
        "tasks.train.workflow=tool_agent",
        "tasks.train.repeat=1",
        "tasks.train.sampling.max_tokens=64",
    ]
    cfg = c.config(*workflow, "tasks.train.workflow_args={tools: [contract_tool]}")
    c.rejects("contract_tol", *workflow, "tasks.train.workflow_args={tools: [contract_tol]}")

    from trine.models import load_tokenizer
    from trine.types import Completion

    class CallsTheTool:
        """A rollout model that calls the tool once, then answers with what it returned."""

        def __init__(self) -> None:
            self.tokenizer, self.policy_version = load_tokenizer(c.model_dir), 0

        async def generate(self, prompt_ids, params):
            seen = self.tokenizer.decode(prompt_ids)
            reply = (
                f"{seen.rsplit('tool', 1)[1][1:].split('<')[0]}"
                if "<|im_start|>tool" in seen
                else ('<tool_call>{"name": "contract_tool", "arguments": {"x": 21}}</tool_call>')
            )
            ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            return [Completion(list(prompt_ids), ids, [0.0] * len(ids), reply, "stop")]

        def close(self) -> None:
            pass

    experiences, metrics = explore(CallsTheTool(), cfg)
    assert len(experiences) == 2 and metrics["tools/calls"] == 2.0 and "tools/errors" not in metrics
    assert all(e.info["response"] == "42" and e.info["turns"] == 2 for e in experiences)
