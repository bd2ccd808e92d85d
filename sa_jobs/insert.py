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

import collections
import datetime as dt
import enum
import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
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
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from sa_jobs.args import (
    JobKind,
    encode_args,
)
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.job_key import detach_running_holders, insert_keyed, keyed_upsert
from sa_jobs.models import (
    CORE_COLUMNS,
    EXISTED_COLUMN,
    Job,
    JobState,
    job_state_type,
    json_recordset,
    unique_index,
)
from sa_jobs.options import InsertOpts, JobKeyMode, ResolvedInsert
from sa_jobs.schema import STATEMENT_OPTION, translate_missing_schema
from sa_jobs.sequence import lock_keys_in, lock_sequence_keys, sequence_values, waits_in_sequence
from sa_jobs.unique import (
    fold_duplicates,
    lock_unique_keys,
    release_expired_locks,
    unique_duplicate,
    unique_values,
)

__all__ = [
    "InsertManyParams",
    "InsertResult",
    "insert",
    "insert_job",
    "insert_many",
    "jobs_insert",
]

SKIPPED_COLUMN = EXISTED_COLUMN


class InsertAction(enum.StrEnum):
    """What an insert did."""

    #: A new job was written.
    INSERTED = "inserted"
    #: A unique job already existed; nothing was written.
    SKIPPED_DUPLICATE = "skipped_duplicate"
    #: A job key's existing job was replaced (``replace`` or ``preserve_run_at``).
    REPLACED = "replaced"
    #: A job key's existing job was returned untouched (``unsafe_dedupe``).
    DEDUPLICATED = "deduplicated"


@attrs.frozen
class InsertResult:
    """What an insert did.

    Attributes:
        job: The inserted job, or the existing one it met.
        unique_skipped_as_duplicate: True when an existing unique job made this insert a
            no-op (River's flag; the same as ``action is SKIPPED_DUPLICATE``).
        action: Inserted, skipped as a duplicate, or — with a job key — replaced or
            deduplicated.
    """

    job: Job
    unique_skipped_as_duplicate: bool = False
    action: InsertAction = InsertAction.INSERTED


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
    if resolved.job_key is not None:
        row["job_key"] = resolved.job_key
        row["job_key_mode"] = resolved.job_key_mode.value
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
    column("job_key", Text),
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
    """Which features the rows use, which decides the statement they need."""
    return {
        "unique": any(row.get("unique_key") for row in rows),
        "sequenced": any(row.get("sequence_key") for row in rows),
    }


@functools.cache
def insert_statement(
    *,
    unique: bool,
    sequenced: bool,
    lock_sequences: bool = False,
    job_key_mode: JobKeyMode | None = None,
) -> Insert:
    """The statement for rows of this shape, built once; execute it with
    :func:`rows_param`."""
    return _build_insert(
        unique=unique, sequenced=sequenced, lock_sequences=lock_sequences, job_key_mode=job_key_mode
    )


def _build_insert(
    *,
    unique: bool,
    sequenced: bool,
    lock_sequences: bool = False,
    job_key_mode: JobKeyMode | None = None,
    bound: Any = None,
) -> Insert:
    source = json_recordset(ROWS_PARAM, _ROW_COLUMNS, "job_rows", bound)
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
            ctes.append(lock_keys_in(source.c.sequence_key).cte("sequence_locks"))
    if job_key_mode is not None:
        values.append(source.c.job_key)
        columns.append("job_key")
        if job_key_mode is not JobKeyMode.UNSAFE_DEDUPE:
            ctes.append(detach_running_holders(source))
    rows_select = select(*values).order_by(source.c.ord)
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
        return statement.returning(*CORE_COLUMNS, sql_false().label(SKIPPED_COLUMN))
    # River's trick: a no-op update makes the existing row come back from RETURNING,
    # and xmax tells the two cases apart. Nothing of the existing row changes.
    return statement.on_conflict_do_update(
        constraint=unique_index, set_={Job.__table__.c.kind: Job.__table__.c.kind}
    ).returning(*CORE_COLUMNS, literal_column("xmax <> 0", Boolean).label(SKIPPED_COLUMN))


