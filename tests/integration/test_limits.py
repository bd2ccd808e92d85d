"""Limits at the fetch: what one limited fetch takes, under concurrency, rate windows, and
what a queue without limits still sends. (Several worker processes:
``tests/acceptance/test_limits_processes.py``.)"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import ConcurrencyLimit, JobState, RateLimit
from sa_jobs._declare.limits import Limit
from sa_jobs._table.limit_tables import RateWindow
from sa_jobs._table.models import Job
from sa_jobs._table.schema import ALL_FEATURES, translate_missing_schema
from sa_jobs.errors import SchemaMissingError
from sa_jobs.worker.limited_fetch import fetch_limited, plan_limits
from tests.factories import make_job
from tests.helpers import make_worker, running, wait_until

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")


@sa_jobs.job_args(kind="test_limits_work")
class Work:
    n: int = 0


def fetch(engine: Engine, queue: str, free: int, limits: Sequence[Limit]) -> list[Any]:
    """One limited fetch of ``queue`` by a process that declared ``limits``."""
    plan = plan_limits(limits, [queue])[queue]
    return fetch_limited(engine, plan, free, "test-limits", features=ALL_FEATURES)


def finish(engine: Engine, jobs: Sequence[Any]) -> None:
    with engine.begin() as connection:
        connection.execute(
            update(Job)
            .where(Job.id.in_([job.id for job in jobs]))
            .values(state=JobState.COMPLETED, finalized_at=func.now())
        )


def add(engine: Engine, count: int, *, queue: str = "q", kind: str = "test_limits_work") -> None:
    with engine.begin() as connection:
        for _ in range(count):
            make_job(connection, queue=queue, kind=kind)


def test_a_queue_limit_takes_only_the_free_running_places(engine: Engine) -> None:
    add(engine, 10)
    limit = [ConcurrencyLimit(queue="q", max_running=3)]
    first = fetch(engine, "q", 10, limit)
    assert len(first) == 3
    assert fetch(engine, "q", 10, limit) == []
    finish(engine, first[:1])
    assert len(fetch(engine, "q", 10, limit)) == 1
    # The process's own free slots still bound the batch.
    finish(engine, first[1:])
    assert len(fetch(engine, "q", 1, limit)) == 1


def test_running_jobs_another_queue_does_not_count_against_a_queue_limit(engine: Engine) -> None:
    with engine.begin() as connection:
        for _ in range(3):
            make_job(connection, queue="elsewhere", state=JobState.RUNNING)
    add(engine, 5)
    assert len(fetch(engine, "q", 10, [ConcurrencyLimit(queue="q", max_running=2)])) == 2


def test_a_kind_at_its_limit_is_skipped_and_other_kinds_are_fetched(engine: Engine) -> None:
    with engine.begin() as connection:
        # The limited kind comes first in fetch order, so a plain LIMIT would take only it.
        for _ in range(5):
            make_job(connection, queue="q", kind="limited_kind", priority=1)
        for _ in range(5):
            make_job(connection, queue="q", kind="free_kind", priority=2)
    limits = [ConcurrencyLimit(kind="limited_kind", max_running=2)]
    batch = fetch(engine, "q", 6, limits)
    assert sorted(job.kind for job in batch) == ["free_kind"] * 4 + ["limited_kind"] * 2
    rest = fetch(engine, "q", 10, limits)
    assert [job.kind for job in rest] == ["free_kind"]


def test_a_kind_limit_counts_its_running_jobs_in_every_queue(engine: Engine) -> None:
    with engine.begin() as connection:
        make_job(connection, queue="other", kind="limited_kind", state=JobState.RUNNING)
        for _ in range(3):
            make_job(connection, queue="q", kind="limited_kind")
    batch = fetch(engine, "q", 10, [ConcurrencyLimit(kind="limited_kind", max_running=2)])
    assert len(batch) == 1


def test_limits_of_a_queue_and_a_kind_both_hold(engine: Engine) -> None:
    with engine.begin() as connection:
        for _ in range(4):
            make_job(connection, queue="q", kind="limited_kind")
            make_job(connection, queue="q", kind="free_kind")
    limits: list[Limit] = [
        ConcurrencyLimit(queue="q", max_running=3),
        ConcurrencyLimit(kind="limited_kind", max_running=1),
    ]
    batch = fetch(engine, "q", 8, limits)
    assert len(batch) == 3
    assert sum(job.kind == "limited_kind" for job in batch) == 1


def test_concurrent_fetchers_never_exceed_the_limit(engine: Engine) -> None:
    """Eight threads fetch at once, nothing finishes: the total is the limit. Without the
    lock, each would count the same running jobs and take its own share."""
    add(engine, 100)
    limits = [ConcurrencyLimit(queue="q", max_running=7)]
    plan = plan_limits(limits, ["q"])["q"]
    start = threading.Barrier(8)
    taken: list[int] = []
    lock = threading.Lock()

    def fetcher() -> None:
        start.wait()
        for _ in range(5):
            jobs = fetch_limited(engine, plan, 3, "t", features=ALL_FEATURES)
            with lock:
                taken.append(len(jobs))

    threads = [threading.Thread(target=fetcher) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(taken) == 7
    with engine.connect() as connection:
        running = connection.scalar(
            select(func.count()).select_from(Job).where(Job.state == JobState.RUNNING)
        )
    assert running == 7


def test_a_rate_limit_counts_starts_not_running_jobs(engine: Engine) -> None:
    add(engine, 10)
    limits = [RateLimit(queue="q", max_starts=4, per=dt.timedelta(hours=1))]
    first = fetch(engine, "q", 3, limits)
    assert len(first) == 3
    finish(engine, first)
    assert len(fetch(engine, "q", 10, limits)) == 1
    assert fetch(engine, "q", 10, limits) == []
    with engine.connect() as connection:
        rows = connection.execute(select(RateWindow)).all()
    assert [(row.scope, row.starts) for row in rows] == [("queue:q", 4)]
    assert rows[0].keep_until == rows[0].window_end + dt.timedelta(hours=1)


def test_a_start_is_stamped_with_the_time_it_was_counted_at(engine: Engine) -> None:
    add(engine, 2)
    (job,) = fetch(engine, "q", 1, [RateLimit(queue="q", max_starts=5, per=60)])
    with engine.connect() as connection:
        window = connection.execute(select(RateWindow)).one()
    assert window.window_start <= job.attempted_at < window.window_end
    assert window.window_end - window.window_start == dt.timedelta(seconds=3)


def test_the_window_slides(engine: Engine) -> None:
    add(engine, 10)
    limits = [RateLimit(queue="q", max_starts=3, per=1)]
    assert len(fetch(engine, "q", 10, limits)) == 3
    assert fetch(engine, "q", 10, limits) == []
    # A second (plus the one window the count errs by) later, the starts fall out.
    wait_until(lambda: len(fetch(engine, "q", 10, limits)) == 3, timeout=3, interval=0.05)


def test_windows_no_period_reaches_are_deleted(engine: Engine) -> None:
    old = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    with engine.begin() as connection:
        connection.execute(
            RateWindow.__table__.insert(),
            [
                {
                    "scope": "queue:q",
                    "window_start": old,
                    "window_end": old + dt.timedelta(seconds=3),
                    "keep_until": old + dt.timedelta(minutes=1),
                    "starts": 50,
                }
            ],
        )
    add(engine, 1)
    assert len(fetch(engine, "q", 1, [RateLimit(queue="q", max_starts=5, per=60)])) == 1
    with engine.connect() as connection:
        starts = connection.scalars(select(RateWindow.starts)).all()
    assert starts == [1]


def test_a_kind_rate_limit_counts_only_that_kind(engine: Engine) -> None:
    with engine.begin() as connection:
        for _ in range(4):
            make_job(connection, queue="q", kind="limited_kind")
            make_job(connection, queue="q", kind="free_kind")
    limits = [RateLimit(kind="limited_kind", max_starts=2, per=3600)]
    assert sorted(job.kind for job in fetch(engine, "q", 8, limits)) == (
        ["free_kind"] * 4 + ["limited_kind"] * 2
    )
    with engine.connect() as connection:
        assert connection.execute(select(RateWindow.scope, RateWindow.starts)).all() == [
            ("kind:limited_kind", 2)
        ]


def test_a_worker_fetches_unlimited_queues_with_the_plain_statement(
    engine: Engine, statements: list[str]
) -> None:
    worker = make_worker(
        engine,
        queues={"limited": 2, "plain": 2},
        limits=[ConcurrencyLimit(queue="limited", max_running=1)],
    )
    worker.handler(Work)(lambda job: None)
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, Work(1), queue="plain")
        sa_jobs.insert(session, Work(2), queue="limited")
    worker.run_until_idle(timeout=10)
    fetches = [s for s in statements if "FOR UPDATE SKIP LOCKED" in s]
    plain = [s for s in fetches if "locked.id" in s and "ranked" not in s]
    limited = [s for s in fetches if "ranked" in s]
    # The limited fetch's locks and count go with its BEGIN, to the driver itself on
    # psycopg 3, past SQLAlchemy's events: test_limited_fetch_trips.py checks them.
    assert plain and limited
    with engine.connect() as connection:
        states = connection.scalars(select(Job.state)).all()
    assert states == [JobState.COMPLETED, JobState.COMPLETED]


def test_a_worker_works_a_limited_queue_to_the_end(engine: Engine) -> None:
    worker = make_worker(
        engine,
        queues={"default": 4},
        limits=[
            ConcurrencyLimit(queue="default", max_running=2),
            RateLimit(kind=Work, max_starts=1000, per=60),
        ],
    )
    seen: list[int] = []
    worker.handler(Work)(lambda job: seen.append(job.args.n))
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Work(n) for n in range(20)])
    with running(worker):
        wait_until(lambda: len(seen) == 20, timeout=10)
    assert sorted(seen) == list(range(20))


@sa_jobs.job_args(kind="test_limits_declared_elsewhere")
class DeclaredElsewhere:
    n: int = 0


def test_a_kind_limit_no_handler_runs_is_warned_about_at_start(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(
        engine,
        queues={"default": 2},
        limits=[
            ConcurrencyLimit(kind=Work, max_running=2),  # handled: no warning
            ConcurrencyLimit(kind="test_limits_wrok", max_running=2),  # a typo
            RateLimit(kind=DeclaredElsewhere, max_starts=5, per=60),  # no handler here
        ],
    )
    # Registered after construction, as usual: the check waits for start.
    worker.handler(Work)(lambda job: None)
    caplog.set_level(logging.WARNING, logger="sa_jobs.worker")

    with running(worker):
        pass

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    about_limits = [w for w in warnings if "no handler of this worker runs" in w]
    assert len(about_limits) == 2, warnings
    typo, elsewhere = sorted(about_limits)
    assert "ConcurrencyLimit names kind 'test_limits_wrok'" in typo
    assert "no job args class declares it either (a typo?)" in typo
    assert "handlers' kinds: test_limits_work" in typo
    assert "RateLimit names kind 'test_limits_declared_elsewhere'" in elsewhere
    assert "this worker has no handler for it" in elsewhere


def test_a_worker_with_limits_needs_the_limits_branch(core_only: Engine) -> None:
    worker = make_worker(core_only, limits=[ConcurrencyLimit(queue="default", max_running=1)])
    with pytest.raises(SchemaMissingError, match="sa_jobs_limits"):
        worker.start()
    assert not worker.is_running


def test_a_fetch_without_the_limits_table_names_the_branch(core_only: Engine) -> None:
    with (
        core_only.begin() as connection,
        pytest.raises(SchemaMissingError, match="limits"),
        translate_missing_schema(),
    ):
        connection.execute(text("SELECT * FROM sa_job_rate_window"))


def test_a_paused_limited_queue_gives_nothing(engine: Engine) -> None:
    add(engine, 3)
    limits = [ConcurrencyLimit(queue="q", max_running=5)]
    with Session(engine) as session, session.begin():
        sa_jobs.pause_queue(session, "q")
    assert fetch(engine, "q", 3, limits) == []
    with Session(engine) as session, session.begin():
        sa_jobs.resume_queue(session, "q")
    assert len(fetch(engine, "q", 3, limits)) == 3
