"""``wait_for`` / ``wait_for_all``: the output of a finished job, or a clear error; woken
by ``NOTIFY`` on ``sa_jobs_done`` (sent only for watched jobs), with a polling fallback
that works behind PgBouncer in transaction mode."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs._base.records import Ending
from sa_jobs._table.schema import DONE_CHANNEL
from sa_jobs.errors import (
    InvalidOptionsError,
    JobCancelledWaitError,
    JobDiscardedError,
    JobNotFoundError,
    SchemaMissingError,
    WaitTimeoutError,
)
from tests.helpers import add_job, cancel, fetch_one, finish_run, libpq_url, wait_until
from tests.pgbouncer import PgBouncer


@sa_jobs.job_args(kind="wait_result_value")
class Result:
    total: int
    label: str = ""


@sa_jobs.job_args(kind="wait_sum", output=Result)
class Sum:
    a: int
    b: int


@sa_jobs.job_args(kind="wait_untyped")
class Untyped:
    n: int = 0


def complete(engine: Engine, job: Job[Any], output: Any) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, job, output=output)


def later(delay: float, action: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def watching(database_url: URL) -> Iterator[psycopg.Connection[Any]]:
    """A connection of the test's own, listening on the done channel."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        connection.execute(f"LISTEN {DONE_CHANNEL}")
        yield connection


def done_notifications(listener: psycopg.Connection[Any], timeout: float = 0.3) -> list[str]:
    return [n.payload for n in listener.notifies(timeout=timeout, stop_after=None)]


# ------------------------------------------------------------------ outcomes


def test_wait_for_returns_the_typed_output_of_a_job_completed_meanwhile(engine: Engine) -> None:
    job_id = add_job(engine, Sum(2, 3))
    job = fetch_one(engine)
    later(0.2, lambda: complete(engine, job, Result(5, "sum")))
    assert sa_jobs.wait_for(engine, job_id, timeout=10) == Result(5, "sum")


def test_wait_for_a_job_already_completed_returns_at_once(engine: Engine) -> None:
    job_id = add_job(engine, Untyped())
    complete(engine, fetch_one(engine), {"done": 1})
    started = time.monotonic()
    with Session(engine) as session:  # a Session works as the bind too
        assert sa_jobs.wait_for(session, job_id, timeout=5) == {"done": 1}
    assert time.monotonic() - started < 1.0


def test_a_job_completed_without_output_gives_none(engine: Engine) -> None:
    job_id = add_job(engine, Untyped())
    finish_run(engine, fetch_one(engine))
    assert sa_jobs.wait_for(engine, job_id, timeout=5) is None


def test_a_discarded_job_raises_with_its_errors(engine: Engine) -> None:
    job_id = add_job(engine, Untyped(), max_attempts=1)
    job = fetch_one(engine)
    later(
        0.2,
        lambda: finish_run(
            engine, job, Ending.FAILED, delay=0.0, error={"attempt": 1, "error": "Boom: broke"}
        ),
    )
    with pytest.raises(JobDiscardedError, match="Boom: broke") as raised:
        sa_jobs.wait_for(engine, job_id, timeout=10)
    assert raised.value.job_id == job_id
    assert [e["error"] for e in raised.value.errors] == ["Boom: broke"]


def test_a_cancelled_job_raises_with_its_reason(engine: Engine) -> None:
    job_id = add_job(engine, Untyped())
    with engine.begin() as connection:
        connection.execute(
            text('UPDATE sa_job SET metadata = \'{"cancel_reason": "not needed"}\' WHERE id = :i'),
            {"i": job_id},
        )
    later(0.2, lambda: cancel(engine, job_id))
    with pytest.raises(JobCancelledWaitError, match="not needed") as raised:
        sa_jobs.wait_for(engine, job_id, timeout=10)
    assert raised.value.reason == "not needed"


def test_a_timeout_names_the_jobs_state(engine: Engine) -> None:
    job_id = add_job(engine, Untyped())
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError, match="'available'") as raised:
        sa_jobs.wait_for(engine, job_id, timeout=0.3, poll_interval=0.1)
    assert 0.3 <= time.monotonic() - started < 2.0
    assert raised.value.state == "available"
    assert isinstance(raised.value, TimeoutError)


