"""One transaction that inserts tens of thousands of unique or sequenced jobs.

PostgreSQL's lock table is small (``max_locks_per_transaction`` x connections, about
6,400 slots by default): anything that takes one advisory lock per unique or sequence
key and holds it to the end of the transaction runs out of shared memory here.
"""

from __future__ import annotations

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from tests.helpers import count_jobs


@sa_jobs.job_args(kind="test_large_unique", unique=sa_jobs.UniqueOpts(by_args=True))
class LargeUnique:
    seq: int


@sa_jobs.job_args(kind="test_large_sequenced", sequence=sa_jobs.SequenceOpts(by_args=True))
class LargeSequenced:
    seq: int


def test_twenty_thousand_unique_jobs_in_one_transaction(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        for batch in range(2):
            results = sa_jobs.insert_many(
                session, [LargeUnique(batch * 10_000 + i) for i in range(10_000)]
            )
            # Inserted in key order, reported in input order.
            assert [r.job.args.seq for r in results] == [batch * 10_000 + i for i in range(10_000)]
        again = sa_jobs.insert_many(session, [LargeUnique(7), LargeUnique(20_001)])
        assert [r.unique_skipped_as_duplicate for r in again] == [True, False]
    assert count_jobs(engine) == 20_001


def test_twenty_thousand_sequences_started_in_one_transaction(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        for batch in range(2):
            sa_jobs.insert_many(
                session, [LargeSequenced(batch * 10_000 + i) for i in range(10_000)]
            )
        sa_jobs.insert_many(session, [LargeSequenced(i) for i in range(1_000)])
    with Session(engine) as session:
        states = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    assert states == {JobState.AVAILABLE: 20_000, JobState.PENDING: 1_000}
