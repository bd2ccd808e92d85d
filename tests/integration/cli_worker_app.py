"""A tiny application for ``sa-jobs work cli_worker_app:make_worker`` (see test_cli.py).

The database comes from ``$SA_JOBS_DATABASE_URL``. ``Touch`` jobs finish at once;
``Linger`` jobs run until ``seconds`` have passed, so a test can stop the worker while
one is running.
"""

from __future__ import annotations

import os
import time

from sqlalchemy import create_engine

import sa_jobs

QUEUE = "cli_worker_app"


@sa_jobs.job_args(kind="cli_worker_app_touch", queue=QUEUE)
class Touch:
    label: str


@sa_jobs.job_args(kind="cli_worker_app_linger", queue=QUEUE)
class Linger:
    seconds: float


def make_worker() -> sa_jobs.Worker:
    engine = create_engine(os.environ["SA_JOBS_DATABASE_URL"])
    worker = sa_jobs.Worker(engine, queues={QUEUE: 2}, poll_interval=0.1)

    @worker.handler(Touch)
    def touch(job: sa_jobs.Job) -> None:
        print(f"touched {job.args.label}", flush=True)

    @worker.handler(Linger)
    def linger(job: sa_jobs.Job) -> None:
        time.sleep(job.args.seconds)  # the job's work, still running when SIGTERM comes
        print(f"lingered {job.args.seconds} s", flush=True)

    return worker


not_a_worker = 42
