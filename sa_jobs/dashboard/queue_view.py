"""The overview's queues: ``sa_jobs.stats()``'s figures per queue, joined with the queue
controls (``sa_jobs.queue_states``), the queues live workers serve, and each queue's
last hour (:func:`~sa_jobs.dashboard.queries.throughput`).

A worker counts as live only while its heartbeat is fresh
(:func:`~sa_jobs.dashboard.workers_view.is_gone`): its row outlives it by a day.

A queue with available jobs and no live worker serving it is *unserved*: its jobs wait
until a worker with that queue starts (a queue name no worker was given, or a typo in
``-q``), and the overview says so above the table.

A queue exists in sa_jobs only through its jobs, its workers and its controls, so the
table lists the union of the three: a paused queue with no jobs yet, or a queue a worker
serves that is empty, still gets its row — and its Pause/Resume button.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import attrs
from sqlalchemy.orm import Session

from sa_jobs._act.queues import queue_states
from sa_jobs._base.states import JobState
from sa_jobs._inspect.key_stats import QueueKeys
from sa_jobs._inspect.queue_stats import Stats, WorkerStats
from sa_jobs._table.schema import QUEUE_BRANCH, Features
from sa_jobs.dashboard.charts import Sparkline, sparkline
from sa_jobs.dashboard.queries import QueueHour, Throughput
from sa_jobs.dashboard.workers_view import is_gone

__all__ = ["QueueRow", "QueuesView", "live_workers", "queues_view"]


@attrs.frozen
class QueueRow:
    name: str
    counts: Mapping[JobState, int]
    estimated: frozenset[JobState]
    oldest_available_age: dt.timedelta | None
    #: When it was paused; None while it is active.
    paused_at: dt.datetime | None
    #: Live worker processes that serve it.
    workers: int
    #: Its last hour: jobs finished and their mean wait (None: none finished).
    hour: QueueHour | None = None
    #: The hour as a sparkline (None: none finished).
    spark: Sparkline | None = None
    #: Its partition keys, for a queue whose available jobs have them (stats()).
    keys: QueueKeys | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def available(self) -> int:
        return self.counts.get(JobState.AVAILABLE, 0)

    @property
    def available_estimated(self) -> bool:
        return JobState.AVAILABLE in self.estimated

    @property
    def unserved(self) -> bool:
        """Jobs are available in it and no live worker serves it: they wait until one
        does. (A paused queue is waiting on purpose, and says so itself.)"""
        return self.available > 0 and not self.workers and not self.paused


@attrs.frozen
class QueuesView:
    rows: Sequence[QueueRow]
    #: The ``sa_jobs_queue`` branch is installed: queues can be paused.
    controls: bool
    #: Worker processes with a fresh heartbeat, and those whose row outlived them.
    live_workers: int = 0
    gone_workers: int = 0
    branch: str = QUEUE_BRANCH

    @property
    def keyed(self) -> list[QueueRow]:
        """The queues whose available jobs have partition keys (fair or limited by key)."""
        return [row for row in self.rows if row.keys is not None]

    @property
    def unserved(self) -> list[QueueRow]:
        """The queues whose available jobs no live worker will fetch."""
        return [row for row in self.rows if row.unserved]


def live_workers(figures: Stats) -> list[WorkerStats]:
    """The workers of ``figures`` that have a heartbeat row, and a fresh one."""
    return [w for w in figures.workers if w.hostname is not None and not is_gone(w.heartbeat_age)]


def queues_view(session: Session, figures: Stats, hour: Throughput) -> QueuesView:
    controls = Features.of(session.connection()).queue
    paused = {state.name: state.paused_at for state in queue_states(session, paused_only=True)}
    live = live_workers(figures)
    serving: dict[str, int] = {}
    for worker in live:
        for queue in worker.queues:
            serving[queue] = serving.get(queue, 0) + 1
    zero = dict.fromkeys(JobState, 0)
    rows = []
    for name in sorted(set(figures.queues) | set(paused) | set(serving) | set(hour.queues)):
        found = figures.queues.get(name)
        finished = hour.queues.get(name)
        rows.append(
            QueueRow(
                name=name,
                counts=found.counts if found else zero,
                estimated=found.estimated if found else frozenset(),
                oldest_available_age=found.oldest_available_age if found else None,
                paused_at=paused.get(name),
                workers=serving.get(name, 0),
                hour=finished,
                spark=sparkline(finished.minutes) if finished else None,
                keys=found.keys if found else None,
            )
        )
    registered = sum(w.hostname is not None for w in figures.workers)
    return QueuesView(
        rows=rows, controls=controls, live_workers=len(live), gone_workers=registered - len(live)
    )
