"""Assertions about enqueued jobs: Oban's ``assert_enqueued``/``refute_enqueued`` and
River's ``rivertest.RequireInserted``/``RequireNotInserted`` for sa_jobs.

They query through the test's session, so they see jobs its code enqueued and did not
commit (a pending ``session.add(enqueue(...))`` is flushed first, as any query flushes).
By default they look at jobs still waiting to run — ``available``, ``scheduled``,
``pending``, ``retryable`` — as Oban does; pass ``state=`` for others.

A failed assertion says what *was* enqueued, and for jobs of the same kind in which
respect each one differs from what was expected::

    AssertionError: expected a job of kind 'send_welcome' with email='ada@example.com'
    (state available, scheduled, pending or retryable); found none among the 1 job the
    session sees:
      job 7 send_welcome [available] queue='default' priority=1 args={'email': 'bob@example.com'}
        differs in: email='bob@example.com'

Every function takes a ``Session`` or an ``AsyncSession``; with an ``AsyncSession`` it
returns an awaitable (``await assert_enqueued(async_session, SendWelcome)``).

A failed assertion's traceback ends at the test's own line: pytest hides the frames of
this module (``__tracebackhide__``), and the ``AssertionError`` is raised afresh at the
call, which drops the frames of ``either_session`` and SQLAlchemy's async bridge.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, ParamSpec, TypeVar, cast

import attrs
from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from sa_jobs._base.sessions import EitherSession, either_session
from sa_jobs._base.states import JobState
from sa_jobs._declare.args import JobKind, default_registry, kind_of
from sa_jobs._table.models import Job

__all__ = [
    "WAITING_STATES",
    "assert_enqueued",
    "assert_not_enqueued",
    "enqueued_jobs",
]

WAITING_STATES = (JobState.AVAILABLE, JobState.SCHEDULED, JobState.PENDING, JobState.RETRYABLE)
"""The states the assertions look at by default: jobs that will still run."""

#: What a failure message says when the session sees no job.
NOTHING_SEEN = "the session sees no job at all"

#: How many jobs a failure message lists (the most recent ones).
LISTED_JOBS = 20

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
KindLike = type | str | object | None
StateLike = JobState | str | Iterable[JobState | str] | None


@attrs.frozen
class _Query:
    """What the caller asked for, checked and resolved."""

    kind_name: str | None
    kind: JobKind | None
    whole_args: object | None
    states: tuple[JobState, ...]
    queue: str | None
    priority: int | None
    tags: tuple[str, ...]
    args: Mapping[str, Any]

    def statement(self) -> Select[Any]:
        query = select(Job).where(Job.state.in_(self.states)).order_by(Job.id)
        if self.kind_name is not None:
            query = query.where(Job.kind == self.kind_name)
        if self.queue is not None:
            query = query.where(Job.queue == self.queue)
        if self.priority is not None:
            query = query.where(Job.priority == self.priority)
        if self.tags:
            query = query.where(Job.tags.contains(list(self.tags)))
        # A job the test holds may have moved on (run_jobs): read the row as it is.
        return query.execution_options(populate_existing=True)

    def differences(self, job: Job[Any]) -> list[str]:
        """How ``job`` differs from what was asked for (empty: it matches)."""
        found: list[str] = []
        if self.kind_name is not None and job.kind != self.kind_name:
            return [f"kind={job.kind!r}"]
        if job.state not in self.states:
            found.append(f"state={JobState(job.state).value}")
        if self.queue is not None and job.queue != self.queue:
            found.append(f"queue={job.queue!r}")
        if self.priority is not None and job.priority != self.priority:
            found.append(f"priority={job.priority}")
        missing_tags = [tag for tag in self.tags if tag not in job.tags]
        if missing_tags:
            found.append(f"tags={job.tags!r}")
        return found + self._args_differences(job)

    def _args_differences(self, job: Job[Any]) -> list[str]:
        if self.whole_args is None and not self.args:
            return []
        if self.kind is None:
            stored = job.args_json if isinstance(job.args_json, Mapping) else {}
            return [
                f"{name}={stored.get(name, '<missing>')!r}"
                for name, expected in self.args.items()
                if name not in stored or stored[name] != expected
            ]
        try:
            decoded = self.kind.decode(job.args_json)
        except Exception as exc:
            return [f"args that do not decode ({type(exc).__name__}: {exc})"]
        if self.whole_args is not None and decoded != self.whole_args:
            return [f"args={decoded!r}"]
        return [
            f"{name}={getattr(decoded, name)!r}"
            for name, expected in self.args.items()
            if getattr(decoded, name) != expected
        ]

    def describe(self) -> str:
        subject = f"kind {self.kind_name!r}" if self.kind_name is not None else "any kind"
        conditions = [f"args {self.whole_args!r}"] if self.whole_args is not None else []
        conditions += [f"{name}={value!r}" for name, value in self.args.items()]
        if self.queue is not None:
            conditions.append(f"queue={self.queue!r}")
        if self.priority is not None:
            conditions.append(f"priority={self.priority}")
        if self.tags:
            conditions.append(f"tags including {list(self.tags)!r}")
        names = [state.value for state in self.states]
        states = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
        with_ = f" with {', '.join(conditions)}" if conditions else ""
        return f"{subject}{with_} (state {states})"


def _resolve(
    kind: KindLike,
    *,
    state: StateLike,
    queue: str | None,
    priority: int | None,
    tags: Iterable[str] | None,
    args: Mapping[str, Any] | None,
    args_subset: Mapping[str, Any],
) -> _Query:
    job_kind: JobKind | None = None
    whole_args: object | None = None
    if kind is None:
        kind_name = None
    elif isinstance(kind, str):
        kind_name = kind
        job_kind = default_registry.get(kind) if kind in default_registry else None
    else:
        # An args class, or an instance of one (then its args must match as a whole).
        job_kind = kind_of(kind)
        kind_name = job_kind.name
        if not isinstance(kind, type):
            whole_args = kind
    wanted = {**(args or {}), **args_subset}
    if wanted and job_kind is not None:
        known = _field_names(job_kind.args_class)
        unknown = sorted(set(wanted) - known) if known is not None else []
        if unknown:
            raise TypeError(
                f"{job_kind.args_class.__qualname__} has no field {', '.join(map(repr, unknown))}"
                f"; its fields are {', '.join(sorted(known or ()))} (to filter on the job's "
                "own columns use queue=, priority=, state=, tags=)"
            )
    if wanted and kind is None:
        raise TypeError("matching args needs a kind: pass the args class or the kind name first")
    return _Query(
        kind_name=kind_name,
        kind=job_kind,
        whole_args=whole_args,
        states=_states(state),
        queue=queue,
        priority=priority,
        tags=tuple(tags or ()),
        args=wanted,
    )


def _field_names(cls: type) -> set[str] | None:
    if attrs.has(cls):
        return {field.name for field in attrs.fields(cls)}
    if dataclasses.is_dataclass(cls):
        return {field.name for field in dataclasses.fields(cls)}
    return None


def _states(state: StateLike) -> tuple[JobState, ...]:
    if state is None:
        return WAITING_STATES
    values: Iterable[JobState | str] = [state] if isinstance(state, str) else state
    try:
        states = tuple(JobState(value) for value in values)
    except ValueError:
        raise TypeError(
            f"state must be a JobState, a state name or a collection of them "
            f"({', '.join(s.value for s in JobState)}), got {state!r}"
        ) from None
    if not states:
        raise TypeError("state= is empty; leave it out to look at the waiting states")
    return states


def _matches(session: Session, query: _Query) -> list[Job[Any]]:
    jobs = session.scalars(query.statement()).all()
    return [job for job in jobs if not query.differences(job)]


def _listing(session: Session, query: _Query) -> str:
    recent = list(
        session.scalars(
            select(Job)
            .order_by(Job.id.desc())
            .limit(LISTED_JOBS + 1)
            .execution_options(populate_existing=True)
        )
    )
    total = len(recent) if len(recent) <= LISTED_JOBS else None
    shown = sorted(recent[:LISTED_JOBS], key=lambda job: job.id)
    if not shown:
        return NOTHING_SEEN
    count = f"the {total}" if total is not None else f"the last {LISTED_JOBS} of the"
    noun = "job" if total == 1 else "jobs"
    lines = [f"{count} {noun} the session sees:"]
    for job in shown:
        lines.append(
            f"  job {job.id} {job.kind} [{JobState(job.state).value}] queue={job.queue!r} "
            f"priority={job.priority} args={job.args_json!r}"
            + (f" tags={job.tags!r}" if job.tags else "")
        )
        differences = query.differences(job)
        if differences and (query.kind_name is None or job.kind == query.kind_name):
            lines.append(f"    differs in: {', '.join(differences)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- tracebacks


def _short_traceback(function: EitherSession[P, R]) -> EitherSession[P, R]:
    """``function``, raising its ``AssertionError`` from the caller's line.

    pytest skips frames whose locals hold ``__tracebackhide__``; the frames between (the
    ``either_session`` wrapper, ``AsyncSession.run_sync`` and its greenlet) are not
    ours to mark, so the error is raised again here with its traceback cut. Other
    errors keep theirs: they are for whoever debugs them.
    """

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        try:
            result = cast(Callable[..., Any], function)(*args, **kwargs)
        except AssertionError as failure:
            raise failure.with_traceback(None) from None
        return _awaited(result) if inspect.isawaitable(result) else result

    return cast(EitherSession[P, R], call)


async def _awaited(result: Awaitable[Any]) -> Any:
    __tracebackhide__ = True
    try:
        return await result
    except AssertionError as failure:
        raise failure.with_traceback(None) from None


# ---------------------------------------------------------------------------- public


@either_session
def enqueued_jobs(
    session: Session,
    kind: KindLike = None,
    /,
    *,
    state: StateLike = None,
    queue: str | None = None,
    priority: int | None = None,
    tags: Iterable[str] | None = None,
    args: Mapping[str, Any] | None = None,
    **args_subset: Any,
) -> list[Job[Any]]:
    """The jobs matching, in id order (Oban's ``all_enqueued``), for your own assertions.

    Args:
        session: The test's session (its uncommitted jobs included).
        kind: An args class, a kind name, an args instance (its args must be equal as a
            whole), or None for any kind.
        state: A state, a state name, or a collection of them; default
            :data:`WAITING_STATES`.
        queue: Only jobs of this queue.
        priority: Only jobs of this priority.
        tags: Only jobs having all of these tags.
        args: Args fields that must be equal, for fields whose names clash with the
            parameters above (``args={"queue": "x"}``).
        **args_subset: Args fields that must be equal (compared on the decoded args
            instance, so datetimes, enums and nested classes compare as Python values).

    Raises:
        TypeError: an args field the class does not have, a state that does not exist.
    """
    query = _resolve(
        kind,
        state=state,
        queue=queue,
        priority=priority,
        tags=tags,
        args=args,
        args_subset=args_subset,
    )
    return _matches(session, query)


@_short_traceback
@either_session
def assert_enqueued(
    session: Session,
    kind: KindLike = None,
    /,
    *,
    count: int | None = None,
    state: StateLike = None,
    queue: str | None = None,
    priority: int | None = None,
    tags: Iterable[str] | None = None,
    args: Mapping[str, Any] | None = None,
    **args_subset: Any,
) -> Job[Any]:
    """Assert that a matching job was enqueued (``count``: exactly that many); return the
    first one, by id, for further checks.

    Takes what :func:`enqueued_jobs` takes, plus ``count``.

    Raises:
        AssertionError: nothing matches (or not ``count`` jobs); the message lists the
            jobs the session sees and how each of the kind differs.
    """
    __tracebackhide__ = True
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise TypeError(
            f"count must be a positive int, got {count!r} (use assert_not_enqueued for none)"
        )
    query = _resolve(
        kind,
        state=state,
        queue=queue,
        priority=priority,
        tags=tags,
        args=args,
        args_subset=args_subset,
    )

    found = _matches(session, query)
    if not found or (count is not None and len(found) != count):
        wanted = "a job" if count is None else f"{count} job{'s' if count > 1 else ''}"
        listing = _listing(session, query)
        among = f"among {listing}" if listing != NOTHING_SEEN else f"({listing})"
        raise AssertionError(
            f"expected {wanted} of {query.describe()}; found {len(found) or 'none'} {among}"
        )
    return found[0]


@_short_traceback
@either_session
def assert_not_enqueued(
    session: Session,
    kind: KindLike = None,
    /,
    *,
    state: StateLike = None,
    queue: str | None = None,
    priority: int | None = None,
    tags: Iterable[str] | None = None,
    args: Mapping[str, Any] | None = None,
    **args_subset: Any,
) -> None:
    """Assert that no matching job was enqueued. As with Oban's ``refute_enqueued``, be
    as unspecific as you can: ``assert_not_enqueued(session, SendWelcome)`` also fails
    for a welcome mail to the wrong address.

    Takes what :func:`enqueued_jobs` takes.

    Raises:
        AssertionError: something matches; the message lists what.
    """
    __tracebackhide__ = True
    query = _resolve(
        kind,
        state=state,
        queue=queue,
        priority=priority,
        tags=tags,
        args=args,
        args_subset=args_subset,
    )

    found = _matches(session, query)
    if found:
        listed = "\n".join(
            f"  job {job.id} {job.kind} [{JobState(job.state).value}] "
            f"queue={job.queue!r} args={job.args_json!r}"
            for job in found[:LISTED_JOBS]
        )
        raise AssertionError(
            f"expected no job of {query.describe()}; found {len(found)}:\n{listed}"
        )
