"""What the dashboard's pages read: each function takes a ``Session`` and returns plain
values for a template.

Every query is bounded, so a page costs the same on a table of ten million jobs as on
an empty one (docs/dashboard.md, "Big tables", has the plans):

* the jobs list is keyset-paginated on the primary key (``id < :before ORDER BY id
  DESC``) and never reads more than :data:`SCAN_WINDOW` rows for one page, however rare
  the filter: a page that finds fewer matches says how far it looked and offers to look
  further back;
* the chart reads the last hour of finished jobs along ``sa_job_finalized_idx`` (state,
  finalized_at), at most :data:`CHART_CAP` of them;
* halted sequences come from the partial slot index, running jobs from
  ``sa_job_running_idx``, each list capped.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from sqlalchemy import (
    Float,
    Integer,
    Select,
    Text,
    func,
    select,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import Session, undefer
from sqlalchemy.sql.expression import ColumnElement

from sa_jobs.models import Job, Leader, WorkerProcess, job_table
from sa_jobs.schema import Features
from sa_jobs.states import JobState

__all__ = [
    "CHART_CAP",
    "PAGE_SIZE",
    "SCAN_WINDOW",
    "HaltedSequence",
    "JobDetail",
    "JobListRow",
    "JobPage",
    "ListFilter",
    "Minute",
    "Throughput",
    "WorkerInfo",
    "WorkersView",
    "halted_sequences",
    "job_detail",
    "list_jobs",
    "throughput",
    "workers",
]

PAGE_SIZE = 50
#: Rows of the table one page of the jobs list may read (newest first), at most.
SCAN_WINDOW = 50_000
#: Finished jobs the chart reads, at most (the newest of the last hour).
CHART_CAP = 200_000
#: Halted sequences, running jobs: lists longer than this are cut.
LIST_CAP = 200
ARGS_PREVIEW = 160


class FilterError(ValueError):
    """A filter in the query string that cannot be applied (shown on the page as is)."""


@attrs.frozen
class ListFilter:
    """The jobs list's filters; empty strings mean "any"."""

    state: JobState | None = None
    queue: str = ""
    kind: str = ""
    tag: str = ""
    text: str = ""

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> ListFilter:
        """The filter in a query string.

        Raises:
            FilterError: an unknown state.
        """
        state_name = params.get("state", "").strip()
        state = None
        if state_name:
            try:
                state = JobState(state_name)
            except ValueError:
                names = ", ".join(s.value for s in JobState)
                raise FilterError(f"unknown state {state_name!r}; use one of {names}") from None
        return cls(
            state=state,
            queue=params.get("queue", "").strip(),
            kind=params.get("kind", "").strip(),
            tag=params.get("tag", "").strip(),
            text=params.get("q", "").strip(),
        )

    @property
    def active(self) -> bool:
        return bool(self.state or self.queue or self.kind or self.tag or self.text)

    def params(self) -> dict[str, str]:
        """The filter as query-string parameters (empty ones left out)."""
        found = {
            "state": self.state.value if self.state else "",
            "queue": self.queue,
            "kind": self.kind,
            "tag": self.tag,
            "q": self.text,
        }
        return {name: value for name, value in found.items() if value}

    def conditions(self, jobs: Any) -> list[ColumnElement[bool]]:
        """The WHERE conditions on ``jobs`` (the table or a subquery of it)."""
        found: list[ColumnElement[bool]] = []
        if self.state is not None:
            found.append(jobs.c.state == self.state)
        if self.queue:
            found.append(jobs.c.queue == self.queue)
        if self.kind:
            found.append(jobs.c.kind == self.kind)
        if self.tag:
            found.append(jobs.c.tags.contains([self.tag]))
        if self.text:
            pattern = "%" + _escape_like(self.text) + "%"
            found.append(sql_cast(jobs.c.args, Text).ilike(pattern, escape="\\"))
        return found


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# ---------------------------------------------------------------------- the jobs list


@attrs.frozen
class JobListRow:
    id: int
    kind: str
    queue: str
    state: JobState
    attempt: int
    max_attempts: int
    priority: int
    tags: Sequence[str]
    created_at: dt.datetime
    scheduled_at: dt.datetime
    finalized_at: dt.datetime | None
    args_preview: str
    last_error: str | None


@attrs.frozen
class JobPage:
    """One page of the jobs list.

    Attributes:
        rows: The jobs, newest first.
        older: The ``before`` cursor of the next (older) page, or None at the end.
        searched_to: Set when the page is short because it read its whole window: the
            lowest id it looked at (older jobs were not searched yet; ``older`` goes on).
    """

    rows: Sequence[JobListRow]
    older: int | None
    searched_to: int | None = None


