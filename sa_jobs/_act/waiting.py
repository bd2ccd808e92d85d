"""Waiting for jobs to finish and taking their outputs: :func:`wait_for`, :func:`wait_for_all`.

A waiter marks its jobs ``output_watched`` (the ``sa_jobs_output`` branch's column),
``LISTEN``\\s on ``sa_jobs_done`` and then reads the rows: the trigger the branch installs
notifies that channel when a *watched* job enters a final state, so completions nobody
waits for send nothing, and the read after ``LISTEN`` is established catches a job that
finished before (no lost wake-up). Between notifications the waiter reads the rows again
every ``poll_interval`` seconds, so it also works where notifications do not arrive
(PgBouncer in transaction mode, drivers that cannot wait for them) — only slower there;
``poll_only=True`` skips ``LISTEN`` altogether.

One listen connection per call, however many jobs it waits for; it is taken out of the
engine's pool and closed (sync), or returned with ``UNLISTEN *`` (async), so no
``LISTEN`` leaks to the application's connections. The waiter's reads run on
connections of the bind's engine outside any session transaction: a job must be
committed to be waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Iterable, Iterator, Sequence
from typing import Any, overload

import attrs
from sqlalchemy import BigInteger, Connection, Engine, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import bindparam
from sqlalchemy.util import greenlet_spawn

from sa_jobs._act.wait_listening import async_listening, listening
from sa_jobs._base.replicas import DEFAULT_MAX_LAG, OnLag, ReplicaReads
from sa_jobs._base.states import FINAL_STATES, JobState
from sa_jobs._declare.args import default_registry
from sa_jobs._declare.output import decode_output
from sa_jobs._table.models import Job
from sa_jobs._table.schema import OUTPUT_BRANCH, missing_schema_error
from sa_jobs.errors import (
    InvalidOptionsError,
    JobCancelledWaitError,
    JobDiscardedError,
    JobNotFoundError,
    SchemaMissingError,
    WaitTimeoutError,
)

__all__ = ["DEFAULT_POLL_INTERVAL", "wait_for", "wait_for_all"]

#: Seconds between reads of the rows when no notification comes (the fallback).
DEFAULT_POLL_INTERVAL = 0.5
#: The metadata key a canceller may set to say why (read into the cancelled error).
CANCEL_REASON_KEY = "cancel_reason"

SyncBind = Engine | Connection | Session
AsyncBind = AsyncEngine | AsyncConnection | AsyncSession

_IDS = bindparam("sa_jobs_wait_ids", type_=ARRAY(BigInteger))
_FINALS = [state.value for state in FINAL_STATES]
#: Mark the jobs watched (once: a watched row is not rewritten).
_WATCH = (
    update(Job)
    .where(Job.id == _IDS.any_(), Job.output_watched.is_(False), Job.state.not_in(_FINALS))
    .values(output_watched=True)
    .execution_options(synchronize_session=False)
)
_READ = select(Job.id, Job.kind, Job.state, Job.output_json, Job.errors, Job.metadata_).where(
    Job.id == _IDS.any_()
)


@attrs.frozen
class _Row:
    id: int
    kind: str
    state: JobState
    output: Any
    errors: list[dict[str, Any]]
    metadata: dict[str, Any]


@overload
def wait_for(
    bind: SyncBind,
    job_id: int,
    *,
    timeout: float,
    poll_interval: float = ...,
    poll_only: bool = ...,
    read_engine: Engine | AsyncEngine | None = ...,
    max_replica_lag: float = ...,
    on_replica_lag: OnLag = ...,
) -> Any: ...
@overload
def wait_for(
    bind: AsyncBind,
    job_id: int,
    *,
    timeout: float,
    poll_interval: float = ...,
    poll_only: bool = ...,
    read_engine: Engine | AsyncEngine | None = ...,
    max_replica_lag: float = ...,
    on_replica_lag: OnLag = ...,
) -> Awaitable[Any]: ...
def wait_for(
    bind: SyncBind | AsyncBind,
    job_id: int,
    *,
    timeout: float,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    poll_only: bool = False,
    read_engine: Engine | AsyncEngine | None = None,
    max_replica_lag: float = DEFAULT_MAX_LAG,
    on_replica_lag: OnLag = "fall_back",
) -> Any:
    """Wait until job ``job_id`` finishes and return its output.

    Sync on an ``Engine``, ``Connection`` or ``Session``; on an ``AsyncEngine``,
    ``AsyncConnection`` or ``AsyncSession`` it returns an awaitable. The output is
    converted to the kind's ``output=`` type when the kind is registered in this
    process (the stored JSON otherwise); None for a job that completed without one.

    Args:
        timeout: Seconds to wait at most.
        poll_interval: Seconds between reads when no notification comes.
        poll_only: Never ``LISTEN`` (behind PgBouncer in transaction mode, where
            notifications do not arrive): read every ``poll_interval``.
        read_engine: A streaming standby of the bind's database (sync for a sync
            bind, async for an async one): the reads every ``poll_interval`` go there,
            behind the replay-lag guard; marking the jobs watched, ``LISTEN``, the
            first read and the read after each notification stay on the bind's
            engine (a notified job is final there, maybe not yet on the replica).
        max_replica_lag: Seconds the replica may be behind (default 5).
        on_replica_lag: Past it, ``"fall_back"`` (poll the primary, the default) or
            ``"report"`` (poll the replica anyway).

    Raises:
        JobDiscardedError: the job was discarded; ``.errors`` holds its attempts' errors.
        JobCancelledWaitError: the job was cancelled; ``.reason`` says why, when known.
        WaitTimeoutError: not finished in time; ``.state`` is where it was.
        JobNotFoundError: no such job (not committed yet, or removed by the cleaner).
        SchemaMissingError: the ``sa_jobs_output`` branch is not installed.
        InvalidOptionsError: a bad id, timeout or interval (before anything is written).
    """
    ids = [_check_id(job_id)]
    settings = _Settings.build(
        timeout, poll_interval, poll_only, read_engine, max_replica_lag, on_replica_lag
    )
    asynchronous = isinstance(bind, AsyncEngine | AsyncConnection | AsyncSession)
    settings.check_kind(asynchronous)
    if isinstance(bind, AsyncEngine | AsyncConnection | AsyncSession):
        return _first(_wait_async(_async_engine(bind), ids, settings))
    return _results(_wait_sync(_sync_engine(bind), ids, settings), ids)[0]


@overload
def wait_for_all(
    bind: SyncBind,
    job_ids: Iterable[int],
    *,
    timeout: float,
    poll_interval: float = ...,
    poll_only: bool = ...,
    read_engine: Engine | AsyncEngine | None = ...,
    max_replica_lag: float = ...,
    on_replica_lag: OnLag = ...,
) -> list[Any]: ...
@overload
def wait_for_all(
    bind: AsyncBind,
    job_ids: Iterable[int],
    *,
    timeout: float,
    poll_interval: float = ...,
    poll_only: bool = ...,
    read_engine: Engine | AsyncEngine | None = ...,
    max_replica_lag: float = ...,
    on_replica_lag: OnLag = ...,
) -> Awaitable[list[Any]]: ...
def wait_for_all(
    bind: SyncBind | AsyncBind,
    job_ids: Iterable[int],
    *,
    timeout: float,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    poll_only: bool = False,
    read_engine: Engine | AsyncEngine | None = None,
    max_replica_lag: float = DEFAULT_MAX_LAG,
    on_replica_lag: OnLag = "fall_back",
) -> Any:
    """:func:`wait_for` for many jobs at once, with one listen connection: their outputs,
    in the order of ``job_ids``, once every one finished.

    Raises:
        JobDiscardedError, JobCancelledWaitError: for the first job (in the order given)
            that did not complete, once all finished.
        WaitTimeoutError: not all finished in time (naming the first one still waiting).
        The rest as :func:`wait_for`.
    """
    if isinstance(job_ids, str | bytes) or not isinstance(job_ids, Iterable):
        raise InvalidOptionsError("job_ids", f"must be an iterable of job ids, got {job_ids!r}")
    ids = [_check_id(job_id) for job_id in job_ids]
    settings = _Settings.build(
        timeout, poll_interval, poll_only, read_engine, max_replica_lag, on_replica_lag
    )
    settings.check_kind(isinstance(bind, AsyncEngine | AsyncConnection | AsyncSession))
    if isinstance(bind, AsyncEngine | AsyncConnection | AsyncSession):
        return _all(_wait_async(_async_engine(bind), ids, settings), ids)
    if not ids:
        return []
    return _results(_wait_sync(_sync_engine(bind), ids, settings), ids)


# ------------------------------------------------------------------ checks


@attrs.frozen
class _Settings:
    timeout: float
    poll_interval: float
    poll_only: bool
    replica: ReplicaReads | None = None

    @classmethod
    def build(
        cls,
        timeout: object,
        poll_interval: object,
        poll_only: object,
        read_engine: Engine | AsyncEngine | None = None,
        max_replica_lag: float = DEFAULT_MAX_LAG,
        on_replica_lag: str = "fall_back",
    ) -> _Settings:
        replica = (
            None
            if read_engine is None
            else ReplicaReads(read_engine, max_lag=max_replica_lag, on_lag=on_replica_lag)
        )
        return cls(
            _seconds("timeout", timeout),
            _seconds("poll_interval", poll_interval),
            _flag("poll_only", poll_only),
            replica,
        )

    def check_kind(self, asynchronous: bool) -> None:
        if self.replica is not None and isinstance(self.replica.engine, AsyncEngine) != (
            asynchronous
        ):
            raise InvalidOptionsError(
                "read_engine",
                "must be of the same kind as the bind: an AsyncEngine for an async bind, "
                "an Engine for a sync one",
            )


def _check_id(job_id: object) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise InvalidOptionsError("job_id", f"must be a job id (an int), got {job_id!r}")
    return job_id


def _seconds(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidOptionsError(option, f"must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidOptionsError(option, f"must be a positive number of seconds, got {value!r}")
    return float(value)


def _flag(option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidOptionsError(option, f"must be True or False, got {value!r}")
    return value


def _sync_engine(bind: SyncBind) -> Engine:
    if isinstance(bind, Engine):
        return bind
    if isinstance(bind, Connection):
        return bind.engine
    if isinstance(bind, Session):
        engine = bind.get_bind()
        return engine if isinstance(engine, Engine) else engine.engine
    raise InvalidOptionsError(
        "bind",
        f"must be an Engine, Connection or Session (or their async forms), got "
        f"{type(bind).__name__}",
    )


def _async_engine(bind: AsyncBind) -> AsyncEngine:
    if isinstance(bind, AsyncEngine):
        return bind
    if isinstance(bind, AsyncConnection):
        return bind.engine
    engine = bind.get_bind()
    return AsyncEngine(engine if isinstance(engine, Engine) else engine.engine)


# ------------------------------------------------------------------ results


def _results(rows: dict[int, _Row], ids: Sequence[int]) -> list[Any]:
    """The outputs of ``ids`` (all final), or the error of the first that did not complete."""
    outputs = []
    for job_id in ids:
        row = rows[job_id]
        if row.state is JobState.DISCARDED:
            raise JobDiscardedError(job_id, row.errors)
        if row.state is JobState.CANCELLED:
            raise JobCancelledWaitError(job_id, _cancel_reason(row), row.metadata)
        kind = default_registry.get(row.kind) if row.kind in default_registry else None
        outputs.append(decode_output(kind, row.output))
    return outputs


def _cancel_reason(row: _Row) -> str | None:
    reason = row.metadata.get(CANCEL_REASON_KEY)
    if isinstance(reason, str) and reason:
        return reason
    last = row.errors[-1].get("error") if row.errors else None
    return last if isinstance(last, str) else None


async def _first(rows: Awaitable[dict[int, _Row]]) -> Any:
    found = await rows
    return _results(found, list(found))[0]


async def _all(rows: Awaitable[dict[int, _Row]], ids: list[int]) -> list[Any]:
    if not ids:
        return []
    return _results(await rows, ids)


class _Progress:
    """What a wait has seen so far: the finished rows, and what it still waits for."""

    def __init__(self, ids: Sequence[int], settings: _Settings) -> None:
        self.pending = set(ids)
        self.finished: dict[int, _Row] = {}
        self.settings = settings
        self.deadline = time.monotonic() + settings.timeout
        self.states: dict[int, JobState] = {}

    def take(self, rows: Iterable[Any], *, replica: bool = False) -> None:
        """Note the rows read; a job missing from them is an error — except on a
        replica, which may not have replayed its insert yet."""
        seen = set()
        for job_id, kind, state, output, errors, metadata in rows:
            row = _Row(
                int(job_id), kind, JobState(state), output, list(errors or []), dict(metadata or {})
            )
            seen.add(row.id)
            self.states[row.id] = row.state
            if row.state in FINAL_STATES:
                self.finished[row.id] = row
                self.pending.discard(row.id)
        missing = sorted(self.pending - seen)
        if missing and not replica:
            raise JobNotFoundError(missing[0])

    def next_wait(self) -> float:
        """Seconds until the next read; raises the timeout when there is none left."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            first = min(self.pending)
            state = self.states.get(first)
            raise WaitTimeoutError(
                first, state.value if state is not None else "unknown", self.settings.timeout
            )
        return min(left, self.settings.poll_interval)


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except ProgrammingError as exc:
        error = missing_schema_error(exc)
        if error is not None:
            raise (
                SchemaMissingError(OUTPUT_BRANCH, "wait_for marks the jobs it waits for there")
                if error.branch == OUTPUT_BRANCH
                else error
            ) from exc
        raise


