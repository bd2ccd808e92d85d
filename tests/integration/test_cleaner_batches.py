"""The cleaner on a backlog: bounded batches, and no lock that stops the queue meanwhile.

A queue that has kept months of finished jobs (or whose cleaner was off) must not be
cleaned in one huge DELETE: that is one long transaction pinning the xmin horizon, and
a burst of WAL. Each pass deletes at most ``limit`` rows per state, and while a pass's
transaction is open, workers keep fetching and applications keep inserting.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

import sa_jobs
from sa_jobs._base.states import JobState
from sa_jobs.worker.maintenance.cleaner import Cleaner, Retention
from sa_jobs.worker.producer import fetch_jobs
from tests.factories import make_job, seconds
from tests.helpers import count_jobs, run_once

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")

EXPIRED = """
INSERT INTO sa_job (kind, args, state, attempt, run_count, finalized_at)
SELECT 'old', '{}'::jsonb, 'completed', 1, 1, now() - interval '2 days'
FROM generate_series(1, :n)
"""


@sa_jobs.job_args(kind="cleaner_batches_probe")
class Probe:
    n: int = 0


def expired_rows(engine: Engine, n: int) -> None:
    with engine.begin() as connection:
        connection.execute(text(EXPIRED), {"n": n})


def test_a_backlog_of_25k_goes_in_three_passes_of_at_most_10k(engine: Engine) -> None:
    expired_rows(engine, 25_000)
    make_job(engine, state=JobState.COMPLETED, finalized_at=-seconds(60))  # within retention
    cleaner = Cleaner(Retention(), limit=10_000)

    passes = [run_once(engine, cleaner) for _ in range(4)]

    assert passes == [10_000, 10_000, 5_000, 0]
    assert count_jobs(engine) == 1
    assert count_jobs(engine, JobState.COMPLETED) == 1


def test_the_queue_keeps_working_while_a_cleaner_pass_is_open(engine: Engine) -> None:
    expired_rows(engine, 15_000)
    with engine.begin() as connection:
        for n in range(3):
            connection.execute(sa_jobs.insert_job(Probe(n)))

    with engine.connect() as cleaning:
        cleaning.begin()
        assert Cleaner(Retention(), limit=10_000).run_once(cleaning) == 10_000
        # The pass's transaction is still open, holding its row locks: it must hold no
        # table lock that blocks inserts or fetches (only ROW EXCLUSIVE and weaker).
        modes = set(
            cleaning.scalars(
                text(
                    "SELECT mode FROM pg_locks WHERE pid = pg_backend_pid()"
                    " AND relation = 'sa_job'::regclass"
                )
            )
        )
        assert modes <= {"AccessShareLock", "RowShareLock", "RowExclusiveLock"}, modes

        with engine.connect() as other:
            # Anything that waits on the cleaner fails fast instead of passing late.
            other.execute(text("SET lock_timeout = '2s'"))
            other.execute(sa_jobs.insert_job(Probe(99)))
            other.commit()
        fetched = fetch_jobs(engine, "default", 10, "worker-during-clean")
        assert sorted(job.args.n for job in fetched) == [0, 1, 2, 99]
        cleaning.commit()

    assert run_once(engine, Cleaner(Retention(), limit=10_000)) == 5_000
    assert count_jobs(engine, JobState.COMPLETED) == 0
    assert count_jobs(engine, JobState.RUNNING) == 4