def _window(before: int | None, size: int) -> Select[Any]:
    """The newest ``size`` jobs below ``before``, read backwards along the primary key."""
    statement = select(job_table).order_by(job_table.c.id.desc()).limit(size)
    if before is not None:
        statement = statement.where(job_table.c.id < before)
    return statement


def list_jobs(
    session: Session,
    jobs_filter: ListFilter,
    before: int | None = None,
    *,
    page_size: int = PAGE_SIZE,
    window: int = SCAN_WINDOW,
) -> JobPage:
    """A page of jobs matching ``jobs_filter``, newest first, with ids below ``before``."""
    scanned = _window(before, window).subquery("scanned")
    last_error = scanned.c.errors[-1]["error"].astext
    statement = (
        select(
            scanned.c.id,
            scanned.c.kind,
            scanned.c.queue,
            scanned.c.state,
            scanned.c.attempt,
            scanned.c.max_attempts,
            scanned.c.priority,
            scanned.c.tags,
            scanned.c.created_at,
            scanned.c.scheduled_at,
            scanned.c.finalized_at,
            func.left(sql_cast(scanned.c.args, Text), ARGS_PREVIEW).label("args_preview"),
            last_error.label("last_error"),
        )
        .where(*jobs_filter.conditions(scanned))
        .order_by(scanned.c.id.desc())
        .limit(page_size + 1)
    )
    found = session.execute(statement).all()
    rows = [JobListRow(**row._mapping) for row in found[:page_size]]
    if len(found) > page_size:
        return JobPage(rows, older=rows[-1].id)
    if not jobs_filter.active:
        return JobPage(rows, older=None)  # the window held every row there was
    # Fewer matches than a page: either the table ends within the window, or the
    # window ran out first — then say where, so the next page searches on from there.
    boundary = session.scalar(
        select(job_table.c.id)
        .where(*([job_table.c.id < before] if before is not None else []))
        .order_by(job_table.c.id.desc())
        .offset(window - 1)
        .limit(1)
    )
    if boundary is None:
        return JobPage(rows, older=None)
    return JobPage(rows, older=boundary, searched_to=boundary)


# ---------------------------------------------------------------------- one job


@attrs.frozen
class JobDetail:
    job: Job[Any]
    features: Features
    #: Jobs waiting behind this one in its sequence (None: not sequenced).
    sequence_waiting: int | None
    #: This job halted its sequence (it is cancelled or discarded and keeps the slot).
    halts_sequence: bool


def job_detail(session: Session, job_id: int) -> JobDetail | None:
    features = Features.of(session.connection())
    options = []
    if features.unique:
        options.append(undefer(Job.unique_key))
        options.append(undefer(Job.unique_states))
        options.append(undefer(Job.unique_expires_at))
    if features.sequence:
        options.append(undefer(Job.sequence_key))
        options.append(undefer(Job.sequence_slot))
    if features.job_key:
        options.append(undefer(Job.job_key))
        options.append(undefer(Job.revision))
    job = session.execute(select(Job).where(Job.id == job_id).options(*options)).scalar()
    if job is None:
        return None
    waiting = None
    halts = False
    if features.sequence and job.sequence_key is not None:
        waiting = session.scalar(
            select(func.count())
            .select_from(job_table)
            .where(
                job_table.c.sequence_key == job.sequence_key,
                job_table.c.state == JobState.PENDING,
            )
        )
        halts = bool(job.sequence_slot) and job.state in (JobState.CANCELLED, JobState.DISCARDED)
    return JobDetail(job, features, waiting, halts)


# ---------------------------------------------------------------------- sequences


@attrs.frozen
class HaltedSequence:
    key: bytes
    job_id: int
    kind: str
    queue: str
    state: JobState
    finalized_at: dt.datetime | None
    last_error: str | None
    waiting: int


def halted_sequences(session: Session, limit: int = LIST_CAP) -> list[HaltedSequence]:
    """Sequences stopped by a cancelled or discarded job, newest halt first, and how many
    jobs wait behind each. Empty without the sequence branch."""
    if not Features.of(session.connection()).sequence:
        return []
    waiting = job_table.alias("waiting")
    pending = (
        select(func.count())
        .where(
            waiting.c.sequence_key == job_table.c.sequence_key, waiting.c.state == JobState.PENDING
        )
        .scalar_subquery()
    )
    statement = (
        select(
            job_table.c.sequence_key,
            job_table.c.id,
            job_table.c.kind,
            job_table.c.queue,
            job_table.c.state,
            job_table.c.finalized_at,
            job_table.c.errors[-1]["error"].astext,
            pending,
        )
        .where(
            # The slot index's own predicate, so the planner reads only slot holders.
            job_table.c.sequence_key.is_not(None),
            job_table.c.sequence_slot,
            job_table.c.state.in_([JobState.CANCELLED, JobState.DISCARDED]),
        )
        .order_by(job_table.c.finalized_at.desc())
        .limit(limit)
    )
    return [HaltedSequence(*row) for row in session.execute(statement)]


