"""A small user module, checked by ``mypy --strict`` in ``tests/unit/test_typing.py``:
everything here must type-check, and each ``reveal_type`` must show what a user expects."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import reveal_type

from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import sa_jobs


@sa_jobs.job_args(kind="typing_send_email")
class SendEmail:
    to: str
    subject: str = ""


worker = sa_jobs.Worker(create_engine("postgresql+psycopg://localhost/app"))  # connects later


@worker.handler(SendEmail)
def send(job: sa_jobs.Job[SendEmail]) -> None:
    reveal_type(job.args.to)


@worker.handler(SendEmail, timeout=dt.timedelta(seconds=30))
def send_in_session(job: sa_jobs.Job[SendEmail], session: Session) -> None:
    sa_jobs.complete_in(session, job)


@worker.handler(SendEmail)
async def send_async(job: sa_jobs.Job[SendEmail], session: AsyncSession) -> int:
    await session.flush()
    return 1


def unit_test_of_handlers(job: sa_jobs.Job[SendEmail], session: AsyncSession) -> None:
    # Decorated handlers keep their own types, so tests can call them directly.
    send(job)
    reveal_type(asyncio.run(send_async(job, session)))


def sync_app(session: Session) -> None:
    result = sa_jobs.insert(session, SendEmail("a@example.com"), priority=2, queue="mail")
    reveal_type(result)
    reveal_type(result.job.args.to)
    many = sa_jobs.insert_many(session, [SendEmail("b@example.com")], max_attempts=3)
    reveal_type(many)
    job = sa_jobs.enqueue(SendEmail("c@example.com"), tags=["welcome"])
    reveal_type(job)
    session.add(job)
    reveal_type(sa_jobs.cancel_job(session, 1))


async def async_app(session: AsyncSession) -> None:
    result = await sa_jobs.insert(session, SendEmail("a@example.com"), priority=2)
    reveal_type(result)
    pending = reveal_type(sa_jobs.insert(session, SendEmail("a@example.com")))
    await pending
    reveal_type(await sa_jobs.retry_job(session, 1))
    reveal_type(await sa_jobs.remove_job(session, "key"))
