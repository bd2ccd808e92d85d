"""Bad input gets a clear error before anything is written; what only the database can
refuse never leaves a batch half-handed-over or a session unusable without saying so."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.adapt import Loader
from sqlalchemy import URL, Engine, event, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState, UniqueOpts
from sa_jobs._insert.insert import ABORTED_TRANSACTION_NOTE
from sa_jobs.errors import InvalidOptionsError, SchemaMissingError
from sa_jobs.worker.maintenance.rescuer import Rescuer
from sa_jobs.worker.producer import fetch_jobs
from tests.factories import clear_workers_and_leader, job_row, make_job, seconds
from tests.helpers import FixedDelay, count_jobs, db_now, engine_at, make_worker

UTC = dt.UTC


@sa_jobs.job_args(kind="bad_input_job")
class Plain:
    text: str = ""


@sa_jobs.job_args(kind="bad_input_unique", unique=UniqueOpts(by_args=True))
class Unique:
    n: int = 0


def nested(depth: int) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for _ in range(depth):
        document = {"x": document}
    return document


# ------------------------------------------------------------------ refused before any SQL


@pytest.mark.parametrize(
    "options",
    [
        {"scheduled_at": dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))},
        {"scheduled_at": dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-5)))},
        {"metadata": {"deep": nested(200)}},
    ],
    ids=["year-0", "year-10000", "nested-metadata"],
)
def test_a_refused_insert_leaves_the_transaction_usable(engine: Engine, options: Any) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, Plain("kept"))
        with pytest.raises(InvalidOptionsError):
            sa_jobs.insert(session, Plain("refused"), **options)
        with pytest.raises(InvalidOptionsError):
            session.add(sa_jobs.enqueue(Plain("refused"), **options))
        assert count_jobs(session) == 1
    with Session(engine) as session:
        assert count_jobs(session) == 1


def test_a_ttl_lock_that_would_end_past_the_last_instant_is_refused(engine: Engine) -> None:
    late = dt.datetime(9999, 12, 20, tzinfo=UTC)
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidOptionsError, match="plus the unique ttl"):
            sa_jobs.insert(
                session, Unique(1), scheduled_at=late, unique=UniqueOpts(ttl=dt.timedelta(days=30))
            )
        assert count_jobs(session) == 0


# ------------------------------------------------------------------ the table refuses too


@pytest.mark.parametrize("column", ["scheduled_at", "created_at"])
@pytest.mark.parametrize("value", ["10000-01-01 00:00:00+00", "0001-01-01 00:00:00+00"])
def test_the_table_refuses_an_instant_python_could_not_read_back(
    engine: Engine, column: str, value: str
) -> None:
    with pytest.raises(IntegrityError, match=f"sa_job_{column}_range_check"), engine.begin() as c:
        c.execute(text(f"INSERT INTO sa_job (kind, {column}) VALUES ('raw', '{value}')"))


# ------------------------------------------------------------------ the fetch hands over or nothing


class UnreadableJsonb(Loader):
    """A jsonb loader that cannot read one particular document (as if it were corrupt)."""

    def load(self, data: Any) -> Any:
        raw = bytes(data)
        if b"unreadable" in raw:
            raise psycopg.DataError("cannot read this document")
        return json.loads(raw)


@pytest.fixture
def fussy_engine(database_url: URL) -> Iterator[Engine]:
    with engine_at(database_url) as engine:

        @event.listens_for(engine, "connect")
        def fussy(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.adapters.register_loader("jsonb", UnreadableJsonb)

        yield engine


def test_a_fetch_that_cannot_load_a_row_marks_nothing_running(
    engine: Engine, fussy_engine: Engine
) -> None:
    with Session(engine) as session, session.begin():
        ids = [r.job.id for r in sa_jobs.insert_many(session, [Plain("ok"), Plain("unreadable")])]
    with pytest.raises(DBAPIError, match="cannot read this document"):
        fetch_jobs(fussy_engine, "default", 10, "fussy-worker")
    # Nothing was marked running (and then lost): both jobs are still there to fetch.
    assert [job_row(engine, job_id).state for job_id in ids] == [JobState.AVAILABLE] * 2
    assert {job.id for job in fetch_jobs(engine, "default", 10, "worker")} == set(ids)


# ------------------------------------------------------------------ what only the database refuses


def test_an_insert_the_database_refuses_says_the_transaction_is_aborted(core_only: Engine) -> None:
    # The unique branch is not installed here, so only PostgreSQL can refuse the insert.
    with Session(core_only) as session:
        session.begin()
        with pytest.raises(SchemaMissingError) as exc:
            sa_jobs.insert(session, Unique(1))
        assert ABORTED_TRANSACTION_NOTE in getattr(exc.value, "__notes__", [])
        with pytest.raises(DBAPIError, match="current transaction is aborted"):
            session.execute(select(1))
        session.rollback()
        assert session.scalar(select(1)) == 1


# ------------------------------------------------------------------ the rescuer's retry policy


@sa_jobs.job_args(kind="bad_input_rescued")
class Rescued:
    n: int = 0


def test_rescued_jobs_follow_the_handlers_then_the_workers_retry_policy(engine: Engine) -> None:
    clear_workers_and_leader(engine)
    worker = make_worker(engine, retry_policy=FixedDelay(3600))

    @worker.handler(Rescued, retry_policy=FixedDelay(120))
    def handle(job: Job) -> None:
        pass

    common = {"state": JobState.RUNNING, "attempt": 1, "attempted_by": ["gone"]}
    with_handler = make_job(engine, kind="bad_input_rescued", attempted_at=-seconds(60), **common)
    without = make_job(engine, kind="nobody_handles_this", attempted_at=-seconds(60), **common)
    with engine.begin() as connection:
        rescued = Rescuer(5.0, retry_delay=worker.retry_delay_for).rescue(connection)
    assert sorted(rescued) == [(with_handler, JobState.RETRYABLE), (without, JobState.RETRYABLE)]
    now = db_now(engine)
    assert abs((job_row(engine, with_handler).scheduled_at - now).total_seconds() - 120) < 5
    assert abs((job_row(engine, without).scheduled_at - now).total_seconds() - 3600) < 5
    assert "RescuedError" in job_row(engine, with_handler).errors[-1]["error"]
