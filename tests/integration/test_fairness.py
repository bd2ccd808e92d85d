"""Partition keys at insert, limits by key and fair fetches, one process at a time (three
worker processes: ``tests/acceptance/test_fair_processes.py``)."""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import ConcurrencyLimit, JobState, RateLimit
from sa_jobs._declare.limits import Limit
from sa_jobs._table.models import Job
from sa_jobs._table.schema import ALL_FEATURES
from sa_jobs._table.service_tables import WorkerProcess
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.worker.keyed_fetch import KeyedQueue, fetch_keyed
from sa_jobs.worker.limited_fetch import plan_limits
from tests.helpers import make_worker

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")


@sa_jobs.job_args(kind="test_fair_tenant", queue="tenants", partition_by=["tenant_id"])
class TenantJob:
    tenant_id: str
    n: int = 0


@sa_jobs.job_args(kind="test_fair_pair", partition_by=["region", "customer"])
class PairJob:
    region: str
    customer: int


@sa_jobs.job_args(kind="test_fair_plain", queue="tenants")
class PlainJob:
    n: int = 0


def add(engine: Engine, jobs: list[Any]) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, jobs)


def keys(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.scalars(select(Job.partition_key).order_by(Job.id)))


def fetch(engine: Engine, plan: KeyedQueue, free: int) -> list[Any]:
    return fetch_keyed(engine, plan, free, "test-fair", features=ALL_FEATURES)


def limited(limits: list[Limit], **weights: int) -> KeyedQueue:
    return KeyedQueue("tenants", plan_limits(limits, ["tenants"])["tenants"], dict(weights))


def finish_all(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(
            update(Job)
            .where(Job.state == JobState.RUNNING)
            .values(state=JobState.COMPLETED, finalized_at=func.now())
        )


def test_inserts_write_the_key_of_a_keyed_kind_and_none_for_others(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, TenantJob("acme"))
        sa_jobs.insert_many(session, [TenantJob("beta"), PlainJob()])
        session.execute(sa_jobs.insert_job(PairJob("eu", 7)))
    assert keys(engine) == ["acme", "beta", None, '["eu",7]']


def test_a_limit_by_key_caps_each_key_and_skips_full_ones(engine: Engine) -> None:
    add(engine, [TenantJob("a", n) for n in range(20)] + [TenantJob("b"), TenantJob("c")])
    plan = limited([ConcurrencyLimit(2, queue="tenants", by_args=["tenant_id"])])
    first = fetch(engine, plan, 10)
    assert Counter(job.partition_key for job in first) == {"a": 2, "b": 1, "c": 1}
    # "a" is at its limit: skipped, and nothing else waits.
    assert fetch(engine, plan, 10) == []
    finish_all(engine)
    assert Counter(job.partition_key for job in fetch(engine, plan, 10)) == {"a": 2}


def test_a_rate_limit_by_key_counts_each_keys_starts(engine: Engine) -> None:
    add(engine, [TenantJob(t, n) for t in "ab" for n in range(10)])
    plan = limited([RateLimit(3, dt.timedelta(hours=1), queue="tenants", by_args=["tenant_id"])])
    assert Counter(job.partition_key for job in fetch(engine, plan, 10)) == {"a": 3, "b": 3}
    finish_all(engine)  # finishing frees no start
    assert fetch(engine, plan, 10) == []


def test_a_fair_fetch_takes_keys_in_turn_whatever_they_hold(engine: Engine) -> None:
    add(engine, [TenantJob("a", n) for n in range(100)])
    add(engine, [TenantJob(t, n) for t in "bcd" for n in range(2)])
    plan = KeyedQueue("tenants")
    batch = fetch(engine, plan, 4)
    assert sorted(job.partition_key for job in batch) == ["a", "b", "c", "d"]
    # Each small tenant has one job left: "a" fills the rest of the batch.
    batch = fetch(engine, plan, 8)
    assert Counter(job.partition_key for job in batch) == {"a": 5, "b": 1, "c": 1, "d": 1}


def test_weights_give_a_key_more_jobs_per_round(engine: Engine) -> None:
    add(engine, [TenantJob(t, n) for t in "ab" for n in range(20)])
    plan = KeyedQueue("tenants", weights={"a": 3})
    assert Counter(job.partition_key for job in fetch(engine, plan, 8)) == {"a": 6, "b": 2}


def test_a_heavy_key_does_not_shut_a_light_one_out_of_a_small_batch(engine: Engine) -> None:
    # Weights spread a key's jobs through its round: b's first job comes before a's
    # second, so a batch of 2 takes one of each (in blocks it took a, a).
    add(engine, [TenantJob("b")] + [TenantJob("a", n) for n in range(2)])
    plan = KeyedQueue("tenants", weights={"a": 3})
    assert sorted(job.partition_key for job in fetch(engine, plan, 2)) == ["a", "b"]


def test_jobs_without_a_key_fill_what_the_keyed_ones_leave(engine: Engine) -> None:
    add(engine, [PlainJob(n) for n in range(3)] + [TenantJob("a")])
    batch = fetch(engine, KeyedQueue("tenants"), 10)
    assert sorted(str(job.partition_key) for job in batch) == ["None"] * 3 + ["a"]


def test_jobs_without_a_key_escape_the_limits_by_key(engine: Engine) -> None:
    """docs/queues.md, "Jobs without a key": no key, so no per-key cap."""
    add(engine, [PlainJob(n) for n in range(5)])
    plan = limited([ConcurrencyLimit(1, queue="tenants", by_args=["tenant_id"])])
    assert [job.partition_key for job in fetch(engine, plan, 10)] == [None] * 5


def test_jobs_without_a_key_wait_behind_a_keyed_backlog_at_the_head(engine: Engine) -> None:
    """docs/queues.md, "Jobs without a key": a job of no key is looked for among the
    queue's first 4 x batch due jobs only; behind a backlog of one key held at its limit
    it is not found until that backlog ahead of it drains."""
    add(engine, [TenantJob("a", n) for n in range(20)])
    add(engine, [PlainJob()])
    plan = limited([ConcurrencyLimit(1, queue="tenants", by_args=["tenant_id"])])
    # A batch of 2: "a" gives its one job, and the window (8 jobs, all of "a") holds no
    # job of no key, although a slot is free.
    assert [job.partition_key for job in fetch(engine, plan, 2)] == ["a"]
    assert fetch(engine, plan, 2) == []
    # A batch of 10: the window (40 jobs) reaches it.
    assert [job.partition_key for job in fetch(engine, plan, 10)] == [None]


def test_the_worker_refuses_a_handled_kind_of_the_queue_without_the_key(engine: Engine) -> None:
    worker = make_worker(
        engine,
        queues={"tenants": 2},
        limits=[ConcurrencyLimit(2, queue="tenants", by_args=["tenant_id"])],
    )
    worker.handler(PlainJob)(lambda job: None)
    with pytest.raises(InvalidOptionsError, match=r"PlainJob.*no field 'tenant_id'"):
        worker.start()
    with engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(WorkerProcess)) == 0
        assert connection.scalar(text("SELECT count(*) FROM sa_job")) == 0


