"""Hooks around inserts and around work: a small typed API that costs nothing unused.

Two protocols, each a pair of calls around one operation:

* :class:`InsertHook` — ``before_insert(jobs)`` / ``after_insert(jobs, error)`` around
  every insert call (:func:`sa_jobs.insert`, :func:`sa_jobs.insert_many`, and each flush
  that writes ``session.add(sa_jobs.enqueue(...))`` jobs). ``before_insert`` may add to
  each job's ``metadata`` before the row is written; ``after_insert`` sees each job's id
  and what the insert did. Registered for the whole process
  (:func:`add_insert_hook`): inserts are made by application code, on any session, with
  no object of sa_jobs' in reach to hold a registry.
* :class:`WorkHook` — ``before_work(job)`` / ``after_work(job, result)`` around every
  attempt a :class:`~sa_jobs.Worker` runs, registered on that worker
  (``Worker(..., hooks=[...])`` or :meth:`~sa_jobs.Worker.add_hook`).

The rules, the same for both:

* ``before_*`` calls run in the order the hooks were registered, ``after_*`` calls in
  the reverse order, so the first hook registered wraps all the others (River's
  middleware order).
* The two calls of one insert or one attempt run in the same thread (a sync handler's)
  or the same task (an async handler's), so a hook may keep state between them in a
  :class:`contextvars.ContextVar` — and what it sets there in ``before_work`` is seen by
  the handler.
* A hook that raises is logged (logger ``sa_jobs.hooks``) and ignored: the insert or
  the attempt goes on as if the hook had not been there, and the other hooks still run.
  A broken metrics hook must never lose a job or fail an attempt.
* With no hook registered, an insert or an attempt pays one attribute check.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from sa_jobs._base.records import Ending
from sa_jobs._base.states import InsertAction
from sa_jobs._declare.option_checks import check_metadata
from sa_jobs.errors import InvalidOptionsError

if TYPE_CHECKING:
    from sa_jobs._base.records import JobRow
    from sa_jobs._table.models import Job

__all__ = [
    "AttemptResult",
    "Ending",
    "InsertHook",
    "InsertingJob",
    "WorkHook",
    "WorkHooks",
    "add_insert_hook",
    "insert_hooks",
    "remove_insert_hook",
]

log = logging.getLogger("sa_jobs.hooks")


# --------------------------------------------------------------------------- what hooks see


class InsertingJob:
    """One job of an insert call, as insert hooks see it.

    Before the insert, everything but ``id`` and ``action`` is known, and ``metadata``
    may be changed: it is the dict that will be written (a copy, so the caller's
    options are never touched). After the insert, ``id`` and ``action`` are set — or
    stay ``None`` if the insert failed.
    """

    __slots__ = ("_original", "_row", "action", "id", "metadata")

    def __init__(self, row: JobRow) -> None:
        self._row = row
        self._original = row["metadata"]
        #: The job's metadata, written as it is when the last ``before_insert`` returns.
        self.metadata: dict[str, Any] = dict(self._original)
        #: The job's id once inserted (the existing job's, for a skipped duplicate).
        self.id: int | None = None
        #: What the insert did with this job, once it did.
        self.action: InsertAction | None = None

    @property
    def kind(self) -> str:
        return self._row["kind"]

    @property
    def queue(self) -> str:
        return self._row["queue"]

    @property
    def priority(self) -> int:
        return self._row["priority"]

    @property
    def tags(self) -> list[str]:
        return list(self._row["tags"])

    @property
    def args_json(self) -> Any:
        """The job's args as they will be stored (JSON)."""
        return self._row["args"]

    def __repr__(self) -> str:
        return f"InsertingJob(kind={self.kind!r}, queue={self.queue!r}, id={self.id!r})"


@attrs.frozen
class AttemptResult:
    """How one attempt ended, as the worker saw it when the handler returned.

    Attributes:
        ending: ``completed``, ``failed``, ``cancelled``, ``snoozed``, or ``returned``
            (given back by a shutdown, to run again without spending an attempt).
        discarded: The attempt failed and the job has no attempts left, so it will be
            discarded (decided again when the outcome is written: a cancel requested
            meanwhile makes it cancelled instead).
        duration: Seconds from the handler's start to the end of the attempt.
        exception: What the handler raised, if it raised.
        error: The message recorded in the job's ``errors`` (a timeout has one without
            an exception).
        delay: Seconds until the job runs again (a retry or a snooze), if it does.
    """

    ending: Ending
    duration: float
    discarded: bool = False
    exception: BaseException | None = None
    error: str | None = None
    delay: float | None = None

    @property
    def outcome(self) -> str:
        """One word for metrics: the ending, or ``"discarded"`` for a last failure."""
        return "discarded" if self.discarded else self.ending.value


# --------------------------------------------------------------------------- the protocols


