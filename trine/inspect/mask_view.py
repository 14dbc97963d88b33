"""Which tokens of an experience train: the one rendering ``trine check`` and ``trine buffer head --tokens``
share.

:func:`experience_spans` cuts an :class:`~trine.types.Experience` into runs of tokens that train
(``action_mask`` 1: what the model sampled) or do not (the prompt, template tokens, observations and tool
output: ``action_mask`` 0), decoded to text. :func:`print_spans` prints them: on a terminal in colour (trained
bold green, masked dim), elsewhere (a pipe, a file, a test) as plain text with every masked run between
:data:`MASK_OPEN` and :data:`MASK_CLOSE`, so the marking survives without colour. ``--json`` outputs give the
spans as dicts (:meth:`Span.as_dict`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MASK_OPEN, MASK_CLOSE = "⟦", "⟧"
"""Around a masked (untrained) run in the plain-text view."""
LEGEND_PLAIN = (
    f"{MASK_OPEN}…{MASK_CLOSE} masked (action_mask 0: prompt, template, observations, tools); the rest trains"
)
LEGEND_RICH = "[bold green]trained (action_mask 1)[/], [dim]masked: prompt, template, observations, tools[/]"


@dataclass
class Span:
    """A run of an experience's tokens that trains or does not."""

    text: str
    """The run's tokens decoded (special tokens kept)."""
    trained: bool
    """Whether its tokens train (``action_mask`` 1)."""
    start: int = 0
    """Its first token's index in ``Experience.tokens``."""
    end: int = 0
    """One past its last token's index."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """``(start, end, value)`` of each run of equal values."""
    out: list[tuple[int, int, int]] = []
    for i, v in enumerate(mask):
        if out and out[-1][2] == v:
            out[-1] = (out[-1][0], i + 1, v)
        else:
            out.append((i, i + 1, v))
    return out


def experience_spans(tokenizer: Any, exp: Any) -> list[Span]:
    """The prompt (masked), then each run of the response's ``action_mask``. Without a tokenizer the
    token ids are shown."""

    def text(a: int, b: int) -> str:
        ids = list(exp.tokens[a:b])
        return tokenizer.decode(ids, skip_special_tokens=False) if tokenizer is not None else str(ids)

    start = exp.prompt_length
    spans = [Span(text(0, start), False, 0, start)] if start else []
    for a, b, v in runs(list(exp.action_mask)):
        spans.append(Span(text(start + a, start + b), bool(v), start + a, start + b))
    return spans


def plain_text(spans: list[Span]) -> str:
    """The spans as text, each masked run between :data:`MASK_OPEN` and :data:`MASK_CLOSE`."""
    return "".join(s.text if s.trained else f"{MASK_OPEN}{s.text}{MASK_CLOSE}" for s in spans)


def print_spans(console: Any, spans: list[Span], title: str) -> None:
    """Print ``spans`` under ``title`` on a rich ``console``: coloured in a panel on a terminal, else
    plain text with the masked runs marked (:func:`plain_text`)."""
    if console.is_terminal and not console.no_color:
        from rich.panel import Panel
        from rich.text import Text

        text = Text()
        for s in spans:
            text.append(s.text, style="bold green" if s.trained else "dim")
        console.print(Panel(text, title=f"{title}: {LEGEND_RICH}", title_align="left"))
        return
    console.print(f"--- {title} ({LEGEND_PLAIN})", markup=False, highlight=False)
    console.print(plain_text(spans), markup=False, highlight=False, soft_wrap=True)
