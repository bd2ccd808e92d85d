"""Queue controls: pause and resume a queue for every worker, in the caller's transaction.

A paused queue has a row in ``sa_job_queue`` (the ``sa_jobs_queue`` branch) with
``paused_at`` set. The fetch statement itself skips such a queue
(:func:`queue_not_paused`), so a pause holds for every worker process on every host from
its next fetch on, and survives restarts and deploys: it is a fact in the database, not
a flag in some process's memory. Inserts into a paused queue succeed as usual; jobs
already running finish.

Pausing and resuming send a control notification (``{"pause": queue}`` /
``{"resume": queue}`` on :data:`~sa_jobs._table.schema.CONTROL_CHANNEL`) when the transaction
commits: a resume wakes the queue's producers at once, and while a queue is paused a
worker stops waking up for every job inserted into it. A worker that missed the
notification sees the resume at its next poll.

**Known queues.** Queues are made by the jobs put in them, so there is no list of them to
check a name against. A queue is *known* when a job is in it, a worker process serves it
(its heartbeat row lists it), or it has a control row already. Pausing, resuming or
filtering on any other name raises :class:`~sa_jobs.errors.UnknownQueueError` before
anything is written: a typo must not silently pause nothing. To pause a queue before its
first job or worker exists, pass ``allow_unknown=True``.

**Served queues.** A queue is *served* while a live worker process lists it in its
heartbeat row; live means a heartbeat within :data:`LIVE_WORKER_WINDOW` (the rescuer's
default ``rescue_after``: past it the rescuer takes the process for gone). A queue with
available jobs that no live worker serves, and that is not paused, is *unserved*: its
jobs wait until a worker serves it (:func:`unserved_queues`, which ``stats()``,
``check_health()`` and the Prometheus gauges report).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from sqlalchemy import (
    Connection,
    Text,
    any_,
    bindparam,
    exists,
    func,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import InstrumentedAttribute, Session
from sqlalchemy.sql.expression import ColumnElement

from sa_jobs._base.sessions import either_session
from sa_jobs._base.sql import seconds_interval
from sa_jobs._declare.option_checks import check_queue
from sa_jobs._table.models import Job
from sa_jobs._table.schema import CONTROL_CHANNEL, QUEUE_BRANCH, Features, translate_missing_schema
from sa_jobs._table.service_tables import JobQueue, WorkerProcess
from sa_jobs.errors import SchemaMissingError, UnknownQueueError

__all__ = [
    "LIVE_WORKER_WINDOW",
    "QueueState",
    "check_known_queues",
    "pause_queue",
    "paused_queue_names",
    "queue_not_paused",
    "queue_states",
    "resume_queue",
    "served_queues",
    "unknown_queues",
    "unserved_queues",
]

#: A worker process whose heartbeat is older than this no longer serves its queues: the
#: rescuer's default ``rescue_after`` (``MaintenanceConfig``; a test keeps them equal).
LIVE_WORKER_WINDOW = dt.timedelta(seconds=60)


@attrs.frozen
class QueueState:
    """A queue's controls as the database has them.

    Attributes:
        name: The queue.
        paused_at: When it was paused; None while it is active.
        updated_at: When its controls last changed; None for a queue never paused.
    """

    name: str
    paused_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None

    @property
    def paused(self) -> bool:
        """No worker fetches from this queue."""
        return self.paused_at is not None


def queue_not_paused(queue: ColumnElement[str] | InstrumentedAttribute[str]) -> ColumnElement[bool]:
    """The fetch statement's clause: ``queue`` (the fetched queue, a bound value; or
    ``Job.queue``, correlated) is not paused.

    Given a bound value it is uncorrelated with the job rows, so PostgreSQL evaluates it
    once per fetch (a primary key lookup) and, for a paused queue, skips the scan of the
    fetch index entirely.
    """
    return ~exists().where(JobQueue.name == queue, JobQueue.paused_at.is_not(None))


def _require_branch(session: Session, function: str) -> None:
    if not Features.of(session.connection()).queue:
        raise SchemaMissingError(
            QUEUE_BRANCH, f"{function}() keeps queue controls in the sa_job_queue table"
        )


def unknown_queues(connection: Connection, queues: Iterable[str]) -> list[str]:
    """The ones of ``queues`` that nothing names (see the module), in the given order.

    Cheap lookups first (a control row, a worker's heartbeat row); the job table last, so
    only a queue that really is unknown costs a scan of it.
    """
    features = Features.of(connection)
    unknown = []
    for queue in queues:
        name = bindparam("queue_name", queue, type_=Text)
        known = [exists().where(name == any_(WorkerProcess.queues))]
        if features.queue:
            known.insert(0, exists().where(JobQueue.name == name))
        known.append(exists().where(Job.queue == name))
        with translate_missing_schema():
            found = connection.scalar(select(or_(*known)))
        if not found:
            unknown.append(queue)
    return unknown


def check_known_queues(session: Session, queues: list[str], hint: str = "") -> None:
    """Raise for the first of ``queues`` that nothing names (see the module); ``hint``
    ends the message (what else the caller could do).

    Raises:
        UnknownQueueError: a queue no job, worker or control row names.
    """
    unknown = unknown_queues(session.connection(), queues)
    if unknown:
        raise UnknownQueueError(unknown[0], hint)


def served_queues(
    connection: Connection,
    *,
    live_within: dt.timedelta = LIVE_WORKER_WINDOW,
    except_worker: str | None = None,
) -> set[str]:
    """The queues that live worker processes serve (a heartbeat within ``live_within``),
    leaving out the process ``except_worker`` (a worker asking about the others)."""
    conditions = [
        WorkerProcess.heartbeat_at > func.now() - seconds_interval(live_within.total_seconds())
    ]
    if except_worker is not None:
        conditions.append(WorkerProcess.id != except_worker)
    served = select(func.unnest(WorkerProcess.queues)).where(*conditions).distinct()
    return set(connection.scalars(served))


def paused_queue_names(connection: Connection) -> set[str]:
    """The queues paused now; none without the ``sa_jobs_queue`` branch."""
    if not Features.of(connection).queue:
        return set()
    return set(connection.scalars(select(JobQueue.name).where(JobQueue.paused_at.is_not(None))))


def unserved_queues(
    connection: Connection,
    oldest_available: Mapping[str, dt.timedelta],
    *,
    live_within: dt.timedelta = LIVE_WORKER_WINDOW,
) -> dict[str, dt.timedelta]:
    """The queues of ``oldest_available`` (queue -> how long its oldest available job has
    been due, :func:`sa_jobs._inspect.job_counts.oldest_available`) that no live worker serves and
    that are not paused, with that age. A paused queue is left out: its jobs wait on
    purpose."""
    if not oldest_available:
        return {}
    left = set(oldest_available) - served_queues(connection, live_within=live_within)
    left -= paused_queue_names(connection) if left else set()
    return {queue: oldest_available[queue] for queue in sorted(left)}


def _notify(session: Session, action: str, queue: str) -> None:
    # Delivered when the caller's transaction commits; dropped if it rolls back.
    session.execute(select(func.pg_notify(CONTROL_CHANNEL, json.dumps({action: queue}))))


def _state(row: Any) -> QueueState:
    return QueueState(name=row.name, paused_at=row.paused_at, updated_at=row.updated_at)


#: How to pause a queue before anything names it (``sa-jobs queue pause`` says
#: ``--allow-unknown`` instead).
ALLOW_UNKNOWN_HINT = "or pass allow_unknown=True to pause it before any job or worker names it"


@either_session
def pause_queue(session: Session, queue: str, *, allow_unknown: bool = False) -> QueueState:
    """Pause ``queue`` for every worker, in the session's transaction.

    From the commit on, no worker fetches a job of this queue (each finds out at its next
    fetch; the notification makes that at once). Jobs already running finish; inserts
    into the queue succeed and wait. Pausing a paused queue changes nothing (it keeps its
    first ``paused_at``). The pause lasts until :func:`resume_queue`, across restarts.

    Args:
        queue: The queue's name.
        allow_unknown: Pause a queue that nothing names yet (no job, worker or control
            row), e.g. before its first deploy.

    Raises:
        InvalidOptionsError: not a queue name.
        UnknownQueueError: no job, worker or control row names the queue (a typo?).
        SchemaMissingError: the ``sa_jobs_queue`` branch is not installed.
    """
    check_queue(queue)
    _require_branch(session, "pause_queue")
    if not allow_unknown:
        check_known_queues(session, [queue], ALLOW_UNKNOWN_HINT)
    statement = pg_insert(JobQueue).values(name=queue, paused_at=func.now())
    statement = statement.on_conflict_do_update(
        index_elements=[JobQueue.name],
        set_={
            "paused_at": func.coalesce(JobQueue.paused_at, statement.excluded.paused_at),
            "updated_at": func.now(),
        },
    )
    row = session.execute(
        statement.returning(JobQueue.name, JobQueue.paused_at, JobQueue.updated_at)
    ).one()
    _notify(session, "pause", queue)
    return _state(row)


@either_session
def resume_queue(session: Session, queue: str) -> QueueState:
    """Resume a paused ``queue``, in the session's transaction; workers serving it fetch
    again as soon as it commits. Resuming an active queue changes nothing.

    Raises:
        InvalidOptionsError: not a queue name.
        UnknownQueueError: no job, worker or control row names the queue (a typo?).
        SchemaMissingError: the ``sa_jobs_queue`` branch is not installed.
    """
    check_queue(queue)
    _require_branch(session, "resume_queue")
    check_known_queues(session, [queue])
    row = session.execute(
        update(JobQueue)
        .where(JobQueue.name == queue)
        .values(paused_at=null(), updated_at=func.now())
        .returning(JobQueue.name, JobQueue.paused_at, JobQueue.updated_at)
    ).one_or_none()
    _notify(session, "resume", queue)
    return _state(row) if row is not None else QueueState(name=queue)


@either_session
def queue_states(session: Session, *, paused_only: bool = False) -> list[QueueState]:
    """The controls of every queue that has some (was ever paused), by name.

    A queue not listed is active. Without the ``sa_jobs_queue`` branch nothing can be
    paused, and the list is empty.
    """
    if not Features.of(session.connection()).queue:
        return []
    statement = select(JobQueue.name, JobQueue.paused_at, JobQueue.updated_at).order_by(
        JobQueue.name
    )
    if paused_only:
        statement = statement.where(JobQueue.paused_at.is_not(None))
    return [_state(row) for row in session.execute(statement)]
