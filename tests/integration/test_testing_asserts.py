"""``sa_jobs.testing.assert_enqueued`` / ``assert_not_enqueued`` / ``enqueued_jobs``: they
see the test's uncommitted jobs, match on decoded args and the job's columns, and fail
with a message that shows what was enqueued."""

from __future__ import annotations

import datetime as dt
import enum
import re
from collections.abc import Iterator
from unittest.mock import ANY

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from sa_jobs.testing import assert_enqueued, assert_not_enqueued, enqueued_jobs
from tests.helpers import add_raw_job


class Plan(enum.Enum):
    FREE = "free"
    PRO = "pro"


@sa_jobs.job_args(kind="test_asserts.invoice")
class Invoice:
    account_id: int
    plan: Plan = Plan.FREE
    due: dt.date | None = None
    queue: str = ""  # an args field named like an option


@sa_jobs.job_args(kind="test_asserts.ping")
class Ping:
    pass


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with engine.connect() as connection:
        transaction = connection.begin()
        with Session(bind=connection, join_transaction_mode="create_savepoint") as session:
            yield session
        transaction.rollback()


def test_sees_a_job_the_test_added_without_flushing_or_committing(session: Session) -> None:
    session.add(sa_jobs.enqueue(Invoice(7, Plan.PRO, dt.date(2030, 1, 31))))

    job = assert_enqueued(session, Invoice, account_id=7, plan=Plan.PRO, due=dt.date(2030, 1, 31))

    assert job.id is not None and job.args == Invoice(7, Plan.PRO, dt.date(2030, 1, 31))
    assert_enqueued(session, "test_asserts.invoice", account_id=7)
    assert_enqueued(session, Invoice(7, Plan.PRO, dt.date(2030, 1, 31)))  # args as a whole
    assert_enqueued(session, queue="default")  # any kind
    assert_enqueued(session, Invoice, account_id=ANY, plan=Plan.PRO)
    assert_not_enqueued(session, Ping)
    assert_not_enqueued(session, Invoice, account_id=8)


def test_filters_on_queue_priority_tags_state_and_clashing_args_names(session: Session) -> None:
    sa_jobs.insert(session, Invoice(1, queue="q-arg"), queue="billing", priority=3, tags=["a", "b"])

    assert_enqueued(session, Invoice, queue="billing", priority=3, tags=["b"])
    assert_enqueued(session, Invoice, args={"queue": "q-arg"})
    assert_not_enqueued(session, Invoice, queue="default")
    assert_not_enqueued(session, Invoice, priority=1)
    assert_not_enqueued(session, Invoice, tags=["c"])
    assert_not_enqueued(session, Invoice, state=JobState.COMPLETED)
    assert_enqueued(session, Invoice, state=["available", JobState.COMPLETED])


def test_count_must_match_exactly(session: Session) -> None:
    sa_jobs.insert_many(session, [Invoice(1), Invoice(1), Invoice(2)])

    assert len(enqueued_jobs(session, Invoice, account_id=1)) == 2
    assert_enqueued(session, Invoice, count=3)
    with pytest.raises(AssertionError, match=r"expected 2 jobs of kind .*found 3"):
        assert_enqueued(session, Invoice, count=2)


def test_a_failure_lists_what_was_enqueued_and_how_each_job_differs(session: Session) -> None:
    ping = sa_jobs.insert(session, Ping()).job
    a = sa_jobs.insert(session, Invoice(1), queue="billing").job
    b = sa_jobs.insert(session, Invoice(2, Plan.PRO)).job

    with pytest.raises(AssertionError) as failure:
        assert_enqueued(session, Invoice, account_id=2, plan=Plan.FREE, queue="billing")

    assert str(failure.value) == (
        "expected a job of kind 'test_asserts.invoice' with account_id=2, "
        "plan=<Plan.FREE: 'free'>, queue='billing' (state available, scheduled, pending or "
        "retryable); found none among the 3 jobs the session sees:\n"
        f"  job {ping.id} test_asserts.ping [available] queue='default' priority=1 args={{}}\n"
        f"  job {a.id} test_asserts.invoice [available] queue='billing' priority=1 "
        "args={'due': None, 'plan': 'free', 'queue': '', 'account_id': 1}\n"
        "    differs in: account_id=1\n"
        f"  job {b.id} test_asserts.invoice [available] queue='default' priority=1 "
        "args={'due': None, 'plan': 'pro', 'queue': '', 'account_id': 2}\n"
        "    differs in: queue='default', plan=<Plan.PRO: 'pro'>"
    )


def test_a_failure_says_when_there_are_no_jobs_and_lists_only_the_latest(
    session: Session,
) -> None:
    with pytest.raises(AssertionError, match=r"found none \(the session sees no job at all\)"):
        assert_enqueued(session, Ping)
    sa_jobs.insert_many(session, [Invoice(n) for n in range(25)])
    with pytest.raises(AssertionError) as failure:
        assert_enqueued(session, Ping)
    message = str(failure.value)
    assert "the last 20 of the jobs the session sees" in message
    assert len(re.findall(r"^  job ", message, re.MULTILINE)) == 20
    assert "'account_id': 24}" in message and "'account_id': 4}" not in message


def test_assert_not_enqueued_lists_the_jobs_that_match(session: Session) -> None:
    job = sa_jobs.insert(session, Invoice(5)).job

    with pytest.raises(AssertionError) as failure:
        assert_not_enqueued(session, Invoice)

    assert str(failure.value) == (
        "expected no job of kind 'test_asserts.invoice' (state available, scheduled, pending "
        f"or retryable); found 1:\n  job {job.id} test_asserts.invoice [available] "
        "queue='default' args={'due': None, 'plan': 'free', 'queue': '', 'account_id': 5}"
    )


def test_a_kind_name_without_a_class_matches_on_the_stored_json(
    engine: Engine, session: Session
) -> None:
    add_raw_job(engine, "test_asserts.unregistered", {"user": "ada", "n": 1})

    assert_enqueued(session, "test_asserts.unregistered", user="ada")
    with pytest.raises(AssertionError, match=r"differs in: user='ada'"):
        assert_enqueued(session, "test_asserts.unregistered", user="bob")


def test_mistakes_in_the_question_are_errors_that_say_what_to_do(session: Session) -> None:
    with pytest.raises(TypeError, match=r"Invoice has no field 'acount_id'; its fields are "):
        assert_enqueued(session, Invoice, acount_id=1)
    with pytest.raises(TypeError, match=r"state must be a JobState.*got 'done'"):
        assert_enqueued(session, Invoice, state="done")
    with pytest.raises(TypeError, match="matching args needs a kind"):
        assert_enqueued(session, account_id=1)
    with pytest.raises(TypeError, match="use assert_not_enqueued for none"):
        assert_enqueued(session, Invoice, count=0)
    with pytest.raises(sa_jobs.errors.InvalidJobArgsError, match="not a job args class"):
        assert_enqueued(session, int)
