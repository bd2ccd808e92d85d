from __future__ import annotations

import pytest
from signup import OUTBOX, SendWelcome, User, sign_up
from sqlalchemy import select
from sqlalchemy.orm import Session

from sa_jobs.testing import RunSummary
from sa_jobs.testing.plugin import JobsTester


def test_signing_up_enqueues_the_welcome_mail(
    sa_jobs_session: Session, sa_jobs_tester: JobsTester
) -> None:
    user = sign_up(sa_jobs_session, "ada@example.com")

    sa_jobs_tester.assert_enqueued(SendWelcome, user_id=user.id, queue="mail")


def test_a_failed_sign_up_enqueues_nothing(
    sa_jobs_session: Session, sa_jobs_tester: JobsTester
) -> None:
    with pytest.raises(ValueError):
        sign_up(sa_jobs_session, "not an address")

    sa_jobs_tester.assert_not_enqueued(SendWelcome)


def test_the_welcome_mail_is_sent_once_and_the_user_marked(
    sa_jobs_session: Session, sa_jobs_tester: JobsTester
) -> None:
    user = sign_up(sa_jobs_session, "ada@example.com")

    assert sa_jobs_tester.run_jobs() == RunSummary(completed=1)

    assert OUTBOX == ["ada@example.com"]
    assert sa_jobs_session.scalar(select(User.welcomed).where(User.id == user.id))
    sa_jobs_tester.assert_enqueued(SendWelcome, state="completed")
    assert sa_jobs_tester.run_jobs() == RunSummary()  # nothing left to do


def test_a_bounced_mail_is_retried_later(
    sa_jobs_session: Session, sa_jobs_tester: JobsTester
) -> None:
    sign_up(sa_jobs_session, "bob@bounce.example")

    summary = sa_jobs_tester.run_jobs()

    assert summary == RunSummary(retryable=1)
    assert "MailBounced: bob@bounce.example bounced" in summary.errors[0]
    job = sa_jobs_tester.assert_enqueued(SendWelcome, state="retryable")
    assert job.attempt == 1
