"""Mistakes ``mypy --strict`` must catch (``tests/unit/test_typing.py`` expects an error
on each line marked with an ``E:`` comment, and nowhere else)."""

from __future__ import annotations

from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import sa_jobs


@sa_jobs.job_args(kind="typing_mistake_email")
class SendEmail:
    to: str


@sa_jobs.job_args(kind="typing_mistake_report")
class Report:
    name: str


worker = sa_jobs.Worker(create_engine("postgresql+psycopg://localhost/app"))


@worker.handler(SendEmail)  # E: a Report handler for SendEmail jobs
def wrong_kind(job: sa_jobs.Job[Report]) -> None:
    pass


def mistakes(session: Session, async_session: AsyncSession) -> None:
    sa_jobs.insert(session, SendEmail("a"), priority="high")  # E: priority is an int
    sa_jobs.insert(session, SendEmail("a"), priorty=1)  # E: a typo in an option
    sa_jobs.enqueue(SendEmail("a"), queue=3)  # E: queue is a str
    result = sa_jobs.insert(session, SendEmail("a"))
    result.job.args.to.append("x")  # E: args.to is a str
    not_awaited = sa_jobs.insert(async_session, SendEmail("a"))
    print(not_awaited.job)  # E: an AsyncSession gives an awaitable
