"""TaskSet: rows of a local dataset mapped to :class:`trine.types.Task`.

Sources (all local; nothing here touches the network):

- a ``.jsonl`` file (one JSON object per line) or a ``.json`` file (a JSON list of objects, or JSON lines);
- a ``.parquet`` file;
- a directory written by ``datasets.Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``
  (``split`` picks the split of a DatasetDict);
- a directory of ``.jsonl``/``.json``/``.parquet`` files (searched recursively, read in sorted order;
  ``split`` keeps the files whose name starts with it or that sit in a folder named after it);
- instead of a path, a task ``generator`` (:mod:`trine.tasks.generators`: reasoning-gym's procedural
  generators, Trine's arithmetic, or ``package.module:function``) called with ``generator_args``.
"""

from __future__ import annotations

import json
import logging
import os
import string
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from trine.types import SamplingParams, Task

logger = logging.getLogger(__name__)

BAD_ROW_MODES = ("error", "skip")
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")

# One row as read from a source: (where it is, for messages; the row itself).
SourceRow = tuple[str, Any]


class _BadRow(Exception):
    """A row that cannot become a Task; carries the reason (the location is added by the caller)."""


class TaskSet(Sequence[Task]):
    """The tasks of one local dataset, each row mapped to a :class:`~trine.types.Task`.

    Args:
        path: a .jsonl/.json/.parquet file, a ``save_to_disk`` directory or a directory of such files
            (or a list of row dicts; see :meth:`from_rows`); None with ``generator``.
        name: name of the taskset; task ids are ``"{name}/{row index}"`` unless ``id_key`` is set.
        split: split of a saved DatasetDict, or file-name prefix / folder inside a directory of files.
        prompt_key: row field holding the prompt (text, or a chat list of ``{role, content}``).
        answer_key: row field holding the reference answer; None when the rows carry no answer.
        messages_key: row field holding a full chat list; used instead of ``prompt_key``.
        system_prompt: system message for every task (for chat prompts it is inserted as the first
            message unless the chat already starts with one).
        prompt_template: Python format string filled from the row (``"What is {question}?"``);
            used instead of ``prompt_key``.
        workflow, reward, repeat, sampling, workflow_args, reward_args: copied into every Task.
        on_bad_row: ``"error"`` raises on the first bad row; ``"skip"`` skips and counts them
            (``skipped_rows``).
        limit: keep only the first ``limit`` good rows.
        id_key: row field holding a stable task id.
        generator: instead of ``path``, a task generator's name or import path
            (:func:`trine.tasks.generators.generate_rows`), called with ``generator_args``.
        generator_args: the generator's keyword arguments (a ``seed`` defaults to one hashed from ``name``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | list[dict[str, Any]] | None = None,
        *,
        name: str = "train",
        split: str | None = None,
        prompt_key: str = "question",
        answer_key: str | None = "answer",
        messages_key: str | None = None,
        system_prompt: str | None = None,
        prompt_template: str | None = None,
        workflow: str = "single_turn",
        reward: str = "exact_match",
        repeat: int = 1,
        sampling: SamplingParams | dict[str, Any] | None = None,
        workflow_args: dict[str, Any] | None = None,
        reward_args: dict[str, Any] | None = None,
        on_bad_row: str = "error",
        limit: int | None = None,
        id_key: str | None = None,
        generator: str | None = None,
        generator_args: dict[str, Any] | None = None,
    ) -> None:
        self.generator = generator
        self.generator_args = dict(generator_args or {})
        path, origin = _source(path, generator, self.generator_args, name)
        in_memory = isinstance(path, (list, tuple))
        self.path = None if in_memory else Path(os.path.expanduser(os.fspath(path)))
        self.name = name
        self.split = split
        self.prompt_key = prompt_key
        self.answer_key = answer_key
        self.messages_key = messages_key
        self.system_prompt = system_prompt
        self.prompt_template = prompt_template
        self.workflow = workflow
        self.reward = reward
        self.repeat = repeat
        self.sampling = _as_sampling(sampling)
        self.workflow_args = dict(workflow_args or {})
        self.reward_args = dict(reward_args or {})
        self.on_bad_row = on_bad_row
        self.limit = limit
        self.id_key = id_key
        self._template_keys = _check_settings(self)
        self.skipped_rows = 0
        source = _iter_memory(path, split) if in_memory else iter_rows(self.path, split)
        self.tasks: list[Task] = self._build(source, origin or ("<rows>" if in_memory else str(self.path)))

    @classmethod
    def from_rows(cls, rows: Iterable[dict[str, Any]], **kwargs: Any) -> TaskSet:
        """Build a TaskSet from in-memory rows (e.g. from :func:`generate_arithmetic`); same keyword arguments."""
        return cls(list(rows), **kwargs)

    # -- Sequence ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, index):  # type: ignore[override]
        return self.tasks[index]

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __repr__(self) -> str:
        return (
            f"TaskSet(name={self.name!r}, path={str(self.path or self.generator or '<rows>')!r}, "
            f"tasks={len(self.tasks)}, "
            f"skipped_rows={self.skipped_rows})"
        )

    # -- building ---------------------------------------------------------------------------------

    def _build(self, rows: Iterable[SourceRow], source: str) -> list[Task]:
        tasks: list[Task] = []
        seen_ids: dict[str, str] = {}
        first_reason = None
        for index, (where, row) in enumerate(rows):
            if self.limit is not None and len(tasks) >= self.limit:
                break
            try:
                task = self._to_task(index, row)
                if task.task_id in seen_ids:
                    raise _BadRow(
                        f"task id {task.task_id!r} (from id_key={self.id_key!r}) repeats the one at "
                        f"{seen_ids[task.task_id]}; ids must be unique"
                    )
            except _BadRow as err:
                message = f"bad row at {where}: {err}"
                if self.on_bad_row == "error":
                    raise ValueError(
                        f"{message}. Fix the data, or pass on_bad_row='skip' to skip such rows."
                    ) from None
                self.skipped_rows += 1
                first_reason = first_reason or message
                continue
            seen_ids[task.task_id] = where
            tasks.append(task)
        if self.skipped_rows:
            logger.warning(
                "taskset %r: skipped %d bad rows; first: %s", self.name, self.skipped_rows, first_reason
            )
        if not tasks:
            why = (
                f"all {self.skipped_rows} rows were bad (first: {first_reason})"
                if self.skipped_rows
                else "no rows"
            )
            raise ValueError(
                f"taskset {self.name!r} from {source!r} is empty: {why}; point path at a dataset with rows."
            )
        return tasks

    def _to_task(self, index: int, row: Any) -> Task:
        if isinstance(row, _Unreadable):
            raise _BadRow(str(row))
        if not isinstance(row, dict):
            raise _BadRow(f"expected a JSON object (a dict of fields), got {type(row).__name__}")
        question = self._question(row)
        system_prompt = self.system_prompt
        if isinstance(question, list) and system_prompt is not None:
            if not question or question[0].get("role") != "system":
                question = [{"role": "system", "content": system_prompt}, *question]
            system_prompt = None
        answer = None if self.answer_key is None else _field(row, self.answer_key, "answer_key")
        task_id = f"{self.name}/{index}" if self.id_key is None else str(_field(row, self.id_key, "id_key"))
        return Task(
            task_id=task_id,
            question=question,
            answer=answer,
            raw=row,
            system_prompt=system_prompt,
            workflow=self.workflow,
            reward=self.reward,
            repeat=self.repeat,
            sampling=self.sampling.replace(),
            taskset=self.name,
            workflow_args=dict(self.workflow_args),
            reward_args=dict(self.reward_args),
        )

    def _question(self, row: dict[str, Any]) -> str | list[dict[str, str]]:
        if self.messages_key is not None:
            messages = _field(row, self.messages_key, "messages_key")
            if not _is_chat(messages) or not messages:
                raise _BadRow(
                    f"field {self.messages_key!r} (messages_key) must be a non-empty list of "
                    f"{{'role', 'content'}} messages, got {_short(messages)}"
                )
            return [dict(message) for message in messages]
        if self.prompt_template is not None:
            missing = [key for key in self._template_keys if row.get(key) is None]
            if missing:
                raise _BadRow(
                    f"prompt_template {self.prompt_template!r} needs field {missing[0]!r}, which the row "
                    f"lacks; the row has keys {sorted(row)}"
                )
            try:
                return self.prompt_template.format_map(row)
            except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
                raise _BadRow(
                    f"prompt_template {self.prompt_template!r} failed on this row: {err!r}"
                ) from None
        value = _field(row, self.prompt_key, "prompt_key")
        if isinstance(value, str) or _is_chat(value):
            return value if isinstance(value, str) else [dict(m) for m in value]
        if isinstance(value, (int, float)):
            return str(value)
        raise _BadRow(
            f"field {self.prompt_key!r} (prompt_key) must be text or a list of chat messages, got {_short(value)}"
        )


# -- settings ---------------------------------------------------------------------------------------


def _source(path: Any, generator: str | None, args: dict[str, Any], name: str) -> tuple[Any, str | None]:
    """``(path or the generated rows, a label for messages)``: exactly one of ``path`` and ``generator``."""
    if generator is None:
        if path is None:
            raise ValueError(
                f"taskset {name!r} has neither path nor generator; give path (a local data file) or "
                "generator (e.g. 'reasoning_gym' with generator_args {dataset: leg_counting})."
            )
        if args:
            raise ValueError(
                f"taskset {name!r}: generator_args={args} is given without a generator; remove it."
            )
        return path, None
    if path is not None:
        raise ValueError(
            f"taskset {name!r} has both path={str(path)!r} and generator={generator!r}; give one of them."
        )
    from trine.tasks.generators import generate_rows

    return generate_rows(generator, args, name), f"generator {generator!r} {args}"


def _as_sampling(sampling: SamplingParams | dict[str, Any] | None) -> SamplingParams:
    if sampling is None:
        return SamplingParams()
    if isinstance(sampling, SamplingParams):
        return sampling
    if isinstance(sampling, dict):
        valid = [f.name for f in fields(SamplingParams)]
        unknown = sorted(set(sampling) - set(valid))
        if unknown:
            raise ValueError(f"sampling has unknown field(s) {unknown}; valid fields are {valid}.")
        return SamplingParams(**sampling)
    raise TypeError(f"sampling={sampling!r}; expected a SamplingParams, a dict of its fields, or None.")


def _check_settings(ts: TaskSet) -> list[str]:
    """Validate the constructor arguments; return the row fields the prompt template needs."""
    if not isinstance(ts.name, str) or not ts.name:
        raise ValueError(f"name={ts.name!r}; expected a non-empty string such as 'train'.")
    if ts.on_bad_row not in BAD_ROW_MODES:
        raise ValueError(f"on_bad_row={ts.on_bad_row!r}; expected one of {BAD_ROW_MODES}.")
    if not isinstance(ts.repeat, int) or isinstance(ts.repeat, bool) or ts.repeat < 1:
        raise ValueError(f"repeat={ts.repeat!r}; expected an integer >= 1 (the group size).")
    if ts.limit is not None and (not isinstance(ts.limit, int) or ts.limit < 1):
        raise ValueError(f"limit={ts.limit!r}; expected None (all rows) or an integer >= 1.")
    if ts.messages_key is not None and ts.prompt_template is not None:
        raise ValueError(
            f"messages_key={ts.messages_key!r} and prompt_template={ts.prompt_template!r} are both set; "
            "give one: a chat field, or a template for a text prompt."
        )
    if ts.prompt_template is None:
        return []
    try:
        parsed = list(string.Formatter().parse(ts.prompt_template))
    except ValueError as err:
        raise ValueError(
            f"prompt_template {ts.prompt_template!r} is not a valid format string: {err}"
        ) from None
    keys: list[str] = []
    for _, field_name, _, _ in parsed:
        if field_name is None:
            continue
        key = field_name.split(".", 1)[0].split("[", 1)[0]
        if not key or key.isdigit():
            raise ValueError(
                f"prompt_template {ts.prompt_template!r} has a positional field {{{field_name}}}; "
                "name row fields instead, e.g. '{question}'."
            )
        if key not in keys:
            keys.append(key)
    return keys


# -- row helpers ------------------------------------------------------------------------------------


def _field(row: dict[str, Any], key: str, setting: str) -> Any:
    value = row.get(key)
    if value is None:
        state = "is null" if key in row else "is missing"
        raise _BadRow(
            f"key {key!r} ({setting}) {state}; the row has keys {sorted(row)} (set {setting} to the right field"
            + (", or answer_key=None if the rows carry no answer)" if setting == "answer_key" else ")")
        )
    return value


def _is_chat(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in value
    )


def _short(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"


class _Unreadable(str):
    """Stands in for a row that could not be parsed (the string is the reason)."""


# -- sources ----------------------------------------------------------------------------------------


def iter_rows(path: Path, split: str | None = None) -> Iterator[SourceRow]:
    """Yield ``(location, row)`` for every row of a local source (see the module docstring)."""
    if not path.exists():
        raise FileNotFoundError(
            f"taskset path {str(path)!r} does not exist; expected a .jsonl/.json/.parquet file or a dataset "
            "directory (relative paths are resolved from the current directory)."
        )
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            yield from _iter_saved(path, split)
            return
        files = _data_files(path, split)
        for file in files:
            yield from _iter_file(file)
        return
    if split is not None:
        raise ValueError(f"split={split!r} was given but {str(path)!r} is a single file; remove split.")
    yield from _iter_file(path)


def _iter_memory(rows: Sequence[Any], split: str | None) -> Iterator[SourceRow]:
    if split is not None:
        raise ValueError(f"split={split!r} was given for in-memory rows; remove split.")
    for number, row in enumerate(rows, start=1):
        yield f"<rows> row {number}", row


def _data_files(directory: Path, split: str | None) -> list[Path]:
    found = sorted(
        p
        for p in directory.rglob("*")
        if p.is_file() and p.suffix in FILE_SUFFIXES and not any(part.startswith(".") for part in p.parts)
    )
    if not found:
        raise FileNotFoundError(
            f"directory {str(directory)!r} holds no {'/'.join(FILE_SUFFIXES)} files and is not a "
            "datasets save_to_disk directory."
        )
    if split is None:
        return found
    chosen = [p for p in found if p.name.startswith(split) or split in p.relative_to(directory).parts[:-1]]
    if not chosen:
        names = [str(p.relative_to(directory)) for p in found][:20]
        raise ValueError(
            f"split={split!r}: no file in {str(directory)!r} starts with it or sits in a folder named after it; "
            f"files found: {names}."
        )
    return chosen


def _iter_file(path: Path) -> Iterator[SourceRow]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from _iter_jsonl(path)
    elif suffix == ".json":
        yield from _iter_json(path)
    elif suffix == ".parquet":
        yield from _iter_parquet(path)
    else:
        raise ValueError(
            f"taskset file {str(path)!r} has suffix {suffix!r}; expected one of {FILE_SUFFIXES}."
        )


def _iter_jsonl(path: Path) -> Iterator[SourceRow]:
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row: Any = json.loads(line)
            except json.JSONDecodeError as err:
                row = _Unreadable(f"not valid JSON ({err})")
            yield f"{path} line {number}", row


def _iter_json(path: Path) -> Iterator[SourceRow]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        yield from _iter_jsonl(path)  # JSON lines saved as .json
        return
    if not isinstance(data, list):
        raise ValueError(
            f"{str(path)!r} holds a JSON {type(data).__name__}; expected a list of row objects (or JSON lines)."
        )
    for number, row in enumerate(data, start=1):
        yield f"{path} row {number}", row


@contextmanager
def _quiet_datasets() -> Iterator[Any]:
    """Import ``datasets`` offline and without progress bars (restored afterwards)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield datasets
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _iter_parquet(path: Path) -> Iterator[SourceRow]:
    with _quiet_datasets() as datasets, tempfile.TemporaryDirectory() as cache:
        dataset = datasets.load_dataset(
            "parquet",
            data_files=[str(path.resolve())],
            split="train",
            cache_dir=cache,
            keep_in_memory=True,
            download_config=datasets.DownloadConfig(local_files_only=True),
        )
        rows = dataset.to_list()
    for number, row in enumerate(rows, start=1):
        yield f"{path} row {number}", row


def _iter_saved(path: Path, split: str | None) -> Iterator[SourceRow]:
    with _quiet_datasets() as datasets:
        loaded = datasets.load_from_disk(str(path), keep_in_memory=True)
        if isinstance(loaded, datasets.DatasetDict):
            splits = list(loaded)
            if split is None and len(splits) == 1:
                split = splits[0]
            if split not in loaded:
                raise ValueError(
                    f"{str(path)!r} is a DatasetDict with splits {splits}; got split={split!r}. "
                    f"Pass split= one of {splits}."
                )
            loaded = loaded[split]
        elif split is not None:
            raise ValueError(
                f"split={split!r} was given but {str(path)!r} is a single saved Dataset; remove split."
            )
        rows = loaded.to_list()
    label = f"{path} (split {split!r})" if split is not None else str(path)
    for number, row in enumerate(rows, start=1):
        yield f"{label} row {number}", row
