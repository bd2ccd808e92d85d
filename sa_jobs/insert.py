"""Putting jobs into the table, always inside the caller's transaction.

Every path ends in the same Core construct, :func:`jobs_insert`: one
``INSERT ... SELECT FROM jsonb_to_recordset(:rows)`` statement whatever the number of
rows, so a batch of 10,000 is one round trip with one bound parameter. The state is
decided by the database clock (a future ``scheduled_at`` makes the job ``scheduled``),
never by the application host's clock.

* :func:`enqueue` returns a pending :class:`~sa_jobs.models.Job` for ``session.add``; a
  ``before_flush`` hook sends all of a flush's pending jobs as one statement.
* :func:`insert` and :func:`insert_many` execute at once and return :class:`InsertResult`.
* :func:`insert_job` returns the construct for you to execute or compose.

Workers learn about new jobs from a statement-level trigger installed by the core
migration: it sends one ``NOTIFY`` per queue per statement, and PostgreSQL folds
identical notifications within a transaction, so a transaction notifies each queue once.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
from sqlalchemy import (
    Boolean,
    Connection,
    Float,
    Integer,
    LargeBinary,
    SmallInteger,
    Text,
    and_,
    bindparam,
    case,
    column,
    event,
    false,
    func,
    inspect,
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
from sqlalchemy.orm import Session, UOWTransaction
from sqlalchemy.sql.dml import Insert

from sa_jobs.args import (
    JobKind,
    KindDefaults,
    check_json_document,
    check_kind_name,
    default_registry,
    encode_args,
)
from sa_jobs.models import CORE_COLUMNS, Job, JobState, job_state_type, unique_index
from sa_jobs.options import InsertOpts, ResolvedInsert
from sa_jobs.schema import translate_missing_schema
from sa_jobs.sequence import lock_sequence_keys, sequence_values, waits_in_sequence
from sa_jobs.unique import fold_duplicates, release_expired_locks, unique_values

__all__ = [
    "InsertManyParams",
    "InsertResult",
    "enqueue",
    "insert",
    "insert_job",
    "insert_many",
    "jobs_insert",
]

#: The label of the extra boolean column every insert returns.
SKIPPED_COLUMN = "unique_skipped_as_duplicate"


@attrs.frozen
class InsertResult:
    """What an insert did.

    Attributes:
        job: The inserted job, or the existing one when the insert was skipped.
        unique_skipped_as_duplicate: True when an existing job made this insert a no-op.
    """

    job: Job
    unique_skipped_as_duplicate: bool = False


@attrs.frozen
class InsertManyParams:
    """One entry of :func:`insert_many` with its own options."""

    args: object
    opts: InsertOpts = attrs.field(factory=InsertOpts)


# --------------------------------------------------------------------------- rows


def _job_row(kind: JobKind, args_json: Any, opts: InsertOpts) -> dict[str, Any]:
    return _row_from(kind, kind.name, args_json, opts.resolve(kind.defaults))


def _row_from(
    kind: JobKind | None, kind_name: str, args_json: Any, resolved: ResolvedInsert
) -> dict[str, Any]:
    row = {
        "kind": kind_name,
        "args": args_json,
        "queue": resolved.queue,
        "priority": resolved.priority,
        "max_attempts": resolved.max_attempts,
        "tags": list(resolved.tags),
        "metadata": resolved.metadata,
        "scheduled_at": _iso(resolved.scheduled_at),
    }
    if kind is not None:
        row.update(unique_values(kind, args_json, resolved, dt.datetime.now(dt.UTC)))
        row.update(sequence_values(kind, args_json, resolved))
    return row


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def build_rows(items: Iterable[tuple[object, InsertOpts]]) -> list[dict[str, Any]]:
    """Validate and convert every item before any SQL is sent."""
    rows = []
    for args, opts in items:
        kind, args_json = encode_args(args)
        rows.append(_job_row(kind, args_json, opts))
    return rows


# --------------------------------------------------------------------------- statement

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
)

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


def jobs_insert(rows: Sequence[dict[str, Any]], *, lock_sequences: bool = False) -> Insert:
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

    A statement without unique or sequenced rows touches only core columns, so it works
    on a database that has only the core branch.
    """
    numbered = [{"ord": index, **row} for index, row in enumerate(rows)]
    source = (
        func.jsonb_to_recordset(bindparam("sa_jobs_rows", numbered, type_=JSONB))
        .table_valued(*_ROW_COLUMNS)
        .render_derived(name="job_rows", with_types=True)
    )
    unique = any(row.get("unique_key") for row in rows)
    sequenced = any(row.get("sequence_key") for row in rows)
    due_at = func.coalesce(source.c.scheduled_at, func.now())
    waits = waits_in_sequence(source.c.sequence_key, source.c.ord) if sequenced else false()
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
        ttl = func.make_interval(0, 0, 0, 0, 0, 0, source.c.unique_ttl)
        values += [
            source.c.unique_key,
            source.c.unique_states,
            case((source.c.unique_ttl.is_not(None), due_at + ttl), else_=null()),
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
            keys = [row["sequence_key"] for row in rows if row.get("sequence_key")]
            ctes.append(lock_sequence_keys(keys).cte("sequence_locks"))
    rows_select = select(*values).order_by(source.c.ord)
    for cte in ctes:
        # Referencing a data-modifying or locking CTE makes it run before the rows do.
        rows_select = rows_select.where(
            select(func.count()).select_from(cte).scalar_subquery() >= 0
        )
    statement = pg_insert(Job).from_select(columns, rows_select)
    for cte in ctes:
        statement = statement.add_cte(cte)
    if not unique:
        return statement.returning(*CORE_COLUMNS, sql_false().label(SKIPPED_COLUMN))
    # River's trick: a no-op update makes the existing row come back from RETURNING,
    # and xmax tells the two cases apart. Nothing of the existing row changes.
    return statement.on_conflict_do_update(
        constraint=unique_index, set_={"kind": statement.excluded.kind}
    ).returning(*CORE_COLUMNS, literal_column("xmax <> 0", Boolean).label(SKIPPED_COLUMN))


def lock_sequences_of(connection: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Take the advisory locks of the rows' sequences before inserting them."""
    keys = [row["sequence_key"] for row in rows if row.get("sequence_key")]
    if keys:
        connection.execute(lock_sequence_keys(keys))


# --------------------------------------------------------------------------- public paths


def insert_job(args: object, opts: InsertOpts | None = None, **options: Any) -> Insert:
    """Return a Core ``Insert`` for one job, for ``session.execute`` or composition.

    Options are those of :class:`~sa_jobs.options.InsertOpts`, as an instance or as
    keywords. Executing the statement returns one row: the job's columns and
    ``unique_skipped_as_duplicate``.
    """
    return jobs_insert(build_rows([(args, _opts(opts, options))]), lock_sequences=True)


def insert(
    session: Session, args: object, opts: InsertOpts | None = None, **options: Any
) -> InsertResult:
    """Insert one job in the session's transaction and return it.

    For an ``AsyncSession``: ``await session.run_sync(sa_jobs.insert, args, ...)``.
    """
    return insert_many(session, [InsertManyParams(args, _opts(opts, options))])[0]


def insert_many(
    session: Session,
    items: Iterable[object | InsertManyParams],
    opts: InsertOpts | None = None,
    *,
    batch_size: int = 10_000,
    **options: Any,
) -> list[InsertResult]:
    """Insert many jobs with one statement per ``batch_size`` rows; results keep input order.

    ``items`` are job args instances (which take ``opts``/keywords) or
    :class:`InsertManyParams` carrying their own options. Everything is validated before
    the first statement is sent.
    """
    shared = _opts(opts, options)
    pairs = [
        (item.args, item.opts) if isinstance(item, InsertManyParams) else (item, shared)
        for item in items
    ]
    rows = build_rows(pairs)
    results: list[InsertResult] = []
    for start in range(0, len(rows), batch_size):
        sent, answers = fold_duplicates(rows[start : start + batch_size])
        statement = (
            select(Job, column(SKIPPED_COLUMN, Boolean))
            .from_statement(jobs_insert(sent))
            .execution_options(populate_existing=True)
        )
        with translate_missing_schema():
            lock_sequences_of(session.connection(), sent)
            returned = session.execute(statement).all()
        for position, answer in enumerate(answers):
            job, skipped = returned[answer]
            # A row folded into an earlier one of the same batch is that one's duplicate.
            folded = answers.index(answer) != position
            results.append(InsertResult(job, bool(skipped) or folded))
    _attach_args(results, pairs)
    return results


def _attach_args(results: Sequence[InsertResult], pairs: Sequence[tuple[object, Any]]) -> None:
    # The caller already holds the args instances; spare job.args a decode.
    for result, (args, _) in zip(results, pairs, strict=True):
        if not result.unique_skipped_as_duplicate:
            result.job.__dict__["_sa_jobs_args"] = args


def _opts(opts: InsertOpts | None, options: dict[str, Any]) -> InsertOpts:
    if opts is not None and options:
        return attrs.evolve(opts, **options)
    if options:
        return InsertOpts(**options)
    return opts if opts is not None else InsertOpts()


# --------------------------------------------------------------------------- session.add


def enqueue(args: object, opts: InsertOpts | None = None, **options: Any) -> Job:
    """Return a new :class:`Job` for ``session.add``; it is inserted at the next flush.

    Args and options are validated now. Nothing is written until the session flushes,
    and a rollback leaves no job. After the flush, ``job.id`` and every column are
    set from the row the database wrote.
    """
    insert_opts = _opts(opts, options)
    kind, args_json = encode_args(args)
    row = _job_row(kind, args_json, insert_opts)
    job = Job(
        kind=row["kind"],
        args_json=row["args"],
        queue=row["queue"],
        priority=row["priority"],
        max_attempts=row["max_attempts"],
        tags=row["tags"],
        metadata_=row["metadata"],
        scheduled_at=insert_opts.scheduled_at,
    )
    job.__dict__["_sa_jobs_args"] = args
    job.__dict__["_sa_jobs_row"] = row
    job.__dict__["_sa_jobs_order"] = next(_enqueue_order)
    return job


# Orders a flush's pending jobs as they were enqueued, so ids follow program order.
_enqueue_order = itertools.count()


def _pending_row(job: Job) -> dict[str, Any]:
    row = job.__dict__.get("_sa_jobs_row")
    if row is not None:
        return dict(row)
    # A Job built by hand (say, for a kind another service handles): validate its
    # attributes like any other insert and fill in what it leaves out.
    opts = InsertOpts(
        queue=job.queue,
        priority=job.priority,
        max_attempts=job.max_attempts,
        tags=job.tags,
        metadata=job.metadata_,
        scheduled_at=job.scheduled_at,
    )
    registered = default_registry.get(job.kind) if job.kind in default_registry else None
    defaults = registered.defaults if registered is not None else KindDefaults()
    check_kind_name(job.kind)
    args_json = job.args_json if job.args_json is not None else {}
    check_json_document(args_json, f"job of kind {job.kind!r}")
    return _row_from(registered, job.kind, args_json, opts.resolve(defaults))


@event.listens_for(Session, "before_flush")
def _insert_pending_jobs(session: Session, _flush: UOWTransaction, _objects: Any) -> None:
    """Insert the flush's pending jobs through :func:`jobs_insert` instead of the ORM."""
    pending = [obj for obj in session.new if isinstance(obj, Job)]
    if not pending:
        return
    pending.sort(key=lambda job: job.__dict__.get("_sa_jobs_order", -1))
    sent, answers = fold_duplicates([_pending_row(job) for job in pending])
    with translate_missing_schema():
        lock_sequences_of(session.connection(), sent)
        returned = session.connection().execute(jobs_insert(sent)).mappings().all()
    for position, (job, answer) in enumerate(zip(pending, answers, strict=True)):
        _become_row(session, job, returned[answer], folded=answers.index(answer) != position)


def _become_row(session: Session, job: Job, row: Any, *, folded: bool) -> None:
    for attribute in Job.__mapper__.column_attrs:
        name = attribute.columns[0].name
        if name in row:
            setattr(job, attribute.key, row[name])
    job.unique_skipped_as_duplicate = bool(row[SKIPPED_COLUMN]) or folded
    job.__dict__.pop("_sa_jobs_row", None)
    state = inspect(job)
    key = Job.__mapper__.identity_key_from_primary_key((job.id,))
    if key in session.identity_map:
        # The row is already represented in this session (a duplicate of a job loaded
        # earlier): keep that object canonical and leave this one detached.
        session.expunge(job)
        return
    # What the unit of work does for a flushed pending object: give it its identity key,
    # put it in the identity map, reset attribute history, and record it as new in the
    # transaction so that a rollback expunges it like any other flushed object.
    session._register_persistent({state})
