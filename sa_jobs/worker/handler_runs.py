"""Running a job's handler: a sync one in the calling thread (the pool's), an async one
on the worker's event loop; with a handler session, the outcome is written in that
session's transaction (``complete_in`` semantics), unless the run was settled meanwhile.

The run's state, its outcome and its interruptions are :class:`.execution.Execution`'s.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from sa_jobs._act.complete import complete_encoded
from sa_jobs.errors import JobTimeoutError, NoHandlerError
from sa_jobs.worker.execution import Execution, Interrupt
from sa_jobs.worker.handlers import Handler
from sa_jobs.worker.missing_rows import (
    batch_checked,
    check_rows,
    check_rows_apart,
    check_rows_apart_async,
    check_rows_async,
)

__all__ = ["prepare", "run_async", "run_sync"]

log = logging.getLogger("sa_jobs.worker")


class _Superseded(Exception):
    """The run was settled by someone else (a timeout) before it could commit."""


def prepare(execution: Execution) -> Handler:
    """The handler of the run, with the job's args decoded up front, so a class that no
    longer fits fails like any error. Public for ``sa_jobs.testing.inline``, which runs
    handlers the same way.

    Raises:
        NoHandlerError: no handler for the job's kind.
    """
    handler = execution.handler
    job = execution.job
    if handler is None:
        raise NoHandlerError(job.kind)
    job.extras.kind = handler.kind
    job.remember_args(handler.kind.decode(job.args_json))
    return handler


def run_sync(execution: Execution, engine: Engine) -> None:
    """Run a sync handler in the calling (pool) thread and settle the execution."""
    hooks = execution.hooks
    if hooks is None:
        _run_sync(execution, engine)
        return
    try:
        _run_sync(execution, engine)
    finally:
        if execution.started is not None:  # begin() ran the before_work hooks
            hooks.after(execution.job, execution.attempt_result())


def _run_sync(execution: Execution, engine: Engine) -> None:
    if not execution.begin():
        return
    claimed = False
    try:
        handler = prepare(execution)
        if handler.wants_session:
            with Session(engine) as session, session.begin():
                if not batch_checked(execution.rows_verdict):
                    check_rows(session, execution.job)
                result = _sync_result(handler.function(execution.job, session))
                data = execution.encode_result(result)
                claimed = execution.try_finish()
                if not claimed:
                    raise _Superseded
                if execution.interrupt_reason is Interrupt.TIMEOUT:
                    raise JobTimeoutError(execution.job.id)
                complete_encoded(session, execution.job, data)
            execution.settle(None)
            return
        if not batch_checked(execution.rows_verdict):
            check_rows_apart(engine, execution.job)
        result = _sync_result(handler.function(execution.job))
        outcome = execution.outcome_for_return(result)
    except _Superseded:
        return
    except BaseException as exc:  # the handler's failure is data, not a crash
        outcome = execution.outcome_for_exception(exc)
    if claimed or execution.try_finish():
        execution.settle(outcome)


def _sync_result(result: object) -> object:
    """The return value of a sync handler (its output).

    A sync handler that returns an awaitable (a plain wrapper around an ``async def``)
    did not do its work: calling it only made a coroutine. Fail the attempt, loudly,
    rather than complete a job whose handler never ran."""
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never awaited, on purpose: no "never awaited" warning
        raise TypeError(
            "the handler returned an awaitable instead of doing its work; declare the "
            "handler itself `async def` (a sync wrapper around an async function hides it)"
        )
    return result


async def run_async(execution: Execution, async_engine: Callable[[], AsyncEngine]) -> None:
    """Run an async handler as a task on the worker's loop and settle the execution."""
    hooks = execution.hooks
    if hooks is None:
        await _run_async(execution, async_engine)
        return
    try:
        await _run_async(execution, async_engine)
    finally:
        if execution.started is not None:  # begin() ran the before_work hooks
            hooks.after(execution.job, execution.attempt_result())


async def _run_async(execution: Execution, async_engine: Callable[[], AsyncEngine]) -> None:
    task = asyncio.current_task()
    assert task is not None
    if not execution.begin():
        return
    claimed = False
    try:
        if not execution.attach_task(task, asyncio.get_running_loop()):
            execution.raise_if_interrupted()
        handler = prepare(execution)
        if handler.wants_session:
            async with AsyncSession(async_engine()) as session, session.begin():
                if not batch_checked(execution.rows_verdict):
                    await check_rows_async(session, execution.job)
                result = await handler.function(execution.job, session)
                data = execution.encode_result(result)
                claimed = execution.try_finish()
                if not claimed:
                    raise _Superseded
                if execution.interrupt_reason is Interrupt.TIMEOUT:
                    raise JobTimeoutError(execution.job.id)
                await session.run_sync(complete_encoded, execution.job, data)
            execution.settle(None)
            return
        if not batch_checked(execution.rows_verdict):
            await check_rows_apart_async(async_engine, execution.job)
        result = await handler.function(execution.job)
        outcome = execution.outcome_for_return(result)
    except _Superseded:
        return
    except BaseException as exc:
        outcome = execution.outcome_for_exception(exc)
    if claimed or execution.try_finish():
        execution.settle(outcome)
