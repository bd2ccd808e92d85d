"""Sequences under load: 20 sequences x 50 jobs, two worker processes, many threads each.

The jobs are inserted in interleaved batches *while* both workers run, so inserts race
completions and promotions. Every handler records its start and end with the database's
clock (``sequence_worker_app.py``). Afterwards, per sequence: the runs never overlap,
they start in id order, and all 1,000 jobs completed exactly once — with no help from
the maintenance repair pass, and well within a minute.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine, func, select, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.models import Job, WorkerProcess
from sa_jobs.states import JobState
from tests.acceptance.processes import wait_for
from tests.acceptance.sequence_worker_app import (
    DDL,
    REPAIRS_TABLE,
    RUNS_TABLE,
    StressJob,
    StressJobInTx,
)
from tests.factories import clear_workers_and_leader

pytestmark = pytest.mark.slow

APP = Path(__file__).with_name("sequence_worker_app.py")
SEQUENCES = 20
JOBS_PER_SEQUENCE = 50
TOTAL = SEQUENCES * JOBS_PER_SEQUENCE
THREADS_PER_PROCESS = 8
INSERT_BATCHES = 10
DEADLINE = 50.0


class App:
    """One worker process running ``sequence_worker_app.py``."""

    def __init__(self, url: URL, worker_id: str, log_path: Path) -> None:
        self.worker_id = worker_id
        self.log_path = log_path
        self._log = log_path.open("wb")
        env = {
            **os.environ,
            "SA_JOBS_TEST_URL": url.render_as_string(hide_password=False),
            "SA_JOBS_TEST_WORKER_ID": worker_id,
            "SA_JOBS_TEST_THREADS": str(THREADS_PER_PROCESS),
            "PYTHONUNBUFFERED": "1",
        }
        self.popen = subprocess.Popen(
            [sys.executable, str(APP)],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parents[2],
        )

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self, timeout: float = 20) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.worker_id} did not stop:\n{self.output()}") from None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        self._log.close()


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


@pytest.fixture
def apps(
    database_url: URL, tables: None, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[list[App]]:
    started = [App(database_url, f"stress-{n}", tmp_path / f"stress-{n}.log") for n in range(2)]
    try:
        yield started
    finally:
        for app in started:
            app.kill()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            for app in started:
                print(f"--- output of {app.worker_id} ---\n{app.output()}")


def heartbeating(engine: Engine, apps: list[App]) -> bool:
    for app in apps:
        if app.popen.poll() is not None:
            raise AssertionError(f"{app.worker_id} exited early:\n{app.output()}")
    with engine.connect() as connection:
        found = set(connection.scalars(select(WorkerProcess.id)))
    return {app.worker_id for app in apps} <= found


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


def completed(engine: Engine) -> int:
    with engine.connect() as connection:
        return connection.scalar(
            select(func.count()).select_from(Job).where(Job.state == JobState.COMPLETED)
        )


def test_twenty_sequences_of_fifty_jobs_on_two_worker_processes(
    engine: Engine, apps: list[App]
) -> None:
    wait_for(lambda: heartbeating(engine, apps), 20, "both workers to heartbeat")
    began = time.monotonic()

    sequence_of = insert_interleaved(engine)
    wait_for(lambda: completed(engine) == TOTAL, DEADLINE, f"all {TOTAL} jobs to complete")
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
