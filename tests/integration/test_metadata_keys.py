"""Partition keys taken from a job's metadata (``job_args(partition_by_metadata=...)``,
``by_metadata=``, ``fair_by_metadata=``): written at insert, counted by the real fetch."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import ConcurrencyLimit
from sa_jobs._table.models import Job
from sa_jobs._table.schema import ALL_FEATURES
from sa_jobs._table.service_tables import WorkerProcess
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.worker.keyed_fetch import KeyedQueue, fetch_keyed
from sa_jobs.worker.limited_fetch import plan_limits
from tests.helpers import make_worker

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")


@sa_jobs.job_args(kind="test_meta_tenant", queue="meta", partition_by_metadata="tenant")
class MetaJob:
    n: int = 0


@sa_jobs.job_args(kind="test_meta_args", queue="meta", partition_by=["tenant"])
class ArgsKeyed:
    tenant: str


def tenant(name: str | None) -> dict[str, Any]:
    return {"tenant": name}


def keys(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.scalars(select(Job.partition_key).order_by(Job.id)))


def test_every_insert_path_writes_the_metadata_key(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, MetaJob(1), metadata=tenant("acme"))
        sa_jobs.insert_many(session, [MetaJob(2), MetaJob(3)], metadata={"tenant": 42})
        session.execute(sa_jobs.insert_job(MetaJob(4), metadata=tenant("beta")))
        session.add(sa_jobs.enqueue(MetaJob(5), metadata=tenant("gamma")))
        # An explicit None: a job of no key, as an args field that is None.
        sa_jobs.insert(session, MetaJob(6), metadata=tenant(None))
    assert keys(engine) == ["acme", "42", "42", "beta", "gamma", None]


def test_an_insert_without_the_metadata_key_is_refused_and_writes_nothing(
    engine: Engine,
) -> None:
    with Session(engine) as session:
        with pytest.raises(InvalidOptionsError, match=r"metadata has no 'tenant'.*metadata="):
            sa_jobs.insert(session, MetaJob(1), metadata={"other": 1})
        with pytest.raises(InvalidOptionsError, match="metadata has no 'tenant'"):
            sa_jobs.insert_many(session, [MetaJob(2), MetaJob(3)])
        # The session is usable: the refusal came before any SQL.
        sa_jobs.insert(session, MetaJob(4), metadata=tenant("acme"))
        session.commit()
    assert keys(engine) == ["acme"]


def test_a_limit_by_metadata_caps_each_key_in_the_real_fetch(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [MetaJob(n) for n in range(10)], metadata=tenant("a"))
        sa_jobs.insert_many(session, [MetaJob(n) for n in range(3)], metadata=tenant("b"))
    limits = [ConcurrencyLimit(2, queue="meta", by_metadata="tenant")]
    plan = KeyedQueue("meta", plan_limits(limits, ["meta"])["meta"])
    fetched = fetch_keyed(engine, plan, 10, "test-meta", features=ALL_FEATURES)
    assert Counter(job.partition_key for job in fetched) == {"a": 2, "b": 2}
    # Both keys are at their limit: the next fetch takes nothing.
    assert fetch_keyed(engine, plan, 10, "test-meta", features=ALL_FEATURES) == []


def test_a_worker_with_a_fair_queue_by_metadata_runs_every_tenant(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        for name in "abc":
            sa_jobs.insert_many(session, [MetaJob(n) for n in range(4)], metadata=tenant(name))
    worker = make_worker(
        engine,
        queues={"meta": sa_jobs.Queue(3, fair_by_metadata="tenant", weights={"a": 2})},
        limits=[ConcurrencyLimit(1, queue="meta", by_metadata="tenant")],
    )
    worker.handler(MetaJob)(lambda job: None)
    assert worker.run_until_idle(timeout=30).worked == 12


def test_the_worker_refuses_a_kind_keyed_by_args_under_a_limit_by_metadata(
    engine: Engine,
) -> None:
    worker = make_worker(
        engine,
        queues={"meta": 2},
        limits=[ConcurrencyLimit(2, queue="meta", by_metadata="tenant")],
    )
    worker.handler(ArgsKeyed)(lambda job: None)
    with pytest.raises(InvalidOptionsError, match=r"declares partition_by=\['tenant'\]"):
        worker.start()
    with engine.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(WorkerProcess)) == 0
        assert connection.scalar(text("SELECT count(*) FROM sa_job")) == 0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: ConcurrencyLimit(2, queue="q", by_args=["t"], by_metadata="t"),
            "not both",
        ),
        (lambda: sa_jobs.RateLimit(2, 60, queue="q", by_metadata=["t"]), "one metadata key"),
        (lambda: sa_jobs.Queue(2, fair_by=["t"], fair_by_metadata="t"), "not both"),
        # Per kind by key is refused with either spelling (docs/queues.md, "Bad input").
        (lambda: ConcurrencyLimit(2, kind=MetaJob, by_metadata="tenant"), "queue of their own"),
        (lambda: sa_jobs.Queue(2, fair_by_metadata=""), "non-empty"),
        (
            lambda: sa_jobs.job_args(
                kind="test_meta_bad", partition_by=["n"], partition_by_metadata="t"
            )(type("Bad", (), {"__annotations__": {"n": int}})),
            "not both",
        ),
    ],
)
def test_bad_declarations_by_metadata_are_refused(build: Any, message: str) -> None:
    with pytest.raises(InvalidOptionsError, match=message):
        build()


def test_two_limits_of_a_queue_by_args_and_by_metadata_are_refused(engine: Engine) -> None:
    with pytest.raises(InvalidOptionsError, match="one partition key"):
        make_worker(
            engine,
            queues={"meta": 1},
            limits=[
                ConcurrencyLimit(1, queue="meta", by_args=["t"]),
                sa_jobs.RateLimit(1, 60, queue="meta", by_metadata="t"),
            ],
        )
