"""Several worker processes on one machine, each its own ``worker_id``, working one
queue together through PgBouncer in transaction mode: every job is worked exactly once.

The processes share PgBouncer's few server connections (``tests.pgbouncer.POOL_SIZE``)
for all their fetches, completions, heartbeats and leader elections, and ``LISTEN`` on a
direct connection each (``Worker(listen_engine=...)``), as ``docs/operations.md`` says.
"""

from __future__ import annotations

import collections

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from tests.acceptance.conftest import Spawn
from tests.acceptance.processes import runs
from tests.acceptance.worker_app import QuickJob
from tests.helpers import engine_at, job_states, url_text, wait_until
from tests.pgbouncer import PgBouncer

pytestmark = pytest.mark.slow

PROCESSES = 3
JOBS = 300


def test_three_processes_through_pgbouncer_work_every_job_exactly_once(
    engine: Engine, pgbouncer: PgBouncer, spawn: Spawn
) -> None:
    through = url_text(pgbouncer.url)
    workers = [
        spawn(f"bouncer-{n}", SA_JOBS_TEST_BEHIND_PGBOUNCER=through) for n in range(PROCESSES)
    ]
    for worker in workers:
        worker.wait_ready(engine)
    for worker in workers:
        worker.wait_logged("listening for new jobs and cancel requests on 127.0.0.1:")

    # Inserted through PgBouncer too, in batches, while the workers wait for them.
    with engine_at(through, connect_args={"prepare_threshold": None}) as bouncer:
        ids: list[int] = []
        for start in range(0, JOBS, 50):
            with Session(bouncer) as session, session.begin():
                batch = [QuickJob(n=n, sleep=0.05) for n in range(start, start + 50)]
                ids += [result.job.id for result in sa_jobs.insert_many(session, batch)]

    wait_until(
        lambda: set(job_states(engine).values()) == {JobState.COMPLETED},
        timeout=60,
        interval=0.1,
        what="every job to complete",
    )
    done = runs(engine)
    starts = collections.Counter(r.job_id for r in done if r.event == "start")
    ends = collections.Counter(r.job_id for r in done if r.event == "end")
    assert set(starts) == set(ends) == set(ids)
    assert set(starts.values()) == set(ends.values()) == {1}, "a job was worked twice"
    assert {r.attempt for r in done} == {1}
    # Every process took its share (each holds at most 10 jobs at a time).
    assert {r.pid for r in done} == {worker.pid for worker in workers}
    for worker in workers:
        assert worker.stop() == 0, worker.output()
        log = worker.output()
        assert "prepared statement" not in log and "Traceback" not in log, log
