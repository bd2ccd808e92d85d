"""Putting jobs into the table, always inside the caller's transaction.

Every path validates and converts all its rows first (:mod:`sa_jobs.rows`), then sends
them through :func:`write_rows`, which uses the one statement of
:mod:`sa_jobs.insert_statement`: ``INSERT ... SELECT FROM jsonb_to_recordset(:rows)``,
any number of rows, one bound parameter, so a batch of 10,000 is one round trip.

* :func:`sa_jobs.enqueue` returns a pending :class:`~sa_jobs.models.Job` for
  ``session.add``; its flush hook (:mod:`sa_jobs.enqueue`) uses :func:`write_rows` too.
* :func:`insert` and :func:`insert_many` execute at once and return :class:`InsertResult`.
* :func:`insert_job` returns the construct for you to execute or compose.

Workers learn about new jobs from a statement-level trigger installed by the core
migration: it sends one ``NOTIFY`` per queue per statement, and PostgreSQL folds
identical notifications within a transaction, so a transaction notifies each queue once.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, Unpack

import attrs
from sqlalchemy import Boolean, Connection, Integer, Text, column, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql.dml import Insert

from sa_jobs.errors import InvalidOptionsError, SchemaMissingError
from sa_jobs.hooks import INSERT_HOOKS, InsertCall
from sa_jobs.insert_statement import (
    MET_COLUMNS,
    build_insert,
    in_input_order,
    insert_statement,
    met_values,
    returns_met_columns,
    rows_param,
    sent_values,
    shape_of,
)
from sa_jobs.job_key import insert_keyed
from sa_jobs.models import EXISTED_COLUMN, Job
from sa_jobs.options import InsertOptions, InsertOpts, JobKeyMode, insert_opts
from sa_jobs.rows import JobRow, build_rows
from sa_jobs.schema import STATEMENT_OPTION, translate_missing_schema
from sa_jobs.sequence import lock_keys
from sa_jobs.sessions import either_session
from sa_jobs.states import InsertAction
from sa_jobs.unique import fold_duplicates

__all__ = [
    "InsertManyParams",
    "InsertResult",
    "Returned",
    "Written",
    "insert",
    "insert_job",
    "insert_many",
    "write_rows",
]


A = TypeVar("A")


@attrs.frozen
class InsertResult(Generic[A]):
    """What an insert did.

    Attributes:
        job: The inserted job, or the existing one it met.
        unique_skipped_as_duplicate: True when an existing unique job made this insert a
            no-op (River's flag; the same as ``action is SKIPPED_DUPLICATE``).
        action: Inserted, skipped as a duplicate, or — with a job key — replaced or
            deduplicated.
        revision: With a job key, Graphile's revision of the job (0 when created, one
            more per update in place).
    """

    job: Job[A]
    unique_skipped_as_duplicate: bool = False
    action: InsertAction = InsertAction.INSERTED
    #: With a job key: the job's revision (0 when created, +1 per update in place);
    #: None for jobs without a key.
    revision: int | None = None


@attrs.frozen
class InsertManyParams:
    """One entry of :func:`insert_many` with its own options."""

    args: object
    opts: InsertOpts = attrs.field(factory=InsertOpts)


@attrs.frozen
class Returned:
    """One row an insert statement gave back, however the caller read it."""

    #: A :class:`Job` (the ORM paths) or a mapping of the row's columns (the flush hook).
    job: Any
    #: The statement met an existing job (a unique duplicate, or a job key's holder).
    existed: bool
    job_key: str | None = None
    revision: int | None = None
    #: For an existing job a statement without a job key met: its columns the statement
    #: did not return for the rows it wrote (:data:`~sa_jobs.insert_statement.MET_COLUMNS`).
    met: dict[str, Any] | None = None


@attrs.frozen
class Written:
    """What became of one input row."""

    returned: Returned
    action: InsertAction


#: Executes one insert statement (with its parameters; ``keyed`` for a job-key round)
#: and returns its rows.
Run = Callable[[Insert, dict[str, Any], bool], list[Returned]]


# --------------------------------------------------------------------------- public paths


def insert_job(
    args: object, opts: InsertOpts | None = None, **options: Unpack[InsertOptions]
) -> Insert:
    """Return a Core ``Insert`` for one job, for ``session.execute`` or composition.

    Options are those of :class:`~sa_jobs.options.InsertOpts`, as an instance or as
    keywords. Executing the statement returns one row: the job's columns and
    ``unique_skipped_as_duplicate``.

    Raises:
        InvalidOptionsError: with a ``job_key``: a keyed add may need a second round when
            a worker starts the existing job mid-statement, which one statement cannot
            do; use :func:`insert` or :func:`sa_jobs.enqueue`.
    """
    rows = build_rows([(args, insert_opts(opts, options))])
    if rows[0].get("job_key") is not None:
        raise InvalidOptionsError(
            "job_key",
            "insert_job() returns one statement, and a keyed add must be able to run a "
            "second round when a worker starts the existing job mid-statement; use "
            "sa_jobs.insert() or sa_jobs.enqueue() for job keys",
        )
    statement = build_insert(shape_of(rows, lock_sequences=True), rows)
    return statement.execution_options(**{STATEMENT_OPTION: True})


@either_session
def insert(
    session: Session, args: A, opts: InsertOpts | None = None, **options: Unpack[InsertOptions]
) -> InsertResult[A]:
    """Insert one job in the session's transaction and return it.

    With an ``AsyncSession``, returns an awaitable: ``await sa_jobs.insert(session, args)``.
    """
    return _insert_many(session, [InsertManyParams(args, insert_opts(opts, options))])[0]


@either_session
def insert_many(
    session: Session,
    items: Iterable[object | InsertManyParams],
    opts: InsertOpts | None = None,
    *,
    batch_size: int = 10_000,
    **options: Unpack[InsertOptions],
) -> list[InsertResult[Any]]:
    """Insert many jobs with one statement per ``batch_size`` rows; results keep input order.

    ``items`` are job args instances (which take ``opts``/keywords) or
    :class:`InsertManyParams` carrying their own options. Everything is validated before
    the first statement is sent. Duplicates of one unique key in a batch are folded (the
    first wins); repeats of one job key are applied in order, as separate adds would be.
    With an ``AsyncSession``, returns an awaitable.
    """
    return _insert_many(session, items, opts, batch_size=batch_size, **options)


def _insert_many(
    session: Session,
    items: Iterable[object | InsertManyParams],
    opts: InsertOpts | None = None,
    *,
    batch_size: int = 10_000,
    **options: Unpack[InsertOptions],
) -> list[InsertResult[Any]]:
    shared = insert_opts(opts, options)
    pairs = [
        (item.args, item.opts) if isinstance(item, InsertManyParams) else (item, shared)
        for item in items
    ]
    rows = build_rows(pairs)

    def run(statement: Insert, params: dict[str, Any], keyed: bool) -> list[Returned]:
        rows = session.execute(_as_jobs(statement, keyed), params).all()
        if keyed:
            return [Returned(job, bool(existed), key, rev) for job, existed, key, rev in rows]
        return [
            Returned(job, bool(existed), met=met_values(met) if existed and met else None)
            for job, existed, *met in rows
        ]

    written = write_rows(session.connection(), rows, run, batch_size=batch_size)
    results = [_result(entry) for entry in written]
    _attach_args(results, pairs)
    return results


def _result(written: Written) -> InsertResult[Any]:
    job: Job[Any] = written.returned.job
    skipped = written.action is InsertAction.SKIPPED_DUPLICATE
    job.unique_skipped_as_duplicate = skipped
    revision = written.returned.revision
    if revision is not None:
        set_committed_value(job, "revision", revision)
    return InsertResult(job, skipped, written.action, revision)


@functools.cache
def _as_jobs(statement: Insert, keyed: bool) -> Any:
    """Load an insert statement's rows as Job objects (built once per statement)."""
    if keyed:
        extra = [column("job_key", Text), column("revision", Integer)]
    elif returns_met_columns(statement):
        extra = [column(name, JSONB) for name in MET_COLUMNS]
    else:
        extra = []
    loading = select(Job, column(EXISTED_COLUMN, Boolean), *extra)
    return loading.from_statement(statement).execution_options(populate_existing=True)


