"""A worker process for the limit-by-key test: every process declares the same limit,
at most :data:`KEY_LIMIT` running jobs per tenant in queue ``tenants``.

Run as ``python -m tests.acceptance.fair_worker_app`` (from the repository's root) with
``SA_JOBS_TEST_URL`` (required) and ``SA_JOBS_TEST_WORKER_ID``. With
``SA_JOBS_TEST_NO_KEY_GUARD=1`` the fetch's guard is switched off (the caps per key are
not passed to the statement): the test must then fail, which shows it tests the guard.

Handlers record start and end in :data:`RUNS_TABLE` (as ``limits_worker_app`` does), so
overlapping records are a lower bound of the running jobs of a key.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from sqlalchemy import Engine, create_engine, text

import sa_jobs
from sa_jobs import ConcurrencyLimit, Job, Worker
from tests.helpers import FAST_RESCUE

RUNS_TABLE = "fair_runs"
RUNS_DDL = f"""
CREATE TABLE {RUNS_TABLE} (
    job_id bigint NOT NULL,
    tenant text NOT NULL,
    pid int NOT NULL,
    event text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

#: Each process alone has more slots than the limit times the keys it could hold.
CONCURRENCY = 6
KEY_LIMIT = 2


@sa_jobs.job_args(kind="fair_tenant_work", queue="tenants", partition_by=["tenant_id"])
class TenantWork:
    tenant_id: str
    sleep: float = 0.03


LIMITS = [ConcurrencyLimit(KEY_LIMIT, queue="tenants", by_args=["tenant_id"])]

_runs_engine: Engine | None = None


def record(job: Job[Any], event: str) -> None:
    assert _runs_engine is not None
    with _runs_engine.begin() as connection:
        connection.execute(
            text(
                f"INSERT INTO {RUNS_TABLE} (job_id, tenant, pid, event)"
                " VALUES (:job_id, :tenant, :pid, :event)"
            ),
            {"job_id": job.id, "tenant": job.args.tenant_id, "pid": os.getpid(), "event": event},
        )


def work(job: Job[TenantWork]) -> None:
    record(job, "start")
    time.sleep(job.args.sleep)
    record(job, "end")


def _remove_guard() -> None:
    from sa_jobs.worker import keyed_fetch

    original = keyed_fetch.KeyCaps.params

    def unguarded(self: keyed_fetch.KeyCaps, fetch_limit: int) -> dict[str, Any]:
        params = original(self, fetch_limit)
        return {
            **params,
            "full_keys": [],
            "capped_keys": [],
            "key_caps": [],
            "default_cap": fetch_limit,
        }

    keyed_fetch.KeyCaps.params = unguarded  # type: ignore[method-assign]


def main() -> None:
    global _runs_engine
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(levelname)s %(name)s: %(message)s",
    )
    if os.environ.get("SA_JOBS_TEST_NO_KEY_GUARD") == "1":
        _remove_guard()
    url = os.environ["SA_JOBS_TEST_URL"]
    engine = create_engine(url, pool_size=6, max_overflow=4)
    _runs_engine = create_engine(url, pool_size=4, max_overflow=4)
    worker = Worker(
        engine,
        queues={"tenants": CONCURRENCY},
        job_timeout=None,
        poll_interval=0.2,
        maintenance=FAST_RESCUE,
        worker_id=os.environ.get("SA_JOBS_TEST_WORKER_ID"),
        limits=LIMITS,
    )
    worker.handler(TenantWork)(work)
    worker.run()
    engine.dispose()
    _runs_engine.dispose()


if __name__ == "__main__":
    main()
