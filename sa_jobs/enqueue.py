"""``session.add(sa_jobs.enqueue(...))``: jobs inserted at flush, in the caller's transaction.

:func:`enqueue` validates and converts at once and returns a pending
:class:`~sa_jobs.models.Job`. A ``before_flush`` hook sends all of a flush's pending jobs
through :func:`~sa_jobs.insert.write_rows` — the same statements every insert path uses,
``ON CONFLICT`` included — and then turns each object into the persistent row, exactly
as the unit of work would have.
"""

from __future__ import annotations

import itertools
from typing import Any, TypeVar, Unpack

from sqlalchemy import event, inspect
from sqlalchemy.orm import Session, UOWTransaction
from sqlalchemy.orm.attributes import set_committed_value

from sa_jobs.args import encode_args
from sa_jobs.insert import Returned, write_rows
from sa_jobs.insert_statement import MET_COLUMNS, met_values
from sa_jobs.models import EXISTED_COLUMN, Job
from sa_jobs.options import InsertOptions, InsertOpts, insert_opts
from sa_jobs.rows import JobRow, row_for, row_of_job
from sa_jobs.states import InsertAction

__all__ = ["enqueue"]

A = TypeVar("A")


def enqueue(args: A, opts: InsertOpts | None = None, **options: Unpack[InsertOptions]) -> Job[A]:
    """Return a new :class:`Job` for ``session.add``; it is inserted at the next flush.

    Args and options are validated now. Nothing is written until the session flushes,
    and a rollback leaves no job. After the flush, ``job.id`` and every column are
    set from the row the database wrote.
    """
    call_opts = insert_opts(opts, options)
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
    return job


# Orders a flush's pending jobs as they were enqueued, so ids follow program order.
_enqueue_order = itertools.count()


def _pending_row(job: Job[Any]) -> JobRow:
    row = job.extras.pending_row
    # A Job built by hand has no row yet: it is validated like any other insert.
    return JobRow(**row) if row is not None else row_of_job(job)  # type: ignore[typeddict-item]


@event.listens_for(Session, "before_flush")
def _insert_pending_jobs(session: Session, _flush: UOWTransaction, _objects: Any) -> None:
    """Insert the flush's pending jobs through the insert construct instead of the ORM."""
    pending = [obj for obj in session.new if isinstance(obj, Job)]
    if not pending:
        return
    pending.sort(key=lambda job: job.extras.order)
    connection = session.connection()

    def run(statement: Any, params: dict[str, Any], _keyed: bool) -> list[Returned]:
        rows = connection.execute(statement, params).mappings()
        return [
            Returned(
                row,
                bool(row[EXISTED_COLUMN]),
                row.get("job_key"),
                row.get("revision"),
                # A job a unique row met: its stored args/metadata/errors (MET_COLUMNS).
                met_values([row[name] for name in MET_COLUMNS])
                if row[EXISTED_COLUMN] and MET_COLUMNS[0] in row
                else None,
            )
            for row in rows
        ]

    written = write_rows(connection, [_pending_row(job) for job in pending], run)
    for job, entry in zip(pending, written, strict=True):
        _become_row(session, job, entry.returned.job, entry.action)


def _become_row(session: Session, job: Job[Any], row: Any, action: InsertAction) -> None:
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