def test_an_unknown_id_raises_not_found_and_writes_nothing(engine: Engine) -> None:
    with pytest.raises(JobNotFoundError, match="no job with id 987654"):
        sa_jobs.wait_for(engine, 987654, timeout=1)


@pytest.mark.parametrize(
    ("call", "option"),
    [
        (lambda e: sa_jobs.wait_for(e, "7", timeout=1), "job_id"),
        (lambda e: sa_jobs.wait_for(e, True, timeout=1), "job_id"),
        (lambda e: sa_jobs.wait_for(e, 1, timeout=0), "timeout"),
        (lambda e: sa_jobs.wait_for(e, 1, timeout=float("inf")), "timeout"),
        (lambda e: sa_jobs.wait_for(e, 1, timeout=1, poll_interval=-1), "poll_interval"),
        (lambda e: sa_jobs.wait_for(e, 1, timeout=1, poll_only="yes"), "poll_only"),
        (lambda e: sa_jobs.wait_for_all(e, 5, timeout=1), "job_ids"),
        (lambda e: sa_jobs.wait_for("engine", 1, timeout=1), "bind"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    engine: Engine, call: Callable[[Engine], object], option: str
) -> None:
    job_id = add_job(engine, Untyped())
    with pytest.raises(InvalidOptionsError, match=option):
        call(engine)
    with engine.connect() as connection:
        assert not connection.scalar(
            text("SELECT output_watched FROM sa_job WHERE id = :i"), {"i": job_id}
        )


def test_without_the_output_branch_wait_for_names_it(core_only: Engine) -> None:
    job_id = add_job(core_only, Untyped())
    with pytest.raises(SchemaMissingError, match="sa_jobs_output"):
        sa_jobs.wait_for(core_only, job_id, timeout=1)


# ------------------------------------------------------------------ notifications


def test_a_notification_wakes_the_waiter_well_before_its_poll(engine: Engine) -> None:
    job_id = add_job(engine, Untyped())
    job = fetch_one(engine)
    later(0.3, lambda: complete(engine, job, 1))
    started = time.monotonic()
    assert sa_jobs.wait_for(engine, job_id, timeout=10, poll_interval=5.0) == 1
    assert time.monotonic() - started < 1.5  # the poll would have taken 5 s


def test_completions_nobody_waits_for_send_no_notification(
    engine: Engine, watching: psycopg.Connection[Any]
) -> None:
    ids = [add_job(engine, Untyped(n)) for n in range(3)]
    for _ in ids:
        complete(engine, fetch_one(engine), {"x": 1})
    assert done_notifications(watching) == []

    # The control: a watched job does notify, once, with its id.
    watched = add_job(engine, Untyped(9))
    job = fetch_one(engine)
    waiter = threading.Thread(target=lambda: sa_jobs.wait_for(engine, watched, timeout=10))
    waiter.start()
    wait_until(lambda: _watched(engine, watched), what="the job to be marked watched")
    complete(engine, job, {"x": 2})
    waiter.join(10)
    assert done_notifications(watching) == [str(watched)]


def _watched(engine: Engine, job_id: int) -> bool:
    with engine.connect() as connection:
        return bool(
            connection.scalar(
                text("SELECT output_watched FROM sa_job WHERE id = :i"), {"i": job_id}
            )
        )


def test_wait_for_all_uses_one_listen_connection_for_many_jobs(engine: Engine) -> None:
    ids = [add_job(engine, Untyped(n)) for n in range(30)]
    jobs = [fetch_one(engine) for _ in ids]
    results: list[Any] = []
    waiter = threading.Thread(
        target=lambda: results.append(sa_jobs.wait_for_all(engine, ids, timeout=20))
    )
    waiter.start()
    wait_until(lambda: all(_watched(engine, i) for i in ids), what="all jobs watched")
    with engine.connect() as connection:
        listening = connection.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query = :q"
            ),
            {"q": f"LISTEN {DONE_CHANNEL}"},
        )
    assert listening == 1
    for job in reversed(jobs):
        complete(engine, job, {"n": job.args.n})
    waiter.join(20)
    assert results == [[{"n": n} for n in range(30)]]


