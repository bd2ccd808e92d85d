"""The worker's own bookkeeping tables, beside the jobs: live worker processes and their
heartbeats, the maintenance leader's lease, the periodic jobs' schedule, and the queue
controls (paused queues). Each is small and written by the worker or the operator, never
by an application's insert; :mod:`sa_jobs._table.models` holds the jobs table itself.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, CheckConstraint, DateTime, Integer, Text, func, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from sa_jobs._table.models import Base

__all__ = ["JobQueue", "Leader", "PeriodicState", "WorkerProcess"]


class WorkerProcess(Base):
    """A live worker process; its heartbeat tells the rescuer its jobs are not orphaned."""

    __tablename__ = "sa_job_worker"

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    hostname: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(BigInteger)
    queues: Mapped[list[str]] = mapped_column(ARRAY(Text))
    started_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    heartbeat_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    # Deferred: a database not yet at sajobs_core_0006 lacks them, and loading the row
    # (the dashboard's Workers page) must not fail there.
    #: Handler threads stuck past their grace period now (revision sajobs_core_0006).
    stuck_threads: Mapped[int] = mapped_column(Integer, server_default=text("0"), deferred=True)
    #: The worker's ``stuck_thread_limit``; None from a worker of an earlier release.
    stuck_thread_limit: Mapped[int | None] = mapped_column(Integer, deferred=True)


class Leader(Base):
    """The one worker process currently running maintenance; the lease expires if it dies."""

    __tablename__ = "sa_job_leader"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    leader_id: Mapped[str] = mapped_column(Text)
    elected_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))


class PeriodicState(Base):
    """The durable schedule of one periodic job (the ``sa_jobs_periodic`` branch).

    ``next_run_at`` is the one instant not yet fired; a tick moves it forward with a
    compare-and-set in the transaction that inserts the instant's job, so each instant
    gets one job whatever the number of processes (``docs/periodic-jobs.md``).
    """

    __tablename__ = "sa_job_periodic"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    #: The schedule's canonical text; a process started later with another one in its
    #: code starts the job over from it.
    schedule: Mapped[str] = mapped_column(Text)
    next_run_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    #: The latest instant fired, and the job and (database) time it was inserted at.
    last_run_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    last_job_id: Mapped[int | None] = mapped_column(BigInteger)
    last_enqueued_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    #: ``sa_jobs.periodic.run_now`` asks for an extra run; the next tick honours it.
    run_now_requested_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    #: The start instant of the process whose code set ``schedule``: only a process
    #: started later may replace it, once, at its start (``docs/periodic-jobs.md``).
    schedule_set_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    #: Last time a worker with this periodic job in its code registered or ticked it;
    #: rows not seen for ``periodic_retire_after`` are deleted.
    seen_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class JobQueue(Base):
    """A queue's controls (the ``sa_jobs_queue`` branch): a row exists once a queue was
    paused, and stays after it is resumed, so later per-queue settings have a home.

    A queue without a row is simply active: queues are made by the jobs put in them.
    """

    __tablename__ = "sa_job_queue"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    #: Set while the queue is paused: no worker fetches from it (the fetch statement
    #: itself checks), inserts still succeed, running jobs finish.
    paused_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )

    __table_args__ = (CheckConstraint("char_length(name) BETWEEN 1 AND 128", name="name_length"),)
