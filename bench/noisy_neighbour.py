"""The noisy neighbour: tenant A enqueues a large backlog, then tenants B…K enqueue a
few jobs each. How long does each of B…K wait, on a fair queue and on a plain one?

Not a test (the CI-sized version is ``tests/integration/test_noisy_neighbour.py``). A
throwaway database (``sa_jobs.devdb``) with every branch; per variant: ``--a-jobs`` jobs
of tenant A, committed, then ``--small-jobs`` jobs for each of the ten tenants B…K in one
transaction (their insert time is the commit of that transaction, on the database's
clock); then one worker process (this one) with ``--concurrency`` slots works the queue
with a no-op handler until B…K are all done, and — for the plain queue — until A is too.

For each of B…K: the time from its insert to its last job's finish, and that time over
its *fair share*: the time its jobs would take at 1/11 of the throughput measured while
B…K were being served (eleven tenants had work). A tenant that got its fair share from
the moment it enqueued shows 1.0; the bound the fair queue claims is 2.0.

    python bench/noisy_neighbour.py --a-jobs 200000 --small-jobs 100
"""

from __future__ import annotations

import argparse
import datetime as dt
import string
import threading
import time
from typing import Any

from _shared import database
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState, Worker
from sa_jobs._table.models import Job

SMALL_TENANTS = list(string.ascii_uppercase[1:11])  # B…K
#: The fair queue's claim: each of B…K finishes within this many times its fair share.
BOUND = 2.0


@sa_jobs.job_args(kind="bench_noisy_tenant", queue="tenants", partition_by=["tenant"])
class TenantJob:
    tenant: str


def enqueue(engine: Engine, a_jobs: int, small_jobs: int) -> dt.datetime:
    """A's backlog, then B…K's jobs; returns when B…K's transaction committed."""
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE sa_job"))
    chunk = 10_000
    with Session(engine) as session, session.begin():
        for start in range(0, a_jobs, chunk):
            sa_jobs.insert_many(session, [TenantJob("A")] * min(chunk, a_jobs - start))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE sa_job"))
    with Session(engine) as session, session.begin():
        for tenant in SMALL_TENANTS:
            sa_jobs.insert_many(session, [TenantJob(tenant)] * small_jobs)
        inserted_at: dt.datetime = session.scalar(select(func.now()))  # type: ignore[assignment]
    return inserted_at


def finishes(engine: Engine) -> dict[str, Any]:
    """Per tenant: completed jobs, the first start and the last finish."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                Job.partition_key,
                func.count().filter(Job.state == JobState.COMPLETED),
                func.count(),
                func.max(Job.finalized_at),
            ).group_by(Job.partition_key)
        ).all()
    return {row[0]: row for row in rows}


def small_done(engine: Engine) -> bool:
    with engine.connect() as connection:
        left = connection.scalar(
            select(func.count()).where(
                Job.partition_key.in_(SMALL_TENANTS), Job.state != JobState.COMPLETED
            )
        )
    return left == 0


def run(engine: Engine, *, fair: bool, a_jobs: int, small_jobs: int, concurrency: int) -> None:
    inserted_at = enqueue(engine, a_jobs, small_jobs)
    queue: Any = sa_jobs.Queue(concurrency, fair_by=["tenant"]) if fair else concurrency
    worker = Worker(engine, queues={"tenants": queue}, poll_interval=0.2, job_timeout=None)
    worker.handler(TenantJob)(lambda job: None)
    began = time.monotonic()
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    while not small_done(engine):
        time.sleep(0.05)
    small_seconds = time.monotonic() - began
    with engine.connect() as connection:
        a_done_then = connection.scalar(
            select(func.count()).where(Job.partition_key == "A", Job.state == JobState.COMPLETED)
        )
    worker.stop()
    thread.join()
    rows = finishes(engine)
    completed = sum(row[1] for row in rows.values())
    throughput = completed / small_seconds
    share = throughput / (len(SMALL_TENANTS) + 1)
    fair_share_seconds = small_jobs / share
    waits = {t: (rows[t][3] - inserted_at).total_seconds() for t in SMALL_TENANTS}
    name = "fair queue" if fair else "plain queue"
    print(f"\n{name}: A {a_jobs:,} jobs, then B…K {small_jobs} each; {concurrency} slots")
    print(
        f"  until B…K were done: {small_seconds:.1f} s, {completed:,} jobs "
        f"({throughput:,.0f} jobs/s), of them A: {a_done_then:,}"
    )
    print(f"  fair share of one tenant: {small_jobs} jobs in {fair_share_seconds:.2f} s")
    worst = max(waits.values())
    for tenant in SMALL_TENANTS:
        print(
            f"  {tenant}: finished {waits[tenant]:.2f} s after its insert "
            f"({waits[tenant] / fair_share_seconds:.2f}x its fair share)"
        )
    print(f"  worst: {worst:.2f} s = {worst / fair_share_seconds:.2f}x the fair share")
    if fair:
        ok = worst <= BOUND * fair_share_seconds
        print(f"  within the bound ({BOUND}x the fair share): {'yes' if ok else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a-jobs", type=int, default=200_000)
    parser.add_argument("--small-jobs", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--only", choices=["fair", "plain"])
    options = parser.parse_args()
    with database("sa_jobs_bench_noisy", pool_size=20) as engine:
        for fair in (True, False):
            if options.only and options.only != ("fair" if fair else "plain"):
                continue
            run(
                engine,
                fair=fair,
                a_jobs=options.a_jobs,
                small_jobs=options.small_jobs,
                concurrency=options.concurrency,
            )


if __name__ == "__main__":
    main()
