"""One API for sync and async applications: functions that take a ``Session`` or an
``AsyncSession``.

sa_jobs' session functions (``insert``, ``insert_many``, ``complete_in``, ``cancel_job``,
``retry_job``, ``remove_job``) are written once, against a sync ``Session``. Decorated
with :func:`either_session`, they also accept an ``AsyncSession`` and then return an
awaitable that runs the same code through ``AsyncSession.run_sync`` — SQLAlchemy's own
bridge, which runs sync ORM code on the async connection in a greenlet, so the SQL, the
checks and the transaction are exactly those of the sync call::

    result = sa_jobs.insert(session, SendEmail(...))              # Session
    result = await sa_jobs.insert(async_session, SendEmail(...))  # AsyncSession

A ``scoped_session`` (Flask-SQLAlchemy's ``db.session``) counts as a ``Session`` and an
``async_scoped_session`` as an ``AsyncSession``. The :class:`EitherSession` protocol
carries the overloads, so mypy sees a plain result
for a ``Session`` and an awaitable for an ``AsyncSession`` — with the wrapped function's
own parameters checked either way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast, overload

from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session
from sqlalchemy.orm import Session, scoped_session

__all__ = ["EitherSession", "either_session"]

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class EitherSession(Protocol[P, R_co]):
    """A function taking a ``Session`` (returns its result) or an ``AsyncSession``
    (returns an awaitable of it)."""

    @overload
    def __call__(
        self, session: Session | scoped_session[Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> R_co: ...

    @overload
    def __call__(
        self,
        session: AsyncSession | async_scoped_session[Any],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Coroutine[Any, Any, R_co]: ...


def either_session(function: Callable[Concatenate[Session, P], R]) -> EitherSession[P, R]:
    """Make ``function(session, ...)`` accept an ``AsyncSession`` too (see the module)."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        # ``session=`` by keyword keeps working at run time (type checkers see it
        # positional-only, as the overloads must be).
        if args:
            session, args = args[0], args[1:]
        elif "session" in kwargs:
            session = kwargs.pop("session")
        else:
            raise TypeError(f"{function.__name__}() takes a Session or an AsyncSession first")
        if isinstance(session, async_scoped_session):
            session = session()  # the task's AsyncSession
        if isinstance(session, AsyncSession):
            return session.run_sync(function, *args, **kwargs)
        return function(session, *args, **kwargs)

    return cast(EitherSession[P, R], call)
