"""``sa_jobs.stats(session)``: how many jobs each queue holds in each state (and how many
workflow steps wait for their dependencies), how long the oldest available one has
waited, what each worker runs, which sequences are halted,
which queues have available jobs that no live worker serves, and the health figures of
:mod:`sa_jobs._inspect.health`.

It must stay fast on a table of 10 million finished jobs, and during a backlog of
millions of available ones: every state is counted by :mod:`sa_jobs._inspect.job_counts` — exactly
up to ``exact_limit`` rows per state (default 100,000), through the partial index holding
that state, and estimated from a page sample of the table past it.
:attr:`Stats.estimated` and :attr:`QueueStats.estimated` name the states whose figures
are estimates. The oldest available age is read by a skip scan of the fetch index, one
descent per queue and priority.

Everything is read in the caller's session; nothing is written.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from typing import Any

import attrs
from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from sa_jobs._base.replicas import DEFAULT_MAX_LAG, OnLag, ReplicaReads, ReplicaStatus
from sa_jobs._base.sessions import either_session
from sa_jobs._base.states import JobState
from sa_jobs._insert.sequence import halts_sequence
from sa_jobs._inspect.health import Health, HealthThresholds, read_health
from sa_jobs._inspect.job_counts import (
    EXACT_LIMIT,
    check_exact_limit,
    count_jobs,
    oldest_available,
    pending_steps,
)
from sa_jobs._inspect.key_stats import QueueKeys, queue_keys
from sa_jobs._table.models import job_table, state_is
from sa_jobs._table.schema import Features
from sa_jobs._table.service_tables import JobQueue, Leader, WorkerProcess

__all__ = [
    "EXACT_LIMIT",
    "HaltedSequence",
    "HaltedSequences",
    "QueueStats",
    "Stats",
    "WorkerStats",
    "as_dict",
    "stats",
    "stats_through",
]

#: How many halted sequences are listed (all are counted).
HALTED_LISTED = 100


@attrs.frozen
class QueueStats:
    """One queue's figures.

    Attributes:
        name: The queue.
        counts: Jobs in each state (every state present, 0 where none).
        estimated: The states whose count is an estimate (past the exact limit).
        oldest_available_age: How long the longest-waiting ``available`` job has been
            due; None when none is available.
        paused: Whether the queue is paused (:func:`sa_jobs.pause_queue`); None without
            the ``sa_jobs_queue`` branch, where nothing can be paused.
        pending_steps: Workflow steps waiting for their dependencies (counted apart
            from ``counts[PENDING]``, which is sequences' waiting jobs); None without the
            ``sa_jobs_workflow`` branch. Past ``exact_limit``, ``exact_limit + 1``.
        keys: For a queue whose available jobs have partition keys (fair or limited by
            key): how many keys, and the ones with the most available jobs with their
            oldest wait (:mod:`sa_jobs._inspect.key_stats`); None otherwise.
    """

    name: str
    counts: Mapping[JobState, int]
    estimated: frozenset[JobState]
    oldest_available_age: dt.timedelta | None
    paused: bool | None = None
    pending_steps: int | None = None
    keys: QueueKeys | None = None


@attrs.frozen
class WorkerStats:
    """A worker process: its heartbeat row, and the jobs it runs now.

    A worker id with running jobs and no heartbeat row (``hostname`` None) has gone
    away; the rescuer fails those attempts after its rescue delay.

    Attributes:
        id: The worker's id (the last entry of its jobs' ``attempted_by``).
        running: Jobs in ``running`` it attempts now.
        hostname: From its heartbeat row; None when it has none.
        pid: Likewise.
        queues: The queues it works.
        started_at: When it registered.
        heartbeat_age: Time since its last heartbeat.
    """

    id: str
    running: int
    hostname: str | None
    pid: int | None
    queues: tuple[str, ...]
    started_at: dt.datetime | None
    heartbeat_age: dt.timedelta | None


@attrs.frozen
class HaltedSequence:
    """A sequence halted by a cancelled or discarded job (see docs/sequences.md)."""

    job_id: int
    kind: str
    queue: str
    state: JobState
    finalized_at: dt.datetime
    #: Jobs of the sequence waiting (``pending``) behind it.
    waiting: int


@attrs.frozen
class HaltedSequences:
    """Every halted sequence counted; the ones halted longest listed (at most 100)."""

    count: int
    listed: tuple[HaltedSequence, ...]


@attrs.frozen
class Stats:
    """What :func:`stats` returns.

    Attributes:
        taken_at: The database's clock when the figures were read.
        queues: Per queue, by name (queues with any job, in name order).
        totals: Jobs in each state over all queues.
        estimated: The states whose figures are estimates (in ``totals`` and in each
            queue).
        exact_limit: Jobs per state counted exactly up to this many.
        workers: Registered worker processes and workers with running jobs, by id.
        leader: The worker running maintenance now; None when no lease is held.
        halted_sequences: None when the sequence branch is not installed.
        health: The xmin horizon, its holders, dead rows and unserved queues:
            :class:`~sa_jobs._inspect.health.Health`.
        unserved_queues: The queues with available jobs that no live worker serves
            (none lists it in a heartbeat younger than the rescuer's default 60 s) and
            that are not paused, by name: their jobs wait until a worker serves them.
            How long each has waited is its ``oldest_available_age``;
            ``health.unserved_queues`` has the same, and the health check warns past
            ``HealthThresholds.unserved_age_warning``.
        pending_steps: Workflow steps waiting for their dependencies, over all queues
            (see :attr:`QueueStats.pending_steps`); None without the ``sa_jobs_workflow``
            branch.
        pending_steps_capped: Some queue has more than ``exact_limit`` of them: its
            figure (and the total) is a floor.
        replica: With ``read_engine=``: where the figures were read and how far behind
            the replica was (:class:`~sa_jobs._base.replicas.ReplicaStatus`); None
            without.
    """

    taken_at: dt.datetime
    queues: Mapping[str, QueueStats]
    totals: Mapping[JobState, int]
    estimated: frozenset[JobState]
    exact_limit: int
    workers: tuple[WorkerStats, ...]
    leader: str | None
    halted_sequences: HaltedSequences | None
    health: Health
    unserved_queues: tuple[str, ...] = ()
    pending_steps: int | None = None
    pending_steps_capped: bool = False
    replica: ReplicaStatus | None = None

    def as_dict(self) -> dict[str, Any]:
        """These figures in a JSON-ready form (:func:`as_dict`): timedeltas in seconds,
        instants in ISO 8601, enums by value. A method, so that callers need no import
        from this internal module."""
        found: dict[str, Any] = as_dict(self)
        return found


# ---------------------------------------------------------------------- counting

_jobs = job_table.c


def _paused_queues(connection: Connection) -> set[str]:
    """The queues paused now (the ``sa_jobs_queue`` branch's table)."""
    return set(connection.scalars(select(JobQueue.name).where(JobQueue.paused_at.is_not(None))))


# ---------------------------------------------------------------------- workers, sequences


def _workers(connection: Connection) -> tuple[WorkerStats, ...]:
    last_attempt = _jobs.attempted_by[func.cardinality(_jobs.attempted_by)]
    running = (
        select(last_attempt.label("worker_id"), func.count().label("running"))
        .where(state_is(_jobs.state, JobState.RUNNING))  # sa_job_running_idx
        .group_by(last_attempt)
        .subquery("running_by_worker")
    )
    w = WorkerProcess.__table__.c
    joined = running.join(WorkerProcess.__table__, running.c.worker_id == w.id, full=True)
    worker_id = func.coalesce(w.id, running.c.worker_id, "?")
    rows = connection.execute(
        select(
            worker_id.label("id"),
            func.coalesce(running.c.running, 0).label("running"),
            w.hostname,
            w.pid,
            w.queues,
            w.started_at,
            (func.now() - w.heartbeat_at).label("heartbeat_age"),
        )
        .select_from(joined)
        .order_by(worker_id)
    )
    return tuple(
        WorkerStats(
            id=row.id,
            running=row.running,
            hostname=row.hostname,
            pid=row.pid,
            queues=tuple(row.queues or ()),
            started_at=row.started_at,
            heartbeat_age=row.heartbeat_age,
        )
        for row in rows
    )


def _leader(connection: Connection) -> str | None:
    leader = Leader.__table__.c
    found: str | None = connection.scalar(
        select(leader.leader_id).where(leader.expires_at > func.now()).limit(1)
    )
    return found


def _halted_sequences(connection: Connection) -> HaltedSequences:
    halted = job_table.alias("halted")
    waiting = job_table.alias("waiting")
    behind = (
        select(func.count())
        .where(
            waiting.c.sequence_key == halted.c.sequence_key,
            waiting.c.sequence_key.is_not(None),
            state_is(waiting.c.state, JobState.PENDING),  # sa_job_sequence_pending_idx
        )
        .scalar_subquery()
    )
    count = connection.scalar(
        select(func.count()).select_from(halted).where(halts_sequence(halted))
    )
    rows = connection.execute(
        select(
            halted.c.id,
            halted.c.kind,
            halted.c.queue,
            halted.c.state,
            halted.c.finalized_at,
            behind.label("waiting"),
        )
        .where(halts_sequence(halted))
        .order_by(halted.c.finalized_at, halted.c.id)
        .limit(HALTED_LISTED)
    )
    return HaltedSequences(
        count=int(count or 0),
        listed=tuple(
            HaltedSequence(
                job_id=row.id,
                kind=row.kind,
                queue=row.queue,
                state=row.state,
                finalized_at=row.finalized_at,
                waiting=row.waiting,
            )
            for row in rows
        ),
    )


# ---------------------------------------------------------------------- stats()


@either_session
def stats(
    session: Session,
    *,
    exact_limit: int = EXACT_LIMIT,
    thresholds: HealthThresholds | None = None,
    read_engine: Engine | AsyncEngine | None = None,
    max_replica_lag: float = DEFAULT_MAX_LAG,
    on_replica_lag: OnLag = "fall_back",
) -> Stats:
    """Counts per queue and state, the oldest available job's age, running jobs by
    worker, halted sequences, the queues no live worker serves and the health figures,
    read in ``session``.

    Args:
        session: A ``Session`` or ``AsyncSession`` (then await the result).
        exact_limit: The jobs of one state are counted exactly up to this many, and
            estimated past it (see the module); at least 1.
        thresholds: What the health figures are judged by (default
            :class:`~sa_jobs._inspect.health.HealthThresholds`).
        read_engine: A streaming standby of the session's database: the counts, ages,
            workers and sequences are read there (the health figures — the horizon,
            dead rows — stay the primary's, whose vacuum they are about). An
            ``AsyncEngine`` with an ``AsyncSession``. See docs/operations.md, "Reads
            from a replica".
        max_replica_lag: Seconds the replica may be behind (default 5).
        on_replica_lag: Past it, ``"fall_back"`` (read in ``session`` instead, the
            default) or ``"report"`` (read the replica anyway); :attr:`Stats.replica`
            says which happened.

    Raises:
        InvalidOptionsError: ``exact_limit`` is not a whole number of at least 1; a
            ``read_engine`` on another database, or bad lag options.
        SchemaMissingError: the database has no sa_job table.
    """
    reads = (
        None
        if read_engine is None
        else ReplicaReads(read_engine, max_lag=max_replica_lag, on_lag=on_replica_lag)
    )
    return stats_through(session, reads, exact_limit=exact_limit, thresholds=thresholds)


def stats_through(
    session: Session,
    reads: ReplicaReads | None,
    *,
    exact_limit: int = EXACT_LIMIT,
    thresholds: HealthThresholds | None = None,
) -> Stats:
    """:func:`stats`, read through ``reads`` when given (the command line's, which
    names its own option in errors)."""
    check_exact_limit(exact_limit)
    primary = session.connection()
    if reads is None:
        return _read_stats(primary, primary, exact_limit, thresholds)
    with reads.sync_engine.connect() as replica:
        reads.check(replica, lambda: primary)
        status = reads.measure(replica)
        reader = replica if status.source == "replica" else primary
        return attrs.evolve(_read_stats(reader, primary, exact_limit, thresholds), replica=status)


def _read_stats(
    connection: Connection,
    primary: Connection,
    exact_limit: int,
    thresholds: HealthThresholds | None,
) -> Stats:
    """The figures, read on ``connection``; the health figures on ``primary``."""
    features = Features.of(connection)
    taken_at: dt.datetime = connection.execute(select(func.now())).scalar_one()
    oldest = oldest_available(connection)
    found = count_jobs(
        connection, JobState, exact_limit, features=features, available_queues=oldest
    )
    counts = {queue: dict(by_state) for queue, by_state in found.counts.items()}
    for queue in oldest:
        counts.setdefault(queue, {})
    estimated = found.estimated
    paused = _paused_queues(connection) if features.queue else None
    for name in paused or ():
        counts.setdefault(name, {})  # a paused queue shows even with no jobs
    steps = pending_steps(connection, exact_limit) if features.workflow else None
    for name in steps or ():
        counts.setdefault(name, {})
    queues = {
        name: QueueStats(
            name=name,
            counts={state: counts[name].get(state, 0) for state in JobState},
            estimated=frozenset(s for s in estimated if counts[name].get(s)),
            oldest_available_age=oldest.get(name),
            paused=None if paused is None else name in paused,
            pending_steps=None if steps is None else steps.get(name, 0),
            keys=queue_keys(connection, name, exact_limit)
            if features.fairness and name in oldest
            else None,
        )
        for name in sorted(counts)
    }
    health = read_health(primary, thresholds, available=oldest)
    return Stats(
        taken_at=taken_at,
        queues=queues,
        totals={state: sum(q.counts[state] for q in queues.values()) for state in JobState},
        estimated=estimated,
        exact_limit=exact_limit,
        workers=_workers(connection),
        leader=_leader(connection),
        halted_sequences=_halted_sequences(connection) if features.sequence else None,
        health=health,
        unserved_queues=tuple(health.unserved_queues or ()),
        pending_steps=None if steps is None else sum(steps.values()),
        pending_steps_capped=any(n > exact_limit for n in (steps or {}).values()),
    )


def as_dict(value: Any) -> Any:
    """A JSON-ready form of :class:`Stats`, :class:`~sa_jobs._inspect.health.Health` or any part
    of them: timedeltas in seconds, instants in ISO 8601, enums by value, sets sorted."""
    if attrs.has(type(value)):
        return {f.name: as_dict(getattr(value, f.name)) for f in attrs.fields(type(value))}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, frozenset | set):
        return sorted(as_dict(item) for item in value)
    if isinstance(value, Mapping):
        return {str(as_dict(key)): as_dict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [as_dict(item) for item in value]
    return value
