"""Sequences under load: 20 sequences x 50 jobs, two worker processes, many threads each.

The jobs are inserted in interleaved batches *while* both workers run, so inserts race
completions and promotions. Every handler records its start and end with the database's
clock (``sequence_worker_app``). Afterwards, per sequence: the runs never overlap,
they start in id order, and all 1,000 jobs completed exactly once — with no help from
the maintenance repair pass, and well within a minute.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._base.states import JobState
from sa_jobs._table.models import Job
from tests.acceptance.conftest import Spawn
from tests.acceptance.sequence_worker_app import (
    DDL,
    REPAIRS_TABLE,
    RUNS_TABLE,
    StressJob,
    StressJobInTx,
)
from tests.factories import clear_workers_and_leader
from tests.helpers import count_jobs, wait_until

pytestmark = pytest.mark.slow

SEQUENCE_APP = "tests.acceptance.sequence_worker_app"
SEQUENCES = 20
JOBS_PER_SEQUENCE = 50
TOTAL = SEQUENCES * JOBS_PER_SEQUENCE
THREADS_PER_PROCESS = 8
INSERT_BATCHES = 10
DEADLINE = 50.0


@pytest.fixture
def tables(engine: Engine) -> Iterator[None]:
    def drop() -> None:
        with engine.begin() as connection:
            connection.execute(text(f"DROP TABLE IF EXISTS {RUNS_TABLE}, {REPAIRS_TABLE}"))
        clear_workers_and_leader(engine)

    drop()
    with engine.begin() as connection:
        for ddl in DDL:
            connection.execute(text(ddl))
    yield
    drop()


def insert_interleaved(engine: Engine) -> dict[int, int]:
    """Insert every job, sequences interleaved, in several transactions; id -> sequence."""
    numbered = [(n, n % SEQUENCES) for n in range(TOTAL)]
    sequence_of: dict[int, int] = {}
    per_batch = TOTAL // INSERT_BATCHES
    for start in range(0, TOTAL, per_batch):
        batch = numbered[start : start + per_batch]
        args = [StressJob(seq, n) if seq % 2 == 0 else StressJobInTx(seq, n) for n, seq in batch]
        with Session(engine) as session, session.begin():
            results = sa_jobs.insert_many(session, args)
            sequence_of.update(
                {result.job.id: seq for result, (_, seq) in zip(results, batch, strict=True)}
            )
    return sequence_of


@pytest.mark.usefixtures("tables")
def test_twenty_sequences_of_fifty_jobs_on_two_worker_processes(
    engine: Engine, spawn: Spawn
) -> None:
    threads = str(THREADS_PER_PROCESS)
    apps = [spawn(f"stress-{n}", app=SEQUENCE_APP, SA_JOBS_TEST_THREADS=threads) for n in range(2)]
    wait_until(
        lambda: all(app.heartbeating(engine) for app in apps),
        timeout=20,
        interval=0.05,
        what="both workers to heartbeat",
    )
    began = time.monotonic()

    sequence_of = insert_interleaved(engine)
    wait_until(
        lambda: count_jobs(engine, JobState.COMPLETED) == TOTAL,
        timeout=DEADLINE,
        interval=0.05,
        what=f"all {TOTAL} jobs to complete",
    )
    elapsed = time.monotonic() - began
    for app in apps:
        assert app.stop() == 0, app.output()

    with engine.connect() as connection:
        runs = connection.execute(
            text(f"SELECT job_id, attempt, seq, pid, event, at FROM {RUNS_TABLE}")
        ).all()
        repairs = connection.execute(
            text(f"SELECT pid, restarted, what, at FROM {REPAIRS_TABLE}")
        ).all()
        final = dict(connection.execute(select(Job.id, Job.state)).all())

    # All 1,000 completed, each worked exactly once.
    assert len(sequence_of) == TOTAL
    assert set(final.values()) == {JobState.COMPLETED}
    starts = {r.job_id: r for r in runs if r.event == "start"}
    ends = {r.job_id: r for r in runs if r.event == "end"}
    assert len(runs) == 2 * TOTAL, "a job ran more than once"
    assert set(starts) == set(ends) == set(sequence_of)
    assert {r.attempt for r in runs} == {1}
    assert all(run.seq == sequence_of[run.job_id] for run in runs)

    # Per sequence: starts follow id order, and no two runs overlap.
    for seq in range(SEQUENCES):
        ids = sorted(job_id for job_id, s in sequence_of.items() if s == seq)
        assert len(ids) == JOBS_PER_SEQUENCE
        by_start = sorted(ids, key=lambda job_id: starts[job_id].at)
        assert by_start == ids, f"sequence {seq} started out of id order"
        for earlier, later in itertools.pairwise(ids):
            assert ends[earlier].at < starts[later].at, (
                f"sequence {seq}: job {later} started at {starts[later].at} before job "
                f"{earlier} ended at {ends[earlier].at}"
            )

    # Different sequences did run in parallel, in both processes.
    events = sorted(
        [(starts[j].at, 1) for j in starts] + [(ends[j].at, -1) for j in ends],
        key=lambda event: (event[0], event[1]),
    )
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    assert peak > 1
    assert len({r.pid for r in runs}) == 2

    # Every promotion happened where a job finished; maintenance never had to step in.
    assert repairs == []
    print(f"\n{TOTAL} sequenced jobs in {elapsed:.1f} s, peak {peak} running at once")
    assert elapsed < DEADLINE