def lock_unique_keys_of(connection: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Before a batch with several unique keys: lock them in sorted order.

    ON CONFLICT waits on each existing (or being-inserted) row in turn, in the batch's
    order; two batches meeting the same keys in different orders would deadlock.
    """
    keys = [row["unique_key"] for row in rows if row.get("unique_key")]
    if len(keys) > 1:
        connection.execute(lock_unique_keys(keys))


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

    Raises:
        InvalidOptionsError: with a ``job_key``: a keyed add may need a second round when
            a worker starts the existing job mid-statement, which one statement cannot
            do; use :func:`insert` or :func:`enqueue`.
    """
    rows = build_rows([(args, _opts(opts, options))])
    if rows[0].get("job_key") is not None:
        raise InvalidOptionsError(
            "job_key",
            "insert_job() returns one statement, and a keyed add must be able to run a "
            "second round when a worker starts the existing job mid-statement; use "
            "sa_jobs.insert() or sa_jobs.enqueue() for job keys",
        )
    statement = jobs_insert(rows, lock_sequences=True)
    return statement.execution_options(**{STATEMENT_OPTION: True})


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
    the first statement is sent. Duplicates of one unique key in a batch are folded (the
    first wins); repeats of one job key are applied in order, as separate adds would be.
    """
    shared = _opts(opts, options)
    pairs = [
        (item.args, item.opts) if isinstance(item, InsertManyParams) else (item, shared)
        for item in items
    ]
    rows = build_rows(pairs)

    def run(statement: Insert, params: dict[str, Any], keyed: bool) -> list[Any]:
        return list(session.execute(_as_jobs(statement, keyed), params).all())

    written = write_rows(session.connection(), rows, run, batch_size=batch_size)
    results = [
        InsertResult(r[0], action is InsertAction.SKIPPED_DUPLICATE, action)
        for r, action in written
    ]
    _attach_args(results, pairs)
    return results


@functools.cache
def _as_jobs(statement: Insert, keyed: bool) -> Any:
    """Load an insert statement's rows as Job objects (built once per statement)."""
    extra = [column("job_key", Text)] if keyed else []
    loading = select(Job, column(SKIPPED_COLUMN, Boolean), *extra)
    return loading.from_statement(statement).execution_options(populate_existing=True)


def write_rows(
    connection: Connection,
    rows: Sequence[dict[str, Any]],
    run: Callable[[Insert, dict[str, Any], bool], list[Any]],
    *,
    batch_size: int = 10_000,
) -> list[tuple[Any, InsertAction]]:
    """Write validated rows in the connection's transaction; one result per row, in order.

    ``run(statement, params, keyed)`` executes a statement and returns its rows as sequences of
    the job, the ``unique_skipped_as_duplicate`` flag and, for keyed statements, the key.
    Consecutive rows of one kind of add (plain, unique or sequenced; or keyed with one
    mode) go together, so ids follow input order.
    """
    results: list[tuple[Any, InsertAction]] = []
    with translate_missing_schema():
        for mode, group in itertools.groupby(rows, key=_keyed_mode):
            batch = list(group)
            if mode is None:
                results.extend(_write_plain(connection, batch, run, batch_size))
            else:
                results.extend(_write_keyed(batch, JobKeyMode(mode), run))
    return results


def _keyed_mode(row: dict[str, Any]) -> str | None:
    return row.get("job_key_mode") if row.get("job_key") is not None else None


def _write_plain(
    connection: Connection,
    rows: Sequence[dict[str, Any]],
    run: Callable[[Insert, dict[str, Any], bool], list[Any]],
    batch_size: int,
) -> list[tuple[Any, InsertAction]]:
    results = []
    for start in range(0, len(rows), batch_size):
        sent, answers = fold_duplicates(rows[start : start + batch_size])
        lock_sequences_of(connection, sent)
        lock_unique_keys_of(connection, sent)
        returned = run(insert_statement(**statement_shape(sent)), rows_param(sent), False)
        answered: set[int] = set()
        for answer in answers:
            row = returned[answer]
            # A row folded into an earlier one of the same batch is that one's duplicate.
            duplicate = bool(row[1]) or answer in answered
            answered.add(answer)
            results.append(
                (row, InsertAction.SKIPPED_DUPLICATE if duplicate else InsertAction.INSERTED)
            )
    return results


def _write_keyed(
    rows: Sequence[dict[str, Any]],
    mode: JobKeyMode,
    run: Callable[[Insert, dict[str, Any], bool], list[Any]],
) -> list[tuple[Any, InsertAction]]:
    met = InsertAction.DEDUPLICATED if mode is JobKeyMode.UNSAFE_DEDUPE else InsertAction.REPLACED
    returned = insert_keyed(
        rows,
        mode,
        run_round=lambda batch, m: run(
            insert_statement(unique=False, sequenced=False, job_key_mode=m),
            rows_param(batch),
            True,
        ),
        key_of=lambda row: row[2],
    )
    return [(row, met if row[1] else InsertAction.INSERTED) for row in returned]


def _attach_args(results: Sequence[InsertResult], pairs: Sequence[tuple[object, Any]]) -> None:
    # The caller already holds the args instances; spare job.args a decode — but only
    # where the stored args are exactly those (not a job met again later in the batch,
    # whose payload a repeat of its key replaced or merged).
    uses = collections.Counter(id(result.job) for result in results)
    for result, (args, _) in zip(results, pairs, strict=True):
        if result.action is InsertAction.INSERTED and uses[id(result.job)] == 1:
            result.job.remember_args(args)


def _opts(opts: InsertOpts | None, options: dict[str, Any]) -> InsertOpts:
    if opts is not None and options:
        return attrs.evolve(opts, **options)
    if options:
        return InsertOpts(**options)
    return opts if opts is not None else InsertOpts()
