"""One job's outcome can never hold up another's.

Each of these used to freeze a worker process: the batch completer retried a statement
PostgreSQL refused forever, every later job of the process stayed ``running``, and
``stop()`` never returned.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Engine, create_engine, text

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs._base.durations import MAX_DELAY
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._table.schema import NO_FEATURES
from sa_jobs.devdb import Server
from sa_jobs.errors import JobCancel, JobSnooze
from sa_jobs.worker.completer import OutcomeWriter
from sa_jobs.worker.maintenance.rescuer import Rescuer
from tests.helpers import (
    AN_HOUR,
    add_job,
    add_jobs,
    db_now,
    engine_at,
    get_job,
    make_worker,
    migrated_database,
    run_once,
    running,
    wait_for_state,
    wait_until,
)


@sa_jobs.job_args(kind="never_stall_poison")
class Poison:
    name: str


@sa_jobs.job_args(kind="never_stall_ok")
class Ok:
    n: int = 0


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise TypeError("no text")


POISONS: dict[str, Callable[[], BaseException]] = {
    "nul": lambda: ValueError("bad \x00 byte"),
    "surrogate": lambda: ValueError("bad \ud800 surrogate"),
    "str-raises": lambda: BrokenStr(),
    "megabyte": lambda: ValueError("x" * 1_000_000),
    "cancel-with-nul": lambda: JobCancel("stop \x00 now"),
    "snooze-forever": lambda: JobSnooze(float("inf")),
    "snooze-1e13": lambda: JobSnooze(1e13),
}


class ForeverPolicy:
    def next_delay(self, job: Job) -> dt.timedelta:
        return dt.timedelta.max


def poison_worker(engine: Engine, **options: Any) -> sa_jobs.Worker:
    worker = make_worker(engine, queues={"default": 4}, retry_policy=AN_HOUR, **options)

    @worker.handler(Poison)
    def poison(job: Job) -> None:
        raise POISONS[job.args.name]()

    @worker.handler(Ok)
    def ok(job: Job) -> None:
        pass

    return worker


def stop_within(worker: sa_jobs.Worker, seconds: float, **options: Any) -> float:
    """Stop ``worker`` from another thread; fail if it takes longer than ``seconds``."""
    began = time.monotonic()
    stopper = threading.Thread(target=lambda: worker.stop(**options), daemon=True)
    stopper.start()
    stopper.join(seconds)
    assert not stopper.is_alive(), f"worker.stop() still running after {seconds} s"
    return time.monotonic() - began


@pytest.mark.parametrize("poison", list(POISONS))
def test_an_outcome_postgresql_would_refuse_holds_up_no_other_job(
    engine: Engine, poison: str
) -> None:
    worker = poison_worker(engine)
    poisoned = add_job(engine, Poison(poison))
    others = add_jobs(engine, [Ok(n) for n in range(6)])
    worker.start()
    try:
        for job_id in others:
            wait_for_state(engine, job_id, JobState.COMPLETED)
        wait_until(lambda: get_job(engine, poisoned).state is not JobState.RUNNING)
    finally:
        stop_within(worker, 10)
    job = get_job(engine, poisoned)
    if poison == "cancel-with-nul":
        assert job.state is JobState.CANCELLED
        assert job.errors[-1]["error"] == "JobCancel: stop \ufffd now"
    elif poison == "snooze-1e13":
        assert job.state is JobState.SCHEDULED
        ahead = job.scheduled_at - db_now(engine)
        assert MAX_DELAY - dt.timedelta(minutes=1) < ahead <= MAX_DELAY
    else:
        assert job.state is JobState.RETRYABLE
        error = job.errors[-1]["error"]
        expected = {
            "nul": "ValueError: bad \ufffd byte",
            "surrogate": "ValueError: bad \ufffd surrogate",
            "str-raises": "BrokenStr: <str() raised TypeError>",
            "snooze-forever": "InvalidOptionsError: snooze delay: must be a finite duration",
        }.get(poison)
        if poison == "megabyte":
            assert error.startswith("ValueError: xxx") and "more characters]" in error
            assert len(error) < 3000
        else:
            assert expected is not None and error.startswith(expected)


def test_a_retry_policy_answering_timedelta_max_is_clamped(engine: Engine) -> None:
    worker = make_worker(engine)

    @worker.handler(Poison, retry_policy=ForeverPolicy())
    def fail(job: Job) -> None:
        raise RuntimeError("fails")

    job_id = add_job(engine, Poison("any"))
    with running(worker):
        job = wait_for_state(engine, job_id, JobState.RETRYABLE)
    ahead = job.scheduled_at - db_now(engine)
    assert MAX_DELAY - dt.timedelta(minutes=1) < ahead <= MAX_DELAY


# ------------------------------------------------------------------ the completer's rules

POISON_TRIGGER = """
CREATE FUNCTION never_stall_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'completed' AND NEW.args->>'name' = 'refused' THEN
        RAISE EXCEPTION 'this completion is refused';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER never_stall_refuse BEFORE UPDATE ON sa_job
