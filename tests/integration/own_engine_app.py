"""An application that builds its worker's engine from a setting of its own
(``$OWN_ENGINE_APP_URL``), not from ``$SA_JOBS_DATABASE_URL``: ``sa-jobs work --url``
cannot steer it (see test_work_url.py)."""

from __future__ import annotations

import os

from sqlalchemy import create_engine

import sa_jobs


@sa_jobs.job_args(kind="own_engine_app_touch", queue="own_engine_app")
class Touch:
    label: str


def make_worker() -> sa_jobs.Worker:
    engine = create_engine(os.environ["OWN_ENGINE_APP_URL"])
    worker = sa_jobs.Worker(engine, queues={"own_engine_app": 2}, poll_interval=0.1)

    @worker.handler(Touch)
    def touch(job: sa_jobs.Job[Touch]) -> None:
        print(f"touched {job.args.label}", flush=True)

    return worker
