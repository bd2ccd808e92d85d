"""The app's table, its job args, and its engine."""

from __future__ import annotations

import os

from sqlalchemy import String, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import sa_jobs


class Base(DeclarativeBase):
    pass


class Signup(Base):
    __tablename__ = "signups"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200), unique=True)
    welcomed: Mapped[bool] = mapped_column(default=False)


@sa_jobs.job_args(kind="fastapi_send_welcome_email", queue="mail", max_attempts=5)
class SendWelcomeEmail:
    # A typed reference to the row: stored as {"table": "signups", "pk": [id]}, loaded
    # by the handler as a Signup; a signup deleted before the job runs cancels the job.
    signup: sa_jobs.Ref[Signup]


def database_url() -> str | None:
    """``$SA_JOBS_DATABASE_URL`` (what ``sa-jobs work --url`` sets) or ``$DATABASE_URL``."""
    return os.environ.get("SA_JOBS_DATABASE_URL") or os.environ.get("DATABASE_URL")


def engine_from_env() -> AsyncEngine:
    """The database URL as an asyncpg engine (``postgresql://`` works too)."""
    url = make_url(database_url() or "postgresql://localhost/myapp")
    return create_async_engine(url.set(drivername="postgresql+asyncpg"))
