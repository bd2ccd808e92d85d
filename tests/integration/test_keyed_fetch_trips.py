"""What one keyed fetch sends on psycopg 3: BEGIN (with the limits' locks) as one query,
the keyed statement on its one generic plan once psycopg has prepared it, COMMIT; and a
fetch that fails ends its transaction (locks released, nothing taken)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import ConcurrencyLimit, JobState
from sa_jobs._declare.limits import Limit
from sa_jobs._table.models import Job
from sa_jobs._table.schema import ALL_FEATURES
from sa_jobs.worker import keyed_fetch
from sa_jobs.worker.keyed_fetch import KeyedQueue, fetch_keyed
from sa_jobs.worker.limited_fetch import plan_limits
from tests.helpers import complete_running
from tests.wire_trace import round_trips, traced_engine

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")


@sa_jobs.job_args(kind="test_trips_tenant", queue="tenants", partition_by=["tenant_id"])
class TenantJob:
    tenant_id: str


def add(engine: Engine, jobs: list[Any]) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, jobs)


def fetch(engine: Engine, plan: KeyedQueue, free: int) -> list[Any]:
    return fetch_keyed(engine, plan, free, "test-trips", features=ALL_FEATURES)


def limited(limits: list[Limit]) -> KeyedQueue:
    return KeyedQueue("tenants", plan_limits(limits, ["tenants"])["tenants"])


@pytest.fixture
def traced(database_url: URL, engine: Engine) -> Iterator[tuple[Engine, Path]]:
    with traced_engine(database_url) as traced:
        yield traced


def test_a_fair_fetch_is_begin_fetch_commit_on_a_generic_plan(
    traced: tuple[Engine, Path],
) -> None:
    one, path = traced
    add(one, [TenantJob(f"t{n:02d}") for n in range(60)])
    plan = KeyedQueue("tenants")
    for _ in range(6):  # psycopg prepares a statement on its fifth run
        assert len(fetch(one, plan, 2)) == 2
    before = round_trips(path)
    assert len(fetch(one, plan, 2)) == 2
    assert round_trips(path) - before == 3  # BEGIN; SET LOCAL, the statement, COMMIT
    with one.connect() as connection:
        plans = connection.execute(
            text(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE 'WITH RECURSIVE walk%'"
            )
        ).one()
    # Planning this statement cost more than running it: every prepared run is generic.
    assert plans.generic_plans >= 2
    assert plans.custom_plans == 0


def test_a_key_limited_fetch_takes_its_locks_and_counts_with_begin(
    traced: tuple[Engine, Path],
) -> None:
    one, path = traced
    add(one, [TenantJob(f"t{n:02d}") for n in range(20)])
    plan = limited([ConcurrencyLimit(1, queue="tenants", by_args=["tenant_id"])])
    assert len(fetch(one, plan, 2)) == 2
    before = round_trips(path)
    assert len(fetch(one, plan, 2)) == 2
    # BEGIN with the locks and the per-key count, the statement, COMMIT: as a plain fetch.
    assert round_trips(path) - before == 3


@sa_jobs.job_args(kind="test_trips_odd_queue", queue="it's a \\ queue", partition_by=["k"])
class OddQueueJob:
    k: str


def test_the_counts_read_with_begin_name_any_queue(engine: Engine) -> None:
    """The opening query's values are literals: a queue name with a quote and a
    backslash is counted as itself, so its full key is skipped."""
    queue = "it's a \\ queue"
    add(engine, [OddQueueJob("a"), OddQueueJob("a"), OddQueueJob("b")])
    plan = KeyedQueue(
        queue, plan_limits([ConcurrencyLimit(1, queue=queue, by_args=["k"])], [queue])[queue]
    )
    assert sorted(job.partition_key for job in fetch(engine, plan, 10)) == ["a", "b"]
    assert fetch(engine, plan, 10) == []  # "a" is running: at its limit
    complete_running(engine)
    assert [job.partition_key for job in fetch(engine, plan, 10)] == ["a"]


def test_a_failed_keyed_fetch_ends_its_transaction(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(engine, [TenantJob(f"t{n}") for n in range(4)])
    plan = limited([ConcurrencyLimit(1, queue="tenants", by_args=["tenant_id"])])

    def broken(features: Any) -> Any:
        def build(row: Any) -> Any:
            raise RuntimeError("unreadable row")

        return build

    monkeypatch.setattr(keyed_fetch, "_builder", broken)
    with pytest.raises(RuntimeError, match="unreadable row"):
        fetch(engine, plan, 2)
    monkeypatch.undo()
    with engine.connect() as connection:
        states = connection.scalars(select(Job.state)).all()
        locks = connection.scalar(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"))
    assert set(states) == {JobState.AVAILABLE}  # rolled back: nothing marked running
    assert locks == 0
    # The connection went back to the pool usable, and the next fetch takes the jobs.
    assert len(fetch(engine, plan, 4)) == 4
    complete_running(engine)