class InsertHook(Protocol):
    """Called around every insert call of this process. Subclass it to inherit no-op
    methods, or implement both methods on any class."""

    def before_insert(self, jobs: Sequence[InsertingJob]) -> None:
        """The jobs are about to be written; their ``metadata`` may be changed."""
        return None

    def after_insert(self, jobs: Sequence[InsertingJob], error: BaseException | None) -> None:
        """The insert statement(s) ran (``error`` is None) or raised ``error``.

        The caller's transaction has not committed yet: a later rollback undoes the
        insert without another call.
        """
        return None


class WorkHook(Protocol):
    """Called around every attempt of a worker. Subclass it to inherit no-op methods,
    or implement both methods on any class."""

    def before_work(self, job: Job[Any]) -> None:
        """The handler is about to run (its timeout has started)."""
        return None

    def after_work(self, job: Job[Any], result: AttemptResult) -> None:
        """The handler returned or raised, or its run was settled without it."""
        return None


def _check_hook(hook: object, option: str, methods: tuple[str, str]) -> None:
    missing = [name for name in methods if not callable(getattr(hook, name, None))]
    if missing:
        raise InvalidOptionsError(
            option,
            f"{hook!r} has no {' or '.join(missing)} method; implement both "
            f"({methods[0]} and {methods[1]}), or subclass sa_jobs.hooks."
            f"{'InsertHook' if option == 'insert_hook' else 'WorkHook'} for no-op defaults",
        )


def _failed(hook: object, call: str) -> None:
    log.exception("%s.%s raised; ignored", type(hook).__name__, call)


# --------------------------------------------------------------------------- insert hooks

_registry_lock = threading.Lock()


class _InsertRegistry:
    """The process's insert hooks: a tuple replaced whole, so readers need no lock."""

    active: tuple[InsertHook, ...] = ()


#: Read by every insert: ``if INSERT_HOOKS.active:`` is all an insert pays without hooks.
INSERT_HOOKS = _InsertRegistry()


def add_insert_hook(hook: InsertHook) -> None:
    """Call ``hook`` around every insert this process makes, after those added before.

    Adding a hook that is registered already does nothing.

    Raises:
        InvalidOptionsError: ``hook`` lacks ``before_insert`` or ``after_insert``.
    """
    _check_hook(hook, "insert_hook", ("before_insert", "after_insert"))
    with _registry_lock:
        if hook not in INSERT_HOOKS.active:
            INSERT_HOOKS.active = (*INSERT_HOOKS.active, hook)


def remove_insert_hook(hook: InsertHook) -> None:
    """Stop calling ``hook`` (no error if it was not registered)."""
    with _registry_lock:
        INSERT_HOOKS.active = tuple(h for h in INSERT_HOOKS.active if h is not hook)


def insert_hooks() -> tuple[InsertHook, ...]:
    """The registered insert hooks, in the order they are called before an insert."""
    return INSERT_HOOKS.active


class InsertCall:
    """One insert call's jobs and hooks: :meth:`begin` runs the ``before_insert`` calls,
    :meth:`end` the ``after_insert`` ones."""

    def __init__(self, hooks: tuple[InsertHook, ...], rows: Sequence[JobRow]) -> None:
        self.hooks = hooks
        self.rows = rows
        self.jobs = [InsertingJob(row) for row in rows]

    def begin(self) -> None:
        for hook in self.hooks:
            try:
                hook.before_insert(self.jobs)
            except Exception:
                _failed(hook, "before_insert")
        for job in self.jobs:
            job._row["metadata"] = self._checked_metadata(job)

    def end(
        self,
        written: Iterable[tuple[int | None, InsertAction]] | None,
        error: BaseException | None = None,
    ) -> None:
        if written is not None:
            for job, (job_id, action) in zip(self.jobs, written, strict=True):
                job.id, job.action = job_id, action
        for hook in reversed(self.hooks):
            try:
                hook.after_insert(self.jobs, error)
            except Exception:
                _failed(hook, "after_insert")

    @staticmethod
    def _checked_metadata(job: InsertingJob) -> dict[str, Any]:
        # A hook that left metadata jsonb cannot store must not fail the insert: the
        # job is written with the metadata it came with.
        try:
            return check_metadata(job.metadata)
        except InvalidOptionsError as exc:
            log.error(
                "an insert hook left unstorable metadata on a %s job (%s); "
                "the job is written without the hooks' changes",
                job.kind,
                exc,
            )
            job.metadata = dict(job._original)
            return job._original


# --------------------------------------------------------------------------- work hooks


class WorkHooks:
    """A worker's work hooks, called in order around each attempt."""

    __slots__ = ("hooks",)

    def __init__(self, hooks: Iterable[WorkHook]) -> None:
        self.hooks = tuple(hooks)

    @staticmethod
    def check(hook: object) -> None:
        """Refuse an object that is not a work hook, when it is registered."""
        _check_hook(hook, "hooks", ("before_work", "after_work"))

    def before(self, job: Job[Any]) -> None:
        for hook in self.hooks:
            try:
                hook.before_work(job)
            except Exception:
                _failed(hook, "before_work")

    def after(self, job: Job[Any], result: AttemptResult) -> None:
        for hook in reversed(self.hooks):
            try:
                hook.after_work(job, result)
            except Exception:
                _failed(hook, "after_work")