def test_wait_for_all_raises_the_first_failure_in_the_order_given(engine: Engine) -> None:
    first, second = add_job(engine, Untyped(1)), add_job(engine, Untyped(2))
    complete(engine, fetch_one(engine), "ok")
    cancel(engine, second)
    with pytest.raises(JobCancelledWaitError) as raised:
        sa_jobs.wait_for_all(engine, [first, second], timeout=5)
    assert raised.value.job_id == second
    assert sa_jobs.wait_for_all(engine, [], timeout=1) == []


# ------------------------------------------------------------------ fallbacks


def test_polling_finds_the_result_behind_pgbouncer(pgbouncer: PgBouncer, engine: Engine) -> None:
    job_id = add_job(engine, Untyped())
    job = fetch_one(engine)
    through = create_engine(pgbouncer.url, poolclass=None)
    try:
        later(0.2, lambda: complete(engine, job, "via bouncer"))
        started = time.monotonic()
        assert sa_jobs.wait_for(through, job_id, timeout=10, poll_interval=0.2) == "via bouncer"
        assert time.monotonic() - started < 3.0
        job_id = add_job(engine, Untyped())
        job = fetch_one(engine)
        later(0.2, lambda: complete(engine, job, "polled"))
        assert (
            sa_jobs.wait_for(through, job_id, timeout=10, poll_interval=0.2, poll_only=True)
            == "polled"
        )
    finally:
        through.dispose()


def test_poll_only_never_listens(engine: Engine) -> None:
    job_id = add_job(engine, Untyped())
    job = fetch_one(engine)
    later(0.3, lambda: complete(engine, job, 3))
    started = time.monotonic()
    assert sa_jobs.wait_for(engine, job_id, timeout=10, poll_interval=1.0, poll_only=True) == 3
    assert time.monotonic() - started >= 0.9  # found by the poll, not a notification


# ------------------------------------------------------------------ async


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_wait_for_is_awaitable_on_async_binds(
    engine: Engine, database_url: URL, driver: str
) -> None:
    job_id = add_job(engine, Sum(1, 1))
    job = fetch_one(engine)
    other = add_job(engine, Untyped())
    other_job = fetch_one(engine)

    async def scenario() -> tuple[Any, Any, float]:
        async_engine = create_async_engine(database_url.set(drivername=f"postgresql+{driver}"))
        try:
            later(0.3, lambda: complete(engine, job, Result(2)))
            started = time.monotonic()
            first = await sa_jobs.wait_for(async_engine, job_id, timeout=10, poll_interval=5.0)
            took = time.monotonic() - started
            later(0.1, lambda: complete(engine, other_job, [1]))
            async with AsyncSession(async_engine) as session:
                both = await sa_jobs.wait_for_all(session, [job_id, other], timeout=10)
            return first, both, took
        finally:
            await async_engine.dispose()

    first, both, took = asyncio.run(scenario())
    assert first == Result(2)
    assert both == [Result(2), [1]]
    assert took < 1.5  # woken by the notification, not the 5 s poll


def test_an_async_timeout_names_the_state(engine: Engine, database_url: URL) -> None:
    job_id = add_job(engine, Untyped())

    async def scenario() -> None:
        async_engine = create_async_engine(database_url.set(drivername="postgresql+psycopg"))
        try:
            await sa_jobs.wait_for(async_engine, job_id, timeout=0.3, poll_interval=0.1)
        finally:
            await async_engine.dispose()

    with pytest.raises(WaitTimeoutError, match="'available'"):
        asyncio.run(scenario())


def test_the_worker_completes_what_a_waiter_waits_for(engine: Engine) -> None:
    worker = sa_jobs.Worker(engine, poll_interval=0.05)
    worker.handler(Sum)(lambda job: Result(job.args.a + job.args.b))
    job_id = add_job(engine, Sum(20, 22))
    worker.start()
    try:
        assert sa_jobs.wait_for(engine, job_id, timeout=10) == Result(42)
    finally:
        worker.stop()
    with Session(engine) as session:
        assert session.get(Job, job_id).state is JobState.COMPLETED  # type: ignore[union-attr]
