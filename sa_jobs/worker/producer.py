"""Fetching jobs for one queue, never more than its free slots.

:func:`jobs_fetch_available` locks due jobs with ``FOR UPDATE SKIP LOCKED`` in priority,
scheduled-time, id order (the order of the fetch index), so any number of worker
processes on any number of hosts can fetch from one table without blocking each other
or taking the same job.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    Engine,
    Integer,
    Text,
    any_,
    bindparam,
    case,
    func,
    null,
    select,
    text,
    update,
)
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.expression import ColumnElement

from sa_jobs._act.queues import queue_not_paused
from sa_jobs._base.error_records import describe
from sa_jobs._base.sql import id_array
from sa_jobs._base.states import JobState
from sa_jobs._table.job_loading import detached_job_builder
from sa_jobs._table.models import CORE_COLUMNS, Job, entering, state_is
from sa_jobs._table.schema import NO_FEATURES, Features
from sa_jobs.worker.db_access import is_transient
from sa_jobs.worker.opening import GENERIC_PLANS, opened_transaction
from sa_jobs.worker.service import Backoff, Service

__all__ = [
    "FETCH_ORDER",
    "Producer",
    "due_in_queue",
    "fetch_jobs",
    "fetched_columns",
    "in_start_order",
    "jobs_fetch_available",
    "running_values",
]

log = logging.getLogger("sa_jobs.worker")

#: How long a busy producer lets slots accumulate before fetching again (River has a
#: cooldown too); short enough not to matter for latency, long enough to batch.
FETCH_COOLDOWN = 0.002
#: The most jobs one fetch takes, and so the most one hand-off wakes. A fetch of 100 is
#: already one round trip per 100 jobs; past that, a bigger batch saves nothing and a
#: bigger burst costs: hundreds of handler threads woken at once queue up for the GIL,
#: the producer and the completer behind them (issue 28: at 500 slots, fetching 250 at a
#: time, a no-op drain ran at a third of the 200-slot rate).
FETCH_BATCH_MAX = 100


def due_in_queue(features: Features) -> list[ColumnElement[bool]]:
    """The rows a fetch of ``:fetch_queue`` may take: its available jobs that are due, of
    a queue that is not paused (with the queue branch). The one place that says so: the
    limited fetch (:mod:`.limited_fetch`) takes from the same rows."""
    queue = bindparam("fetch_queue", type_=Text)
    due = [
        state_is(Job.state, JobState.AVAILABLE),
        Job.queue == queue,
        Job.scheduled_at <= func.now(),
    ]
    if features.queue:
        due.append(queue_not_paused(queue))
    return due


#: The order jobs start in: the fetch index's.
FETCH_ORDER = (Job.priority, Job.scheduled_at, Job.id)


def running_values(features: Features, attempted_at: ColumnElement[Any]) -> dict[str, Any]:
    """What a fetch writes into the jobs it takes (``:fetch_worker_id`` is bound)."""
    values: dict[str, Any] = {
        **entering(JobState.RUNNING),
        "attempt": Job.attempt + 1,
        "run_count": Job.run_count + 1,
        "attempted_at": attempted_at,
        "attempted_by": func.array_append(
            func.coalesce(Job.attempted_by, text("'{}'::text[]")),
            bindparam("fetch_worker_id", type_=Text),
        ),
    }
    if features.unique:
        values["unique_key"] = case((Job.unique_until_start, null()), else_=Job.unique_key)
    return values


def fetched_columns(features: Features) -> tuple[Any, ...]:
    """The columns a fetch returns: with the sequence branch, the jobs' ``sequence_key``;
    with the workflow branch, their ``workflow_id`` (the completer writes a step's
    outcome in a transaction, and a plain job's in autocommit mode)."""
    columns: tuple[Any, ...] = CORE_COLUMNS
    if features.sequence:
        columns = (*columns, Job.sequence_key)
    if features.workflow:
        columns = (*columns, Job.workflow_id)
    return columns


@functools.cache
def jobs_fetch_available(features: Features = NO_FEATURES) -> ReturningUpdate[Any]:
    """Lock up to ``:fetch_limit`` due jobs of ``:fetch_queue``, mark them running for
    ``:fetch_worker_id``.

    Built once per set of features (it runs for every fetch); the three values are bound
    at execution. With the unique branch installed, jobs whose lock lasts only until they
    start (Faktory's ``unique_until: start``) give up their key here, for good. With the
    sequence branch, the jobs come back with their ``sequence_key``, so finishing a job
    that is not in a sequence can skip the sequence bookkeeping. With the queue branch, a
    paused queue gives nothing (:func:`~sa_jobs._act.queues.queue_not_paused`).
    """
    locked = (
        select(Job.id)
        .where(*due_in_queue(features))
        .order_by(*FETCH_ORDER)
        .limit(bindparam("fetch_limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("locked")
    )
    return (
        update(Job)
        # The locked ids as one array, not a join to the CTE: sa_job is then read by
        # primary key whatever the plan, and the statement runs a generic plan (the
        # fetch opens with opening.GENERIC_PLANS). Joined, the generic plan took
        # ``LIMIT :fetch_limit`` for a tenth of the queue and hash-joined a sequential
        # scan of sa_job; left to choose, PostgreSQL planned every fetch afresh, which
        # cost about what running it does (docs/performance.md).
        .where(Job.id == any_(id_array(select(func.array_agg(locked.c.id)))))
        .values(running_values(features, func.now()))
        .returning(*fetched_columns(features))
    )


@functools.cache
def _job_builder(features: Features) -> Callable[[Sequence[Any]], Job[Any]]:
    # The fetch's returned columns, sequence_key among them with the sequence branch:
    # the completer tells an unsequenced job by its loaded sequence_key being None.
    return detached_job_builder(fetched_columns(features))


def fetch_jobs(
    engine: Engine,
    queue: str,
    limit: int,
    worker_id: str,
    *,
    features: Features | None = None,
) -> list[Job[Any]]:
    """Fetch and detach jobs, in the order they should start.

    The rows are marked running and loaded in one transaction, which commits only once
    every row has been loaded: if anything about a row cannot be read, nothing is marked
    running, rather than a batch being marked and never handed over. ``features``: the
    database's (:meth:`~sa_jobs._table.schema.Features.of`) unless given.

    The rows are read with Core and built into detached ``Job`` objects directly
    (:mod:`sa_jobs._table.job_loading`): the same objects a Session would leave behind, for a
    fraction of the CPU.
    """
    params = {"fetch_queue": queue, "fetch_limit": limit, "fetch_worker_id": worker_id}
    # BEGIN goes with the generic-plan setting as one query on psycopg 3 (BEGIN, fetch,
    # COMMIT: the round trips of engine.begin()); other drivers begin as usual.
    with opened_transaction(engine, (), settings=GENERIC_PLANS) as (connection, _):
        if features is None:
            features = Features.of(connection)
        build = _job_builder(features)
        rows = connection.execute(jobs_fetch_available(features), params).all()
        jobs = [build(row) for row in rows]
    return in_start_order(jobs)


def in_start_order(jobs: list[Job[Any]]) -> list[Job[Any]]:
    """``jobs`` sorted as they should start (RETURNING keeps no order)."""
    jobs.sort(key=lambda job: (job.priority, job.scheduled_at, job.id))
    return jobs


class Producer(Service):
    """Keeps one queue's slots busy: fetches when woken (NOTIFY, a finished job) or polled."""

    def __init__(
        self,
        queue: str,
        concurrency: int,
        *,
        fetch: Callable[[str, int], list[Job[Any]]],
        dispatch: Callable[[list[Job[Any]]], None],
        poll_interval: float,
        stopping: threading.Event,
    ) -> None:
        super().__init__(f"producer-{queue}", stopping)
        self.queue = queue
        self.concurrency = concurrency
        self._fetch = fetch
        self._dispatch = dispatch
        self._poll_interval = poll_interval
        self._lock = threading.Lock()
        self._free = concurrency
        #: Free slots that make a busy producer fetch before its cooldown has passed:
        #: half of them, or a full batch if that is fewer.
        self._half = max(1, min(concurrency // 2, FETCH_BATCH_MAX))
        self._wake = threading.Event()
        # True once a fetch found nothing while no job was running; reset by any activity.
        self._drained = False
        self._backoff = Backoff()

    def wake(self) -> None:
        with self._lock:
            self._drained = False
        self._wake.set()

    def release(self) -> None:
        """A job of this queue has settled; its slot is free.

        The producer is woken when there is a fetch worth making: the first free slot
        of a full queue, or half the slots free (see :meth:`_fill_slots`); not once per
        job, which cost a thread wake-up per job on a busy worker.
        """
        with self._lock:
            self._free += 1
            self._drained = False
            worth_a_fetch = self._free == 1 or self._free == self._half
        if worth_a_fetch:
            self._wake.set()

    @property
    def free(self) -> int:
        """Slots no job holds."""
        with self._lock:
            return self._free

    @property
    def drained(self) -> bool:
        with self._lock:
            return self._drained and self._free == self.concurrency

    def run_loop(self) -> None:
        while not self.stopping.is_set():
            self._wake.wait(self._poll_interval)
            self._wake.clear()
            try:
                self._fill_slots()
                self._backoff.reset()
                self.outage.succeeded()
            except Exception as exc:
                failure = f"fetching from queue {self.queue!r} failed: {describe(exc)}"
                if is_transient(exc):
                    self.outage.failed("fetch", failure)
                else:
                    log.error("%s", failure)
                self._back_off()
            self.passed()

    def _back_off(self) -> None:
        """Wait out the backoff; a stop, or a wake (the end of an outage, see
        :mod:`.outage`), cuts it short."""
        deadline = time.monotonic() + self._backoff.next_wait()
        while not self.stopping.is_set() and not self._wake.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wake.wait(min(left, 0.05))

    def _await_half_free(self, deadline: float) -> int:
        """Wait until half the slots are free or ``deadline``; return the free slots."""
        while True:
            with self._lock:
                free = self._free
            left = deadline - time.monotonic()
            if free >= self._half or left <= 0 or self.stopping.is_set():
                return free
            self._wake.wait(left)
            self._wake.clear()

    def _fill_slots(self) -> None:
        """Fetch and dispatch until the slots are full or the queue has nothing due."""
        while not self.stopping.is_set():
            with self._lock:
                free = self._free
                # A fetch in flight is activity: run_until_idle must not take the queue
                # for drained while the fetch may be taking a job.
                self._drained = False
            if free == 0:
                return
            if free < self._half:
                # Busy: let more slots free up so the next fetch is a fuller batch (one
                # round trip for several jobs) — until half are free or the cooldown
                # has passed, whichever comes first. An idle queue never waits, and
                # fast handlers are not held up by a fixed pause.
                free = self._await_half_free(time.monotonic() + FETCH_COOLDOWN)
            free = min(free, FETCH_BATCH_MAX)  # more slots free: the loop fetches again
            jobs = self._fetch(self.queue, free)
            with self._lock:
                self._free -= len(jobs)
                if not jobs and self._free == self.concurrency:
                    self._drained = True
            if jobs:
                self._dispatch(jobs)  # the whole batch in one hand-off
            if len(jobs) < free:
                return
