"""``session.add(sa_jobs.enqueue(...))``: jobs inserted at flush, in the caller's transaction.

:func:`enqueue` validates and converts at once and returns a pending
:class:`~sa_jobs.models.Job`. A ``before_flush`` hook sends all of a flush's pending jobs
through :func:`~sa_jobs.insert.write_rows` — the same statements every insert path uses,
``ON CONFLICT`` included — and then turns each object into the persistent row, exactly
as the unit of work would have.
"""

from __future__ import annotations

import itertools
from typing import Any

from sqlalchemy import event, inspect
from sqlalchemy.orm import Session, UOWTransaction
from sqlalchemy.orm.attributes import set_committed_value

from sa_jobs.args import KindDefaults, check_kind_name, default_registry, encode_args
from sa_jobs.convert import check_json_document
from sa_jobs.insert import (
    InsertAction,
    _job_row,
    _opts,
    _row_from,
    write_rows,
)
from sa_jobs.models import EXISTED_COLUMN, Job
from sa_jobs.options import InsertOpts

__all__ = ["enqueue"]


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
    job.remember_args(args)
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
    """Insert the flush's pending jobs through the insert construct instead of the ORM."""
    pending = [obj for obj in session.new if isinstance(obj, Job)]
    if not pending:
        return
    pending.sort(key=lambda job: job.__dict__.get("_sa_jobs_order", -1))
    connection = session.connection()

    def run(statement: Any, params: dict[str, Any], _keyed: bool) -> list[Any]:
        returned = connection.execute(statement, params).mappings()
        return [_as_result_row(row) for row in returned]

    written = write_rows(connection, [_pending_row(job) for job in pending], run)
    for job, (row, action) in zip(pending, written, strict=True):
        _become_row(session, job, row[0], action)


def _as_result_row(mapping: Any) -> tuple[Any, bool, str | None]:
    # The same shape the ORM paths get: (job columns, existed, job key).
    return (mapping, bool(mapping[EXISTED_COLUMN]), mapping.get("job_key"))


def _become_row(session: Session, job: Job, row: Any, action: InsertAction) -> None:
    for attribute in Job.__mapper__.column_attrs:
        name = attribute.columns[0].name
        if name in row:
            setattr(job, attribute.key, row[name])
    job.unique_skipped_as_duplicate = action is InsertAction.SKIPPED_DUPLICATE
    job.__dict__["_sa_jobs_insert_action"] = action
    job.__dict__.pop("_sa_jobs_row", None)
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
