"""A worker process for the limits test: every process declares the same limits.

Run as ``python -m tests.acceptance.limits_worker_app`` (from the repository's root) with
``SA_JOBS_TEST_URL`` (required) and ``SA_JOBS_TEST_WORKER_ID``.

Queues and limits (:data:`QUEUES`, :data:`LIMITS`): ``limited`` runs at most
:data:`QUEUE_LIMIT` jobs at once across all processes; :class:`CappedJob`, in ``mixed_a``
and ``mixed_b``, at most :data:`KIND_LIMIT`; ``rated`` starts at most :data:`RATE` jobs
in any :data:`RATE_PERIOD`; ``other`` has no limit. Each process alone has more slots
than any limit, so only the limits can hold the numbers down.

Handlers record their start and end in :data:`RUNS_TABLE`, stamped with the database's
``clock_timestamp()``, each in a transaction of its own: a handler's record lies inside
the job's time in ``running`` (it begins after the fetch committed and ends before the
outcome is written), so overlapping records are a lower bound of running jobs.

The test imports this module for the args classes and the DDL; nothing runs on import.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
import time

from sqlalchemy import Engine, create_engine, text

import sa_jobs
from sa_jobs import ConcurrencyLimit, Job, RateLimit, Worker
from tests.helpers import FAST_RESCUE

RUNS_TABLE = "limits_runs"
RUNS_DDL = f"""
CREATE TABLE {RUNS_TABLE} (
    job_id bigint NOT NULL,
    kind text NOT NULL,
    queue text NOT NULL,
    pid int NOT NULL,
    event text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

QUEUES = {"limited": 4, "mixed_a": 3, "mixed_b": 3, "rated": 3, "other": 4}
QUEUE_LIMIT = 3
KIND_LIMIT = 2
RATE = 8
RATE_PERIOD = dt.timedelta(seconds=1)


@sa_jobs.job_args(kind="limits_sleep")
class SleepJob:
    sleep: float = 0.02


@sa_jobs.job_args(kind="limits_capped")
class CappedJob:
    sleep: float = 0.02


LIMITS = [
    ConcurrencyLimit(queue="limited", max_running=QUEUE_LIMIT),
    ConcurrencyLimit(kind=CappedJob, max_running=KIND_LIMIT),
    RateLimit(queue="rated", max_starts=RATE, per=RATE_PERIOD),
]

_runs_engine: Engine | None = None


def record(job: Job, event: str) -> None:
    assert _runs_engine is not None
    with _runs_engine.begin() as connection:
        connection.execute(
            text(
                f"INSERT INTO {RUNS_TABLE} (job_id, kind, queue, pid, event)"
                " VALUES (:job_id, :kind, :queue, :pid, :event)"
            ),
            {
                "job_id": job.id,
                "kind": job.kind,
                "queue": job.queue,
                "pid": os.getpid(),
                "event": event,
            },
        )


def sleep_job(job: Job) -> None:
    record(job, "start")
    time.sleep(job.args.sleep)  # the job's work
    record(job, "end")


def main() -> None:
    global _runs_engine
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(levelname)s %(name)s: %(message)s",
    )
    url = os.environ["SA_JOBS_TEST_URL"]
    # Few connections: three of these processes share the server with other tests.
    engine = create_engine(url, pool_size=6, max_overflow=4)
    _runs_engine = create_engine(url, pool_size=4, max_overflow=4)
    worker = Worker(
        engine,
        queues=QUEUES,
        job_timeout=None,
        poll_interval=0.2,
        maintenance=FAST_RESCUE,
        worker_id=os.environ.get("SA_JOBS_TEST_WORKER_ID"),
        limits=LIMITS,
    )
    worker.handler(SleepJob)(sleep_job)
    worker.handler(CappedJob)(sleep_job)
    worker.run()
    engine.dispose()
    _runs_engine.dispose()


if __name__ == "__main__":
    main()
