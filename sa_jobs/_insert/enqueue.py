"""``session.add(sa_jobs.enqueue(...))``: jobs inserted at flush, in the caller's transaction.

:func:`enqueue` validates and converts at once and returns a pending
:class:`~sa_jobs._table.models.Job`. A ``before_flush`` hook sends all of a flush's pending jobs
through :func:`~sa_jobs._insert.insert.write_rows` — the same statements every insert path uses,
``ON CONFLICT`` included — and then turns each object into the persistent row, exactly
as the unit of work would have.
"""

from __future__ import annotations

import itertools
from typing import Any, TypeVar, Unpack

from sqlalchemy import event, inspect
from sqlalchemy.orm import Session, UOWTransaction
from sqlalchemy.orm.attributes import set_committed_value

from sa_jobs._base.records import JobRow
from sa_jobs._base.states import InsertAction
from sa_jobs._declare.args import encode_args
from sa_jobs._declare.options import InsertOptions, InsertOpts, insert_opts
from sa_jobs._declare.refs import Ref, iter_refs, placeholder_pks
from sa_jobs._insert.insert import ROW_COLUMNS, core_run, write_rows
from sa_jobs._insert.rows import row_for, row_of_job
from sa_jobs._table.models import Job
from sa_jobs.errors import InvalidJobArgsError

__all__ = ["enqueue"]

A = TypeVar("A")


def enqueue(args: A, opts: InsertOpts | None = None, **options: Unpack[InsertOptions]) -> Job[A]:
    """Return a new :class:`Job` for ``session.add``; it is inserted at the next flush.

    Args and options are validated now. Nothing is written until the session flushes,
    and a rollback leaves no job. After the flush, ``job.id`` and every column are
    set from the row the database wrote.
    """
    call_opts = insert_opts(opts, options)
    pending = pending_refs(args)
    if pending:
        # Checked now with a stand-in key; written after the flush that gives the
        # instance its key (``_insert_deferred_jobs``).
        with placeholder_pks():
            kind, args_json = encode_args(args)
    else:
        kind, args_json = encode_args(args)
    row = row_for(kind, args_json, call_opts)
    job: Job[A] = Job(
        kind=row["kind"],
        args_json=row["args"],
        queue=row["queue"],
        priority=row["priority"],
        max_attempts=row["max_attempts"],
        tags=row["tags"],
        metadata_=row["metadata"],
        scheduled_at=call_opts.scheduled_at,
    )
    job.remember_args(args)
    job.extras.pending_row = row
    job.extras.order = next(_enqueue_order)
    if pending:
        job.extras.deferred = (args, call_opts)
    return job


def pending_refs(args: object) -> list[Ref[Any]]:
    """The references in ``args`` to instances with no primary key yet.

    Raises:
        InvalidJobArgsError: such an instance belongs to no session, so no flush would
            ever give it a key.
    """
    pending = [ref for ref, _policy in iter_refs(args) if ref.is_pending]
    for ref in pending:
        if inspect(ref.instance).session is None:
            raise InvalidJobArgsError(
                f"{type(args).__qualname__} references {ref.model.__qualname__} "
                f"{ref.instance!r}, which has no primary key and is in no session, so "
                "nothing would ever give it one: session.add() it before enqueueing the "
                "job (or flush it, or reference it by key: Ref(Model, pk))"
            )
    return pending


# Orders a flush's pending jobs as they were enqueued, so ids follow program order.
_enqueue_order = itertools.count()


def _pending_row(job: Job[Any]) -> JobRow:
    row = job.extras.pending_row
    # A Job built by hand has no row yet: it is validated like any other insert.
    return JobRow(**row) if row is not None else row_of_job(job)  # type: ignore[typeddict-item]


@event.listens_for(Session, "before_flush")
def _insert_pending_jobs(session: Session, flush: UOWTransaction, _objects: Any) -> None:
    """Insert the flush's pending jobs through the insert construct instead of the ORM."""
    pending = [obj for obj in session.new if isinstance(obj, Job)]
    if not pending:
        return
    pending.sort(key=lambda job: job.extras.order)
    deferred = [job for job in pending if job.extras.deferred is not None]
    if deferred:
        # Jobs that reference instances this flush inserts wait for their keys: out of
        # the unit of work now, written in after_flush_postexec (same transaction).
        for job in deferred:
            _check_flushed_here(session, job)
        for job in deferred:
            session.expunge(job)
        flush.attributes[_DEFERRED] = deferred
        pending = [job for job in pending if job.extras.deferred is None]
        if not pending:
            return
    _write_jobs(session, pending)


_DEFERRED = "sa_jobs_deferred_jobs"


def _check_flushed_here(session: Session, job: Job[Any]) -> None:
    args, _opts = job.extras.deferred  # type: ignore[misc]
    for ref, _policy in iter_refs(args):
        if ref.is_pending and ref.instance not in session.new:
            raise InvalidJobArgsError(
                f"job {job.kind!r} references {ref.model.__qualname__} {ref.instance!r}, "
                "which has no primary key and is not pending in the session flushing the "
                "job, so this flush would not give it one: add it to this session (or "
                "flush it first)"
            )


@event.listens_for(Session, "after_flush_postexec")
def _insert_deferred_jobs(session: Session, flush: UOWTransaction) -> None:
    """The jobs whose referenced instances this flush inserted: encoded with their keys
    now, then written like any other enqueued job, still inside the flush."""
    deferred: list[Job[Any]] | None = flush.attributes.pop(_DEFERRED, None)
    if not deferred:
        return
    for job in deferred:
        args, call_opts = job.extras.deferred  # type: ignore[misc]
        kind, args_json = encode_args(args)
        row = row_for(kind, args_json, call_opts)
        job.args_json = row["args"]
        job.remember_args(args)
        job.extras.pending_row = row
        job.extras.deferred = None
        session.add(job)
    _write_jobs(session, deferred)


def _write_jobs(session: Session, pending: list[Job[Any]]) -> None:
    connection = session.connection()

    rows = [_pending_row(job) for job in pending]
    written = write_rows(connection, rows, core_run(connection), ROW_COLUMNS)
    for job, entry in zip(pending, written, strict=True):
        _become_row(session, job, entry.returned.job, entry.action)


def _become_row(session: Session, job: Job[Any], row: dict[str, Any], action: InsertAction) -> None:
    for attribute in Job.__mapper__.column_attrs:
        name = attribute.columns[0].name
        if name in row:
            setattr(job, attribute.key, row[name])
    job.unique_skipped_as_duplicate = action is InsertAction.SKIPPED_DUPLICATE
    job.extras.insert_action = action
    job.extras.pending_row = None
    state = inspect(job)
    key = Job.__mapper__.identity_key_from_primary_key((job.id,))
    existing = session.identity_map.get(key)
    if existing is not None:
        # The row is already represented in this session (a job loaded earlier, now
        # replaced by a job key or met as a duplicate): keep that object canonical, bring
        # it up to date, and leave this one detached.
        for attribute in Job.__mapper__.column_attrs:
            name = attribute.columns[0].name
            if name in row:
                set_committed_value(existing, attribute.key, row[name])
        session.expunge(job)
        return
    # What the unit of work does for a flushed pending object: give it its identity key,
    # put it in the identity map, reset attribute history, and record it as new in the
    # transaction so that a rollback expunges it like any other flushed object.
    session._register_persistent({state})
