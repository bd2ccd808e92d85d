"""``sa-jobs demo``: a short tour against a throwaway database.

It finds a server the way the tests do (``$SA_JOBS_DATABASE_URL``, the local server, or
an embedded one), creates a database with a random name, installs the schema, shows the
insert paths, works the jobs with a :class:`sa_jobs.Worker` (a sync handler, an async
one, one that writes in the job's own transaction, and one that fails once), prints
where every job ended up, and drops the database again.

Everything it prints after the first line is the same on every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Column, Engine, MetaData, Table, Text, create_engine, func, insert, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.devdb import Server, find_server, throwaway_database

Say = Callable[[str], None]

# The application's own table, written by a handler in the job's transaction.
app_metadata = MetaData()
signups = Table("demo_signup", app_metadata, Column("email", Text, primary_key=True))


@sa_jobs.job_args(kind="demo_send_email", queue="mail", max_attempts=5)
class SendEmail:
    to: str
    template: str = "welcome"


@sa_jobs.job_args(kind="demo_resize_image")
class ResizeImage:
    image: str
    width: int = 128


@sa_jobs.job_args(kind="demo_record_signup")
class RecordSignup:
    email: str


@sa_jobs.job_args(kind="demo_flaky_report", max_attempts=3)
class FlakyReport:
    name: str


class RetryAtOnce:
    """A retry policy with no delay, so ``run_until_idle`` also works the retry."""

    def next_delay(self, job: sa_jobs.Job[Any]) -> dt.timedelta:
        return dt.timedelta(0)


def run(say: Say = print, server: Server | None = None) -> None:
    """Run the tour, reporting through ``say``.

    Args:
        say: Receives each line of output.
        server: The server to make the throwaway database on; default
            :func:`~sa_jobs.devdb.find_server` (started and stopped here if embedded).
    """
    own_server = server is None
    if server is None:
        server = find_server()
    say(f"using {server.source}")
    try:
        with throwaway_database(server, prefix="sa_jobs_demo") as url:
            engine = create_engine(url)
            try:
                _tour(engine, say)
            finally:
                engine.dispose()
    finally:
        if own_server:
            server.stop()


def _tour(engine: Engine, say: Say) -> None:
    sa_jobs.migrate(engine)
    app_metadata.create_all(engine)
    say("schema installed (sa_jobs.migrate)")
    _enqueue(engine, say)
    _work(engine, say)
    _final_states(engine, say)


def _enqueue(engine: Engine, say: Say) -> None:
    with Session(engine) as session:
        session.begin()
        session.add(sa_jobs.enqueue(SendEmail(to="rolled-back@example.com")))
        session.flush()
        session.rollback()
    say(f"a rolled-back enqueue leaves {_count(engine)} jobs")

    with Session(engine) as session, session.begin():
        session.add(sa_jobs.enqueue(SendEmail(to="ada@example.com")))
        sa_jobs.insert(session, SendEmail(to="grace@example.com", template="reminder"))
        later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        sa_jobs.insert(session, SendEmail(to="later@example.com"), scheduled_at=later)
        sa_jobs.insert_many(session, [SendEmail(to=f"user{i}@example.com") for i in range(3)])
        sa_jobs.insert(session, ResizeImage(image="cat.png"))
        sa_jobs.insert(session, RecordSignup(email="ada@example.com"))
        sa_jobs.insert(session, FlakyReport(name="monthly"))
    say(f"a committed transaction left {_count(engine)} jobs:")

    with Session(engine) as session:
        for job in session.scalars(select(sa_jobs.Job).order_by(sa_jobs.Job.id)):
            say(f"  #{job.id:<3} {job.kind:<18} {job.state.value:<9} {_describe(job.args)}")


def _work(engine: Engine, say: Say) -> None:
    worker = sa_jobs.Worker(engine, queues={"default": 2, "mail": 2}, poll_interval=0.1)
    sent: list[str] = []
    resized: list[str] = []

    @worker.handler(SendEmail)
    def send_email(job: sa_jobs.Job[SendEmail]) -> None:  # a sync handler runs in a thread
        sent.append(f"{job.args.to} ({job.args.template})")

    @worker.handler(ResizeImage)
    async def resize_image(job: sa_jobs.Job[ResizeImage]) -> None:  # an async one on the event loop
        await asyncio.sleep(0)
        resized.append(f"{job.args.image} to {job.args.width} px")

    @worker.handler(RecordSignup)
    def record_signup(job: sa_jobs.Job[RecordSignup], session: Session) -> None:
        # Declaring `session` makes the worker complete the job in this transaction:
        # the row below and the completion commit together, or neither does.
        session.execute(insert(signups).values(email=job.args.email))

    @worker.handler(FlakyReport, retry_policy=RetryAtOnce())
    def flaky_report(job: sa_jobs.Job[FlakyReport]) -> None:
        if job.attempt == 1:
            raise RuntimeError(f"report {job.args.name!r} is not ready yet")

    with _quiet_worker_log():
        worker.run_until_idle(timeout=30)

    say("a worker worked everything due (Worker.run_until_idle):")
    say(f"  the sync handler sent {len(sent)} emails:")
    for email in sorted(sent):
        say(f"    {email}")
    say(f"  the async handler resized {', '.join(sorted(resized))}")
    with Session(engine) as session:
        rows = session.scalars(select(signups.c.email).order_by(signups.c.email)).all()
    say(f"  the session handler wrote demo_signup {rows} in the transaction that completed its job")
    say("  the flaky report failed its first attempt and was retried at once")


def _final_states(engine: Engine, say: Say) -> None:
    say("final state of every job:")
    with Session(engine) as session:
        for job in session.scalars(select(sa_jobs.Job).order_by(sa_jobs.Job.id)):
            line = (
                f"  #{job.id:<3} {job.kind:<18} {job.state.value:<9} "
                f"attempt {job.attempt}/{job.max_attempts}"
            )
            if job.errors:
                last = job.errors[-1]
                line += f"  (attempt {last['attempt']} failed: {last['error']})"
            say(line)
    say("the scheduled email stays scheduled: run_until_idle works only what is due now")


def _describe(args: object) -> str:
    if isinstance(args, SendEmail):
        return f"to={args.to}"
    if isinstance(args, ResizeImage):
        return f"image={args.image}"
    if isinstance(args, RecordSignup):
        return f"email={args.email}"
    if isinstance(args, FlakyReport):
        return f"name={args.name}"
    return repr(args)


def _count(engine: Engine) -> int:
    with Session(engine) as session:
        return session.scalar(select(func.count()).select_from(sa_jobs.Job)) or 0


@contextlib.contextmanager
def _quiet_worker_log() -> Iterator[None]:
    """Keep the expected failure's warning off stderr when logging is not configured.

    Without any handler Python prints warnings through its last-resort handler, which
    would interleave the flaky job's (expected) failure with the tour.
    """
    if logging.getLogger().handlers:
        yield
        return
    logger = logging.getLogger("sa_jobs")
    handler = logging.NullHandler()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