FOR EACH ROW EXECUTE FUNCTION never_stall_refuse();
"""


@pytest.fixture
def refusing_trigger(engine: Engine) -> Iterator[None]:
    """A trigger that refuses to let the job with args ``{"name": "refused"}`` complete."""
    with engine.begin() as connection:
        connection.execute(text(POISON_TRIGGER))
    try:
        yield
    finally:
        with engine.begin() as connection:
            connection.execute(text("DROP TRIGGER never_stall_refuse ON sa_job"))
            connection.execute(text("DROP FUNCTION never_stall_refuse()"))


def test_an_outcome_the_database_refuses_fails_that_job_alone_with_the_reason(
    engine: Engine, refusing_trigger: None
) -> None:
    worker = make_worker(engine, queues={"default": 8}, retry_policy=AN_HOUR)

    @worker.handler(Poison)
    def succeed(job: Job) -> None:
        pass

    ids = add_jobs(
        engine, [Poison("fine-1"), Poison("refused"), Poison("fine-2"), Poison("fine-3")]
    )
    with running(worker):
        refused = wait_for_state(engine, ids[1], JobState.RETRYABLE)
        for job_id in ids[:1] + ids[2:]:
            wait_for_state(engine, job_id, JobState.COMPLETED)
    (error,) = refused.errors
    assert error["attempt"] == 1
    assert error["error"].startswith(
        "OutcomeNotStored: the worker could not store this attempt's outcome (completed)"
    )
    assert "this completion is refused" in error["error"]
    # Failed like any attempt: due again per its retry policy (an hour).
    assert refused.scheduled_at - db_now(engine) > dt.timedelta(minutes=59)


def test_transient_errors_are_retried_for_a_bounded_time_then_left_to_the_rescuer() -> None:
    # A server that is not there: every attempt is a (transient) connection failure.
    with engine_at("postgresql+psycopg://nobody@127.0.0.1:1/nowhere") as gone:
        writer = OutcomeWriter(gone, features=NO_FEATURES, give_up_after=0.5, backoff=(0.05, 0.1))
        outcomes = [Outcome(job_id, 1, Ending.COMPLETED) for job_id in (1, 2, 3)]
        began = time.monotonic()
        writer.write(outcomes)
        assert time.monotonic() - began < 3
        assert writer.given_up == 3


# ------------------------------------------------------------------ stop() is bounded


@pytest.fixture
def own_database(pg_server: Server) -> Iterator[URL]:
    with migrated_database(pg_server, "sa_jobs_never_stall") as url:
        yield url


def set_connections(admin: Engine, database: str, allowed: bool) -> None:
    with admin.connect() as connection:
        connection.execute(
            text(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS {str(allowed).lower()}')
        )
        if not allowed:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": database},
            )


def test_stop_returns_within_its_bound_when_the_database_is_gone(
    own_database: URL, pg_server: Server
) -> None:
    engine = create_engine(own_database)
    admin = create_engine(pg_server.url, isolation_level="AUTOCOMMIT")
    release = threading.Event()
    worker = make_worker(engine, queues={"default": 2})

    @worker.handler(Ok)
    def wait_for_the_outage(job: Job) -> None:
        release.wait(30)

    job_id = add_job(engine, Ok())
    worker.start()
    try:
        wait_until(lambda: get_job(engine, job_id).state is JobState.RUNNING)
        set_connections(admin, own_database.database or "", allowed=False)
        release.set()  # the handler returns; its completion cannot be written now
        took = stop_within(worker, 25, flush_timeout=1.0)
    finally:
        release.set()
        set_connections(admin, own_database.database or "", allowed=True)
    assert took < 25
    engine.dispose()
    admin.dispose()
    with engine_at(own_database) as engine:
        # The completion was given up on: the job stays running, held by nobody, and
        # the rescuer retries it.
        assert get_job(engine, job_id).state is JobState.RUNNING
        time.sleep(0.1)  # the worker's last heartbeat gets older than the rescuer's 0.05 s
        assert run_once(engine, Rescuer(0.05)) == 1
        assert get_job(engine, job_id).state is JobState.RETRYABLE
