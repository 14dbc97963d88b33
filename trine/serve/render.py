"""From OpenAI chat messages to the tokens the model reads, and from its reply back to an OpenAI message.

- :func:`template_messages`: the request's messages as the chat template reads them (content parts
  joined, ``developer`` as ``system``, an assistant's ``tool_calls`` with their arguments as objects, or
  written as Hermes ``<tool_call>`` blocks into its content when the template does not render
  ``tool_calls`` itself: how the model wrote them);
- :func:`render_prompt`: template + tokenizer exactly as :class:`~trine.workflows.trajectory.Trajectory`
  renders an opening chat (so a one-call experience and a session start from the same tokens);
- :func:`history_keys`: what must stay the same for a later call to continue a session;
- :func:`reply_message`: the model's text as ``message.content`` + ``message.tool_calls``.
"""

from __future__ import annotations

import json
from typing import Any

from trine.serve.schemas import ApiError, Message
from trine.tools import format_tool_call, parse_tool_calls, strip_tool_calls
from trine.tools.parsing import OPEN

TemplateMessage = dict[str, Any]
HistoryKey = tuple[str, "str | None"]
"""``(role, content)`` of one message as the client sent it; content ``None``: a reply of ours (any
echo of it continues the session)."""


def template_messages(messages: list[Message], tokenizer: Any) -> list[TemplateMessage]:
    """The request's messages as plain dicts for ``tokenizer.apply_chat_template``."""
    renders_calls = "tool_calls" in str(getattr(tokenizer, "chat_template", "") or "")
    out: list[TemplateMessage] = []
    for i, message in enumerate(messages):
        role = "system" if message.role == "developer" else message.role
        if message.content is None and not (role == "assistant"):
            raise ApiError(
                400,
                f"messages.{i}.content is null; a {message.role} message needs a string (or text parts).",
                param=f"messages.{i}.content",
            )
        item: TemplateMessage = {"role": role, "content": _text(message.content)}
        if message.name is not None:
            item["name"] = message.name
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        if message.tool_calls:
            if role != "assistant":
                raise ApiError(
                    400,
                    f"messages.{i}.tool_calls is set on a {role} message; only assistant messages have them.",
                    param=f"messages.{i}.tool_calls",
                )
            calls = [
                (c.id, c.function.name, _arguments(c.function.arguments, i, k))
                for k, c in enumerate(message.tool_calls)
            ]
            if renders_calls:
                item["tool_calls"] = [
                    {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                    for cid, name, args in calls
                ]
            else:
                blocks = [format_tool_call(name, args) for _, name, args in calls]
                item["content"] = "\n".join([item["content"], *blocks] if item["content"] else blocks)
        out.append(item)
    return out


def history_keys(messages: list[TemplateMessage]) -> list[HistoryKey]:
    """``(role, content)`` per message: compared with the next call of the session."""
    return [(m["role"], str(m.get("content", ""))) for m in messages]


def continues(keys: list[HistoryKey], history: list[HistoryKey]) -> bool:
    """Whether ``keys`` (a new call's messages) start with ``history`` (ours: any assistant echo)."""
    if len(keys) < len(history):
        return False
    for (role, content), (h_role, h_content) in zip(keys, history):
        if role != h_role or (h_content is not None and content != h_content):
            return False
    return True


def render_prompt(
    tokenizer: Any, messages: list[TemplateMessage], tools: list[dict[str, Any]] | None
) -> list[int]:
    """Token ids of ``messages`` (+ ``tools``) with the generation prompt, as the model will read them."""
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=True
        )
    except Exception as err:  # jinja's TemplateError or a template that raises on a role order
        raise template_error(err) from None
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def template_error(err: Exception) -> ApiError:
    """A chat template's refusal of the messages as a 400 naming ``messages``."""
    return ApiError(
        400,
        f"the model's chat template cannot render these messages ({type(err).__name__}: {err}); check the "
        "roles and their order (e.g. a tool message must follow an assistant message with tool_calls).",
        param="messages",
    )


def reply_message(text: str, *, parse_tools: bool, call_prefix: str) -> tuple[dict[str, Any], bool]:
    """``(message, has_tool_calls)``: the assistant message for ``text``; with ``parse_tools`` its
    well-formed Hermes ``<tool_call>`` blocks become ``tool_calls`` (arguments as JSON text) and the rest
    of the text the content (None when empty)."""
    if parse_tools and OPEN in text:
        calls, _errors = parse_tool_calls(text, id_prefix=call_prefix)
        if calls:
            tool_calls = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": json.dumps(call.arguments, ensure_ascii=False),
                    },
                }
                for call in calls
            ]
            content = strip_tool_calls(text) or None
            return {"role": "assistant", "content": content, "tool_calls": tool_calls}, True
    return {"role": "assistant", "content": text}, False


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


def _arguments(arguments: str, i: int, k: int) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        param = f"messages.{i}.tool_calls.{k}.function.arguments"
        raise ApiError(
            400,
            f"{param}={arguments[:80]!r} is not a JSON object; send the arguments as JSON text of an object.",
            param=param,
        )
    return value


__all__ = [
    "HistoryKey",
    "TemplateMessage",
    "continues",
    "history_keys",
    "render_prompt",
    "reply_message",
    "template_error",
    "template_messages",
]
