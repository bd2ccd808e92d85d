"""The dashboard's way to the database: one call per page or action, sync or async engine.

Every read and every action is written once, as a function of a sync ``Session`` — the
same way sa_jobs' own session functions are (``sessions.either_session``). For a sync
``Engine`` it runs in Starlette's thread pool, so a slow query never blocks the event
loop; for an ``AsyncEngine`` it runs through ``AsyncSession.run_sync``, SQLAlchemy's
bridge, on the async connection.

Each call is one short transaction with a statement timeout of its own: a dashboard
left open on a wall refreshes forever, and a query of it that ran for minutes would hold
back the xmin horizon that keeps a busy queue table vacuumed (docs/operations.md). Reads
are also ``READ ONLY``, so a page can never write by mistake. Objects outlive their
session (``expire_on_commit=False``): templates read them after the transaction ended.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Engine, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from sa_jobs.errors import InvalidOptionsError
from sa_jobs.schema import translate_missing_schema

__all__ = ["STATEMENT_TIMEOUT_MS", "Database"]

T = TypeVar("T")

#: How long one statement of the dashboard may run before PostgreSQL cancels it.
STATEMENT_TIMEOUT_MS = 10_000


class Database:
    """Runs one function of a ``Session`` per call, in a transaction of its own."""

    def __init__(self, engine: Engine | AsyncEngine) -> None:
        if not isinstance(engine, Engine | AsyncEngine):
            raise InvalidOptionsError(
                "engine",
                f"create_app() takes a SQLAlchemy Engine or AsyncEngine, not "
                f"{type(engine).__name__}; build one with sqlalchemy.create_engine(url)",
            )
        self.engine = engine

    async def read(self, work: Callable[[Session], T]) -> T:
        """``work(session)`` in a read-only transaction, rolled back at the end."""
        return await self._run(functools.partial(_in_transaction, work, read_only=True))

    async def write(self, work: Callable[[Session], T]) -> T:
        """``work(session)`` in a transaction committed when it returns."""
        return await self._run(functools.partial(_in_transaction, work, read_only=False))

    async def _run(self, work: Callable[[Session], T]) -> T:
        if isinstance(self.engine, AsyncEngine):
            async with AsyncSession(self.engine, expire_on_commit=False) as session:
                return await session.run_sync(work)
        engine = self.engine
        return await run_in_threadpool(_with_session, engine, work)


def _with_session(engine: Engine, work: Callable[[Session], T]) -> T:
    with Session(engine, expire_on_commit=False) as session:
        return work(session)


def _in_transaction(work: Callable[[Session], T], session: Session, *, read_only: bool) -> T:
    with translate_missing_schema(), session.begin():
        if read_only:
            session.execute(text("SET TRANSACTION READ ONLY"))
        # Local to this transaction: the application's own sessions keep their settings.
        session.execute(
            select(func.set_config("statement_timeout", str(STATEMENT_TIMEOUT_MS), True))
        )
        return work(session)
