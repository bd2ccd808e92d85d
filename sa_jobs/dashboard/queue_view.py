"""The overview's queues: ``sa_jobs.stats()``'s figures per queue, joined with the queue
controls (``sa_jobs.queue_states``) and the queues live workers serve.

A queue exists in sa_jobs only through its jobs, its workers and its controls, so the
table lists the union of the three: a paused queue with no jobs yet, or a queue a worker
serves that is empty, still gets its row — and its Pause/Resume button.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import attrs
from sqlalchemy.orm import Session

from sa_jobs.queue_stats import Stats
from sa_jobs.queues import queue_states
from sa_jobs.schema import QUEUE_BRANCH, Features
from sa_jobs.states import JobState

__all__ = ["QueueRow", "QueuesView", "queues_view"]


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

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


@attrs.frozen
class QueuesView:
    rows: Sequence[QueueRow]
    #: The ``sa_jobs_queue`` branch is installed: queues can be paused.
    controls: bool
    branch: str = QUEUE_BRANCH


def queues_view(session: Session, figures: Stats) -> QueuesView:
    controls = Features.of(session.connection()).queue
    paused = {state.name: state.paused_at for state in queue_states(session, paused_only=True)}
    serving: dict[str, int] = {}
    for worker in figures.workers:
        for queue in worker.queues:
            serving[queue] = serving.get(queue, 0) + 1
    zero = dict.fromkeys(JobState, 0)
    rows = []
    for name in sorted(set(figures.queues) | set(paused) | set(serving)):
        found = figures.queues.get(name)
        rows.append(
            QueueRow(
                name=name,
                counts=found.counts if found else zero,
                estimated=found.estimated if found else frozenset(),
                oldest_available_age=found.oldest_available_age if found else None,
                paused_at=paused.get(name),
                workers=serving.get(name, 0),
            )
        )
    return QueuesView(rows=rows, controls=controls)
