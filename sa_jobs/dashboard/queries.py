"""What the dashboard's pages read beside the jobs list (:mod:`.job_list`) and the
workers (:mod:`.workers_view`): one job, halted sequences, the last hour. Each function
takes a ``Session`` and returns plain values for a template.

Every query is bounded, so a page costs the same on a table of millions of jobs as on
an empty one (docs/dashboard.md, "Big tables"):

* the chart reads the last hour of finished jobs along ``sa_job_finalized_idx`` (state,
  finalized_at), at most :data:`CHART_CAP` of each state, counted per queue and minute;
* halted sequences come from the partial slot index, at most :data:`LIST_CAP`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from sqlalchemy import Float, Integer, case, func, select
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import Session, undefer

from sa_jobs._base.states import JobState
from sa_jobs._declare.output import output_preview
from sa_jobs._inspect.ref_jobs import refs_in
from sa_jobs._table.models import Job, job_table, state_is
from sa_jobs._table.schema import Features
from sa_jobs.dashboard.sequence_keys import SequenceKeys, SequenceParts
from sa_jobs.errors import JobNotFoundError

__all__ = [
    "CHART_CAP",
    "LIST_CAP",
    "HaltedSequence",
    "JobDetail",
    "Minute",
    "QueueHour",
    "Throughput",
    "halted_sequences",
    "halts_sequence",
    "job_detail",
    "throughput",
]

#: Finished jobs of each state the chart reads, at most (the newest of the last hour).
CHART_CAP = 200_000
#: Halted sequences: a longer list is cut.
LIST_CAP = 200
#: The states in which a job that keeps its sequence's slot halts the sequence.
HALTING_STATES = (JobState.CANCELLED, JobState.DISCARDED)


# ---------------------------------------------------------------------- one job


@attrs.frozen
class JobDetail:
    job: Job[Any]
    features: Features
    #: Jobs waiting behind this one in its sequence (None: not sequenced).
    sequence_waiting: int | None
    #: This job halted its sequence (it is cancelled or discarded and keeps the slot).
    halts_sequence: bool
    #: What its sequence key is made of, from its own kind, queue and args (None: not
    #: sequenced, or made in a way the dashboard does not try).
    sequence_parts: SequenceParts | None = None
    #: Its recorded output as indented JSON, cut if long (None: none, or no branch).
    output: str | None = None
    #: The rows its args reference (``sa_jobs.Ref``): table, primary key, and the
    #: jobs-list filter value (``table:[pk]``).
    refs: list[tuple[str, str, str]] = attrs.field(factory=list)


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
    if features.output:
        options.append(undefer(Job.output_json))
    job = session.execute(select(Job).where(Job.id == job_id).options(*options)).scalar()
    if job is None:
        return None
    waiting = None
    halts = False
    parts = None
    if features.sequence and job.sequence_key is not None:
        parts = SequenceKeys().describe(job.sequence_key, job.kind, job.queue, job.args_json)
        waiting = session.scalar(
            select(func.count())
            .select_from(job_table)
            .where(
                job_table.c.sequence_key == job.sequence_key,
                state_is(job_table.c.state, JobState.PENDING),
            )
        )
        halts = _halts(job.state, job.sequence_key, job.sequence_slot)
    stored = job.output_json if features.output else None
    output = output_preview(stored) if stored is not None else None
    refs = [
        (table, json.dumps(pk)[1:-1], f"{table}:{json.dumps(pk)}")
        for table, pk in refs_in(job.args_json)
    ]
    return JobDetail(job, features, waiting, halts, parts, output, refs)


def _halts(state: JobState, sequence_key: bytes | None, slot: bool | None) -> bool:
    """A cancelled or discarded job that keeps its sequence's slot halts the sequence."""
    return sequence_key is not None and bool(slot) and state in HALTING_STATES


def halts_sequence(session: Session, job_id: int) -> bool:
    """Whether job ``job_id`` halts its sequence (needs the sequence branch).

    Raises:
        JobNotFoundError: no such job.
    """
    row = session.execute(
        select(job_table.c.state, job_table.c.sequence_key, job_table.c.sequence_slot).where(
            job_table.c.id == job_id
        )
    ).first()
    if row is None:
        raise JobNotFoundError(job_id)
    return _halts(*row)


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
    #: What the key is made of, from the halted job's kind, queue and args (None: made in
    #: a way the dashboard does not try, or args too large to read here).
    parts: SequenceParts | None = None


#: A halted job's args are read for its key's description only up to this size (bytes,
#: as stored): a page of 200 sequences must not read 200 large payloads.
MAX_ARGS_READ = 16_384


