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
from sqlalchemy.sql.dml import Insert

from sa_jobs.job_key import detach_unavailable_holders, keyed_upsert
from sa_jobs.models import (
    CORE_COLUMNS,
    EXISTED_COLUMN,
    Job,
    JobState,
    job_state_type,
    json_recordset,
    states_bitmask,
    unique_index,
)
from sa_jobs.options import DEFAULT_UNIQUE_STATES, JobKeyMode
from sa_jobs.sequence import lock_keys_in, waits_in_sequence
from sa_jobs.sql import seconds_interval
from sa_jobs.unique import release_expired_locks, unique_duplicate

__all__ = ["ROWS_PARAM", "insert_statement", "jobs_insert", "rows_param", "statement_shape"]

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


def jobs_insert(
    rows: Sequence[dict[str, Any]],
    *,
    lock_sequences: bool = False,
    job_key_mode: JobKeyMode | None = None,
) -> Insert:
    """The one statement that inserts jobs: any number of rows, one bound parameter.

    ``rows`` come from :func:`build_rows`; rows sharing a unique key must have been
    folded (:func:`~sa_jobs.unique.fold_duplicates`). The statement returns the core job
    columns plus ``unique_skipped_as_duplicate``, one row per input row, in order: a
    unique row that met an existing job returns that job.

    Sequenced rows must be inserted under their sequences' advisory locks: the callers
    here take them with :func:`~sa_jobs.sequence.lock_sequence_keys` first;
    ``lock_sequences=True`` takes them inside the statement instead (for
    :func:`insert_job`), which keeps the one-active-job guarantee but, under contention,
    may end in a unique violation rather than a waiting job.

    With ``job_key_mode`` every row has a distinct job key and the statement is one
    round of a keyed add (:mod:`sa_jobs.job_key`): it returns a row only for jobs it
    inserted or met, plus the ``job_key`` column to match them up.

    A statement without unique, sequenced or keyed rows touches only core columns, so it
    works on a database that has only the core branch.
    """
    return _build_insert(
        **statement_shape(rows),
        lock_sequences=lock_sequences,
        job_key_mode=job_key_mode,
        bound=rows_param(rows)[ROWS_PARAM],
    )


#: The one bound parameter of every insert statement: the rows, as a JSON array.
ROWS_PARAM = "sa_jobs_rows"


def rows_param(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The parameters for :func:`insert_statement`; ``ord`` keeps ids in input order."""
    return {ROWS_PARAM: [{"ord": index, **row} for index, row in enumerate(rows)]}


def statement_shape(rows: Sequence[dict[str, Any]]) -> dict[str, bool]:
    """Which features the rows use, which decides the statement they need.

    ``numbered``: several unique rows, which go into the table in key order (see
    :func:`_build_insert`) and so take ids numbered in input order beforehand.
    """
    unique = any(row.get("unique_key") for row in rows)
    return {
        "unique": unique,
        "sequenced": any(row.get("sequence_key") for row in rows),
        "numbered": unique and len(rows) > 1,
    }


@functools.cache
def insert_statement(
    *,
    unique: bool,
    sequenced: bool,
    numbered: bool = False,
    lock_sequences: bool = False,
    job_key_mode: JobKeyMode | None = None,
) -> Insert:
    """The statement for rows of this shape, built once; execute it with
    :func:`rows_param`."""
    return _build_insert(
        unique=unique,
        sequenced=sequenced,
        numbered=numbered,
        lock_sequences=lock_sequences,
        job_key_mode=job_key_mode,
    )


#: The identity sequence of ``sa_job.id`` (PostgreSQL's name for it).
_ID_SEQUENCE = literal_column("'sa_job_id_seq'", Text)


def _build_insert(
    *,
    unique: bool,
    sequenced: bool,
    numbered: bool = False,
    lock_sequences: bool = False,
    job_key_mode: JobKeyMode | None = None,
    bound: Any = None,
) -> Insert:
    source = json_recordset(ROWS_PARAM, _ROW_COLUMNS, "job_rows", bound)
    if unique:
        # Releasing expired TTL locks reads the rows' keys as well: parse the JSON once.
        source = select(*source.c).cte("job_rows_parsed").prefix_with("MATERIALIZED")
    due_at = func.coalesce(source.c.scheduled_at, func.now())
    inserted = ~unique_duplicate(source.c.unique_key) if unique else None
    waits = (
        waits_in_sequence(source.c.sequence_key, source.c.ord, inserted) if sequenced else false()
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
    if sequenced:
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
        if lock_sequences:
            ctes.append(lock_keys_in(source.c.sequence_key).cte("sequence_locks"))
    if job_key_mode is not None:
        values.append(source.c.job_key)
        columns.append("job_key")
        if job_key_mode is not JobKeyMode.UNSAFE_DEDUPE:
            ctes.append(detach_unavailable_holders(source))
    # Unique rows go in key order: ON CONFLICT waits on rows one by one, and two batches
    # that met the same keys in different orders would deadlock; a global order cannot.
    # (write_rows maps the results back to input order.) Their ids still follow input
    # order — fetching breaks ties by id, so a batch runs first in, first out — because
    # they are drawn first and handed out smallest first to the first input row.
    order = (source.c.unique_key, source.c.ord) if unique else (source.c.ord,)
    rows_select = select(*values).order_by(*order)
    if numbered:
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
        # Referencing a data-modifying or locking CTE makes it run before the rows do.
        rows_select = rows_select.where(
            select(func.count()).select_from(cte).scalar_subquery() >= 0
        )
    statement = pg_insert(Job).from_select(columns, rows_select)
    for cte in ctes:
        statement = statement.add_cte(cte)
    if job_key_mode is not None:
        return keyed_upsert(statement, job_key_mode)
    if not unique:
        return statement.returning(*CORE_COLUMNS, sql_false().label(EXISTED_COLUMN))
    # River's trick: a no-op update makes the existing row come back from RETURNING,
    # and xmax tells the two cases apart. Nothing of the existing row changes.
    return statement.on_conflict_do_update(
        constraint=unique_index, set_={Job.__table__.c.kind: Job.__table__.c.kind}
    ).returning(*CORE_COLUMNS, literal_column("xmax <> 0", Boolean).label(EXISTED_COLUMN))