# ---------------------------------------------------------------------- workers


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
    running: Sequence[RunningJob]


@attrs.frozen
class WorkersView:
    workers: Sequence[WorkerInfo]
    leader_id: str | None
    leader_expires_at: dt.datetime | None
    #: Running jobs whose worker has no heartbeat row (gone; the rescuer will see to them).
    orphans: Sequence[RunningJob]
    now: dt.datetime


def workers(session: Session, limit: int = LIST_CAP) -> WorkersView:
    now = session.scalar(select(func.now()))
    assert now is not None
    processes = session.scalars(select(WorkerProcess).order_by(WorkerProcess.started_at)).all()
    leader = session.scalar(select(Leader).where(Leader.expires_at > func.now()))
    last_worker = job_table.c.attempted_by[func.cardinality(job_table.c.attempted_by)]
    running = [
        RunningJob(*row)
        for row in session.execute(
            select(
                job_table.c.id,
                job_table.c.kind,
                job_table.c.queue,
                job_table.c.attempt,
                job_table.c.attempted_at,
                last_worker,
            )
            .where(job_table.c.state == JobState.RUNNING)
            .order_by(job_table.c.attempted_at)
            .limit(limit)
        )
    ]
    by_worker: dict[str | None, list[RunningJob]] = {}
    for job in running:
        by_worker.setdefault(job.worker_id, []).append(job)
    infos = [
        WorkerInfo(
            id=process.id,
            hostname=process.hostname,
            pid=process.pid,
            queues=process.queues,
            started_at=process.started_at,
            heartbeat_at=process.heartbeat_at,
            is_leader=leader is not None and leader.leader_id == process.id,
            running=by_worker.pop(process.id, []),
        )
        for process in processes
    ]
    orphans = [job for jobs in by_worker.values() for job in jobs]
    return WorkersView(
        infos,
        leader.leader_id if leader else None,
        leader.expires_at if leader else None,
        orphans,
        now,
    )


# ---------------------------------------------------------------------- the chart


@attrs.frozen
class Minute:
    """One minute of the last hour: jobs finished, and how long they waited and ran."""

    start: dt.datetime
    completed: int = 0
    discarded: int = 0
    #: Mean seconds from scheduled_at to the start of the run that completed.
    wait: float | None = None
    #: Mean seconds that run took.
    run: float | None = None


@attrs.frozen
class Throughput:
    minutes: Sequence[Minute]
    #: The hour held more finished jobs than the chart reads: the oldest minutes shown
    #: may be incomplete.
    capped: bool


def throughput(session: Session, *, cap: int = CHART_CAP) -> Throughput:
    """The last 60 minutes, one :class:`Minute` each (the current one last)."""
    now = session.scalar(select(func.date_trunc("minute", func.now())))
    assert now is not None
    since = now - dt.timedelta(minutes=59)
    per_state: dict[JobState, dict[dt.datetime, Any]] = {}
    capped = False
    for state in (JobState.COMPLETED, JobState.DISCARDED):
        recent = (
            select(job_table.c.finalized_at, job_table.c.attempted_at, job_table.c.scheduled_at)
            .where(job_table.c.state == state, job_table.c.finalized_at >= since)
            .order_by(job_table.c.finalized_at.desc())
            .limit(cap)
            .subquery()
        )
        minute = func.date_trunc("minute", recent.c.finalized_at).label("minute")
        statement = select(
            minute,
            sql_cast(func.count(), Integer),
            sql_cast(
                func.avg(func.extract("epoch", recent.c.attempted_at - recent.c.scheduled_at)),
                Float,
            ),
            sql_cast(
                func.avg(func.extract("epoch", recent.c.finalized_at - recent.c.attempted_at)),
                Float,
            ),
        ).group_by(minute)
        rows = session.execute(statement).all()
        per_state[state] = {row[0]: row for row in rows}
        capped = capped or sum(row[1] for row in rows) >= cap
    minutes = []
    for index in range(60):
        start = since + dt.timedelta(minutes=index)
        done = per_state[JobState.COMPLETED].get(start)
        failed = per_state[JobState.DISCARDED].get(start)
        minutes.append(
            Minute(
                start=start,
                completed=done[1] if done else 0,
                discarded=failed[1] if failed else 0,
                wait=max(done[2], 0.0) if done and done[2] is not None else None,
                run=max(done[3], 0.0) if done and done[3] is not None else None,
            )
        )
    return Throughput(minutes, capped)
