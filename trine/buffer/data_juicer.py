"""Bridge to Data-Juicer (``pip install -e ".[data]"``): run a Data-Juicer recipe over tasks or experiences.

A recipe is Data-Juicer's ``process`` list — one ``{op_name: {arguments}}`` per operator, e.g.
``[{"whitespace_normalization_mapper": {}}, {"text_length_filter": {"min_len": 10}},
{"document_deduplicator": {}}]`` — or the path of a Data-Juicer YAML recipe holding such a list.

Fields are mapped both ways: each row (task) or experience becomes a Data-Juicer sample whose keys
(``text``, ``query``, ``response``, ...: the ``text_key``/``query_key``/... defaults of its operators)
are filled from the configured fields; Data-Juicer's filters and deduplicators decide which
samples survive, and for tasks its mappers' edits are written back into the same fields. For
experiences the edited text is *not* written back (experiences are token-in, token-out: their tokens
are what the model sampled), so only filters, deduplicators and the per-sample stats
(``info["data_juicer"]``) take effect.

Data-Juicer 1.6 imports ``ray`` and ``aiohttp`` whenever it runs an operator and, when they are
missing, pip-installs them by itself at run time; :func:`require_data_juicer` checks for them first
and fails with the install command instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trine.buffer.mappers import as_tokenizer, experience_text
from trine.buffer.operators import Operator, add_lineage
from trine.types import Experience

STATS_KEY = "__dj__stats__"
_INDEX = "__trine_row__"
EXPERIENCE_SOURCES = ("prompt", "response")


def require_data_juicer() -> None:
    """Raise ImportError (with the install command) unless Data-Juicer and what it imports are installed."""
    missing = [m for m in ("data_juicer", "ray", "aiohttp") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"the Data-Juicer bridge needs the package(s) {missing} (py-data-juicer imports ray and aiohttp "
            "when it runs an operator and would pip-install them itself); install them with "
            '`pip install -e ".[data]"` (or `pip install py-data-juicer ray aiohttp`).'
        )


def load_recipe(process: list[dict[str, Any]] | str | Path) -> list[dict[str, dict[str, Any]]]:
    """The ``process`` list of a recipe: given directly, or read from a Data-Juicer YAML file."""
    if isinstance(process, (str, Path)):
        import yaml

        path = Path(process).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"Data-Juicer recipe {str(path)!r} does not exist; give a YAML file path."
            )
        process = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("process")
    if not isinstance(process, list) or not process:
        raise ValueError(
            f"Data-Juicer process={process!r}; expected a non-empty list of {{op_name: {{arguments}}}}, e.g. "
            "[{'text_length_filter': {'min_len': 10}}]."
        )
    out = []
    for index, item in enumerate(process):
        if isinstance(item, str):
            item = {item: {}}
        if not isinstance(item, dict) or len(item) != 1:
            raise ValueError(
                f"Data-Juicer process item #{index} is {item!r}; expected one {{op_name: {{arguments}}}}."
            )
        ((name, args),) = item.items()
        out.append({str(name): dict(args or {})})
    return out


@contextlib.contextmanager
def _quiet(quiet: bool) -> Iterator[None]:
    """Hide datasets' progress bars and Data-Juicer's log lines inside the block; keep ``os.environ``.

    ``datasets.Dataset.map`` with ``num_proc`` (which Data-Juicer's operators call) replaces ``os.environ``
    by a copy of itself and leaves it so (datasets 4.x/5.x); everything holding the real mapping (rich's
    consoles read ``COLUMNS`` from it) would then miss later changes. The real one is put back, updated."""
    import os

    import datasets
    from loguru import logger

    environ = os.environ
    bars_were_off = datasets.utils.are_progress_bars_disabled()
    if quiet:
        datasets.disable_progress_bars()
        logger.disable("data_juicer")
    try:
        yield
    finally:
        if os.environ is not environ:
            changed = dict(os.environ)
            os.environ = environ  # noqa: B003 - putting the real mapping back, updated below
            for key in set(environ) - set(changed):
                del environ[key]
            environ.update(changed)
        if quiet:
            logger.enable("data_juicer")
            if not bars_were_off:
                datasets.enable_progress_bars()


def run_recipe(
    samples: list[dict[str, Any]],
    process: list[dict[str, Any]] | str | Path,
    *,
    num_proc: int = 1,
    quiet: bool = True,
) -> list[tuple[int, dict[str, Any]]]:
    """Run the recipe's operators in order over ``samples`` (Data-Juicer samples: ``{"text": ...}``).

    Returns ``(index into samples, processed sample)`` for every surviving sample, in order; the
    processed sample carries Data-Juicer's stats under ``"__dj__stats__"`` when a filter computed
    some. ``num_proc`` is given to every operator that does not set its own.
    """
    require_data_juicer()
    from data_juicer.core.data import NestedDataset
    from data_juicer.ops import load_ops

    recipe = [
        {name: {"num_proc": num_proc, **args}} for item in load_recipe(process) for name, args in item.items()
    ]
    if not samples:
        return []
    with _quiet(quiet):
        try:
            ops = load_ops(recipe)
        except KeyError as err:
            raise ValueError(
                f"unknown Data-Juicer operator {err}; see Data-Juicer's operator list."
            ) from None
        dataset = NestedDataset.from_list([{**s, _INDEX: i} for i, s in enumerate(samples)])
        for op in ops:
            dataset = op.run(dataset)
        rows = dataset.to_list()
    return [(int(row.pop(_INDEX)), row) for row in rows]


def process_task_rows(
    rows: list[dict[str, Any]],
    *,
    process: list[dict[str, Any]] | str | Path,
    fields: dict[str, str] | None = None,
    stats_field: str | None = None,
    num_proc: int = 1,
) -> list[dict[str, Any]]:
    """Run a recipe over task rows (a task-pipeline step: ``trine.buffer.data_juicer:process_task_rows``).

    ``fields`` maps Data-Juicer keys to row fields (default ``{"text": "question"}``): the row's
    field fills the sample key and the processed value is written back. Rows the recipe drops are
    dropped; with ``stats_field`` the sample's Data-Juicer stats are stored in that row field.
    """
    fields = dict(fields or {"text": "question"})
    samples = []
    for number, row in enumerate(rows):
        missing = [f for f in fields.values() if not isinstance(row.get(f), str)]
        if missing:
            raise ValueError(
                f"task row #{number} has no text field(s) {missing} (keys: {sorted(row)}); set fields= "
                "{data_juicer_key: row_field} to text fields of the rows."
            )
        samples.append({key: row[field] for key, field in fields.items()})
    out = []
    for index, sample in run_recipe(samples, process, num_proc=num_proc):
        row = dict(rows[index])
        for key, field in fields.items():
            row[field] = sample[key]
        if stats_field is not None:
            row[stats_field] = dict(sample.get(STATS_KEY) or {})
        out.append(row)
    return out


class DataJuicerOperator(Operator):
    """Experience operator running a Data-Juicer recipe: drops what its filters/deduplicators drop.

    ``fields`` maps Data-Juicer keys to experience texts, ``"prompt"`` or ``"response"`` (default
    ``{"text": "response"}``; texts come from ``info`` or are decoded with ``tokenizer``, a path or
    a loaded tokenizer). Each surviving experience gets the sample's stats in
    ``info["data_juicer"]`` (and ``"data_juicer"`` in its lineage when there are any). Counts:
    ``dropped``.
    """

    name = "data_juicer"

    def __init__(
        self,
        process: list[dict[str, Any]] | str,
        fields: dict[str, str] | None = None,
        tokenizer: Any = None,
        num_proc: int = 1,
    ) -> None:
        require_data_juicer()
        self.process = load_recipe(process)
        self.fields = dict(fields or {"text": "response"})
        bad = {k: v for k, v in self.fields.items() if v not in EXPERIENCE_SOURCES}
        if bad:
            raise ValueError(f"data_juicer fields={bad}; each value must be one of {EXPERIENCE_SOURCES}.")
        self.tokenizer, self.num_proc = tokenizer, num_proc

    def apply(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        if not experiences:
            return experiences, {"dropped": 0.0}
        self.tokenizer = as_tokenizer(self.tokenizer)
        texts = {
            src: [experience_text(e, src, self.tokenizer) for e in experiences]
            for src in set(self.fields.values())
        }
        samples = [{key: texts[src][i] for key, src in self.fields.items()} for i in range(len(experiences))]
        kept = []
        for index, sample in run_recipe(samples, self.process, num_proc=self.num_proc):
            e = experiences[index]
            stats = dict(sample.get(STATS_KEY) or {})
            if stats:
                e.info["data_juicer"] = stats
                add_lineage(e, self.name)
            kept.append(e)
        return kept, {"dropped": float(len(experiences) - len(kept))}
