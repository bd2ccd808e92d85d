"""Periodic jobs whose schedule lives in the database: :class:`PeriodicJob` (given to
``Worker(periodic=[...])``), :func:`run_now` and :func:`periodic_jobs`.

The modules: :mod:`.schedule` (cron and intervals, DST), :mod:`.plan` (which instants a
tick fires, catch-up), :mod:`.definition` (``PeriodicJob`` and its checks),
:mod:`.state` (the statements on ``sa_job_periodic``). The ticker that fires them is a
maintenance service, ``sa_jobs.worker.maintenance.periodic``. See
``docs/periodic-jobs.md``.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func
from sqlalchemy.orm import Session

from sa_jobs._base.sessions import either_session
from sa_jobs._table.schema import translate_missing_schema
from sa_jobs._table.service_tables import PeriodicState
from sa_jobs.errors import PeriodicJobNotFoundError
from sa_jobs.periodic.definition import PeriodicJob
from sa_jobs.periodic.plan import CATCH_UP_LIMIT, CatchUp
from sa_jobs.periodic.state import periodic_list, periodic_request_run

__all__ = [
    "CATCH_UP_LIMIT",
    "CatchUp",
    "PeriodicJob",
    "PeriodicState",
    "periodic_jobs",
    "run_now",
]


@either_session
def run_now(session: Session, name: str) -> dt.datetime:
    """Ask for one extra run of the periodic job ``name``, in the session's transaction.

    The request is stored in the job's row; the next tick of a worker that has the job
    in its code inserts one job (its metadata says ``run_now``) and clears the request.
    The schedule is not changed. A second request before that tick is the same request.
    Returns the instant of the pending request (the database's ``now()``).

    Raises:
        PeriodicJobNotFoundError: no periodic job of that name is in the database.
    """
    with translate_missing_schema():
        requested = session.execute(periodic_request_run(name, func.now())).scalar()
    if requested is None:
        raise PeriodicJobNotFoundError(name)
    instant: dt.datetime = requested
    return instant


@either_session
def periodic_jobs(session: Session) -> list[PeriodicState]:
    """Every periodic job's stored state (name, schedule, last and next runs), by name."""
    with translate_missing_schema():
        return list(session.scalars(periodic_list()))
