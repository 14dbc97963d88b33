"""Table layout of :class:`~trine.buffer.sql.SQLBuffer` and the Experience <-> row codec.

One row per experience. Everything a query may want to filter or aggregate on is a real column;
the per-token arrays are stored compactly as little-endian bytes (``int32`` for ``tokens`` and
``action_mask``, ``float32`` for ``logprobs`` and ``token_rewards``; NULL where the field is None).

=================  ==============  =====================================================================
column             type            meaning
=================  ==============  =====================================================================
seq                integer (pk)    insertion order; the FIFO ``get`` hands out the oldest (lowest seq) first
id                 text, unique    ``Experience.id``
task_id            text            ``Experience.task_id``
taskset            text            ``info["taskset"]`` if present, else ""
group_id           text            ``Experience.group_id``
run_id             text            ``Experience.run_id``
step               integer         ``Experience.step``
policy_version     integer         ``Experience.policy_version``
reward             float, null     scalar reward; NULL while pending
reward_status      text            "pending" (reward unknown), "ready" (trainable), "dropped" (stale,
                                   or pending past the timeout: then ``expired_at`` is set),
                                   "rolled_back" (put after the checkpoint a crashed run resumed
                                   from; never handed out again, see ``SQLBuffer.load_state_dict``)
prompt_length      integer         ``Experience.prompt_length``
response_length    integer         ``len(tokens) - prompt_length``
created_at         float           the buffer's ``clock()`` at the ``put`` (unix time by default)
consumed_at        float, null     time of the ``get`` that took it for good; NULL until then
use_count          integer         how many times it was handed out (up to ``reuse_limit``)
priority           float           ``policy_version - use_count * reuse_decay`` (updated by the
                                   priority sampler, which hands out the highest first, ties:
                                   lowest seq; FIFO leaves it at ``policy_version``)
last_get           integer, null   number of the last ``get`` that handed it out (cooldown)
expired_at         float, null     time it expired while pending (dropped, or default reward)
kind               text            "rollout", "sft" or "preference"
status             text, null      how the trajectory ended: ``Experience.status`` (ok, truncated, timeout,
                                   env_error, tool_error, reward_error); NULL in rows of an older Trine
lineage            JSON            ``info["lineage"]`` if present (names of the operators applied), else []
tokens             bytes           int32 little-endian, prompt + response
action_mask        bytes           int32 little-endian, one per response token
logprobs           bytes, null     float32 little-endian, one per response token
token_rewards      bytes, null     float32 little-endian
info               JSON            ``Experience.info`` (the whole dict; the copies above are for queries)
task_seq           integer, null   ``info["task_seq"]``: the row's task in the task ledger of explorer
                                   processes (:mod:`trine.buffer.sql_tasks`); NULL otherwise
=================  ==============  =====================================================================

Beside it, the table ``<table>_batches`` (e.g. ``experiences_batches``) holds one row per ``put``:
the explored batches, which ``get(None)`` hands out whole (oldest first). It is written in the same
transaction as the put's rows, and created on opening a database made by an older Trine (which then
has no batch records for its rows).

=================  ==============  =====================================================================
column             type            meaning
=================  ==============  =====================================================================
batch              integer (pk)    autoincrement: put order
size               integer         ``len(experiences)`` of the put (0: every task was skipped or filtered)
created_at         float           the buffer's ``clock()`` at the ``put``
taken_at           float, null     time of the ``get(None)`` that took it; NULL until then
producer           text, null      who put it when several processes feed the table (``explorer-0``)
producer_batch     integer, null   that producer's own batch counter; (producer, producer_batch) is
                                   unique, so a restarted explorer never puts a batch twice
=================  ==============  =====================================================================

A plain query works on any backend, e.g.
``SELECT task_id, AVG(reward) FROM experiences WHERE reward_status = 'ready' GROUP BY task_id``.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

from trine.types import Experience

PENDING, READY, DROPPED, ROLLED_BACK = "pending", "ready", "dropped", "rolled_back"

BROWSE_COLUMNS = ("policy_version", "reward", "kind", "reward_status", "consumed_at", "task_id")
"""The columns of the ``browse`` index: the plain columns the studio's experience filters read (not
``expired_at``, which an older table may lack until it is opened: only the few dropped rows need it)."""

_INT32, _FLOAT32 = "i", "f"
assert array(_INT32).itemsize == 4 and array(_FLOAT32).itemsize == 4


def pack(values: list[int] | list[float] | None, code: str) -> bytes | None:
    """Little-endian bytes of ``values`` as int32 (``code="i"``) or float32 (``code="f"``)."""
    if values is None:
        return None
    try:
        arr = array(code, values)
    except OverflowError as err:
        raise ValueError(
            f"value out of int32 range in {list(values)[:8]}...; token ids and masks must fit in int32."
        ) from err
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def unpack(blob: bytes | None, code: str) -> list[Any] | None:
    """Inverse of :func:`pack`."""
    if blob is None:
        return None
    arr = array(code)
    arr.frombytes(bytes(blob))
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tolist()


def build_table(metadata: Any, name: str) -> Any:
    """The ``sqlalchemy.Table`` called ``name`` in ``metadata`` (imports SQLAlchemy)."""
    import sqlalchemy as sa

    seq_type = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # INTEGER PRIMARY KEY = rowid
    table = sa.Table(
        name,
        metadata,
        sa.Column("seq", seq_type, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(), nullable=False, unique=True),
        sa.Column("task_id", sa.String(), nullable=False, default=""),
        sa.Column("taskset", sa.String(), nullable=False, default=""),
        sa.Column("group_id", sa.String(), nullable=False, default=""),
        sa.Column("run_id", sa.String(), nullable=False, default=""),
        sa.Column("step", sa.Integer(), nullable=False, default=0),
        sa.Column("policy_version", sa.Integer(), nullable=False, default=0),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("reward_status", sa.String(16), nullable=False),
        sa.Column("prompt_length", sa.Integer(), nullable=False),
        sa.Column("response_length", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("consumed_at", sa.Float(), nullable=True),
        sa.Column("use_count", sa.Integer(), nullable=False, default=0),
        sa.Column("priority", sa.Float(), nullable=False, default=0.0),
        sa.Column("last_get", sa.Integer(), nullable=True),
        sa.Column("expired_at", sa.Float(), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False, default="rollout"),
        sa.Column("status", sa.String(16), nullable=True),  # NULL (a row of an older Trine) = "ok"
        sa.Column("lineage", sa.JSON(), nullable=False),
        sa.Column("tokens", sa.LargeBinary(), nullable=False),
        sa.Column("action_mask", sa.LargeBinary(), nullable=False),
        sa.Column("logprobs", sa.LargeBinary(), nullable=True),
        sa.Column("token_rewards", sa.LargeBinary(), nullable=True),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.Column("task_seq", sa.BigInteger(), nullable=True),  # its task in the ledger (explorer processes)
        # get(): unconsumed rows of one status in seq order; set_rewards by (task_id, run_id).
        sa.Index(f"ix_{name}_claim", "reward_status", "consumed_at", "seq"),
        sa.Index(f"ix_{name}_task_run", "task_id", "run_id"),
        sa.Index(f"ix_{name}_run", "run_id"),  # find_runs (trine serve: a response's rows)
        sa.Index(f"ix_{name}_group", "group_id"),
        sa.Index(f"ix_{name}_last_get", "last_get"),
        # the studio's experience browser (trine.studio.experience_sql): its filters and counts read
        # this narrow covering index instead of the wide rows (100k rows: ~5 ms instead of ~200 ms)
        sa.Index(f"ix_{name}_browse", *BROWSE_COLUMNS),
    )
    # ... and its info["batch"] / info["finish_reason"] filters these, which also cover the browse
    # columns, so any mix of filters is answered from one index (SQLite only: there CAST never fails,
    # while on PostgreSQL a non-integer "batch" would make the put fail)
    batch, finish = table.c.info["batch"].as_integer(), table.c.info["finish_reason"].as_string()
    sa.Index(f"ix_{name}_batch", batch, finish, *BROWSE_COLUMNS).ddl_if(dialect="sqlite")
    sa.Index(f"ix_{name}_finish", finish, batch, *BROWSE_COLUMNS).ddl_if(dialect="sqlite")
    return table


def build_batches_table(metadata: Any, name: str) -> Any:
    """The ``sqlalchemy.Table`` ``<name>_batches`` in ``metadata``: one row per put (see above)."""
    import sqlalchemy as sa

    batch_type = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # INTEGER PRIMARY KEY = rowid
    return sa.Table(
        f"{name}_batches",
        metadata,
        sa.Column("batch", batch_type, primary_key=True, autoincrement=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("taken_at", sa.Float(), nullable=True),
        sa.Column("producer", sa.String(), nullable=True),
        sa.Column("producer_batch", sa.Integer(), nullable=True),
        # get(None): the oldest batch not taken yet.
        sa.Index(f"ix_{name}_batches_open", "taken_at", "batch"),
        # a producer (an explorer process) puts each of its batches once: its cursor survives a kill
        sa.UniqueConstraint("producer", "producer_batch", name=f"uq_{name}_batches_producer"),
    )


def add_missing_columns(conn: Any, table: Any) -> list[str]:
    """Add the nullable columns a table made by an older Trine lacks; returns their names."""
    import sqlalchemy as sa

    present = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
    added = [c for c in table.columns if c.name not in present and c.nullable]
    for column in added:
        kind = column.type.compile(dialect=conn.dialect)
        conn.execute(sa.text(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}"))
    return [c.name for c in added]


def experience_to_row(e: Experience, now: float) -> dict[str, Any]:
    """The column values that store ``e`` (put at unix time ``now``)."""
    info = dict(e.info)
    lineage = info.get("lineage", [])
    return {
        "id": e.id,
        "task_id": e.task_id,
        "taskset": str(info.get("taskset", "")),
        "group_id": e.group_id,
        "run_id": e.run_id,
        "step": int(e.step),
        "policy_version": int(e.policy_version),
        "reward": None if e.reward is None else float(e.reward),
        "reward_status": PENDING if e.reward is None else READY,
        "prompt_length": int(e.prompt_length),
        "response_length": e.response_length,
        "created_at": now,
        "consumed_at": None,
        "use_count": 0,
        "priority": float(e.policy_version),  # use_count 0
        "last_get": None,
        "expired_at": None,
        "kind": e.kind,
        "status": e.status,
        "lineage": [str(x) for x in lineage] if isinstance(lineage, (list, tuple)) else [str(lineage)],
        "tokens": pack(e.tokens, _INT32),
        "action_mask": pack(e.action_mask, _INT32),
        "logprobs": pack(e.logprobs, _FLOAT32),
        "token_rewards": pack(e.token_rewards, _FLOAT32),
        "info": info,
        "task_seq": info.get("task_seq"),
    }


def row_to_experience(row: Any) -> Experience:
    """Rebuild the Experience stored in ``row`` (a SQLAlchemy Row or a mapping)."""
    m = row._mapping if hasattr(row, "_mapping") else row
    return Experience(
        id=m["id"],
        tokens=unpack(m["tokens"], _INT32) or [],
        prompt_length=m["prompt_length"],
        action_mask=unpack(m["action_mask"], _INT32) or [],
        logprobs=unpack(m["logprobs"], _FLOAT32),
        reward=m["reward"],
        token_rewards=unpack(m["token_rewards"], _FLOAT32),
        task_id=m["task_id"],
        group_id=m["group_id"],
        run_id=m["run_id"],
        step=m["step"],
        policy_version=m["policy_version"],
        kind=m["kind"],
        status=m.get("status") or "ok",
        info=dict(m["info"] or {}),
    )
