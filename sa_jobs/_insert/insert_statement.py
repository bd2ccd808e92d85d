"""The INSERT statement every insert path sends: built once per shape, bound per call.

``INSERT INTO sa_job ... SELECT ... FROM jsonb_to_recordset(:sa_jobs_rows) ORDER BY ord``
takes any number of rows through one bound parameter. Which features the rows use —
unique keys, sequences, a job-key mode — decides the shape: extra columns, the CTEs that
must run first (TTL releases, sequence locks, detaching running key holders) and the
``ON CONFLICT`` clause. The state is decided by the database clock.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import attrs
from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    LargeBinary,
    SmallInteger,
    Text,
    and_,
    case,
    column,
    false,
    func,
    literal_column,
    not_,
    null,
    select,
)
from sqlalchemy import DateTime as SADateTime
from sqlalchemy import cast as sql_cast
from sqlalchemy import false as sql_false
from sqlalchemy.dialects.postgresql import ARRAY, BIT, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.dml import Insert

from sa_jobs._base.records import JobRow
from sa_jobs._base.sql import json_recordset, runs_first, seconds_interval
from sa_jobs._base.states import JobState
from sa_jobs._declare.options import DEFAULT_UNIQUE_STATES, JobKeyMode
from sa_jobs._insert.job_key import detach_unavailable_holders, keyed_upsert
from sa_jobs._insert.sequence import lock_keys_in, waits_in_sequence
from sa_jobs._insert.unique import release_expired_locks, unique_duplicate
from sa_jobs._table.feature_indexes import unique_index
from sa_jobs._table.models import CORE_COLUMNS, EXISTED_COLUMN, Job, job_state_type, states_bitmask

__all__ = [
    "MET_COLUMNS",
    "ROWS_PARAM",
    "SENT_COLUMNS",
    "InsertShape",
    "build_insert",
    "in_input_order",
    "insert_statement",
    "met_values",
    "returns_met_columns",
    "rows_param",
    "sent_values",
    "shape_of",
]

# The shape of one element of the :rows parameter; "ord" keeps ids in input order.
_ROW_COLUMNS = (
    column("ord", Integer),
    column("kind", Text),
    column("args", JSONB),
    column("queue", Text),
    column("priority", SmallInteger),
    column("max_attempts", SmallInteger),
    column("tags", ARRAY(Text)),
    column("metadata", JSONB),
    column("scheduled_at", SADateTime(timezone=True)),
    column("unique_key", LargeBinary),
    column("unique_states", BIT(8)),
    column("unique_ttl", Float),
    column("unique_until_start", Boolean),
    column("sequence_key", LargeBinary),
    column("sequence_continue_on_cancelled", Boolean),
    column("sequence_continue_on_discarded", Boolean),
    column("job_key", Text),
)
#: Read only from rows that have one, so other inserts' SQL is what it was before keys.
_PARTITION_KEY_COLUMN = column("partition_key", Text)

#: What a unique row without ``unique_states`` blocks in (unique.py leaves the default out).
_DEFAULT_UNIQUE_STATES = literal_column(f"B'{states_bitmask(DEFAULT_UNIQUE_STATES)}'", BIT(8))

_INSERTED_COLUMNS = (
    "kind",
    "args",
    "state",
    "queue",
    "priority",
    "max_attempts",
    "tags",
    "metadata",
    "scheduled_at",
)


#: A row ``INSERT … ON CONFLICT DO UPDATE`` returns existed before the statement (River's
#: trick: the no-op update leaves ``xmax`` set on the existing row only).
_EXISTED = literal_column("xmax <> 0", Boolean)

#: The identity sequence of ``sa_job.id`` (PostgreSQL's name for it).
_ID_SEQUENCE = literal_column("'sa_job_id_seq'", Text)


#: The one bound parameter of every insert statement: the rows, as a JSON array.
ROWS_PARAM = "sa_jobs_rows"


@attrs.frozen
class InsertShape:
    """What decides the statement a batch of rows needs (one statement is built per shape).

    Attributes:
        unique: Some rows have a unique key: ``ON CONFLICT`` against the unique index, and
            expired TTL locks of their keys are released first.
        sequenced: Some rows join a sequence: they take its slot or wait ``pending``.
        numbered: Several unique rows: inserted in key order, ids drawn in input order.
        lock_sequences: Take the sequences' advisory locks inside the statement (for
            ``insert_job``, whose caller sends nothing before it).
        job_key_mode: Every row has a distinct job key; one round of a keyed add.
        partitioned: Some rows have a partition key (their kind's ``partition_by``).
    """

    unique: bool = False
    sequenced: bool = False
    numbered: bool = False
    lock_sequences: bool = False
    job_key_mode: JobKeyMode | None = None
    partitioned: bool = False


def shape_of(
    rows: Sequence[JobRow], *, lock_sequences: bool = False, job_key_mode: JobKeyMode | None = None
) -> InsertShape:
    """The shape of the statement that inserts ``rows``."""
    unique = any(row.get("unique_key") for row in rows)
    return InsertShape(
        unique=unique,
        sequenced=any(row.get("sequence_key") for row in rows),
        numbered=unique and len(rows) > 1,
        lock_sequences=lock_sequences,
        job_key_mode=job_key_mode,
        partitioned=any(row.get("partition_key") for row in rows),
    )


def rows_param(rows: Sequence[JobRow]) -> dict[str, Any]:
    """The parameters of :func:`insert_statement`; ``ord`` is each row's input position."""
    return {ROWS_PARAM: [{"ord": index, **row} for index, row in enumerate(rows)]}


def in_input_order(sent: Sequence[JobRow], returned: list[Any]) -> list[Any]:
    """Put the rows a unique statement returned back in input order.

    The statement inserts unique rows ordered by ``(unique_key, ord)`` (see
    :func:`insert_statement`) and returns them in that order; hex keys of equal length
    sort as the bytes do, and rows without a key come last, as PostgreSQL sorts NULLs.
    """
    order = sorted(
        range(len(sent)),
        key=lambda i: (sent[i].get("unique_key") is None, sent[i].get("unique_key") or "", i),
    )
    by_input: list[Any] = [None] * len(sent)
    for position, index in enumerate(order):
        by_input[index] = returned[position]
    return by_input


#: What a statement without a job key does not read back for the rows it wrote: they hold
#: what was sent (``args``, ``metadata``) or the default (``errors``), and the insert
#: paths fill them in from the sent rows (:func:`sent_values`) instead of decoding three
#: JSON documents per row, a quarter of ``insert_many``'s CPU. For an existing job a
#: unique row met, a unique statement returns them as :data:`MET_COLUMNS` (NULL for the
#: rows it wrote; a plain statement meets nothing and leaves them out), so
#: a duplicate costs no second round trip.
SENT_COLUMNS = ("args", "metadata", "errors")
#: ``met_args``, ``met_metadata``, ``met_errors``: the columns of a job the insert met.
MET_COLUMNS = tuple(f"met_{name}" for name in SENT_COLUMNS)
_READ_BACK_COLUMNS = tuple(c for c in CORE_COLUMNS if c.name not in SENT_COLUMNS)


def sent_values(row: JobRow) -> dict[str, Any]:
    """The :data:`SENT_COLUMNS` of a row an insert wrote, by column name."""
    return {"args": row["args"], "metadata": row["metadata"], "errors": []}


def met_values(values: Sequence[Any]) -> dict[str, Any]:
    """The :data:`SENT_COLUMNS` of a job an insert met, from its :data:`MET_COLUMNS`."""
    return dict(zip(SENT_COLUMNS, values, strict=True))


def returns_met_columns(statement: Insert) -> bool:
    """Whether ``statement`` returns :data:`MET_COLUMNS` (a unique one built here does; a
    plain one meets nothing, and leaves them out rather than send NULLs per row)."""
    return MET_COLUMNS[0] in statement.exported_columns


def _met_columns(existed: ColumnElement[bool]) -> list[Any]:
    """:data:`MET_COLUMNS`: the stored values where the row existed, else NULL."""
    table = Job.__table__
    return [
        case((existed, table.c[name]), else_=null()).label(met)
        for name, met in zip(SENT_COLUMNS, MET_COLUMNS, strict=True)
    ]


@functools.cache
def insert_statement(shape: InsertShape) -> Insert:
    """The INSERT for rows of ``shape``, built once; execute it with :func:`rows_param`.

    A statement without a job key leaves :data:`SENT_COLUMNS` out of its ``RETURNING``.
    """
    return build_insert(shape, read_back_sent=False)


def build_insert(
    shape: InsertShape, rows: Sequence[JobRow] | None = None, *, read_back_sent: bool = True
) -> Insert:
    """The INSERT for rows of ``shape``; with ``rows``, carrying them (for ``insert_job``).

    It returns the core job columns plus ``unique_skipped_as_duplicate``, one row per
    input row: a unique row that met an existing job returns that job (River's no-op
    update). With a ``job_key_mode`` it returns a row only for jobs it inserted or met,
    plus ``job_key`` and ``revision`` to match them up (:mod:`sa_jobs._insert.job_key`).
    Without ``read_back_sent``, a statement without a job key returns every core column
    but :data:`SENT_COLUMNS`.

    Sequenced rows must be inserted under their sequences' advisory locks: the insert
    paths take them first (:func:`sa_jobs._insert.sequence.lock_keys`); with
    ``lock_sequences`` the statement takes them itself, which keeps the one-active-job
    guarantee but, under contention, may end in a unique violation rather than a
    waiting job. A statement without unique, sequenced or keyed rows touches only core
    columns, so it works on a database that has only the core branch.
    """
    unique = shape.unique
    value = rows_param(rows)[ROWS_PARAM] if rows is not None else None
    row_columns = (*_ROW_COLUMNS, _PARTITION_KEY_COLUMN) if shape.partitioned else _ROW_COLUMNS
    source: Any = json_recordset(ROWS_PARAM, row_columns, "job_rows", value)
    if unique:
        # Releasing expired TTL locks reads the rows' keys as well: parse the JSON once.
        source = select(*source.c).cte("job_rows_parsed").prefix_with("MATERIALIZED")
    due_at = func.coalesce(source.c.scheduled_at, func.now())
    inserted = ~unique_duplicate(source.c.unique_key) if unique else None
    waits = (
        waits_in_sequence(source.c.sequence_key, source.c.ord, inserted)
        if shape.sequenced
        else false()
    )
    state = case(
        (waits, JobState.PENDING.value),
        (due_at > func.now(), JobState.SCHEDULED.value),
        else_=JobState.AVAILABLE.value,
    )
    values: list[Any] = [
        source.c.kind,
        source.c.args,
        sql_cast(state, job_state_type),
        source.c.queue,
        source.c.priority,
        source.c.max_attempts,
        source.c.tags,
        source.c.metadata,
        due_at,
    ]
    columns = list(_INSERTED_COLUMNS)
    ctes = []
    if unique:
        ttl = seconds_interval(source.c.unique_ttl)
        values += [
            source.c.unique_key,
            case(
                (
                    source.c.unique_key.is_not(None),
                    func.coalesce(source.c.unique_states, _DEFAULT_UNIQUE_STATES),
                ),
                else_=null(),
            ),
            # Faktory: the lock lasts ttl from the later of now and scheduled_at.
            case(
                (source.c.unique_ttl.is_not(None), func.greatest(due_at, func.now()) + ttl),
                else_=null(),
            ),
            func.coalesce(source.c.unique_until_start, False),
        ]
        columns += ["unique_key", "unique_states", "unique_expires_at", "unique_until_start"]
        ctes.append(release_expired_locks(source))
    if shape.sequenced:
        values += [
            source.c.sequence_key,
            and_(source.c.sequence_key.is_not(None), not_(waits)),
            func.coalesce(source.c.sequence_continue_on_cancelled, False),
            func.coalesce(source.c.sequence_continue_on_discarded, False),
        ]
        columns += [
            "sequence_key",
            "sequence_slot",
            "sequence_continue_on_cancelled",
            "sequence_continue_on_discarded",
        ]
        if shape.lock_sequences:
            ctes.append(lock_keys_in(source.c.sequence_key).cte("sequence_locks"))
    if shape.partitioned:
        values.append(source.c.partition_key)
        columns.append("partition_key")
    if shape.job_key_mode is not None:
        values.append(source.c.job_key)
        columns.append("job_key")
        if shape.job_key_mode is not JobKeyMode.UNSAFE_DEDUPE:
            ctes.append(detach_unavailable_holders(source))
    # Unique rows go in key order: ON CONFLICT waits on rows one by one, and two batches
    # that met the same keys in different orders would deadlock; a global order cannot.
    # (write_rows maps the results back to input order.) Their ids still follow input
    # order — fetching breaks ties by id, so a batch runs first in, first out — because
    # they are drawn first and handed out smallest first to the first input row.
    order = (source.c.unique_key, source.c.ord) if unique else (source.c.ord,)
    rows_select = select(*values).order_by(*order)
    if shape.numbered:
        drawn = (
            select(func.nextval(_ID_SEQUENCE).label("id"))
            .select_from(source)
            .cte("drawn_ids")
            .prefix_with("MATERIALIZED")
        )
        ranked = select(
            drawn.c.id, func.row_number().over(order_by=drawn.c.id).label("position")
        ).subquery("ranked_ids")
        rows_select = rows_select.add_columns(ranked.c.id).join_from(
            source, ranked, ranked.c.position == source.c.ord + 1
        )
        columns.append("id")
    for cte in ctes:
        rows_select = runs_first(rows_select, cte)
    statement = pg_insert(Job).from_select(columns, rows_select)
    for cte in ctes:
        statement = statement.add_cte(cte)
    if shape.job_key_mode is not None:
        return keyed_upsert(statement, shape.job_key_mode, partitioned=shape.partitioned)
    if not unique:
        returned = CORE_COLUMNS if read_back_sent else _READ_BACK_COLUMNS
        return statement.returning(*returned, sql_false().label(EXISTED_COLUMN))
    # River's trick: a no-op update makes the existing row come back from RETURNING,
    # and xmax tells the two cases apart. Nothing of the existing row changes.
    return statement.on_conflict_do_update(
        constraint=unique_index, set_={Job.__table__.c.kind: Job.__table__.c.kind}
    ).returning(
        *(CORE_COLUMNS if read_back_sent else _READ_BACK_COLUMNS),
        _EXISTED.label(EXISTED_COLUMN),
        *([] if read_back_sent else _met_columns(_EXISTED)),
    )
