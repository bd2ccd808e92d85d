"""The reindexer: a bloated hot index is rebuilt concurrently, the queue working meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._base.records import Ending, Outcome
from sa_jobs.worker.db_access import autocommit
from sa_jobs.worker.maintenance.loop import MaintenanceConfig
from sa_jobs.worker.maintenance.reindexer import Reindexer, ReindexSettings
from sa_jobs.worker.producer import fetch_jobs
from tests.helpers import (
    add_jobs,
    count_jobs,
    eventually,
    fast_maintenance,
    finish_outcomes,
    make_worker,
    running,
)

SMALL = ReindexSettings(min_bytes=64 * 1024, bloat_factor=4.0, lock_timeout=30.0)


@sa_jobs.job_args(kind="reindex_noop", queue="reindexed")
class Noop:
    n: int = 0


@pytest.fixture
def connection(engine: Engine) -> Iterator[Connection]:
    with autocommit(engine).connect() as connection:
        yield connection


def fetch_idx(connection: Connection) -> tuple[int, int]:
    """sa_job_fetch_idx's size in bytes and its file (a rebuild gives it a new one)."""
    row = connection.execute(
        text(
            "SELECT pg_relation_size('sa_job_fetch_idx'), pg_relation_filenode('sa_job_fetch_idx')"
        )
    ).one()
    return int(row[0]), int(row[1])


def bloat_fetch_index(engine: Engine, connection: Connection, jobs: int) -> None:
    """Jobs enter the fetch index as available and leave it finished: what a busy queue
    does to it. VACUUM removes the dead entries, but not the pages they filled."""
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many_fast(session, [Noop(n) for n in range(jobs)])
    connection.execute(
        text(
            "UPDATE sa_job SET state = 'completed', finalized_at = now() WHERE queue = 'reindexed'"
        )
    )
    connection.execute(text("VACUUM ANALYZE sa_job"))


def work_one(engine: Engine) -> None:
    """Enqueue, fetch and complete a job: the queue's whole round."""
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, Noop(-1))
    (job,) = fetch_jobs(engine, "reindexed", 1, "reindex-test")
    outcome = Outcome.of(job, Ending.COMPLETED)
    assert finish_outcomes(engine, [outcome]) == [(job.id, sa_jobs.JobState.COMPLETED)]


def test_a_bloated_fetch_index_is_rebuilt_concurrently_while_the_queue_keeps_working(
    engine: Engine, connection: Connection
) -> None:
    reindexer = Reindexer(SMALL)
    assert reindexer.run_once(connection) == 0  # an empty table: nothing is bloated
    bloat_fetch_index(engine, connection, 5_000)
    bloated, old_file = fetch_idx(connection)
    assert bloated > SMALL.min_bytes

    # An open snapshot makes REINDEX CONCURRENTLY wait (for older snapshots) midway, so
    # the queue's round trips below run while the rebuild is in progress.
    with engine.connect() as holder:
        holder.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        holder.execute(text("SELECT 1 FROM sa_job LIMIT 1"))
        rebuilt: list[int] = []
        rebuild = threading.Thread(
            target=lambda: rebuilt.append(reindexer.run_once(autocommit(engine).connect()))
        )
        rebuild.start()
        try:
            assert eventually(
                lambda: (
                    connection.scalar(
                        text(
                            "SELECT count(*) FROM pg_stat_progress_create_index"
                            " WHERE command = 'REINDEX CONCURRENTLY'"
                        )
                    )
                    == 1
                ),
                timeout=10,
            )
            for _ in range(3):
                work_one(engine)
            assert rebuild.is_alive()
        finally:
            holder.rollback()
            rebuild.join(30)
    assert rebuilt == [1]

    size, new_file = fetch_idx(connection)
    assert new_file != old_file
    assert size < bloated / 4
    valid = connection.scalar(
        text("SELECT indisvalid FROM pg_index WHERE indexrelid = 'sa_job_fetch_idx'::regclass")
    )
    assert valid is True
    work_one(engine)  # and through the new index
    # Now small: the next pass leaves it alone.
    assert reindexer.run_once(connection) == 0
    assert fetch_idx(connection)[1] == new_file


def test_an_index_left_half_built_by_a_failed_rebuild_is_dropped(
    engine: Engine, connection: Connection
) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many_fast(session, [Noop(1), Noop(2)])
    # A concurrent build that fails (duplicate keys) leaves an invalid index, as an
    # interrupted REINDEX CONCURRENTLY leaves its *_ccnew.
    with pytest.raises(Exception, match="could not create unique index"):
        connection.execute(
            text("CREATE UNIQUE INDEX CONCURRENTLY sa_job_fetch_idx_ccnew ON sa_job (queue)")
        )
    leftover = "SELECT count(*) FROM pg_class WHERE relname = 'sa_job_fetch_idx_ccnew'"
    assert connection.scalar(text(leftover)) == 1
    assert Reindexer(SMALL).run_once(connection) == 0
    assert connection.scalar(text(leftover)) == 0


def test_settings_must_be_positive() -> None:
    with pytest.raises(sa_jobs.errors.InvalidOptionsError, match="bloat_factor"):
        ReindexSettings(bloat_factor=0)


@pytest.mark.usefixtures("no_workers_or_leader")
def test_the_leader_rebuilds_a_bloated_index_on_its_own_thread_when_reindexing_is_on(
    engine: Engine, connection: Connection
) -> None:
    bloat_fetch_index(engine, connection, 5_000)
    _, old_file = fetch_idx(connection)
    worker = make_worker(
        engine,
        queues={"reindexed": 2},
        maintenance=fast_maintenance(reindex_interval=0.1, reindex=SMALL),
    )

    @worker.handler(Noop)
    def noop(job: sa_jobs.Job[Noop]) -> None:
        pass

    with running(worker):
        assert eventually(lambda: fetch_idx(connection)[1] != old_file, timeout=10)
        add_jobs(engine, [Noop(n) for n in range(3)])
        assert eventually(lambda: count_jobs(engine, sa_jobs.JobState.AVAILABLE) == 0)


def test_reindexing_is_off_by_default() -> None:
    assert MaintenanceConfig().reindex_interval is None