# ------------------------------------------------------------------ sync


def _wait_sync(engine: Engine, ids: list[int], settings: _Settings) -> dict[int, _Row]:
    progress = _Progress(ids, settings)
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    with contextlib.ExitStack() as stack:
        listener = None if settings.poll_only else stack.enter_context(listening(engine))
        if settings.replica is not None:
            # A read engine on another database is refused before anything is written.
            _check_replica(settings.replica, engine)
        with _translated(), autocommit.connect() as connection:
            connection.execute(_WATCH, {"sa_jobs_wait_ids": ids})
        # The first read (the one that may say "no such job"), and a read after a
        # notification, on the primary (see wait_for).
        on_primary = True
        while True:
            with _translated():
                if settings.replica is None or on_primary:
                    with autocommit.connect() as connection:
                        progress.take(connection.execute(_READ, _pending(progress)))
                else:
                    progress.take(_read_replica(settings.replica, engine, progress), replica=True)
            if not progress.pending:
                return progress.finished
            wait = progress.next_wait()
            on_primary = False
            if listener is None:
                time.sleep(wait)
                continue
            for payload in listener(wait):
                if payload.isdigit() and int(payload) in progress.pending:
                    on_primary = True
                    break


def _pending(progress: _Progress) -> dict[str, Any]:
    return {"sa_jobs_wait_ids": sorted(progress.pending)}


