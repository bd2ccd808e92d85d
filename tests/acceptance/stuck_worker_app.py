"""A worker whose ``Hang`` handler ignores its 0.2 s timeout, for
``sa-jobs work tests.acceptance.stuck_worker_app:make_worker`` (test_stuck_threads.py).

``stuck_thread_limit=1``: the first stuck thread reaches the limit. Heartbeats every
0.2 s, so the row says so at once. ``Quick`` jobs finish at once.
"""

from __future__ import annotations

import os
import time

from sqlalchemy import create_engine

import sa_jobs
from sa_jobs.worker import MaintenanceConfig

QUEUE = "stuck_app"


@sa_jobs.job_args(kind="stuck_app_hang", queue=QUEUE, max_attempts=1)
class Hang:
    seconds: float


@sa_jobs.job_args(kind="stuck_app_quick", queue=QUEUE)
class Quick:
    label: str


def make_worker() -> sa_jobs.Worker:
    engine = create_engine(os.environ["SA_JOBS_DATABASE_URL"])
    worker = sa_jobs.Worker(
        engine,
        queues={QUEUE: 2},
        poll_interval=0.1,
        stuck_thread_limit=1,
        interrupt_grace=0.2,
        maintenance=MaintenanceConfig(heartbeat_interval=0.2),
    )

    @worker.handler(Hang, timeout=0.2)
    def hang(job: sa_jobs.Job[Hang]) -> None:
        time.sleep(job.args.seconds)  # never looks at job.cancelled: stuck

    @worker.handler(Quick)
    def quick(job: sa_jobs.Job[Quick]) -> None:
        print(f"quick {job.args.label}", flush=True)

    return worker
