"""A tiny application for ``sa-jobs work cli_worker_app:make_worker`` (see test_cli.py).

The database comes from ``$SA_JOBS_DATABASE_URL``. ``Touch`` jobs finish at once;
``Linger`` jobs run until ``seconds`` have passed, so a test can stop the worker while
one is running; ``Rendezvous`` jobs run until ``workers`` of them have started (with one
slot per process: until that many processes took one, so a test of several processes
does not depend on how fast each one starts).
"""

from __future__ import annotations

import os
import time

from sqlalchemy import create_engine, func, select

import sa_jobs

QUEUE = "cli_worker_app"


@sa_jobs.job_args(kind="cli_worker_app_touch", queue=QUEUE)
class Touch:
    label: str


@sa_jobs.job_args(kind="cli_worker_app_linger", queue=QUEUE)
class Linger:
    seconds: float


@sa_jobs.job_args(kind="cli_worker_app_rendezvous", queue=QUEUE)
class Rendezvous:
    workers: int


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

    @worker.handler(Rendezvous)
    def rendezvous(job: sa_jobs.Job) -> None:
        started = (
            select(func.count())
            .select_from(sa_jobs.Job)
            .where(sa_jobs.Job.kind == job.kind, sa_jobs.Job.attempt > 0)
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with engine.connect() as connection:
                if (connection.scalar(started) or 0) >= job.args.workers:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"fewer than {job.args.workers} rendezvous started within 30 s")

    return worker


not_a_worker = 42
