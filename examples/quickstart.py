"""Quickstart: enqueue jobs in your own transaction, then work them.

    python examples/quickstart.py

A user signs up and their welcome email is enqueued in the same transaction: both are
committed, or (when the signup fails) neither is. A worker then sends the emails and
marks the users welcomed, completing each job in the transaction of that write.

It makes a throwaway database on whatever server ``sa_jobs.devdb`` finds
(``$SA_JOBS_DATABASE_URL``, a local server, or an embedded one) and drops it at the end.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, String, create_engine, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sa_jobs
from sa_jobs.devdb import find_server, throwaway_database


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)
    welcomed: Mapped[bool] = mapped_column(default=False)


@sa_jobs.job_args(kind="send_welcome_email", queue="mail", max_attempts=5)
class SendWelcomeEmail:
    user_id: int


def sign_up(session: Session, email: str) -> None:
    """The application's signup: a user row and its welcome email, one transaction."""
    user = User(email=email)
    session.add(user)
    session.flush()  # assigns user.id
    session.add(sa_jobs.enqueue(SendWelcomeEmail(user_id=user.id)))


def make_worker(engine: Engine, outbox: list[str]) -> sa_jobs.Worker:
    worker = sa_jobs.Worker(engine, queues={"mail": 5})

    @worker.handler(SendWelcomeEmail)
    def send_welcome_email(job: sa_jobs.Job, session: Session) -> None:
        # Declaring `session` completes the job in this session's transaction, so
        # `welcomed = True` and the job's completion commit together.
        user = session.get_one(User, job.args.user_id)
        outbox.append(f"Welcome, {user.email}!")
        user.welcomed = True

    return worker


def run(engine: Engine) -> None:
    sa_jobs.migrate(engine)  # or `sa-jobs migrate`, or `alembic upgrade heads`
    Base.metadata.create_all(engine)

    with Session(engine) as session, session.begin():
        sign_up(session, "ada@example.com")
        sign_up(session, "grace@example.com")
    print(f"signed up 2 users: {count(engine, User)} users, {count(engine, sa_jobs.Job)} jobs")

    try:
        with Session(engine) as session, session.begin():
            sign_up(session, "alan@example.com")  # user and job flushed...
            sign_up(session, "ada@example.com")  # ...then a taken email fails the transaction
    except IntegrityError:
        print(
            "a failed transaction took its jobs with it: "
            f"{count(engine, User)} users, {count(engine, sa_jobs.Job)} jobs"
        )

    outbox: list[str] = []
    make_worker(engine, outbox).run_until_idle()
    print("the worker sent:")
    for email in sorted(outbox):
        print(f"  {email}")

    with Session(engine) as session:
        for user in session.scalars(select(User).order_by(User.email)):
            print(f"user {user.email}: welcomed={user.welcomed}")
        for job in session.scalars(select(sa_jobs.Job).order_by(sa_jobs.Job.id)):
            print(f"job #{job.id} {job.kind} user_id={job.args.user_id}: {job.state.value}")


def count(engine: Engine, model: type[Any]) -> int:
    with Session(engine) as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


def main() -> None:
    server = find_server()
    print(f"using {server.source}")
    try:
        with throwaway_database(server, prefix="sa_jobs_example") as url:
            engine = create_engine(url)
            try:
                run(engine)
            finally:
                engine.dispose()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
