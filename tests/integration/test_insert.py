"""Inserting jobs inside the caller's transaction, on every path."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from typing import Any

import pytest
from sqlalchemy import URL, Engine, inspect, select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs.errors import InvalidJobArgsError, InvalidOptionsError, UnknownKindError
from tests.helpers import count_jobs, insert_listener, notified_queues


@sa_jobs.job_args(kind="test_send_email", queue="mail", max_attempts=5, priority=2)
class SendEmail:
    to: str
    template: str = "welcome"


@sa_jobs.job_args(kind="test_plain")
class Plain:
    n: int = 0


# ------------------------------------------------------------------ transactional enqueue


def test_committed_enqueue_leaves_exactly_one_job(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        session.add(sa_jobs.enqueue(SendEmail(to="a@example.com")))

    with Session(engine) as session:
        jobs = session.scalars(select(Job)).all()
    assert len(jobs) == 1
    job = jobs[0]
    assert job.args == SendEmail(to="a@example.com")
    assert (job.kind, job.queue, job.priority) == ("test_send_email", "mail", 2)
    assert job.max_attempts == 5
    assert job.state is JobState.AVAILABLE
    assert job.attempt == 0
    assert job.errors == []


def test_rolled_back_enqueue_leaves_no_job(engine: Engine) -> None:
    with Session(engine) as session:
        session.begin()
        job = sa_jobs.enqueue(SendEmail(to="a@example.com"))
        session.add(job)
        session.flush()
        assert job.id is not None
        session.rollback()
        # Like any flushed-then-rolled-back ORM object, it is transient again.
        assert inspect(job).transient

    assert count_jobs(engine) == 0


def test_nothing_is_written_before_flush(engine: Engine) -> None:
    with Session(engine, autoflush=False) as session, session.begin():
        job = sa_jobs.enqueue(SendEmail(to="a@example.com"))
        session.add(job)
        assert job.id is None
        assert count_jobs(engine) == 0
        session.flush()
        assert job.id is not None
        assert inspect(job).persistent


def test_flushed_job_reflects_the_row_the_database_wrote(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        job = sa_jobs.enqueue(SendEmail(to="a@example.com"), tags=["x"], metadata={"k": 1})
        session.add(job)
        session.flush()
        assert job.state is JobState.AVAILABLE
        assert job.created_at is not None and job.scheduled_at is not None
        assert job.tags == ["x"]
        assert job.metadata_ == {"k": 1}
        assert job.unique_skipped_as_duplicate is False
        # The flush left nothing dirty behind: a second flush sends no UPDATE.
        assert job not in session.dirty


def test_one_flush_inserts_all_pending_jobs_in_one_statement_in_program_order(
    engine: Engine, statements: list[str]
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        jobs = [sa_jobs.enqueue(Plain(n=i)) for i in range(50)]
        session.add_all(reversed(jobs))
        session.add_all(jobs)
        statements.clear()
        session.flush()
        inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT")]
        assert len(inserts) == 1
        ids = [job.id for job in jobs]
    assert ids == sorted(ids)


def test_enqueue_works_next_to_the_applications_own_rows(engine: Engine) -> None:
    sessions = sessionmaker(engine)
    with sessions.begin() as session:
        session.add(sa_jobs.enqueue(Plain(n=1)))
        session.add(sa_jobs.enqueue(Plain(n=2)))
    with sessions() as session:
        assert sorted(job.args.n for job in session.scalars(select(Job))) == [1, 2]


def test_hand_built_job_is_validated_and_defaulted(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        job = Job(kind="handled_elsewhere", args_json={"x": 1})
        session.add(job)
        session.flush()
        assert (job.queue, job.priority, job.max_attempts) == ("default", 1, 25)
    with Session(engine) as session:
        bad = Job(kind="handled_elsewhere", args_json={}, priority=9)
        session.add(bad)
        with pytest.raises(InvalidOptionsError, match="priority"):
            session.flush()


# ------------------------------------------------------------------ insert, insert_many, insert_job


def test_insert_returns_the_job_in_the_callers_transaction(engine: Engine) -> None:
    with Session(engine) as session:
        session.begin()
        result = sa_jobs.insert(session, SendEmail(to="b@example.com"), queue="other")
        assert result.unique_skipped_as_duplicate is False
        assert result.job.queue == "other"
        assert result.job in session
        assert session.get(Job, result.job.id) is result.job
        session.rollback()
    assert count_jobs(engine) == 0


def test_insert_many_of_ten_thousand_is_one_statement(
    engine: Engine, statements: list[str]
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        statements.clear()
        results = sa_jobs.insert_many(session, [Plain(n=i) for i in range(10_000)])
        inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT")]
        assert len(inserts) == 1
        assert [r.job.args.n for r in results] == list(range(10_000))
        ids = [r.job.id for r in results]
    assert ids == sorted(ids)
    assert count_jobs(engine) == 10_000


def test_insert_many_batches_by_batch_size(engine: Engine, statements: list[str]) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        statements.clear()
        sa_jobs.insert_many(session, [Plain(n=i) for i in range(25)], batch_size=10)
        inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT")]
        assert len(inserts) == 3


def test_insert_many_takes_per_item_options(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(
            session,
            [
                sa_jobs.InsertManyParams(Plain(n=1), sa_jobs.InsertOpts(queue="a")),
                Plain(n=2),
            ],
            queue="b",
        )
    assert [r.job.queue for r in results] == ["a", "b"]


def test_jobs_of_a_plain_insert_hold_every_column_without_reading_the_json_back(
    engine: Engine, statements: list[str]
) -> None:
    # A plain insert leaves args/metadata/errors out of RETURNING (decoding them was a
    # quarter of insert_many's CPU) and fills them in from what it sent: the objects must
    # still equal the rows, with nothing left to load after the session is gone.
    shared = {"trace": "abc", "nested": {"k": [1, 2.5, None]}}
    with Session(engine, expire_on_commit=False) as session, session.begin():
        many = sa_jobs.insert_many(session, [Plain(n=i) for i in range(3)], metadata=shared)
        one = sa_jobs.insert(session, SendEmail(to="x@example.com"))
        added = sa_jobs.enqueue(Plain(n=9), metadata={"m": 1})
        session.add(added)
        session.flush()
        returning = [s.split("RETURNING", 1)[1] for s in statements if "RETURNING" in s]
        assert returning and all("sa_job.args" not in r for r in returning)
    jobs = [r.job for r in many] + [one.job, added]
    with Session(engine) as session:
        stored = {job.id: job for job in session.scalars(select(Job))}
        for job in jobs:  # detached: an unloaded attribute would raise here
            row = stored[job.id]
            assert (job.args_json, job.metadata_, job.errors) == (
                row.args_json,
                row.metadata_,
                row.errors,
            )
    assert [job.metadata_ for job in jobs[:3]] == [shared] * 3
    # One resolved options value serves the whole batch; each row has its own metadata.
    assert len({id(job.metadata_) for job in jobs[:3]}) == 3


@sa_jobs.job_args(kind="test_unique_by_account", unique=sa_jobs.UniqueOpts(by_args=True))
class ByAccount:
    account_id: int = sa_jobs.field(unique=True)
    note: str = ""


def test_a_unique_insert_that_meets_a_job_returns_that_job_as_stored(
    engine: Engine, statements: list[str]
) -> None:
    # Unique statements do not return args/metadata/errors for the rows they wrote (they
    # are filled from what was sent); for a job they met they return them as extra
    # columns, in the same statement — it must be the stored job (other args, other
    # metadata), not what this call sent, and a duplicate costs no second round trip.
    with Session(engine, expire_on_commit=False) as session, session.begin():
        sa_jobs.insert(session, ByAccount(account_id=1, note="first"), metadata={"n": 1})
    with Session(engine, expire_on_commit=False) as session, session.begin():
        statements.clear()
        many = sa_jobs.insert_many(
            session,
            [ByAccount(account_id=1, note="second"), ByAccount(account_id=2, note="new")],
            metadata={"n": 2},
        )
        added = sa_jobs.enqueue(ByAccount(account_id=1, note="third"), metadata={"n": 3})
        session.add(added)
        session.flush()
        sent = [s.lstrip().split(None, 1)[0].upper() for s in statements]
    met, fresh = many[0], many[1]
    assert met.unique_skipped_as_duplicate and not fresh.unique_skipped_as_duplicate
    assert added.unique_skipped_as_duplicate
    for job in (met.job, added):  # detached now: nothing left to load
        assert (job.args, job.metadata_, job.errors) == (
            ByAccount(account_id=1, note="first"),
            {"n": 1},
            [],
        )
    assert (fresh.job.args, fresh.job.metadata_) == (ByAccount(account_id=2, note="new"), {"n": 2})
    assert "SELECT" not in sent  # the met jobs came back with the inserts themselves


def test_insert_job_is_a_core_insert_to_execute_or_compose(engine: Engine) -> None:
    statement = sa_jobs.insert_job(SendEmail(to="c@example.com"), priority=4)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        row = session.execute(statement).one()
    assert row.kind == "test_send_email"
    assert row.priority == 4
    assert row.unique_skipped_as_duplicate is False
    with engine.begin() as connection:
        assert connection.execute(sa_jobs.insert_job(Plain())).one().queue == "default"
    assert count_jobs(engine) == 2


def test_call_site_options_beat_kind_defaults(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        job = sa_jobs.insert(
            session, SendEmail(to="x"), queue="q", priority=3, max_attempts=1, tags=["t"]
        ).job
    assert (job.queue, job.priority, job.max_attempts, job.tags) == ("q", 3, 1, ["t"])


# ------------------------------------------------------------------ scheduling


def test_future_scheduled_at_makes_a_scheduled_job(engine: Engine) -> None:
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        job = sa_jobs.insert(session, Plain(), scheduled_at=later).job
        queued = sa_jobs.enqueue(Plain(), scheduled_at=later)
        session.add(queued)
        session.flush()
    assert job.state is JobState.SCHEDULED
    assert queued.state is JobState.SCHEDULED
    assert job.scheduled_at == later


def test_past_scheduled_at_makes_an_available_job(engine: Engine) -> None:
    earlier = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        job = sa_jobs.insert(session, Plain(), scheduled_at=earlier).job
    assert job.state is JobState.AVAILABLE
    assert job.scheduled_at == earlier


def test_state_follows_the_database_clock_not_the_callers_zone(engine: Engine) -> None:
    # The same instant written in another zone is still in the future.
    tokyo = dt.timezone(dt.timedelta(hours=9))
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)).astimezone(tokyo)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        assert sa_jobs.insert(session, Plain(), scheduled_at=later).job.state is JobState.SCHEDULED


# ------------------------------------------------------------------ AsyncSession


def test_async_session_enqueue_and_insert(database_url: URL, engine: Engine) -> None:
    async def scenario() -> None:
        async_engine = create_async_engine(database_url)
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                job = sa_jobs.enqueue(Plain(n=1))
                session.add(job)
                await session.flush()
                assert job.id is not None
                result = await session.run_sync(sa_jobs.insert, Plain(n=2), queue="async")
                assert result.job.queue == "async"
                row = (await session.execute(sa_jobs.insert_job(Plain(n=3)))).one()
                assert row.kind == "test_plain"
            async with AsyncSession(async_engine) as session:
                await session.begin()
                session.add(sa_jobs.enqueue(Plain(n=4)))
                await session.flush()
                await session.rollback()
        finally:
            await async_engine.dispose()

    asyncio.run(scenario())
    with Session(engine) as session:
        assert sorted(j.args.n for j in session.scalars(select(Job))) == [1, 2, 3]


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("options", "option_name"),
    [
        ({"priority": 0}, "priority"),
        ({"priority": 5}, "priority"),
        ({"priority": True}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"queue": ""}, "queue"),
        ({"queue": "q" * 129}, "queue"),
        ({"tags": ["t" * 256]}, "tags"),
        ({"tags": "not-a-list"}, "tags"),
        ({"scheduled_at": dt.datetime(2030, 1, 1)}, "scheduled_at"),
        ({"metadata": {"x": float("nan")}}, "metadata"),
    ],
)
def test_bad_options_fail_before_anything_is_written(
    engine: Engine, statements: list[str], options: dict[str, Any], option_name: str
) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        sa_jobs.insert(session, Plain(n=0))
        statements.clear()
        with pytest.raises(InvalidOptionsError, match=option_name) as raised:
            sa_jobs.insert_many(session, [Plain(n=1), Plain(n=2)], **options)
        assert raised.value.option == option_name
        with pytest.raises(InvalidOptionsError, match=option_name):
            sa_jobs.enqueue(Plain(), **options)
        with pytest.raises(InvalidOptionsError, match=option_name):
            sa_jobs.insert_job(Plain(), **options)
        assert statements == []
    # The transaction is still usable and kept only the good job.
    assert count_jobs(engine) == 1


def test_args_that_do_not_convert_fail_before_the_batch_is_sent(
    engine: Engine, statements: list[str]
) -> None:
    @sa_jobs.job_args(kind="test_with_datetime")
    class WithDatetime:
        at: dt.datetime

    with Session(engine, expire_on_commit=False) as session, session.begin():
        statements.clear()
        good = WithDatetime(at=dt.datetime.now(dt.UTC))
        bad = WithDatetime(at=dt.datetime(2030, 1, 1))
        with pytest.raises(InvalidJobArgsError, match="naive datetime"):
            sa_jobs.insert_many(session, [good, bad])
        assert statements == []
    assert count_jobs(engine) == 0


def test_unregistered_class_is_refused() -> None:
    class NotAJob:
        pass

    with pytest.raises(InvalidJobArgsError, match="job_args"):
        sa_jobs.enqueue(NotAJob())


def test_unknown_kind_on_read_names_the_kind(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        session.add(Job(kind="nobody_registered_this", args_json={}))
    with Session(engine) as session:
        job = session.scalars(select(Job)).one()
        with pytest.raises(UnknownKindError, match="nobody_registered_this"):
            _ = job.args


# ------------------------------------------------------------------ notifications


def test_commit_notifies_each_queue_once(engine: Engine, database_url: URL) -> None:
    with insert_listener(database_url) as listener:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            for _ in range(3):
                session.add(sa_jobs.enqueue(Plain(), queue="a"))
                session.flush()
            sa_jobs.insert_many(session, [Plain()] * 5, queue="b")
            sa_jobs.insert(session, Plain(), queue="a")
        assert sorted(notified_queues(listener, timeout=0.5)) == ["a", "b"]


def test_rollback_and_scheduled_jobs_do_not_notify(engine: Engine, database_url: URL) -> None:
    with insert_listener(database_url) as listener:
        with Session(engine) as session:
            session.begin()
            sa_jobs.insert(session, Plain(), queue="rolled_back")
            session.rollback()
        with Session(engine, expire_on_commit=False) as session, session.begin():
            later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
            sa_jobs.insert(session, Plain(), queue="later", scheduled_at=later)
        assert notified_queues(listener, timeout=0.5) == []


# ------------------------------------------------------------------ concurrency


def test_concurrent_enqueuers_each_get_their_own_jobs(engine: Engine) -> None:
    threads, per_thread = 16, 50
    barrier = threading.Barrier(threads)
    failures: list[BaseException] = []

    def enqueue_many(worker: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                with Session(engine, expire_on_commit=False) as session, session.begin():
                    session.add(sa_jobs.enqueue(Plain(n=worker * 1000 + i)))
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    pool = [threading.Thread(target=enqueue_many, args=(w,)) for w in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert failures == []
    with Session(engine) as session:
        values = sorted(job.args.n for job in session.scalars(select(Job)))
    assert values == sorted(w * 1000 + i for w in range(threads) for i in range(per_thread))
