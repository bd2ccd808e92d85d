"""What a worker runs for each kind: the handler function and its per-kind settings."""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable
from typing import Any

import attrs

from sa_jobs.args import UNSET, JobKind, kind_of
from sa_jobs.errors import DuplicateKindError, InvalidOptionsError, NoHandlerError
from sa_jobs.options import check_timeout
from sa_jobs.worker.retry import RetryPolicy

__all__ = ["Handler", "HandlerRegistry"]


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
    """Handlers by kind name."""

    def __init__(self, default_timeout: dt.timedelta | None) -> None:
        self._handlers: dict[str, Handler] = {}
        self._default_timeout = default_timeout

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
            existing = self._handlers[kind.name].function
            raise DuplicateKindError(kind.name, existing, function)  # type: ignore[arg-type]
        handler = Handler(
            kind=kind,
            function=function,
            is_async=inspect.iscoroutinefunction(function),
            wants_session=_wants_session(function),
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

    def all(self) -> list[Handler]:
        return list(self._handlers.values())


def _wants_session(function: Callable[..., Any]) -> bool:
    parameters = inspect.signature(function).parameters
    if "session" in parameters:
        return True
    positional = [
        p
        for p in parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(positional) > 2 or not positional:
        raise InvalidOptionsError(
            "handler",
            f"{getattr(function, '__qualname__', function)} must take (job) or (job, session)",
        )
    return False
