"""What a worker runs for each kind: the handler function and its per-kind settings.

A handler's signature is checked when it is registered, so a mistake surfaces at
``@worker.handler(...)`` rather than as a job discarded after its attempts:

* it takes the job first, and optionally the session second — a second parameter is the
  session if it is named ``session`` or annotated as a ``Session``/``AsyncSession``;
  any other required parameter is refused;
* an ``async def`` handler that takes a session needs an async engine, which the worker
  must be able to provide (see :mod:`sa_jobs.worker.aio`);
* a handler whose job parameter is annotated ``Job[X]`` is registered for ``X`` itself
  (``Job`` is invariant, as mypy sees it too);
* a kind has one handler per worker.
"""

from __future__ import annotations

import datetime as dt
import inspect
import typing
from collections.abc import Callable
from typing import Any

import attrs
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from sa_jobs._declare.args import JobKind, kind_of
from sa_jobs._declare.option_checks import check_timeout
from sa_jobs._declare.options import UNSET
from sa_jobs._table.models import Job
from sa_jobs.errors import DuplicateHandlerError, InvalidOptionsError, NoHandlerError
from sa_jobs.worker.retry import RetryPolicy

__all__ = ["Handler", "HandlerRegistry"]

_SESSION_TYPE_NAMES = {"Session", "AsyncSession"}


@attrs.frozen
class Handler:
    """A registered handler.

    Attributes:
        kind: The kind it handles (and the converter that decodes its args).
        function: The handler, ``(job)`` or ``(job, session)``, sync or ``async def``.
        is_async: Runs on the worker's event loop instead of a thread.
        wants_session: Gets a session whose transaction also completes the job.
        timeout: Run time limit, ``None`` for none.
        retry_policy: Overrides the worker's policy for this kind.
    """

    kind: JobKind
    function: Callable[..., Any]
    is_async: bool
    wants_session: bool
    timeout: dt.timedelta | None
    retry_policy: RetryPolicy | None = None


