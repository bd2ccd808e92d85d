"""The noisy neighbour, CI-sized (the full-sized figure: ``bench/noisy_neighbour.py``):
tenant A enqueues a backlog, then tenants B…K enqueue a few jobs each, and one worker
works the queue. On a fair queue each of B…K is done before twice its fair share of the
work has run — however long A's backlog; on a plain queue they wait behind all of A."""

from __future__ import annotations

import string
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from sa_jobs._table.models import Job
from tests.helpers import make_worker, wait_until

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")

SMALL = list(string.ascii_uppercase[1:11])  # B…K
SMALL_JOBS = 50


@sa_jobs.job_args(kind="test_noisy_tenant", queue="tenants", partition_by=["tenant"])
class TenantJob:
    tenant: str


def enqueue(engine: Engine, a_jobs: int) -> None:
    with Session(engine) as session, session.begin():
        for start in range(0, a_jobs, 5000):
            sa_jobs.insert_many(session, [TenantJob("A")] * min(5000, a_jobs - start))
    with Session(engine) as session, session.begin():
        for tenant in SMALL:
            sa_jobs.insert_many(session, [TenantJob(tenant)] * SMALL_JOBS)


def small_left(engine: Engine) -> int:
    with engine.connect() as connection:
        return connection.scalar(  # type: ignore[return-value]
            select(func.count()).where(
                Job.partition_key.in_(SMALL), Job.state != JobState.COMPLETED
            )
        )


def work_until_small_done(engine: Engine, queue: Any, timeout: float) -> int:
    """Run a worker until B…K are done; how many jobs had finished by B…K's last."""
    worker = make_worker(engine, queues={"tenants": queue}, poll_interval=0.2)
    worker.handler(TenantJob)(lambda job: None)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: small_left(engine) == 0, timeout=timeout, interval=0.05)
    finally:
        worker.stop()
        thread.join(10)
    with engine.connect() as connection:
        last = select(func.max(Job.finalized_at)).where(Job.partition_key.in_(SMALL))
        return connection.scalar(  # type: ignore[return-value]
            select(func.count()).where(Job.finalized_at <= last.scalar_subquery())
        )


def test_on_a_fair_queue_the_small_tenants_get_their_share_at_once(engine: Engine) -> None:
    enqueue(engine, 20_000)
    began = time.monotonic()
    finished = work_until_small_done(engine, sa_jobs.Queue(10, fair_by=["tenant"]), timeout=120)
    # Eleven tenants share the worker: B…K's 500 jobs are their fair share of 550.
    fair_share = len(SMALL) * SMALL_JOBS * (len(SMALL) + 1) / len(SMALL)
    assert finished <= 2 * fair_share, (finished, time.monotonic() - began)


def test_on_a_plain_queue_they_wait_behind_the_whole_backlog(engine: Engine) -> None:
    enqueue(engine, 2_000)
    finished = work_until_small_done(engine, 10, timeout=120)
    assert finished == 2_000 + len(SMALL) * SMALL_JOBS
