"""Putting jobs into the table, always inside the caller's transaction.

Every path validates and converts all its rows first (:mod:`sa_jobs._insert.rows`), then sends
them through :func:`write_rows`, which uses the one statement of
:mod:`sa_jobs._insert.insert_statement`: ``INSERT ... SELECT FROM jsonb_to_recordset(:rows)``,
any number of rows, one bound parameter, so a batch of 10,000 is one round trip.

* :func:`sa_jobs.enqueue` returns a pending :class:`~sa_jobs._table.models.Job` for
  ``session.add``; its flush hook (:mod:`sa_jobs._insert.enqueue`) uses :func:`write_rows` too.
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, Unpack

import attrs
from sqlalchemy import Boolean, Connection, Integer, Text, column, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.sql.dml import Insert

from sa_jobs._base.records import InsertResult, JobRow
from sa_jobs._base.sessions import either_session
from sa_jobs._base.states import InsertAction
from sa_jobs._declare.options import InsertOptions, InsertOpts, JobKeyMode, insert_opts
from sa_jobs._insert.copy_rows import copy_rows, copyable, supports_copy
from sa_jobs._insert.insert_statement import (
    MET_COLUMNS,
    InsertShape,
    build_insert,
    in_input_order,
    insert_statement,
    met_values,
    returns_met_columns,
    rows_param,
    sent_values,
    shape_of,
)
from sa_jobs._insert.job_key import insert_keyed
from sa_jobs._insert.rows import build_rows
from sa_jobs._insert.sequence import lock_keys
from sa_jobs._insert.unique import fold_duplicates
from sa_jobs._table.models import EXISTED_COLUMN, Job
from sa_jobs._table.schema import STATEMENT_OPTION, translate_missing_schema
from sa_jobs.errors import InvalidOptionsError, SchemaMissingError
from sa_jobs.hooks import INSERT_HOOKS, InsertCall

__all__ = [
    "ORM_JOBS",
    "ROW_COLUMNS",
    "InsertManyParams",
    "JobForm",
    "Returned",
    "Written",
    "core_run",
    "decode_returned",
    "insert",
    "insert_job",
    "insert_many",
    "insert_many_fast",
    "write_rows",
]

A = TypeVar("A")


@attrs.frozen
class InsertManyParams:
    """One entry of :func:`insert_many` with its own options."""

    args: object
    opts: InsertOpts = attrs.field(factory=InsertOpts)


#: How a caller holds the job of a returned row: a :class:`Job` (the ORM paths) or the
#: row's columns by name (the flush hook, periodic jobs).
J = TypeVar("J")


@attrs.frozen
class Returned(Generic[J]):
    """One row an insert statement gave back: the job, as the caller holds it, and what
    the statement says about it. Built only by :func:`decode_returned`."""

    job: J
    #: The statement met an existing job (a unique duplicate, or a job key's holder).
    existed: bool
    job_key: str | None = None
    revision: int | None = None
    #: For an existing job a statement without a job key met: its columns the statement
    #: did not return for the rows it wrote (:data:`~sa_jobs._insert.insert_statement.MET_COLUMNS`).
    met: dict[str, Any] | None = None


def decode_returned(row: Mapping[Any, Any], job: J) -> Returned[J]:
    """The one reading of a row an insert statement returns, by column name.

    ``row`` is the row's mapping (a Core ``RowMapping``, or an ORM row's ``_mapping``:
    the same labels); ``job`` is the job as the caller loaded it from that row.
    """
    existed = bool(row[EXISTED_COLUMN])
    met = None
    if existed and MET_COLUMNS[0] in row:
        # A job a unique row met: its stored args/metadata/errors.
        met = met_values([row[name] for name in MET_COLUMNS])
    return Returned(job, existed, row.get("job_key"), row.get("revision"), met)


class JobForm(Protocol[J]):
    """What :func:`write_rows` needs of the form a caller holds returned jobs in."""

    def id_of(self, job: J) -> int: ...

    def with_values(self, job: J, values: dict[str, Any]) -> J:
        """The job completed with columns the statement did not return."""
        ...


class _OrmJobs:
    """Jobs loaded by the ORM (:func:`insert`, :func:`insert_many`)."""

    def id_of(self, job: Job[Any]) -> int:
        return job.id

    def with_values(self, job: Job[Any], values: dict[str, Any]) -> Job[Any]:
        for name, value in values.items():
            set_committed_value(job, _ATTRIBUTE_OF[name], value)
        return job


class _RowColumns:
    """Jobs as their row's columns by name (the flush hook, periodic jobs)."""

    def id_of(self, job: dict[str, Any]) -> int:
        return int(job["id"])

    def with_values(self, job: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
        return {**job, **values}


ORM_JOBS: JobForm[Job[Any]] = _OrmJobs()
ROW_COLUMNS: JobForm[dict[str, Any]] = _RowColumns()


@attrs.frozen
class Written(Generic[J]):
    """What became of one input row."""

    returned: Returned[J]
    action: InsertAction


#: Executes one insert statement (with its parameters; ``keyed`` for a job-key round)
#: and returns its rows, each through :func:`decode_returned`.
Run = Callable[[Insert, dict[str, Any], bool], list[Returned[J]]]


def core_run(connection: Connection) -> Run[dict[str, Any]]:
    """A :data:`Run` on a Core connection: each job as its row's columns."""

    def run(statement: Insert, params: dict[str, Any], _keyed: bool) -> list[Returned[Any]]:
        rows = connection.execute(statement, params).mappings()
        return [decode_returned(row, dict(row)) for row in rows]

    return run


# --------------------------------------------------------------------------- public paths


def insert_job(
    args: object, opts: InsertOpts | None = None, **options: Unpack[InsertOptions]
) -> Insert:
    """Return a Core ``Insert`` for one job, for ``session.execute`` or composition.

    Options are those of :class:`~sa_jobs._declare.options.InsertOpts`, as an instance or as
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


@either_session
def insert_many_fast(
    session: Session,
    items: Iterable[object | InsertManyParams],
    opts: InsertOpts | None = None,
    *,
    batch_size: int = 10_000,
    **options: Unpack[InsertOptions],
) -> int:
    """Insert many jobs through ``COPY`` and return only how many were written (River's
    ``InsertManyFast``): for bulk loads where nobody reads the jobs back.

    Validated exactly as :func:`insert_many`, everything before anything is sent, in
    the session's transaction; the insert hooks run (with no ids for the copied jobs).
    Jobs scheduled for later, unique jobs, sequenced jobs and jobs with a job key need
    the database's clock, ``ON CONFLICT`` or locks, so they take :func:`insert_many`'s
    statement in their place (ids still follow input order); a duplicate it skips, or a
    job key's replacement, is not counted. With an ``AsyncSession``, returns an
    awaitable.
    """
    shared = insert_opts(opts, options)
    rows = build_rows(
        (item.args, item.opts) if isinstance(item, InsertManyParams) else (item, shared)
        for item in items
    )
    connection = session.connection()
    hooks = INSERT_HOOKS.active
    call = InsertCall(hooks, rows) if hooks else None
    if call is not None:
        call.begin()
    try:
        written = _write_fast(connection, rows, batch_size)
    except BaseException as exc:
        if call is not None:
            call.end(None, exc)
        raise
    if call is not None:
        call.end(written)
    return sum(action is InsertAction.INSERTED for _, action in written)


def _write_fast(
    connection: Connection, rows: Sequence[JobRow], batch_size: int
) -> list[tuple[int | None, InsertAction]]:
    """Runs of copyable rows through ``COPY``, the others through the statement, in order."""
    can_copy = supports_copy(connection)
    written: list[tuple[int | None, InsertAction]] = []
    with _noting_aborted_transaction(), translate_missing_schema():
        for copied, group in itertools.groupby(rows, key=lambda row: can_copy and copyable(row)):
            batch = list(group)
            if not copied:
                run = core_run(connection)
                written.extend(
                    (entry.returned.job["id"], entry.action)
                    for entry in _write_rows(connection, batch, run, ROW_COLUMNS, batch_size)
                )
                continue
            for start in range(0, len(batch), batch_size):
                count = copy_rows(connection, batch[start : start + batch_size])
                written.extend([(None, InsertAction.INSERTED)] * count)
    return written


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

    def run(statement: Insert, params: dict[str, Any], keyed: bool) -> list[Returned[Job[Any]]]:
        rows = session.execute(_as_jobs(statement, keyed), params).all()
        return [decode_returned(row._mapping, row[0]) for row in rows]

    written = write_rows(session.connection(), rows, run, ORM_JOBS, batch_size=batch_size)
    results = [_result(entry) for entry in written]
    _attach_args(results, pairs)
    return results


def _result(written: Written[Job[Any]]) -> InsertResult[Any]:
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
    connection: Connection,
    rows: Sequence[JobRow],
    run: Run[J],
    form: JobForm[J],
    *,
    batch_size: int = 10_000,
) -> list[Written[J]]:
    """Write validated rows in the connection's transaction; one result per row, in order.

    ``run`` executes each statement and reads its rows; ``form`` is how it holds their
    jobs. Consecutive rows of one kind of
    add (plain, unique or sequenced; or keyed with one mode) go together, so ids follow
    input order. The process's insert hooks (:mod:`sa_jobs.hooks`) run around it.
    """
    hooks = INSERT_HOOKS.active
    if not hooks:
        return _write_rows(connection, rows, run, form, batch_size)
    call = InsertCall(hooks, rows)
    call.begin()
    try:
        written = _write_rows(connection, rows, run, form, batch_size)
    except BaseException as exc:
        call.end(None, exc)
        raise
    call.end((form.id_of(entry.returned.job), entry.action) for entry in written)
    return written


def _write_rows(
    connection: Connection, rows: Sequence[JobRow], run: Run[J], form: JobForm[J], batch_size: int
) -> list[Written[J]]:
    results: list[Written[J]] = []
    with _noting_aborted_transaction(), translate_missing_schema():
        for mode, group in itertools.groupby(rows, key=_keyed_mode):
            batch = list(group)
            if mode is None:
                results.extend(_write_plain(connection, batch, run, form, batch_size))
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
    connection: Connection, rows: Sequence[JobRow], run: Run[J], form: JobForm[J], batch_size: int
) -> list[Written[J]]:
    results = []
    for start in range(0, len(rows), batch_size):
        sent, answers = fold_duplicates(rows[start : start + batch_size])
        _lock_sequences_of(connection, sent)
        shape = shape_of(sent)
        returned = run(insert_statement(shape), rows_param(sent), False)
        if shape.unique:
            returned = in_input_order(sent, returned)
        returned = [
            attrs.evolve(
                entry,
                job=form.with_values(
                    entry.job, entry.met if entry.met is not None else sent_values(row)
                ),
            )
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


#: Job attribute names by column name (``metadata`` is ``metadata_`` on the class).
_ATTRIBUTE_OF = {attr.columns[0].name: attr.key for attr in Job.__mapper__.column_attrs}


def _lock_sequences_of(connection: Connection, rows: Sequence[JobRow]) -> None:
    """Take the advisory locks of the rows' sequences before inserting them."""
    keys = [row["sequence_key"] for row in rows if row.get("sequence_key")]
    if keys:
        connection.execute(lock_keys(keys))


def _write_keyed(rows: Sequence[JobRow], mode: JobKeyMode, run: Run[J]) -> list[Written[J]]:
    met = InsertAction.DEDUPLICATED if mode is JobKeyMode.UNSAFE_DEDUPE else InsertAction.REPLACED
    returned = insert_keyed(
        rows,
        mode,
        run_round=lambda batch, m: run(
            insert_statement(
                InsertShape(
                    job_key_mode=m, partitioned=any(row.get("partition_key") for row in batch)
                )
            ),
            rows_param(batch),
            True,
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
