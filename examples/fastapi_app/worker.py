"""The worker: sends welcome emails and marks signups welcomed, on the app's engine.

sa-jobs work examples.fastapi_app.worker:worker     # DATABASE_URL=postgresql+asyncpg://...
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

import sa_jobs
from examples.fastapi_app.models import SendWelcomeEmail, database_url, engine_from_env

#: What the "mailer" sent, newest last (a real app would call its email service).
OUTBOX: list[str] = []


def build_worker(engine: AsyncEngine) -> sa_jobs.Worker:
    worker = sa_jobs.Worker(engine, queues={"mail": 10})

    @worker.handler(SendWelcomeEmail)
    async def send_welcome_email(job: sa_jobs.Job[SendWelcomeEmail], session: AsyncSession) -> None:
        # The session's transaction also completes the job: `welcomed` and the
        # completion commit together, or the job runs again.
        signup = await job.args.signup.load(session)
        OUTBOX.append(f"Welcome, {signup.email}!")
        signup.welcomed = True

    return worker


worker = build_worker(engine_from_env()) if database_url() else None
