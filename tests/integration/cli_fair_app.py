"""An application with a fair queue for ``sa-jobs work`` (see test_cli_fair_queues.py).

The database comes from ``$SA_JOBS_DATABASE_URL``. Its worker serves ``FAIR`` as
``sa_jobs.Queue(2, fair_by=["tenant"], weights={"acme": 2})`` and ``PLAIN`` as a plain
queue; ``Tenanted`` jobs are keyed by ``tenant`` and finish at once.
"""

from __future__ import annotations

import os

from sqlalchemy import create_engine

import sa_jobs

FAIR = "cli_fair_app"
PLAIN = "cli_fair_app_plain"


@sa_jobs.job_args(kind="cli_fair_app_tenanted", queue=FAIR, partition_by=["tenant"])
class Tenanted:
    tenant: str


def make_worker() -> sa_jobs.Worker:
    engine = create_engine(os.environ["SA_JOBS_DATABASE_URL"])
    worker = sa_jobs.Worker(
        engine,
        queues={FAIR: sa_jobs.Queue(2, fair_by=["tenant"], weights={"acme": 2}), PLAIN: 1},
        poll_interval=0.1,
    )
    worker.handler(Tenanted)(lambda job: None)
    return worker
