"""``sa-jobs demo``: a short tour against a throwaway database.

It finds a server the way the tests do (``$SA_JOBS_DATABASE_URL``, the local server, or
an embedded one), creates a database with a random name, installs the schema, shows the
insert paths, and drops the database again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.devdb import find_server, throwaway_database


@sa_jobs.job_args(kind="demo_send_email", queue="mail", max_attempts=5)
class SendEmail:
    to: str
    template: str = "welcome"


def run(say: Callable[[str], None] = print) -> None:
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
        server.stop()


def _tour(engine: Engine, say: Callable[[str], None]) -> None:
    sa_jobs.migrate(engine)
    say("schema installed (sa_jobs.migrate)")

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
    say(f"a committed transaction left {_count(engine)} jobs:")

    with Session(engine) as session:
        for job in session.scalars(select(sa_jobs.Job).order_by(sa_jobs.Job.id)):
            say(f"  #{job.id} {job.kind} {job.state.value:<9} to={job.args.to}")


def _count(engine: Engine) -> int:
    with Session(engine) as session:
        return session.scalar(select(func.count()).select_from(sa_jobs.Job)) or 0
