"""Grouped sessions for GRPO (issue 26 item 6, docs/serve.md "Groups for GRPO"): an agent that runs N
sessions of one task with the same ``task_id`` gets one group in the buffer, handed out whole
(``buffer.whole_groups``) once every session is rewarded, and the trainer's advantages are relative to
that group, over real HTTP with the ``openai`` client."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="trine serve needs the fastapi/uvicorn of the serve extra")
pytest.importorskip("openai", reason="the tests speak the official openai client")

from tests.helpers import SERVE_MODEL, serving  # noqa: E402
from trine.algorithms.advantages import grpo_advantages  # noqa: E402
from trine.buffer import BufferTimeout, SQLBuffer  # noqa: E402
from trine.buffer.sampling import SamplingRules  # noqa: E402
from trine.trainer.inputs import sample_inputs  # noqa: E402


def episode(served, session: str, task: str) -> None:
    """One agent episode of two turns in ``session``, of task ``task``, committed without a reward."""
    client, messages = served.client(), [{"role": "user", "content": "2+2"}]
    for turn in range(2):
        reply = client.chat.completions.create(
            model=SERVE_MODEL,
            messages=messages,
            max_tokens=3,
            extra_body={"session_id": session, "task_id": task},
        )
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
        messages += [{"role": "user", "content": f"again {turn}"}]
    assert served.post(f"/v1/sessions/{session}/commit", {}).status_code == 200


def test_sessions_sharing_a_task_id_are_one_group_with_group_relative_advantages(engine, tmp_path):
    rules = SamplingRules(whole_groups=True)
    buffer = SQLBuffer(f"sqlite:///{tmp_path / 'buffer.db'}", poll_interval=0.02, rules=rules)
    try:
        with serving(engine, buffer) as served:
            for i in range(3):
                episode(served, f"a{i}", "task-a")
            for i in range(2):
                episode(served, f"b{i}", "task-b")
            assert buffer.metrics()["buffer/pending"] == 5  # committed without a reward: pending
            for session, reward in [("a0", 1.0), ("a1", 0.0), ("b0", 1.0), ("b1", 0.5)]:
                assert (
                    served.post("/v1/feedback", {"session_id": session, "reward": reward}).status_code == 200
                )
            [b0, b1] = buffer.get(2, timeout=2)  # group a waits for its third member (whole_groups)
            with pytest.raises(BufferTimeout):
                buffer.get(1, timeout=0.3)
            assert served.post("/v1/feedback", {"session_id": "a2", "reward": 0.5}).status_code == 200
            group_a = buffer.get(3, timeout=2)
    finally:
        buffer.close()
    assert {e.info["session_id"] for e in group_a} == {"a0", "a1", "a2"}
    assert {e.group_id for e in group_a} == {"task-a"} and {e.task_id for e in group_a} == {"task-a"}
    assert {(b0.info["session_id"], b0.group_id), (b1.info["session_id"], b1.group_id)} == {
        ("b0", "task-b"),
        ("b1", "task-b"),
    }
    assert all(e.response_length > 3 and 0 in e.action_mask for e in group_a)  # 2 turns, the user's masked
    batch = [b0, *group_a, b1]  # the trainer's batch, groups interleaved
    inputs = sample_inputs(batch, ("rewards", "group_ids"))
    assert inputs["group_ids"].tolist() == [0, 1, 1, 1, 0]
    advantages, _ = grpo_advantages(inputs["rewards"], inputs["group_ids"])
    by_session = {e.info["session_id"]: float(a) for e, a in zip(batch, advantages)}
    assert by_session["a0"] == pytest.approx(1.0, abs=1e-4)  # (1 - 0.5) / std(1, 0, 0.5) = 0.5 / 0.5
    assert by_session["a2"] == pytest.approx(0.0, abs=1e-6) and by_session["a1"] == pytest.approx(
        -1.0, abs=1e-4
    )
    assert by_session["b0"] == pytest.approx(-by_session["b1"]) and by_session["b0"] > 0  # its own group