def halted_sequences(session: Session, limit: int | None = None) -> list[HaltedSequence]:
    """Sequences stopped by a cancelled or discarded job, newest halt first, and how many
    jobs wait behind each. Empty without the sequence branch."""
    limit = LIST_CAP if limit is None else limit
    if not Features.of(session.connection()).sequence:
        return []
    waiting = job_table.alias("waiting")
    pending = (
        select(func.count())
        .where(
            waiting.c.sequence_key == job_table.c.sequence_key,
            state_is(waiting.c.state, JobState.PENDING),
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
            case(
                (func.pg_column_size(job_table.c.args) <= MAX_ARGS_READ, job_table.c.args),
                else_=None,
            ),
        )
        .where(
            # The slot index's own predicate, so the planner reads only slot holders.
            job_table.c.sequence_key.is_not(None),
            job_table.c.sequence_slot,
            state_is(job_table.c.state, *HALTING_STATES),
        )
        .order_by(job_table.c.finalized_at.desc())
        .limit(limit)
    )
    keys = SequenceKeys()
    return [
        HaltedSequence(*row[:-1], parts=keys.describe(row[0], row.kind, row.queue, row[-1]))
        for row in session.execute(statement)
    ]


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
class QueueHour:
    """One queue's last hour: its minutes, and their totals."""

    queue: str
    minutes: Sequence[Minute]
    completed: int
    discarded: int
    #: Mean seconds from scheduled_at to the start of the run, over the completed jobs.
    wait: float | None


@attrs.frozen
class Throughput:
    #: Every queue's jobs, minute by minute.
    minutes: Sequence[Minute]
    #: Each queue that finished a job in the hour.
    queues: Mapping[str, QueueHour]
    #: The hour held more finished jobs than the chart reads: the oldest minutes shown
    #: may be incomplete.
    capped: bool


@attrs.define
class _Sums:
    """Running sums of one (queue, minute): counts, and waits/runs for the means."""

    completed: int = 0
    discarded: int = 0
    wait: float = 0.0
    waited: int = 0
    run: float = 0.0
    ran: int = 0

    def add(self, other: _Sums) -> None:
        for field in attrs.fields(_Sums):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def minute(self, start: dt.datetime) -> Minute:
        return Minute(
            start=start,
            completed=self.completed,
            discarded=self.discarded,
            # Clock skew between hosts can make a difference slightly negative.
            wait=max(self.wait / self.waited, 0.0) if self.waited else None,
            run=max(self.run / self.ran, 0.0) if self.ran else None,
        )


def throughput(session: Session, *, cap: int | None = None) -> Throughput:
    """The last 60 minutes, one :class:`Minute` each (the current one last), for all
    queues together and for each queue."""
    cap = CHART_CAP if cap is None else cap
    now = session.scalar(select(func.date_trunc("minute", func.now())))
    assert now is not None
    since = now - dt.timedelta(minutes=59)
    sums: dict[tuple[str, dt.datetime], _Sums] = {}
    capped = False
    for state in (JobState.COMPLETED, JobState.DISCARDED):
        read = 0
        for queue, minute, count, wait, waited, run, ran in session.execute(
            _per_queue_minute(state, since, cap)
        ):
            read += count
            if not since <= minute <= now:
                continue  # finalized "in the future" by a host whose clock runs ahead
            found = sums.setdefault((queue, minute), _Sums())
            if state is JobState.COMPLETED:
                found.add(
                    _Sums(completed=count, wait=wait or 0.0, waited=waited, run=run or 0.0, ran=ran)
                )
            else:
                found.discarded += count
        capped = capped or read >= cap
    starts = [since + dt.timedelta(minutes=index) for index in range(60)]
    overall = {start: _Sums() for start in starts}
    per_queue: dict[str, dict[dt.datetime, _Sums]] = {}
    for (queue, minute), found in sums.items():
        per_queue.setdefault(queue, {start: _Sums() for start in starts})[minute].add(found)
        overall[minute].add(found)
    queues = {}
    for queue in sorted(per_queue):
        hour = _Sums()
        for found in per_queue[queue].values():
            hour.add(found)
        queues[queue] = QueueHour(
            queue=queue,
            minutes=[found.minute(start) for start, found in per_queue[queue].items()],
            completed=hour.completed,
            discarded=hour.discarded,
            wait=hour.minute(now).wait,
        )
    return Throughput([found.minute(start) for start, found in overall.items()], queues, capped)


def _per_queue_minute(state: JobState, since: dt.datetime, cap: int) -> Any:
    """Per queue and minute: how many jobs of ``state`` finished, and the sums (and
    counts) of their waits and runs — at most ``cap`` jobs, the newest."""
    recent = (
        select(
            job_table.c.queue,
            job_table.c.finalized_at,
            job_table.c.attempted_at,
            job_table.c.scheduled_at,
        )
        .where(state_is(job_table.c.state, state), job_table.c.finalized_at >= since)
        .order_by(job_table.c.finalized_at.desc())
        .limit(cap)
        .subquery()
    )
    minute = func.date_trunc("minute", recent.c.finalized_at).label("minute")
    wait = func.extract("epoch", recent.c.attempted_at - recent.c.scheduled_at)
    run = func.extract("epoch", recent.c.finalized_at - recent.c.attempted_at)
    return select(
        recent.c.queue,
        minute,
        sql_cast(func.count(), Integer),
        sql_cast(func.sum(wait), Float),
        sql_cast(func.count(wait), Integer),
        sql_cast(func.sum(run), Float),
        sql_cast(func.count(run), Integer),
    ).group_by(recent.c.queue, minute)