def _read_replica(reads: ReplicaReads, primary: Engine, progress: _Progress) -> list[Any]:
    """The rows, read on the replica (or on the primary when the guard falls back);
    sync code, also run through the greenlet bridge for async engines."""
    with reads.reading(primary.connect) as (connection, _status):
        return list(connection.execute(_READ, _pending(progress)))


def _check_replica(reads: ReplicaReads, primary: Engine) -> None:
    with reads.reading(primary.connect):
        pass


# ------------------------------------------------------------------ async


async def _wait_async(engine: AsyncEngine, ids: list[int], settings: _Settings) -> dict[int, _Row]:
    progress = _Progress(ids, settings)
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with contextlib.AsyncExitStack() as stack:
        wake: asyncio.Event | None = None
        if not settings.poll_only:
            wake = await stack.enter_async_context(
                async_listening(autocommit, lambda job_id: job_id in progress.pending)
            )
        if settings.replica is not None:
            await greenlet_spawn(_check_replica, settings.replica, engine.sync_engine)
        with _translated():
            async with autocommit.connect() as connection:
                await connection.execute(_WATCH, {"sa_jobs_wait_ids": ids})
        on_primary = True  # as in _wait_sync
        while True:
            with _translated():
                if settings.replica is None or on_primary:
                    async with autocommit.connect() as connection:
                        result = await connection.execute(_READ, _pending(progress))
                        progress.take(result.all())
                else:
                    rows = await greenlet_spawn(
                        _read_replica, settings.replica, engine.sync_engine, progress
                    )
                    progress.take(rows, replica=True)
            if not progress.pending:
                return progress.finished
            wait = progress.next_wait()
            if wake is None:
                await asyncio.sleep(wait)
                continue
            on_primary = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), wait)
                on_primary = True
            wake.clear()
