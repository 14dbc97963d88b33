"""A black-box agent, written only against the official ``openai`` client, trained by ``trine serve``.

It answers arithmetic questions through any OpenAI-compatible endpoint, ``--samples`` answers each
(``task_id`` groups them for GRPO), and sends each answer's grade back (``POST /v1/feedback``), which
``trine train`` trains on; the server loads the new weights, so the agent's own score rises. It stays at
most ``--max-lag`` rounds ahead of the served weights (``policy_version``, listed with the model).

    trine serve examples/serve_agent/config.yaml & trine train examples/serve_agent/config.yaml &
    python examples/serve_agent/agent.py --rounds 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
from pathlib import Path

from openai import AsyncOpenAI

DATA = Path(__file__).resolve().parents[1] / "arithmetic" / "data" / "train.jsonl"  # the questions


async def ask(client: AsyncOpenAI, model: str, row: dict, samples: int, task_id: str) -> tuple[list, int]:
    """One question: ``samples`` answers, each graded and the grades sent back; (rewards, version)."""
    response = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": row["question"]}],
        n=samples,
        temperature=1.0,
        max_tokens=6,
        extra_body={"task_id": task_id},
    )
    rewards = [float((c.message.content or "").strip() == row["answer"]) for c in response.choices]
    for choice, reward in zip(response.choices, rewards):
        feedback = {"response_id": response.id, "choice": choice.index, "reward": reward}
        await client.post("/feedback", body=feedback, cast_to=object)
    return rewards, int((response.model_extra or {}).get("policy_version", 0))


async def served_version(client: AsyncOpenAI) -> int:  # trine serve lists it with the model
    return int(((await client.models.list()).data[0].model_extra or {}).get("policy_version", 0))


async def main(args: argparse.Namespace) -> list[dict]:
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    rng, log = random.Random(args.seed), []
    for r in range(args.rounds):
        while r - await served_version(client) > args.max_lag:  # let training keep up
            await asyncio.sleep(0.2)
        batch = rng.sample(range(len(rows)), args.questions)
        results = await asyncio.gather(
            *(ask(client, args.model, rows[i], args.samples, f"r{r}-q{i}") for i in batch)
        )
        score = statistics.fmean(x for rewards, _ in results for x in rewards)
        log.append({"round": r, "reward": score, "versions": sorted({v for _, v in results})})
        print(json.dumps(log[-1]), flush=True)
    await client.close()
    return log


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="EMPTY")
    parser.add_argument("--model", default="serve_agent")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--questions", type=int, default=16, help="questions asked at once per round")
    parser.add_argument("--samples", type=int, default=8, help="answers per question (a GRPO group)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-lag", type=int, default=2, help="rounds ahead of the served weights")
    asyncio.run(main(parser.parse_args()))
