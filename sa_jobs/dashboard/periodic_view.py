"""What the Periodic page reads: every periodic job's stored schedule state
(``sa_jobs.periodic.periodic_jobs``), with the state of the last job each one inserted.

The rows are few (one per ``PeriodicJob`` in some worker's code), so the page reads
them all; the last jobs' states come in one more query by primary key.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import attrs
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sa_jobs._base.states import JobState
from sa_jobs._table.models import job_table
from sa_jobs._table.schema import PERIODIC_BRANCH, Features
from sa_jobs._table.service_tables import PeriodicState
from sa_jobs.periodic import periodic_jobs
from sa_jobs.worker.maintenance.periodic import REGISTER_INTERVAL

__all__ = ["STALE_AFTER", "PeriodicRow", "PeriodicView", "periodic_view"]

#: A worker that has a periodic job in its code marks it seen every REGISTER_INTERVAL;
#: a row not seen for a few of those is in no running worker's code right now, so
#: nothing will fire it (nor honour a run request) until one starts.
STALE_AFTER = dt.timedelta(seconds=3 * REGISTER_INTERVAL)


@attrs.frozen
class PeriodicRow:
    state: PeriodicState
    #: The state of the last job it inserted (None: none yet, or deleted since).
    last_job_state: JobState | None
    #: No running worker has this periodic job in its code (not seen lately).
    stale: bool


@attrs.frozen
class PeriodicView:
    #: The ``sa_jobs_periodic`` branch is installed (else ``rows`` is empty).
    installed: bool
    rows: Sequence[PeriodicRow]
    now: dt.datetime
    branch: str = PERIODIC_BRANCH


def periodic_view(session: Session) -> PeriodicView:
    now = session.scalar(select(func.now()))
    assert now is not None
    if not Features.of(session.connection()).periodic:
        return PeriodicView(installed=False, rows=[], now=now)
    states = periodic_jobs(session)
    last_ids = [row.last_job_id for row in states if row.last_job_id is not None]
    job_states: dict[int, JobState] = {}
    if last_ids:
        found = session.execute(
            select(job_table.c.id, job_table.c.state).where(job_table.c.id.in_(last_ids))
        )
        job_states = {job_id: job_state for job_id, job_state in found}
    rows = [
        PeriodicRow(
            state=row,
            last_job_state=job_states.get(row.last_job_id) if row.last_job_id else None,
            stale=now - row.seen_at > STALE_AFTER,
        )
        for row in states
    ]
    return PeriodicView(installed=True, rows=rows, now=now)
