"""Log records people can use: every record about a job carries its ``job_id``, ``kind``,
``queue`` and ``attempt`` as attributes; a completed run is DEBUG, a failed one WARNING
with its error; counts read as English ("1 job", not "1 jobs")."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from sqlalchemy import Engine

import sa_jobs
from sa_jobs import Job
from tests.helpers import AN_HOUR, add_job, make_worker, running, wait_until


@sa_jobs.job_args(kind="logging_task", queue="logs")
class Task:
    fail: bool = False


def job_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if hasattr(r, "job_id")]


def test_a_runs_ending_is_logged_with_the_jobs_fields(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sa_jobs.worker")
    worker = make_worker(engine, queues={"logs": 2}, retry_policy=AN_HOUR)

    @worker.handler(Task)
    def handle(job: Job) -> None:
        if job.args.fail:
            raise ValueError("no luck")

    ok = add_job(engine, Task())
    failed = add_job(engine, Task(fail=True))
    with running(worker):
        wait_until(lambda: {r.job_id for r in job_records(caplog)} == {ok, failed})  # type: ignore[attr-defined]
    by_job = {r.job_id: r for r in job_records(caplog)}  # type: ignore[attr-defined]
    done, error = by_job[ok], by_job[failed]
    assert (done.levelno, done.kind, done.queue, done.attempt) == (  # type: ignore[attr-defined]
        logging.DEBUG,
        "logging_task",
        "logs",
        1,
    )
    assert done.getMessage() == f"job {ok} (logging_task) attempt 1 completed"
    assert error.levelno == logging.WARNING
    assert (
        error.getMessage() == f"job {failed} (logging_task) attempt 1 failed: ValueError: no luck"
    )


def test_a_count_of_one_job_is_singular(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sa_jobs.worker")
    worker = make_worker(engine, queues={"logs": 1})

    @worker.handler(Task)
    def handle(job: Job) -> None:
        pass

    soon = dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=300)
    add_job(engine, Task(), scheduled_at=soon)
    with running(worker):
        wait_until(lambda: any("scheduler: 1 job" in r.getMessage() for r in caplog.records))
    assert not any(" 1 jobs" in r.getMessage() for r in caplog.records)
