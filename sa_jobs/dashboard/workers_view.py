"""What the Workers page reads: each worker process, whether it is still alive, the
leader, and what each one runs.

**Gone workers.** A worker's heartbeat row outlives the process: the cleaner deletes it
only after a day. The rescuer treats a worker as gone once its heartbeat is older than
its ``rescue_after``; the dashboard has no worker configuration to read that from, so it
uses the default (:data:`GONE_AFTER`, ``MaintenanceConfig().rescue_after``, 60 s). Such
a worker is shown with "no heartbeat for …", left out of the live counts, and its
running jobs are listed as orphans — the rescuer's next work.

**Bounded per worker.** Running jobs are ranked per worker (a window function over
``sa_job_running_idx``'s rows) and each worker shows at most :data:`LIST_CAP` of them
with its total, so one busy worker cannot make the others look idle.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import attrs
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sa_jobs._base.states import JobState
from sa_jobs._table.models import job_table, state_is
from sa_jobs._table.service_tables import Leader, WorkerProcess
from sa_jobs.worker.maintenance.loop import MaintenanceConfig

__all__ = [
    "GONE_AFTER",
    "LIST_CAP",
    "RunningJob",
    "WorkerInfo",
    "WorkersView",
    "is_gone",
    "workers_view",
]

#: Running jobs shown per worker, and orphans shown in all, at most.
LIST_CAP = 200
#: A worker silent this long is gone: the rescuer's default ``rescue_after``.
GONE_AFTER = dt.timedelta(seconds=MaintenanceConfig().rescue_after)


def is_gone(heartbeat_age: dt.timedelta | None) -> bool:
    """Whether a worker whose last heartbeat is this old (None: no row) is gone."""
    return heartbeat_age is None or heartbeat_age > GONE_AFTER


@attrs.frozen
class RunningJob:
    id: int
    kind: str
    queue: str
    attempt: int
    attempted_at: dt.datetime | None
    worker_id: str | None


@attrs.frozen
class WorkerInfo:
    id: str
    hostname: str
    pid: int
    queues: Sequence[str]
    started_at: dt.datetime
    heartbeat_at: dt.datetime
    is_leader: bool
    #: Its running jobs, longest running first, at most :data:`LIST_CAP`.
    running: Sequence[RunningJob]
    #: All its running jobs.
    running_count: int
    #: No heartbeat for longer than :data:`GONE_AFTER`: its jobs are orphans.
    gone: bool
    silent_for: dt.timedelta


@attrs.frozen
class WorkersView:
    #: Live workers first (oldest first), then gone ones.
    workers: Sequence[WorkerInfo]
    leader_id: str | None
    leader_expires_at: dt.datetime | None
    #: Running jobs whose worker has no heartbeat row or is gone (the rescuer's work),
    #: at most :data:`LIST_CAP`.
    orphans: Sequence[RunningJob]
    orphan_count: int
    now: dt.datetime
    gone_after: dt.timedelta = GONE_AFTER

    @property
    def live(self) -> int:
        return sum(not worker.gone for worker in self.workers)


def workers_view(session: Session, limit: int | None = None) -> WorkersView:
    limit = LIST_CAP if limit is None else limit
    now = session.scalar(select(func.now()))
    assert now is not None
    processes = session.scalars(select(WorkerProcess).order_by(WorkerProcess.started_at)).all()
    leader = session.scalar(select(Leader).where(Leader.expires_at > func.now()))
    running, totals = _running_by_worker(session, limit)
    infos = []
    for process in processes:
        silent_for = now - process.heartbeat_at
        infos.append(
            WorkerInfo(
                id=process.id,
                hostname=process.hostname,
                pid=process.pid,
                queues=process.queues,
                started_at=process.started_at,
                heartbeat_at=process.heartbeat_at,
                is_leader=leader is not None and leader.leader_id == process.id,
                running=running.get(process.id, []),
                running_count=totals.get(process.id, 0),
                gone=is_gone(silent_for),
                silent_for=silent_for,
            )
        )
    live_ids = {info.id for info in infos if not info.gone}
    orphaned = [worker for worker in sorted(running, key=str) if worker not in live_ids]
    orphans = [job for worker in orphaned for job in running[worker]][:limit]
    return WorkersView(
        workers=sorted(infos, key=lambda info: info.gone),  # stable: started_at within
        leader_id=leader.leader_id if leader else None,
        leader_expires_at=leader.expires_at if leader else None,
        orphans=orphans,
        orphan_count=sum(totals[worker] for worker in orphaned),
        now=now,
    )


def _running_by_worker(
    session: Session, limit: int
) -> tuple[dict[str | None, list[RunningJob]], dict[str | None, int]]:
    """Each worker's running jobs (the first ``limit`` by start), and how many it runs."""
    worker = job_table.c.attempted_by[func.cardinality(job_table.c.attempted_by)]
    ranked = (
        select(
            job_table.c.id,
            job_table.c.kind,
            job_table.c.queue,
            job_table.c.attempt,
            job_table.c.attempted_at,
            worker.label("worker_id"),
            func.row_number()
            .over(partition_by=worker, order_by=(job_table.c.attempted_at, job_table.c.id))
            .label("rank"),
            func.count().over(partition_by=worker).label("total"),
        )
        # A literal state: the condition matches sa_job_running_idx's predicate.
        .where(state_is(job_table.c.state, JobState.RUNNING))
        .subquery("ranked")
    )
    rows = session.execute(
        select(ranked).where(ranked.c.rank <= limit).order_by(ranked.c.worker_id, ranked.c.rank)
    ).all()
    running: dict[str | None, list[RunningJob]] = {}
    totals: dict[str | None, int] = {}
    for row in rows:
        running.setdefault(row.worker_id, []).append(
            RunningJob(row.id, row.kind, row.queue, row.attempt, row.attempted_at, row.worker_id)
        )
        totals[row.worker_id] = row.total
    return running, totals
