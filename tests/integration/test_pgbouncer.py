"""Through a real PgBouncer in transaction pooling mode (``tests.pgbouncer``).

Every statement here goes through PgBouncer, whose few server connections serve one
transaction of one client at a time: inserts on every path, the worker's fetches,
completions and retries, cancellation, and maintenance (leader election, the scheduler,
the rescuer). The engine is built as ``docs/operations.md`` says (psycopg 3 with
``prepare_threshold=None``); the first test shows what goes wrong without it. Checks read
the database directly (the ``engine`` fixture), not through PgBouncer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState, Worker
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.worker.maintenance.leader import LEADER_NAME
from tests.factories import leader_row, make_job, make_worker_row
from tests.helpers import (
    FAST_RESCUE,
    INSERT_PATHS,
    NO_DELAY,
    SLOW_HEARTBEAT,
    count_jobs,
    engine_at,
    get_job,
    insert_through,
    job_states,
    make_worker,
    running,
    wait_event,
    wait_for_state,
    wait_idle,
    wait_listening,
    wait_until,
)
from tests.pgbouncer import PgBouncer

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")

#: More than psycopg's prepare_threshold (5): a statement run this often would be
#: prepared on a server connection.
REPEATS = 12


@sa_jobs.job_args(kind="pgbouncer_plain")
class Plain:
    n: int = 0


@sa_jobs.job_args(kind="pgbouncer_unique", unique=sa_jobs.UniqueOpts(by_args=True))
class UniqueTask:
    n: int = 0


@sa_jobs.job_args(kind="pgbouncer_sequenced", sequence=sa_jobs.SequenceOpts(by_args=True))
class Sequenced:
    account: int = sa_jobs.field(sequence=True)
    n: int = 0


@sa_jobs.job_args(kind="pgbouncer_flaky")
class Flaky:
    n: int = 0


@sa_jobs.job_args(kind="pgbouncer_long")
class Long:
    n: int = 0


def test_the_bouncer_pools_by_transaction_and_breaks_psycopgs_prepared_statements(
    pgbouncer: PgBouncer,
) -> None:
    """What the recipe is for: two clients of one server connection, each running a
    statement often enough for psycopg 3 to prepare it, collide on its name."""
    with psycopg.connect(pgbouncer.admin_url, autocommit=True) as admin:
        pools = admin.execute("SHOW DATABASES").fetchall()
    assert {row[0] for row in pools} >= {pgbouncer.url.database}
    with psycopg.connect(pgbouncer.admin_url, autocommit=True) as admin:
        mode = admin.execute("SHOW CONFIG").fetchall()
    assert ("pool_mode", "transaction") in {(row[0], row[1]) for row in mode}

    url = pgbouncer.one_connection_url
    with engine_at(url) as default, pytest.raises(Exception, match="prepared statement"):
        connections = [default.connect(), default.connect()]
        try:
            for _ in range(REPEATS):
                for connection in connections:
                    connection.execute(text("SELECT 1 + 1")).scalar()
                    connection.commit()
        finally:
            for connection in connections:
                connection.close()
    with engine_at(url, connect_args={"prepare_threshold": None}) as recipe:
        connections = [recipe.connect(), recipe.connect()]
        for _ in range(REPEATS):
            for connection in connections:
                assert connection.execute(text("SELECT 1 + 1")).scalar() == 2
                connection.commit()
        for connection in connections:
            connection.close()


@pytest.mark.parametrize("path", INSERT_PATHS)
def test_every_insert_path_works_through_the_bouncer(
    bouncer_engine: Engine, engine: Engine, path: str
) -> None:
    for n in range(REPEATS):
        insert_through(bouncer_engine, path, Plain(n))
        first, skipped = insert_through(bouncer_engine, path, UniqueTask(n))
        again, skipped_again = insert_through(bouncer_engine, path, UniqueTask(n))
        assert (again, skipped, skipped_again) == (first, False, True)
        insert_through(bouncer_engine, path, Sequenced(account=n % 3, n=n))
        if path != "insert_job":  # keyed adds take insert() or enqueue() (a second round)
            insert_through(bouncer_engine, path, Plain(n), job_key=f"key-{n % 4}")

    keys = 4 if path != "insert_job" else 0
    assert count_jobs(engine) == REPEATS * 3 + keys
    with engine.connect() as connection:
        keyed = connection.execute(
            text("SELECT job_key, count(*) FROM sa_job WHERE job_key IS NOT NULL GROUP BY 1")
        ).all()
        sequenced = connection.execute(
            text("SELECT state, count(*) FROM sa_job WHERE kind = 'pgbouncer_sequenced' GROUP BY 1")
        ).all()
    assert sorted(keyed) == [(f"key-{k}", 1) for k in range(keys)]
    # One job of each of the 3 sequences may run; the others wait their turn.
    assert dict(sequenced) == {JobState.AVAILABLE.value: 3, JobState.PENDING.value: REPEATS - 3}


def test_the_worker_fetches_completes_and_retries_through_the_bouncer(
    bouncer_engine: Engine, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(bouncer_engine, retry_policy=NO_DELAY, poll_only=True)
    failed: set[int] = set()

    @worker.handler(Plain)
    def plain(job: Job[Plain]) -> None:
        pass

    @worker.handler(Sequenced)
    def sequenced(job: Job[Sequenced], session: Session) -> None:
        session.execute(text("SELECT 1"))  # completed in this session's transaction

    @worker.handler(Flaky)
    def flaky(job: Job[Flaky]) -> None:
        if job.id not in failed:
            failed.add(job.id)
            raise ValueError("first attempt fails")

    with Session(bouncer_engine) as session, session.begin():
        sa_jobs.insert_many(session, [Plain(n) for n in range(40)])
        sa_jobs.insert_many(session, [Sequenced(account=n % 4, n=n) for n in range(20)])
        sa_jobs.insert_many(session, [Flaky(n) for n in range(10)])

    with caplog.at_level(logging.INFO, logger="sa_jobs.worker"):
        worker.run_until_idle(timeout=60)

    assert set(job_states(engine).values()) == {JobState.COMPLETED}
    assert count_jobs(engine) == 70
    with engine.connect() as connection:
        attempts = connection.execute(
            text("SELECT kind, max(attempt), min(attempt) FROM sa_job GROUP BY kind")
        ).all()
    assert {(kind, hi, lo) for kind, hi, lo in attempts} == {
        ("pgbouncer_plain", 1, 1),
        ("pgbouncer_sequenced", 1, 1),
        ("pgbouncer_flaky", 2, 2),
    }
    assert "prepared statement" not in caplog.text
    assert "poll_only: the worker polls for new jobs every 0.05 s" in caplog.text


def test_a_running_job_is_cancelled_through_the_bouncer_by_notify_on_a_listen_engine(
    bouncer_engine: Engine, engine: Engine
) -> None:
    # Heartbeats too slow to matter: only the notification can interrupt the job in time.
    worker = make_worker(bouncer_engine, maintenance=SLOW_HEARTBEAT, listen_engine=engine)
    started = threading.Event()

    @worker.handler(Long)
    def long(job: Job[Long]) -> None:
        started.set()
        while True:
            job.check_cancelled()
            threading.Event().wait(0.01)  # the job's work, in small steps

    with running(worker):
        wait_listening(worker)
        job_id = insert_through(bouncer_engine, "insert", Long())[0]
        wait_event(started, "the job to start")
        with Session(bouncer_engine) as session, session.begin():
            sa_jobs.cancel_job(session, job_id)
        job = wait_for_state(engine, job_id, JobState.CANCELLED, timeout=3)
    assert job.finalized_at is not None


def test_without_a_listen_engine_the_worker_finds_out_and_polls_saying_so(
    bouncer_engine: Engine, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """A LISTEN through the bouncer never hears anything: the worker must not trust it.
    It polls, says why, and a cancel still arrives (at its heartbeat)."""
    worker = make_worker(bouncer_engine)
    started = threading.Event()

    @worker.handler(Long)
    def long(job: Job[Long]) -> None:
        started.set()
        while True:
            job.check_cancelled()
            threading.Event().wait(0.01)  # the job's work, in small steps

    with caplog.at_level(logging.INFO, logger="sa_jobs.worker"), running(worker):
        run = worker._run
        assert run is not None
        wait_event(run.notifier.polling, "the worker to give up listening", timeout=15)
        assert not worker.listening.is_set()
        job_id = insert_through(bouncer_engine, "insert", Long())[0]
        wait_event(started, "the polling worker to start the job")
        with Session(bouncer_engine) as session, session.begin():
            sa_jobs.cancel_job(session, job_id)
        wait_for_state(engine, job_id, JobState.CANCELLED, timeout=5)

    warning = [r for r in caplog.records if "received no notification" in r.getMessage()]
    assert len(warning) == 1 and warning[0].levelno == logging.WARNING
    message = warning[0].getMessage()
    assert f"127.0.0.1:{bouncer_engine.url.port}/" in message
    assert "listen_engine" in message and "poll_only=True" in message


def test_with_a_direct_listen_engine_the_worker_says_where_it_listens(
    bouncer_engine: Engine, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # Polls too slow to matter: only the insert's notification can wake the worker.
    worker = make_worker(bouncer_engine, listen_engine=engine.url, poll_interval=60)
    worker.handler(Plain)(lambda job: None)
    with caplog.at_level(logging.INFO, logger="sa_jobs.worker"), running(worker):
        wait_listening(worker)
        wait_idle(worker)
        job_id = insert_through(bouncer_engine, "insert", Plain())[0]
        wait_for_state(engine, job_id, JobState.COMPLETED, timeout=3)

    where = f"{engine.url.host}:{engine.url.port}/{engine.url.database}"
    assert f"listening for new jobs and cancel requests on {where}" in caplog.text
    assert "received no notification" not in caplog.text


def test_maintenance_elects_one_leader_schedules_and_rescues_through_the_bouncer(
    bouncer_engine: Engine, engine: Engine
) -> None:
    # A job whose worker vanished long ago, and one due a moment from now.
    make_worker_row(engine, "vanished", heartbeat_at=dt.timedelta(minutes=-10))
    orphan = make_job(
        engine, kind="pgbouncer_plain", state=JobState.RUNNING, attempt=1,
        attempted_by=["vanished"], attempted_at=dt.timedelta(minutes=-10),
    )  # fmt: skip
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    scheduled = insert_through(bouncer_engine, "insert", Plain(1), scheduled_at=later)[0]
    assert get_job(engine, scheduled).state is JobState.SCHEDULED

    workers = [
        make_worker(bouncer_engine, maintenance=FAST_RESCUE, poll_only=True, worker_id=f"w{i}")
        for i in range(2)
    ]
    for worker in workers:
        worker.handler(Plain)(lambda job: None)
    with running(workers[0]), running(workers[1]):
        wait_for_state(engine, scheduled, JobState.COMPLETED, timeout=10)
        # Rescued (its attempt failed, saying whose it was), retried, and worked here.
        rescued: Any = wait_for_state(engine, orphan, JobState.COMPLETED, timeout=15)
        assert rescued.attempt == 2
        assert "RescuedError" in rescued.errors[-1]["error"]
        assert "vanished" in rescued.errors[-1]["error"]
        lease = wait_until(lambda: leader_row(engine), timeout=5, what="a leader")
        assert lease.name == LEADER_NAME and lease.leader_id in {"w0", "w1"}
        # Never two believe they lead at once, and the lease's holder comes to lead (a
        # holder held up past its ttl stops believing until it renews).
        for _ in range(100):
            assert len(believed_leaders(workers)) <= 1
            time.sleep(0.01)
        wait_until(
            lambda: believed_leaders(workers) == [leader_row(engine).leader_id],
            timeout=5, what="the lease's holder to lead",
        )  # fmt: skip


def believed_leaders(workers: list[Worker]) -> list[str]:
    return [w.id for w in workers if w._run is not None and w._run.maintenance.is_leader]


def test_a_listen_engine_on_another_database_is_refused_at_start(
    bouncer_engine: Engine, core_only: Engine
) -> None:
    worker = make_worker(bouncer_engine, listen_engine=core_only)
    with pytest.raises(InvalidOptionsError, match=r"listen_engine.*same database"):
        worker.start()
    assert not worker.is_running


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"listen_engine": "not a url"}, "is not a database URL"),
        ({"listen_engine": "sqlite:///x.db"}, "must be a PostgreSQL URL"),
        ({"listen_engine": 42}, "must be an Engine or a database URL, got int"),
        ({"poll_only": "yes"}, "must be True or False"),
        ({"poll_only": True, "listen_engine": "postgresql://h/db"}, "one or the other"),
        ({"listen_engine": "postgresql+pg8000://h/db"}, "cannot wait for notifications"),
        ({"listen_engine": create_async_engine("postgresql+psycopg://h/db")}, "sync Engine"),
    ],
)
def test_bad_listen_options_are_refused_when_the_worker_is_built(
    engine: Engine, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidOptionsError, match=message):
        sa_jobs.Worker(engine, **options)


def test_a_worker_whose_engine_prepares_statements_behind_the_bouncer_is_warned(
    pgbouncer: PgBouncer, bouncer_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        engine_at(pgbouncer.url) as default,
        caplog.at_level(logging.WARNING),
        running(make_worker(default, poll_only=True)),
    ):
        pass
    warned = [r.getMessage() for r in caplog.records if "prepare_threshold" in r.getMessage()]
    assert len(warned) == 1
    assert "through a connection pooler" in warned[0]

    caplog.clear()
    with caplog.at_level(logging.WARNING), running(make_worker(bouncer_engine, poll_only=True)):
        pass
    assert "prepare_threshold" not in caplog.text


def test_async_session_handlers_work_through_the_bouncer_on_the_derived_engine(
    pgbouncer: PgBouncer, engine: Engine
) -> None:
    """The async engine the worker derives prepares as the given engine does (not at
    all): on one shared server connection, two of its connections would otherwise both
    prepare ``_pg3_0`` and collide."""
    recipe = {"connect_args": {"prepare_threshold": None}}
    with engine_at(pgbouncer.one_connection_url, **recipe) as one:
        worker = make_worker(one, poll_only=True)

        @worker.handler(Plain)
        async def plain(job: Job[Plain], session: AsyncSession) -> None:
            for _ in range(REPEATS):
                await session.execute(text("SELECT 1 + 1"))
            await asyncio.sleep(0.01)  # several sessions are open at once

        with Session(one) as session, session.begin():
            sa_jobs.insert_many(session, [Plain(n) for n in range(20)])
        worker.run_until_idle(timeout=60)

    assert set(job_states(engine).values()) == {JobState.COMPLETED}


def test_two_migrations_at_once_through_the_bouncer_queue_on_the_transaction_lock(
    bouncer_engine: Engine,
) -> None:
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            sa_jobs.migrate(bouncer_engine)
        except BaseException as exc:  # reported below, with the other thread's
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