class HandlerRegistry:
    """Handlers by kind name.

    Args:
        default_timeout: The worker's run time limit.
        async_session_problem: Why an async handler could not get a session here (the
            engine's driver has no async form), or None.
    """

    def __init__(
        self,
        default_timeout: dt.timedelta | None,
        async_session_problem: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._handlers: dict[str, Handler] = {}
        self._default_timeout = default_timeout
        self._async_session_problem = async_session_problem

    def register(
        self,
        args_class: type,
        function: Callable[..., Any],
        *,
        timeout: Any = UNSET,
        retry_policy: RetryPolicy | None = None,
    ) -> Handler:
        kind = kind_of(args_class)
        if kind.name in self._handlers:
            raise DuplicateHandlerError(kind.name, self._handlers[kind.name].function, function)
        is_async = _is_async(function)
        wants_session = _wants_session(function)
        if wants_session:
            _check_session_kind(function, is_async)
        _check_job_annotation(function, args_class)
        if is_async and wants_session:
            problem = self._async_session_problem()
            if problem is not None:
                raise InvalidOptionsError(
                    "handler", f"{_name(function)} is async and takes a session, but {problem}"
                )
        if retry_policy is not None and not callable(getattr(retry_policy, "next_delay", None)):
            raise InvalidOptionsError(
                "retry_policy", f"must have a next_delay(job) method, got {retry_policy!r}"
            )
        handler = Handler(
            kind=kind,
            function=function,
            is_async=is_async,
            wants_session=wants_session,
            timeout=self._resolve_timeout(kind, timeout),
            retry_policy=retry_policy,
        )
        self._handlers[kind.name] = handler
        return handler

    def _resolve_timeout(self, kind: JobKind, timeout: Any) -> dt.timedelta | None:
        # The handler's own setting wins, then the args class's, then the worker's.
        if timeout is not UNSET:
            return check_timeout(timeout)
        if kind.defaults.timeout is not UNSET:
            return check_timeout(kind.defaults.timeout)
        return self._default_timeout

    def get(self, kind: str) -> Handler:
        try:
            return self._handlers[kind]
        except KeyError:
            raise NoHandlerError(kind) from None

    def find(self, kind: str) -> Handler | None:
        return self._handlers.get(kind)

    def all(self) -> list[Handler]:
        return list(self._handlers.values())


def _name(function: Callable[..., Any]) -> str:
    return str(getattr(function, "__qualname__", None) or function)


def _check_job_annotation(function: Callable[..., Any], args_class: type) -> None:
    """A handler annotated ``job: Job[Other]`` is registered for the wrong kind: refuse.

    Annotations that cannot be resolved here (a name imported only for type checking)
    are left to the type checker, which sees the same mismatch statically."""
    try:
        hints = typing.get_type_hints(function)
        first = next(iter(inspect.signature(function).parameters.values()))
    except Exception:
        return
    annotation = hints.get(first.name)
    if typing.get_origin(annotation) is not Job:
        return
    (declared,) = typing.get_args(annotation)
    if declared is Any or isinstance(declared, typing.TypeVar):
        return
    if declared is not args_class:
        raise InvalidOptionsError(
            "handler",
            f"{_name(function)} is registered for {args_class.__name__} jobs but its job "
            f"parameter is annotated Job[{getattr(declared, '__name__', declared)}]; annotate "
            f"it Job[{args_class.__name__}] or register it for the class it expects",
        )


def _is_async(function: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 - an object with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _is_session_annotation(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return annotation.rsplit(".", 1)[-1].strip("'\" ") in _SESSION_TYPE_NAMES
    return isinstance(annotation, type) and issubclass(annotation, Session | AsyncSession)


def _session_kind(annotation: Any) -> str | None:
    """``"AsyncSession"``, ``"Session"``, or None for an annotation that names neither."""
    if isinstance(annotation, str):
        name = annotation.rsplit(".", 1)[-1].strip("'\" ")
        return name if name in _SESSION_TYPE_NAMES else None
    if isinstance(annotation, type) and issubclass(annotation, AsyncSession):
        return "AsyncSession"
    if isinstance(annotation, type) and issubclass(annotation, Session):
        return "Session"
    return None


def _check_session_kind(function: Callable[..., Any], is_async: bool) -> None:
    """An ``async def`` handler gets an ``AsyncSession``, a sync one a ``Session``; one
    annotated the other way would misuse it — an async handler calling
    ``session.execute(...)`` un-awaited, its writes silently never made."""
    second = [
        p
        for p in inspect.signature(function).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ][1]
    declared = _session_kind(second.annotation)
    expected = "AsyncSession" if is_async else "Session"
    if declared is not None and declared != expected:
        kind = "an async" if is_async else "a sync"
        raise InvalidOptionsError(
            "handler",
            f"{_name(function)} is {kind} handler, so its session is {'an' if is_async else 'a'} "
            f"{expected}, but it is annotated {declared}; annotate it {expected}",
        )


def _wants_session(function: Callable[..., Any]) -> bool:
    """Whether the handler takes a session; refuses signatures the worker cannot call."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError) as exc:
        raise InvalidOptionsError(
            "handler", f"cannot read the signature of {function!r}: {exc}"
        ) from None
    name = _name(function)
    usage = "a handler takes (job) or (job, session)"
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_varargs = any(p.kind is p.VAR_POSITIONAL for p in parameters)
    for parameter in parameters:
        if parameter.kind is parameter.KEYWORD_ONLY and parameter.default is parameter.empty:
            raise InvalidOptionsError(
                "handler",
                f"{name} has a required keyword-only parameter {parameter.name!r}, which the "
                f"worker cannot fill; {usage}",
            )
    if not positional and not takes_varargs:
        raise InvalidOptionsError("handler", f"{name} takes no parameter for the job; {usage}")
    required = [p for p in positional if p.default is p.empty]
    if len(required) > 2:
        extra = ", ".join(p.name for p in required[2:])
        raise InvalidOptionsError(
            "handler", f"{name} has parameters the worker cannot fill ({extra}); {usage}"
        )
    if len(positional) < 2:
        return False
    second = positional[1]
    if second.name == "session" or _is_session_annotation(second.annotation):
        return True
    if second.default is not second.empty:
        return False
    raise InvalidOptionsError(
        "handler",
        f"{name}'s second parameter {second.name!r} is not a session; name it `session` or "
        "annotate it as sqlalchemy.orm.Session (or AsyncSession for an async handler); " + usage,
    )