def test_a_fair_worker_runs_every_tenant(engine: Engine) -> None:
    add(engine, [TenantJob(t, n) for t in "abc" for n in range(5)])
    worker = make_worker(
        engine, queues={"tenants": sa_jobs.Queue(3, fair_by=["tenant_id"], weights={"a": 2})}
    )
    worker.handler(TenantJob)(lambda job: None)
    result = worker.run_until_idle(timeout=30)
    assert result.worked == 15


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: sa_jobs.Queue(5, fair_by=["tenant_id"], weights={"a": 0}), "weight of key 'a'"),
        (lambda: sa_jobs.Queue(5, weights={"a": 2}), "add fair_by"),
        (lambda: sa_jobs.Queue(0, fair_by=["t"]), "positive int"),
        (lambda: ConcurrencyLimit(0, queue="q", by_args=["t"]), "max_running"),
        (lambda: ConcurrencyLimit(2, queue="q", by_args="tenant_id"), r"\['tenant_id'\]"),
        (lambda: ConcurrencyLimit(2, kind=TenantJob, by_args=["tenant_id"]), "not of a kind"),
        (
            lambda: sa_jobs.job_args(kind="test_fair_bad", partition_by=["nope"])(
                type("Bad", (), {"__annotations__": {"tenant_id": str}})
            ),
            "Bad has no field 'nope'",
        ),
    ],
)
def test_bad_declarations_are_refused_where_they_are_written(build: Any, message: str) -> None:
    with pytest.raises(InvalidOptionsError, match=message):
        build()


def test_a_hundred_thousand_keys_are_walked_a_batch_at_a_time(engine: Engine) -> None:
    """100,000 tenants with a job each (written by SQL: the insert path is tested above):
    a fetch visits only a batch of keys from its cursor, so it costs the same as with ten,
    and successive fetches move on through the keys without repeating one."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO sa_job (kind, args, queue, partition_key)"
                " SELECT 'test_fair_tenant', jsonb_build_object('tenant_id', k), 'tenants', k"
                " FROM (SELECT 't' || lpad(n::text, 6, '0') AS k"
                " FROM generate_series(1, 100000) AS n) AS keys"
            )
        )
        connection.execute(text("ANALYZE sa_job"))
    plan = limited([ConcurrencyLimit(1, queue="tenants", by_args=["tenant_id"])])
    seen: list[str] = []
    for _ in range(5):
        began = time.perf_counter()
        batch = fetch(engine, plan, 10)
        assert time.perf_counter() - began < 2.0
        seen += sorted(job.partition_key for job in batch)
    assert seen == [f"t{n:06d}" for n in range(1, 51)]


def test_a_limit_by_key_on_a_queue_the_worker_does_not_serve_is_refused(engine: Engine) -> None:
    with pytest.raises(InvalidOptionsError, match="'tenants', which this worker does not serve"):
        make_worker(
            engine,
            queues={"default": 2},
            limits=[ConcurrencyLimit(2, queue="tenants", by_args=["tenant_id"])],
        )


def test_a_fair_queue_and_a_limit_by_key_must_name_the_same_fields(engine: Engine) -> None:
    worker = make_worker(
        engine,
        queues={"tenants": sa_jobs.Queue(2, fair_by=["n"])},
        limits=[ConcurrencyLimit(2, queue="tenants", by_args=["tenant_id"])],
    )
    with pytest.raises(InvalidOptionsError, match="one partition key"):
        worker.start()
    with engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(WorkerProcess)) == 0
