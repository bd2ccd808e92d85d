"""A worker process for the acceptance tests.

Run as ``python -m tests.acceptance.worker_app`` (from the repository's root) with:

* ``SA_JOBS_TEST_URL`` — the database (required);
* ``SA_JOBS_TEST_WORKER_ID`` — the worker's id (optional);
* ``SA_JOBS_TEST_GRACE`` — the worker's ``interrupt_grace`` in seconds (default 5);
* ``SA_JOBS_TEST_QUEUES`` — the queues it serves, comma-separated (default ``default``),
  10 jobs of each at once; ``SA_JOBS_TEST_POLL`` — its poll interval (default 0.5 s);
* ``SA_JOBS_TEST_BEHIND_PGBOUNCER`` — a URL through PgBouncer in transaction mode: build
  the engines as ``docs/operations.md`` says (no server-side prepared statements) and
  ``LISTEN`` on a direct connection to ``SA_JOBS_TEST_URL``.

Maintenance is fast (heartbeat 0.2 s, rescue after 1 s, leader lease 0.6 s) so a test can
watch a dead process's jobs being rescued. Handlers write what they do into
``acceptance_runs`` (see :data:`RUNS_DDL`) in transactions of their own, so the record
survives the process being killed.

The tests import this module for the job args classes; nothing runs on import.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from sqlalchemy import Engine, create_engine, text

import sa_jobs
from sa_jobs import Job, Worker
from tests.helpers import FAST_RESCUE

RUNS_TABLE = "acceptance_runs"
RUNS_DDL = f"""
CREATE TABLE {RUNS_TABLE} (
    seq bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    attempt int NOT NULL,
    pid int NOT NULL,
    event text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


@sa_jobs.job_args(kind="acceptance_long")
class LongJob:
    """Runs ``first`` seconds on its first attempt and ``later`` seconds after that."""

    first: float = 60.0
    later: float = 0.0
    #: Checks ``job.check_cancelled()`` while it runs; False: ignores interruptions.
    interruptible: bool = True


@sa_jobs.job_args(kind="acceptance_quick")
class QuickJob:
    n: int = 0
    sleep: float = 0.01


@sa_jobs.job_args(kind="acceptance_poison")
class PoisonJob:
    """Fails with an error text PostgreSQL cannot store as is (a NUL character)."""

    n: int = 0


@sa_jobs.job_args(kind="acceptance_progress")
class ProgressJob:
    """Records its progress (``job.record_output``) ``steps`` times, then runs on for a
    minute on its first attempt; a later attempt returns at once."""

    steps: int = 3


_runs_engine: Engine | None = None


def record(job: Job, event: str) -> None:
    assert _runs_engine is not None
    with _runs_engine.begin() as connection:
        connection.execute(
            text(
                f"INSERT INTO {RUNS_TABLE} (job_id, attempt, pid, event)"
                " VALUES (:job_id, :attempt, :pid, :event)"
            ),
            {"job_id": job.id, "attempt": job.attempt, "pid": os.getpid(), "event": event},
        )


def long_job(job: Job) -> None:
    record(job, "start")
    args: LongJob = job.args
    seconds = args.first if job.attempt == 1 else args.later
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if args.interruptible:
            job.check_cancelled()
        time.sleep(0.02)  # the job's work, in small steps
    record(job, "end")


def quick_job(job: Job) -> None:
    record(job, "start")
    time.sleep(job.args.sleep)  # the job's work
    record(job, "end")


def progress_job(job: Job) -> dict[str, Any]:
    record(job, "start")
    if job.attempt == 1:
        for step in range(1, job.args.steps + 1):
            job.record_output({"step": step})
            record(job, f"step {step}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job.check_cancelled()
            time.sleep(0.02)  # the rest of the work: long enough to be killed in
    record(job, "end")
    return {"finished": True, "attempt": job.attempt}


def poison_job(job: Job) -> None:
    record(job, "start")
    raise ValueError("poison \x00 in the message")


def main() -> None:
    global _runs_engine
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(levelname)s %(name)s: %(message)s",
    )
    url = os.environ["SA_JOBS_TEST_URL"]
    bouncer = os.environ.get("SA_JOBS_TEST_BEHIND_PGBOUNCER")
    settings: dict[str, Any] = {"pool_size": 12}
    if bouncer:
        settings["connect_args"] = {"prepare_threshold": None}
    engine = create_engine(bouncer or url, **settings)
    _runs_engine = create_engine(bouncer or url, **settings)
    worker = Worker(
        engine,
        queues=dict.fromkeys(os.environ.get("SA_JOBS_TEST_QUEUES", "default").split(","), 10),
        job_timeout=None,
        poll_interval=float(os.environ.get("SA_JOBS_TEST_POLL", "0.5")),
        maintenance=FAST_RESCUE,
        interrupt_grace=float(os.environ.get("SA_JOBS_TEST_GRACE", "5")),
        worker_id=os.environ.get("SA_JOBS_TEST_WORKER_ID"),
        listen_engine=url if bouncer else None,
    )
    worker.handler(LongJob)(long_job)
    worker.handler(QuickJob)(quick_job)
    worker.handler(PoisonJob)(poison_job)
    worker.handler(ProgressJob)(progress_job)
    worker.run()
    logging.getLogger("worker_app").info("worker.run() returned; exiting")
    engine.dispose()
    _runs_engine.dispose()


if __name__ == "__main__":
    main()
