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

With a read engine (``create_app(engine, read_engine=replica)``) the reads run on the
replica behind the replay-lag guard of :mod:`sa_jobs._base.replicas`, and the actions on
the primary; where the page's reads went is kept in :data:`REPLICA_STATUS` for the
page's banner (a context variable: a request is one task, so its reads and its
rendering share it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import TypeVar

from sqlalchemy import Engine, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.util import greenlet_spawn
from starlette.concurrency import run_in_threadpool

from sa_jobs._base.replicas import ReplicaReads, ReplicaStatus
from sa_jobs._table.schema import translate_missing_schema
from sa_jobs.errors import InvalidOptionsError

__all__ = ["REPLICA_STATUS", "STATEMENT_TIMEOUT_MS", "Database"]

T = TypeVar("T")

#: How long one statement of the dashboard may run before PostgreSQL cancels it.
STATEMENT_TIMEOUT_MS = 10_000
#: Where this request's last read went (None: no read engine, or nothing read yet).
REPLICA_STATUS: ContextVar[ReplicaStatus | None] = ContextVar("sa_jobs_replica", default=None)


class Database:
    """Runs one function of a ``Session`` per call, in a transaction of its own."""

    def __init__(self, engine: Engine | AsyncEngine, replica: ReplicaReads | None = None) -> None:
        if not isinstance(engine, Engine | AsyncEngine):
            raise InvalidOptionsError(
                "engine",
                f"create_app() takes a SQLAlchemy Engine or AsyncEngine, not "
                f"{type(engine).__name__}; build one with sqlalchemy.create_engine(url)",
            )
        if replica is not None and isinstance(replica.engine, AsyncEngine) != isinstance(
            engine, AsyncEngine
        ):
            raise InvalidOptionsError(
                "read_engine", "must be of the same kind as engine: both sync, or both async"
            )
        self.engine = engine
        self.replica = replica

    async def read(self, work: Callable[[Session], T]) -> T:
        """``work(session)`` in a read-only transaction, rolled back at the end — on the
        replica when there is one (and it is not too far behind)."""
        if self.replica is None:
            return await self._run(functools.partial(_in_transaction, work, read_only=True))
        primary = self.engine.sync_engine if isinstance(self.engine, AsyncEngine) else self.engine
        found: tuple[T, ReplicaStatus]
        if isinstance(self.engine, AsyncEngine):
            # The sync forms of async engines work inside SQLAlchemy's greenlet bridge.
            found = await greenlet_spawn(_on_replica, self.replica, primary, work)
        else:
            found = await run_in_threadpool(_on_replica, self.replica, primary, work)
        result, status = found
        REPLICA_STATUS.set(status)
        return result

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


def _on_replica(
    reads: ReplicaReads, primary: Engine, work: Callable[[Session], T]
) -> tuple[T, ReplicaStatus]:
    """``work`` read-only on the replica (or on the primary, when the guard falls back)."""
    with translate_missing_schema(), reads.reading(primary.begin) as (connection, status):
        # Allowed after the guard's queries: only read-*write* must come first.
        connection.execute(text("SET TRANSACTION READ ONLY"))
        connection.execute(
            select(func.set_config("statement_timeout", str(STATEMENT_TIMEOUT_MS), True))
        )
        with Session(bind=connection, expire_on_commit=False) as session:
            return work(session), status
