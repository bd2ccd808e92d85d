"""A small application whose tests use sa_jobs' pytest plugin (see docs/testing.md).

Signing up writes a user and enqueues the welcome mail in one transaction; the
handler sends the mail and marks the user welcomed in the transaction that completes
its job.
"""

from __future__ import annotations

import os

from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sa_jobs


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "signup_user"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)
    welcomed: Mapped[bool] = mapped_column(default=False)


@sa_jobs.job_args(kind="signup_send_welcome", queue="mail", max_attempts=3)
class SendWelcome:
    user_id: int
    email: str


#: Stands in for a mail service: what was sent.
OUTBOX: list[str] = []


class MailBounced(Exception):
    pass


def sign_up(session: Session, email: str) -> User:
    """The code under test: a user, and their welcome mail, in the caller's transaction."""
    if "@" not in email:
        raise ValueError(f"not an email address: {email!r}")
    user = User(email=email)
    session.add(user)
    session.flush()
    session.add(sa_jobs.enqueue(SendWelcome(user_id=user.id, email=email)))
    return user


# Creating an engine does not connect: tests never touch this database.
engine = create_engine(os.environ.get("APP_DATABASE_URL", "postgresql+psycopg:///signup"))
worker = sa_jobs.Worker(engine, queues={"mail": 5})


@worker.handler(SendWelcome)
def send_welcome(job: sa_jobs.Job, session: Session) -> None:
    user = session.get(User, job.args.user_id)
    if user is None:
        raise sa_jobs.errors.JobCancel("the user is gone")
    if user.email.endswith("@bounce.example"):
        raise MailBounced(f"{user.email} bounced")
    OUTBOX.append(user.email)
    user.welcomed = True