def write_rows(
    connection: Connection, rows: Sequence[JobRow], run: Run, *, batch_size: int = 10_000
) -> list[Written]:
    """Write validated rows in the connection's transaction; one result per row, in order.

    ``run`` executes each statement and reads its rows. Consecutive rows of one kind of
    add (plain, unique or sequenced; or keyed with one mode) go together, so ids follow
    input order. The process's insert hooks (:mod:`sa_jobs.hooks`) run around it.
    """
    hooks = INSERT_HOOKS.active
    if not hooks:
        return _write_rows(connection, rows, run, batch_size)
    call = InsertCall(hooks, rows)
    call.begin()
    try:
        written = _write_rows(connection, rows, run, batch_size)
    except BaseException as exc:
        call.end(None, exc)
        raise
    call.end((_id_of(entry.returned), entry.action) for entry in written)
    return written


def _id_of(returned: Returned) -> int:
    """The id of a row an insert statement returned (a Job, or the flush hook's mapping)."""
    job = returned.job
    job_id: int = job.id if isinstance(job, Job) else job["id"]
    return job_id


def _write_rows(
    connection: Connection, rows: Sequence[JobRow], run: Run, batch_size: int
) -> list[Written]:
    results: list[Written] = []
    with _noting_aborted_transaction(), translate_missing_schema():
        for mode, group in itertools.groupby(rows, key=_keyed_mode):
            batch = list(group)
            if mode is None:
                results.extend(_write_plain(connection, batch, run, batch_size))
            else:
                results.extend(_write_keyed(batch, JobKeyMode(mode), run))
    return results


