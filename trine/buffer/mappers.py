"""Reward mappers: experience operators that add computed signals to the reward.

- ``reward_shaping``: ``reward += Σ weight × info[field]`` for configured fields;
- ``overlong``: DAPO's soft overlong punishment (:func:`~trine.buffer.operators.overlong_penalty`);
- ``quality``: an auxiliary judge scores each response — a local HF model (the geometric-mean
  probability of the response given the prompt, or the probability of "Yes" to a judging prompt) or
  an OpenAI-compatible endpoint (a 0–10 rating) — scaled to ``score_range`` and added with ``weight``
  (Trinity-RFT report v2 §3.4.2, use case 1: quality scores in [-0.5, 0.5]);
- ``diversity``: the cosine distance of a response's embedding (mean-pooled last hidden states of a
  local HF model) to its group's mean embedding, added with a weight that follows a schedule over
  the training steps (use case 2: weight 0.5 → 0.3).

Every added amount is recorded in ``info["reward_parts"]`` and the operator's name appended to
``info["lineage"]``. Pending rewards (None) are left alone and counted (``pending``). Models are
loaded lazily, on the first call.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from trine.buffer.operators import Operator, add_lineage, groups_of, overlong_penalty
from trine.types import Experience


def _add_part(e: Experience, name: str | None, key: str, amount: float) -> None:
    """``reward += amount``, recorded as ``reward_parts[key]`` (and ``name`` appended to the lineage)."""
    e.reward = float(e.reward) + amount
    e.info.setdefault("reward_parts", {})[key] = amount
    if name:
        add_lineage(e, name)


class RewardShaping(Operator):
    """``reward += Σ weights[field] × info[field]`` (dotted fields reach into nested dicts, e.g.
    ``"reward_parts.format"``); each term recorded as ``reward_parts["shaping/<field>"]``.

    ``missing``: what to do when an experience lacks a field — ``"skip"`` the term (counted as
    ``missing``) or ``"error"``.
    """

    name = "reward_shaping"

    def __init__(self, weights: dict[str, float], missing: str = "skip") -> None:
        if not isinstance(weights, dict) or not weights:
            raise ValueError(f"reward_shaping weights={weights!r}; expected a dict {{info field: weight}}.")
        if missing not in ("skip", "error"):
            raise ValueError(f"reward_shaping missing={missing!r}; expected 'skip' or 'error'.")
        self.weights = {str(k): float(v) for k, v in weights.items()}
        self.missing = missing

    def apply(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        counts = {"shaped": 0.0, "missing": 0.0, "pending": 0.0}
        for e in experiences:
            if e.reward is None:
                counts["pending"] += 1
                continue
            shaped = False
            for field, weight in self.weights.items():
                value = _lookup(e.info, field)
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    if self.missing == "error":
                        raise ValueError(
                            f"reward_shaping: experience {e.id} has info[{field!r}]={value!r}; expected a "
                            "number. Fix the workflow, or pass missing='skip'."
                        )
                    counts["missing"] += 1
                    continue
                _add_part(e, None, f"shaping/{field}", weight * float(value))
                shaped = True
            if shaped:
                add_lineage(e, self.name)
                counts["shaped"] += 1
        return experiences, counts


def _lookup(info: dict[str, Any], path: str) -> Any:
    value: Any = info
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


class OverlongShaping(Operator):
    """DAPO's soft overlong punishment added to the reward (``reward_parts["overlong"]``).

    ``max_tokens``: the generation limit L_max; ``buffer``: L_cache; ``penalty``: the value at L_max.
    """

    name = "overlong"

    def __init__(self, max_tokens: int, buffer: int, penalty: float = 1.0) -> None:
        self.max_tokens, self.buffer, self.penalty = max_tokens, buffer, penalty

    def apply(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        counts = {"shaped": 0.0, "pending": 0.0}
        for e in experiences:
            if e.reward is None:
                counts["pending"] += 1
                continue
            p = overlong_penalty(e.response_length, self.max_tokens, self.buffer, self.penalty)
            if p:
                _add_part(e, self.name, "overlong", p)
                counts["shaped"] += 1
        return experiences, counts


# -- quality ---------------------------------------------------------------------------------------

JUDGE_TEMPLATE = (
    "Here is a question and a response.\n\nQuestion: {prompt}\n\nResponse: {response}\n\n"
    "Is the response correct, clear and helpful? Answer Yes or No."
)
API_TEMPLATE = (
    "Rate the quality (correctness, clarity, helpfulness) of the response to the question on a scale "
    "from 0 to 10. Reply with the number only.\n\nQuestion: {prompt}\n\nResponse: {response}"
)
QUALITY_METHODS = ("logprob", "yes_prob", "api")


class QualityMapper(Operator):
    """Add ``weight × score`` to each reward, ``score`` a judge's quality rating in ``score_range``.

    Methods (the judge's raw score ``p`` is in [0, 1], then ``score = lo + (hi - lo) · p``):

    - ``"logprob"``: ``p = exp(mean log p_judge(response tokens | prompt))``, the geometric-mean
      per-token probability of the response under the local judge ``model``;
    - ``"yes_prob"``: ``p = P("Yes") / (P("Yes") + P("No"))`` for the next token after the judging
      prompt ``template`` (chat-templated when the judge's tokenizer has a chat template);
    - ``"api"``: an OpenAI-compatible endpoint (``api_base``, ``model`` = the served model name,
      key from env ``api_key_env``) rates 0–10; ``p = rating / 10`` (needs the ``openai`` package).

    Args:
        model: local HF model directory (or a loaded model, with ``tokenizer`` a loaded tokenizer);
            the served model name for ``"api"``.
        policy_tokenizer: tokenizer (path or object) to decode experience tokens when
            ``info["response"]``/``info["prompt"]`` are absent; default: the judge's.
        batch_size, max_length, device, dtype: local judge settings.
    Records ``info["quality"] = p`` and ``reward_parts["quality"]``; counts ``scored``,
    ``pending``, ``unparsed`` (api replies without a number) and ``score_mean`` (of ``p``).
    """

    name = "quality"

    def __init__(
        self,
        model: Any,
        method: str = "logprob",
        weight: float = 1.0,
        score_range: tuple[float, float] | list[float] = (-0.5, 0.5),
        template: str | None = None,
        tokenizer: Any = None,
        policy_tokenizer: Any = None,
        api_base: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        batch_size: int = 8,
        max_length: int = 2048,
        device: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        if method not in QUALITY_METHODS:
            raise ValueError(f"quality method={method!r}; expected one of {QUALITY_METHODS}.")
        if len(score_range) != 2 or float(score_range[0]) > float(score_range[1]):
            raise ValueError(f"quality score_range={score_range!r}; expected [low, high] with low <= high.")
        self.method, self.weight = method, float(weight)
        self.low, self.high = float(score_range[0]), float(score_range[1])
        self.template = template or (API_TEMPLATE if method == "api" else JUDGE_TEMPLATE)
        self.api_base, self.api_key_env, self.model_name = api_base, api_key_env, model
        self.policy_tokenizer = policy_tokenizer
        self._client = None
        self.judge = (
            None if method == "api" else LocalLM(model, tokenizer, device, dtype, batch_size, max_length)
        )

    def apply(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        ready = [e for e in experiences if e.reward is not None]
        counts = {"scored": 0.0, "pending": float(len(experiences) - len(ready)), "unparsed": 0.0}
        if not ready:
            return experiences, counts
        prompts, responses = experience_texts(ready, self._decoder())
        raw = self._score(prompts, responses)
        scored = []
        for e, p in zip(ready, raw):
            if p is None:
                counts["unparsed"] += 1
                continue
            e.info["quality"] = p
            _add_part(e, self.name, "quality", self.weight * (self.low + (self.high - self.low) * p))
            scored.append(p)
        counts["scored"] = float(len(scored))
        counts["score_mean"] = sum(scored) / len(scored) if scored else 0.0
        return experiences, counts

    def _decoder(self) -> Any:
        if self.policy_tokenizer is not None:
            self.policy_tokenizer = as_tokenizer(self.policy_tokenizer)
            return self.policy_tokenizer
        return None if self.judge is None else self.judge.tokenizer

    def _score(self, prompts: list[str], responses: list[str]) -> list[float | None]:
        if self.method == "logprob":
            return [math.exp(x) for x in self.judge.mean_logprobs(prompts, responses)]
        texts = [self.template.format(prompt=p, response=r) for p, r in zip(prompts, responses)]
        if self.method == "yes_prob":
            return self.judge.yes_probability(texts)
        if self._client is None:
            self._client = _api_client(self.api_base, self.api_key_env)
        return [_api_rating(self._client, self.model_name, text) for text in texts]


def _api_client(api_base: str | None, key_env: str) -> Any:
    import os

    try:
        import openai
    except ImportError as err:
        raise ImportError(
            "quality method='api' needs the openai package; install it with `pip install openai`."
        ) from err
    return openai.OpenAI(base_url=api_base, api_key=os.environ.get(key_env, "EMPTY"))


def _api_rating(client: Any, model: str, text: str) -> float | None:
    """Ask an OpenAI-compatible chat endpoint for a 0–10 rating; ``rating / 10`` or None if unparsable."""
    reply = client.chat.completions.create(
        model=str(model), messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0.0
    )
    found = re.search(r"\d+(?:\.\d+)?", reply.choices[0].message.content or "")
    return None if found is None else min(max(float(found.group()) / 10.0, 0.0), 1.0)


# -- diversity -------------------------------------------------------------------------------------

SCHEDULES = ("constant", "linear", "cosine")


def scheduled_weight(step: int, start: float, end: float | None, total_steps: int | None, kind: str) -> float:
    """``start`` moving to ``end`` over ``total_steps`` steps (``linear`` or ``cosine``), then ``end``.

    ``constant`` (or no ``end``/``total_steps``) is always ``start``.
    """
    if kind == "constant" or end is None or not total_steps:
        return start
    frac = min(max(step / total_steps, 0.0), 1.0)
    if kind == "cosine":
        frac = (1 - math.cos(math.pi * frac)) / 2
    return start + (end - start) * frac


class DiversityMapper(Operator):
    """Add ``w(step) × (1 − cos(e_i, mean_group e))`` to each reward, ``e_i`` the response embedding.

    Embeddings are the mean-pooled last hidden states of the local ``model`` over the response's
    tokens (a causal LM, or an encoder such as a sentence-embedding model). A group of one scores 0.
    The weight moves from ``weight`` to ``final_weight`` over ``total_steps`` (``schedule``:
    constant/linear/cosine), read from the step given to the call (else the number of calls).
    Records ``info["diversity"]`` and ``reward_parts["diversity"]``; counts ``scored``, ``pending``,
    ``weight`` and ``score_mean``.
    """

    name = "diversity"

    def __init__(
        self,
        model: Any,
        weight: float = 0.5,
        final_weight: float | None = None,
        total_steps: int | None = None,
        schedule: str = "linear",
        tokenizer: Any = None,
        policy_tokenizer: Any = None,
        batch_size: int = 8,
        max_length: int = 2048,
        device: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"diversity schedule={schedule!r}; expected one of {SCHEDULES}.")
        self.weight, self.final_weight = float(weight), final_weight
        self.total_steps, self.schedule = total_steps, schedule
        self.policy_tokenizer = policy_tokenizer
        self.embedder = LocalLM(model, tokenizer, device, dtype, batch_size, max_length)

    def apply(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        import torch

        w = scheduled_weight(self.step, self.weight, self.final_weight, self.total_steps, self.schedule)
        ready = [e for e in experiences if e.reward is not None]
        counts = {"scored": float(len(ready)), "pending": float(len(experiences) - len(ready)), "weight": w}
        if not ready:
            return experiences, counts
        if self.policy_tokenizer is not None:
            self.policy_tokenizer = as_tokenizer(self.policy_tokenizer)
        decoder = self.policy_tokenizer or self.embedder.tokenizer
        responses = [experience_text(e, "response", decoder) for e in ready]
        embeddings = self.embedder.embed(responses)
        row = {id(e): i for i, e in enumerate(ready)}
        scores = []
        for group in groups_of(ready).values():
            idx = torch.tensor([row[id(e)] for e in group])
            emb = embeddings[idx]
            sim = torch.nn.functional.cosine_similarity(emb, emb.mean(0, keepdim=True), dim=-1)
            for e, s in zip(group, sim.tolist()):
                d = 0.0 if len(group) == 1 else 1.0 - s
                e.info["diversity"] = d
                _add_part(e, self.name, "diversity", w * d)
                scores.append(d)
        counts["score_mean"] = sum(scores) / len(scores)
        return experiences, counts


MAPPERS: dict[str, type[Operator]] = {
    "reward_shaping": RewardShaping,
    "overlong": OverlongShaping,
    "quality": QualityMapper,
    "diversity": DiversityMapper,
}


# -- local auxiliary models ---------------------------------------------------------------------------


def as_tokenizer(tokenizer: Any) -> Any:
    """A loaded tokenizer: ``tokenizer`` itself, or the one saved at that path."""
    if isinstance(tokenizer, (str, Path)):
        from trine.models import load_tokenizer

        return load_tokenizer(tokenizer)
    return tokenizer


def experience_text(e: Experience, which: str, tokenizer: Any) -> str:
    """The ``"prompt"`` or ``"response"`` of an experience as text: ``info[which]`` when it is a
    string, else the tokens decoded with ``tokenizer`` (special tokens skipped)."""
    text = e.info.get(which)
    if isinstance(text, str):
        return text
    if tokenizer is None:
        raise ValueError(
            f"experience {e.id} has no info[{which!r}] text and no tokenizer was given to decode its "
            "tokens; pass tokenizer= (or policy_tokenizer=) the policy's tokenizer directory."
        )
    tokens = e.tokens[: e.prompt_length] if which == "prompt" else e.response_tokens
    return tokenizer.decode(tokens, skip_special_tokens=True)


def experience_texts(experiences: list[Experience], tokenizer: Any) -> tuple[list[str], list[str]]:
    """``(prompts, responses)`` of the experiences as text (see :func:`experience_text`)."""
    prompts = [experience_text(e, "prompt", tokenizer) for e in experiences]
    return prompts, [experience_text(e, "response", tokenizer) for e in experiences]


class LocalLM:
    """A local Hugging Face model used as a judge or an embedder, loaded on first use.

    ``model`` is a model directory (loaded with :func:`trine.models.load_model`; an encoder that is
    not a causal LM falls back to ``transformers.AutoModel``) or an already loaded model, in which
    case ``tokenizer`` must be given too (a loaded tokenizer or its directory).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 8,
        max_length: int = 2048,
    ) -> None:
        is_path = isinstance(model, (str, Path))
        if not is_path and tokenizer is None:
            raise ValueError("a loaded judge/embedding model needs its tokenizer: pass tokenizer=...")
        if batch_size < 1 or max_length < 2:
            raise ValueError(f"batch_size={batch_size}, max_length={max_length}; expected >= 1 and >= 2.")
        self.path = str(model) if is_path else None
        self._model = None if is_path else model
        self._tokenizer = tokenizer
        self.device, self.dtype = device, dtype
        self.batch_size, self.max_length = batch_size, max_length

    @property
    def model(self) -> Any:
        if self._model is None:
            from trine.models import load_model

            try:
                self._model = load_model(self.path, dtype=self.dtype, device=self.device)
            except ValueError:  # not a causal LM (e.g. a BERT-style sentence encoder)
                from transformers import AutoModel

                self._model = (
                    AutoModel.from_pretrained(self.path, local_files_only=True).to(self.device).eval()
                )
        return self._model

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None or isinstance(self._tokenizer, (str, Path)):
            from trine.models import load_tokenizer

            self._tokenizer = load_tokenizer(self._tokenizer or self.path)
        return self._tokenizer

    def _prompt_ids(self, text: str) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            from trine.models.chat import encode_prompt

            return encode_prompt(tok, [{"role": "user", "content": text}])
        ids = tok(text, add_special_tokens=True)["input_ids"]
        return ids or [tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id]

    def _forward(self, seqs: list[list[int]], hidden: bool = False) -> tuple[Any, Any]:
        """Right-padded forward of ``seqs``: ``(logits or last hidden states, attention mask)``."""
        import torch

        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
        ids, mask = ids.to(self.model.device), mask.to(self.model.device)
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=hidden)
        if not hidden:
            return out.logits.float(), mask
        last = out.hidden_states[-1] if getattr(out, "hidden_states", None) else out.last_hidden_state
        return last.float(), mask

    def mean_logprobs(self, prompts: list[str], responses: list[str]) -> list[float]:
        """Mean log-probability per response token of each response given its (chat-templated)
        prompt; ``-inf`` for an empty response."""
        from trine.models.batching import response_logprobs

        pairs = []
        for prompt, response in zip(prompts, responses):
            r = self.tokenizer(response, add_special_tokens=False)["input_ids"][: self.max_length - 1]
            pairs.append((self._prompt_ids(prompt)[-(self.max_length - len(r)) :], r))
        scores = response_logprobs(self.model, pairs, pad_id=self.tokenizer.pad_token_id or 0)
        return [sum(lp) / len(lp) if lp else float("-inf") for lp in scores]

    def yes_probability(self, texts: list[str]) -> list[float]:
        """``P(Yes) / (P(Yes) + P(No))`` of the next token after each (chat-templated) text."""
        import torch

        yes, no = (
            self._answer_ids(("Yes", " Yes", "yes", " yes")),
            self._answer_ids(("No", " No", "no", " no")),
        )
        yes, no = yes - no, no - yes
        if not yes or not no:
            raise ValueError("the judge's tokenizer cannot tell 'Yes' from 'No' by their first token.")
        seqs = [self._prompt_ids(t)[-self.max_length :] for t in texts]
        out: list[float] = []
        for start in range(0, len(seqs), self.batch_size):
            chunk = seqs[start : start + self.batch_size]
            logits, _ = self._forward(chunk)
            last = torch.stack([logits[i, len(s) - 1] for i, s in enumerate(chunk)])
            probs = torch.softmax(last, dim=-1)
            p_yes, p_no = probs[:, sorted(yes)].sum(-1), probs[:, sorted(no)].sum(-1)
            out.extend((p_yes / (p_yes + p_no).clamp_min(1e-30)).tolist())
        return out

    def _answer_ids(self, words: tuple[str, ...]) -> set[int]:
        """First token ids of the spellings of an answer word (only single-token spellings when any)."""
        ids = [x for x in (self.tokenizer(w, add_special_tokens=False)["input_ids"] for w in words) if x]
        single = {x[0] for x in ids if len(x) == 1}
        return single or {x[0] for x in ids}

    def embed(self, texts: list[str]):
        """Mean-pooled last hidden states of each text, ``[len(texts), hidden]`` (float32, CPU)."""
        import torch

        tok = self.tokenizer
        fallback = tok.eos_token_id if tok.eos_token_id is not None else (tok.pad_token_id or 0)
        seqs = [tok(t, add_special_tokens=False)["input_ids"][: self.max_length] or [fallback] for t in texts]
        parts = []
        for start in range(0, len(seqs), self.batch_size):
            hidden, mask = self._forward(seqs[start : start + self.batch_size], hidden=True)
            m = mask.unsqueeze(-1).to(hidden.dtype)
            parts.append(((hidden * m).sum(1) / m.sum(1)).cpu())
        return torch.cat(parts)
