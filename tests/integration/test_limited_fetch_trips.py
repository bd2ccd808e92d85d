"""What one queue-limited fetch sends on psycopg 3: BEGIN with the limits' locks and
counts as one query, the fetch, (for a rate limit) the starts recorded, COMMIT; the
fetch's time is read after the locks are granted; and a fetch that fails ends its
transaction (locks released, nothing taken)."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.engine import URL

from sa_jobs import ConcurrencyLimit, JobState, RateLimit
from sa_jobs._declare.limits import Limit
from sa_jobs._table.models import Job
from sa_jobs._table.schema import ALL_FEATURES
from sa_jobs.worker import limited_fetch
from sa_jobs.worker.limited_fetch import LOCK_CLASS, fetch_limited, plan_limits
from tests.factories import make_job
from tests.helpers import complete_running, db_now, engine_at, recorded_statements
from tests.wire_trace import round_trips, sent, traced_engine

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")

KIND = "test_limited_trips"


def add(engine: Engine, count: int, queue: str) -> None:
    with engine.begin() as connection:
        for _ in range(count):
            make_job(connection, queue=queue, kind=KIND)


def fetch(engine: Engine, queue: str, free: int, limits: Sequence[Limit]) -> list[Any]:
    plan = plan_limits(limits, [queue])[queue]
    return fetch_limited(engine, plan, free, "test-limited-trips", features=ALL_FEATURES)


@pytest.fixture
def traced(database_url: URL, engine: Engine) -> Iterator[tuple[Engine, Path]]:
    with traced_engine(database_url) as traced:
        yield traced


def test_a_never_binding_concurrency_limit_is_begin_fetch_commit(
    traced: tuple[Engine, Path],
) -> None:
    one, path = traced
    add(one, 10, "trips_q")
    limits = [ConcurrencyLimit(100, queue="trips_q")]
    assert len(fetch(one, "trips_q", 2, limits)) == 2  # the connection is made
    before = len(sent(path))
    assert len(fetch(one, "trips_q", 3, limits)) == 3
    messages = sent(path)[before:]
    waits = [m.split("\t")[2] for m in messages if m.split("\t")[2] in ("Query", "Sync")]
    # BEGIN with the lock and the count (simple), the fetch (extended), COMMIT (simple):
    # three round trips, as a plain fetch.
    assert waits == ["Query", "Sync", "Query"]
    assert '"BEGIN; SELECT count(pg_advisory_xact_lock(' in messages[0]
    assert messages[-1].endswith('"COMMIT"')
    complete_running(one)


def test_a_rate_limited_fetch_adds_only_the_starts_it_records(
    traced: tuple[Engine, Path],
) -> None:
    one, path = traced
    add(one, 10, "trips_rated")
    limits = [RateLimit(1000, per=dt.timedelta(seconds=1), queue="trips_rated")]
    assert len(fetch(one, "trips_rated", 2, limits)) == 2
    before = round_trips(path)
    assert len(fetch(one, "trips_rated", 3, limits)) == 3
    # The opening query, the fetch, the starts counted in their window, the old windows
    # deleted, COMMIT.
    assert round_trips(path) - before == 5
    complete_running(one)


def test_the_fetch_time_is_read_after_the_locks_are_granted(engine: Engine) -> None:
    """The opening query is one message, so ``statement_timestamp()`` would be when it
    arrived, before a lock held elsewhere was released; the fetch's time (its jobs'
    ``attempted_at``) must be later than every earlier fetch's, so later than that."""
    add(engine, 2, "trips_wait")
    limits = [RateLimit(100, per=dt.timedelta(hours=1), queue="trips_wait")]
    plan = plan_limits(limits, ["trips_wait"])["trips_wait"]
    (number,) = {rule.lock_number for rule in plan.rules}
    fetched: list[Any] = []
    with engine.connect() as holder:
        holder.execute(select(func.pg_advisory_xact_lock(LOCK_CLASS, number)))
        fetcher = threading.Thread(
            target=lambda: fetched.extend(fetch(engine, "trips_wait", 2, limits))
        )
        fetcher.start()
        fetcher.join(0.5)
        assert fetcher.is_alive()  # waiting for the lock
        released_at = db_now(holder)
        holder.commit()
    fetcher.join(5)
    assert len(fetched) == 2
    assert all(job.attempted_at > released_at for job in fetched)
    complete_running(engine)


def test_another_driver_sends_the_locks_and_the_count_one_by_one(database_url: URL) -> None:
    """psycopg2 (any driver but psycopg 3): the driver's BEGIN, then the lock and the
    count as statements of their own, the same limits enforced."""
    with engine_at(database_url.set(drivername="postgresql+psycopg2")) as other:
        add(other, 3, "trips_other_driver")
        limits = [ConcurrencyLimit(2, queue="trips_other_driver")]
        with recorded_statements(other) as statements:
            assert len(fetch(other, "trips_other_driver", 5, limits)) == 2
        assert "pg_advisory_xact_lock" in statements[0]
        assert "clock_timestamp()" in statements[1]
        assert fetch(other, "trips_other_driver", 5, limits) == []  # at its limit
        complete_running(other)


def test_a_failed_limited_fetch_ends_its_transaction(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(engine, 4, "trips_broken")
    limits = [ConcurrencyLimit(100, queue="trips_broken")]

    def broken(features: Any) -> Any:
        def build(row: Any) -> Any:
            raise RuntimeError("unreadable row")

        return build

    monkeypatch.setattr(limited_fetch, "_job_builder", broken)
    with pytest.raises(RuntimeError, match="unreadable row"):
        fetch(engine, "trips_broken", 2, limits)
    monkeypatch.undo()
    with engine.connect() as connection:
        states = connection.scalars(select(Job.state)).all()
        locks = connection.scalar(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"))
    assert set(states) == {JobState.AVAILABLE}  # rolled back: nothing marked running
    assert locks == 0
    # The connection went back to the pool usable, and the next fetch takes the jobs.
    assert len(fetch(engine, "trips_broken", 4, limits)) == 4
    complete_running(engine)