#: Added to a database error raised by an insert: the caller's transaction is unusable now.
ABORTED_TRANSACTION_NOTE = (
    "sa_jobs: the database refused this insert, so the transaction it ran in is aborted; "
    "roll it back (session.rollback()) before using the session again"
)


@contextlib.contextmanager
def _noting_aborted_transaction() -> Iterator[None]:
    """Say so when a failed insert statement left the caller's transaction aborted.

    Every input is validated before SQL is sent, so this is for what only the database
    can refuse (a lock timeout, a trigger, a missing schema branch).
    """
    try:
        yield
    except (DBAPIError, SchemaMissingError) as exc:
        exc.add_note(ABORTED_TRANSACTION_NOTE)
        raise


def _keyed_mode(row: JobRow) -> str | None:
    return row.get("job_key_mode") if row.get("job_key") is not None else None


def _write_plain(
    connection: Connection, rows: Sequence[JobRow], run: Run, batch_size: int
) -> list[Written]:
    results = []
    for start in range(0, len(rows), batch_size):
        sent, answers = fold_duplicates(rows[start : start + batch_size])
        _lock_sequences_of(connection, sent)
        shape = shape_of(sent)
        returned = run(insert_statement(shape), rows_param(sent), False)
        if shape.unique:
            returned = in_input_order(sent, returned)
        returned = [
            _with_values(entry, entry.met if entry.met is not None else sent_values(row))
            for entry, row in zip(returned, sent, strict=True)
        ]
        answered: set[int] = set()
        for answer in answers:
            row = returned[answer]
            # A row folded into an earlier one of the same batch is that one's duplicate.
            duplicate = row.existed or answer in answered
            answered.add(answer)
            action = InsertAction.SKIPPED_DUPLICATE if duplicate else InsertAction.INSERTED
            results.append(Written(row, action))
    return results


def _with_values(entry: Returned, values: dict[str, Any]) -> Returned:
    """Complete a returned row with the columns the insert did not return."""
    if isinstance(entry.job, Job):
        for name, value in values.items():
            set_committed_value(entry.job, _ATTRIBUTE_OF[name], value)
        return entry
    return attrs.evolve(entry, job={**entry.job, **values})


#: Job attribute names by column name (``metadata`` is ``metadata_`` on the class).
_ATTRIBUTE_OF = {attr.columns[0].name: attr.key for attr in Job.__mapper__.column_attrs}


def _lock_sequences_of(connection: Connection, rows: Sequence[JobRow]) -> None:
    """Take the advisory locks of the rows' sequences before inserting them."""
    keys = [row["sequence_key"] for row in rows if row.get("sequence_key")]
    if keys:
        connection.execute(lock_keys(keys))


def _write_keyed(rows: Sequence[JobRow], mode: JobKeyMode, run: Run) -> list[Written]:
    met = InsertAction.DEDUPLICATED if mode is JobKeyMode.UNSAFE_DEDUPE else InsertAction.REPLACED
    returned = insert_keyed(
        rows,
        mode,
        run_round=lambda batch, m: run(
            insert_statement(shape_of([], job_key_mode=m)), rows_param(batch), True
        ),
        key_of=lambda row: str(row.job_key),
    )
    return [Written(row, met if row.existed else InsertAction.INSERTED) for row in returned]


def _attach_args(results: Sequence[InsertResult[Any]], pairs: Sequence[tuple[object, Any]]) -> None:
    # The caller already holds the args instances; spare job.args a decode — but only
    # where the stored args are exactly those (not a job met again later in the batch,
    # whose payload a repeat of its key replaced or merged).
    uses = collections.Counter(id(result.job) for result in results)
    for result, (args, _) in zip(results, pairs, strict=True):
        if result.action is InsertAction.INSERTED and uses[id(result.job)] == 1:
            result.job.remember_args(args)
