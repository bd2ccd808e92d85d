"""Every error sa_jobs raises.

All of them derive from :class:`SaJobsError`; where an error resembles a builtin
(bad input is a ``ValueError``, a missing thing is a ``LookupError``) it also
derives from that builtin, so existing ``except`` clauses keep working. Each
message says what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta as _timedelta

from sa_jobs.durations import MAX_DELAY, delay_seconds


def a_or_an(noun: str) -> str:
    """``noun`` with its indefinite article, for messages that name a type: "an Engine",
    "an int", "a str" (by the first letter; type names rarely need better)."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


class SaJobsError(Exception):
    """The root of every sa_jobs error."""


class InvalidJobArgsError(SaJobsError, ValueError):
    """A job args class or value cannot be used (not convertible, bad declaration)."""


class UnknownKindError(SaJobsError, LookupError):
    """A kind string names no registered job args class."""

    def __init__(self, kind: str, message: str | None = None) -> None:
        self.kind = kind
        super().__init__(
            message
            or f"no job args class is registered for kind {kind!r}; decorate a class with "
            f"@sa_jobs.job_args(kind={kind!r}) and make sure its module is imported"
        )


class UnknownQueueError(SaJobsError, LookupError):
    """A queue named in a queue control or a job filter is known to nothing: no job is in
    it, no worker serves it, and it was never paused (a misspelt name, most likely)."""

    def __init__(self, queue: str, hint: str = "") -> None:
        self.queue = queue
        super().__init__(
            f"no job, worker or queue control names queue {queue!r}; check its spelling"
            + (f" ({hint})" if hint else "")
        )


class DuplicateKindError(SaJobsError, ValueError):
    """Two different classes claim the same kind."""

    def __init__(self, kind: str, existing: type, new: type) -> None:
        self.kind = kind
        self.existing = existing
        self.new = new
        owner = f"{existing.__module__}.{existing.__qualname__}"
        super().__init__(
            f"kind {kind!r} is already registered by {owner}; "
            f"give {new.__module__}.{new.__qualname__} a different kind= (kinds are stored in "
            "job rows, so they must stay unique and stable)"
        )


class DuplicateHandlerError(SaJobsError, ValueError):
    """A worker was given a second handler for a kind."""

    def __init__(self, kind: str, existing: object, new: object) -> None:
        self.kind = kind
        self.existing = existing
        self.new = new
        super().__init__(
            f"kind {kind!r} already has a handler in this worker, {_describe_function(existing)}; "
            f"a worker runs one handler per kind, so register {_describe_function(new)} for "
            "another args class (or remove the first registration)"
        )


def _describe_function(function: object) -> str:
    module = getattr(function, "__module__", None)
    name = getattr(function, "__qualname__", None) or repr(function)
    return f"{module}.{name}" if module else str(name)


class InvalidOptionsError(SaJobsError, ValueError):
    """An insert, unique, sequence or worker option is out of range or contradictory."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"{option}: {message}")


class SchemaMissingError(SaJobsError, LookupError):
    """The tables (or a feature's columns) are not in the database yet, or not at the
    version this sa_jobs needs (``outdated``)."""

    def __init__(self, branch: str, detail: str = "", *, outdated: bool = False) -> None:
        self.branch = branch
        self.outdated = outdated
        how = (
            "run `sa-jobs migrate` (or `alembic upgrade heads` with sa_jobs' migrations in your "
            "version_locations)"
        )
        status = "is not up to date" if outdated else "is not installed"
        what = f"the sa_jobs {branch!r} migration branch {status} in this database"
        super().__init__(f"{what}; {how}" + (f" ({detail})" if detail else ""))


class SchemaManagedElsewhereError(SaJobsError):
    """``sa-jobs migrate`` found sa_jobs' tables installed by another Alembic environment."""

    def __init__(self, version_table: str) -> None:
        self.version_table = version_table
        super().__init__(
            f"sa_jobs' tables are already in this database, but {version_table} does not "
            "record them: another Alembic environment (your application's, whose "
            "alembic_version lists the sajobs_ revisions) installed them; upgrade them there "
            "with `alembic upgrade heads` rather than with sa-jobs migrate"
        )


class JobNotFoundError(SaJobsError, LookupError):
    """No job has the given id."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id}; it may have been removed by the cleaner")


class JobStateError(SaJobsError):
    """The job is not in a state that allows the operation."""

    def __init__(self, job_id: int, state: str, operation: str, allowed: Iterable[str]) -> None:
        self.job_id = job_id
        self.state = state
        self.operation = operation
        allowed_text = ", ".join(sorted(allowed))
        super().__init__(
            f"cannot {operation} job {job_id}: it is {state!r}, and {operation} needs one of "
            f"{allowed_text}"
        )


class JobInterruptedError(SaJobsError):
    """The worker asked a running job to stop; raised by ``job.check_cancelled()``."""

    reason = "interrupted"

    def __init__(self, job_id: int, detail: str = "") -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} was {self.reason}" + (f": {detail}" if detail else ""))


class JobTimeoutError(JobInterruptedError, TimeoutError):
    """The job ran past its timeout; the attempt is failed and retried per policy."""

    reason = "timed out"


class JobCancelledError(JobInterruptedError):
    """The job was cancelled (``sa_jobs.cancel_job``); it ends ``cancelled``."""

    reason = "cancelled"


class WorkerShutdownError(JobInterruptedError):
    """The worker is shutting down; the job goes back to ``available`` without spending
    an attempt."""

    reason = "interrupted by worker shutdown"


class JobCancel(SaJobsError):
    """Raise from a handler to cancel the job for good (no more attempts)."""

    def __init__(self, reason: str = "cancelled by its handler") -> None:
        self.reason = reason
        super().__init__(reason)


class JobSnooze(SaJobsError):
    """Raise from a handler to run the job again after ``delay``, without spending an
    attempt.

    ``delay`` is a timedelta or a number of seconds; longer than
    :data:`sa_jobs.durations.MAX_DELAY` (365 days) is clamped to it.

    Raises:
        InvalidOptionsError: the delay is negative, NaN or infinite (raised where the
            snooze is built, so the handler's attempt fails with this error).
    """

    def __init__(self, delay: float | _timedelta) -> None:
        try:
            seconds = delay_seconds(delay, maximum=MAX_DELAY)
        except ValueError as exc:
            raise InvalidOptionsError("snooze delay", str(exc)) from None
        self.seconds = seconds
        super().__init__(f"snoozed for {seconds:g} s")


class NoHandlerError(SaJobsError, LookupError):
    """The worker fetched a job of a kind it has no handler for."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(
            f"this worker has no handler for kind {kind!r}; register one with "
            f"@worker.handler(<args class of {kind!r}>) or route the kind to another queue"
        )


class UniqueConflictError(SaJobsError):
    """Making the job runnable again would duplicate a unique job that is still active."""

    def __init__(self, job_id: int, holder_id: int | None) -> None:
        self.job_id = job_id
        self.holder_id = holder_id
        holder = f"job {holder_id}" if holder_id is not None else "another job"
        super().__init__(
            f"cannot retry job {job_id}: its unique key is held by {holder}; wait for that "
            "job to finish (or cancel it), then retry"
        )


class BenchmarkError(SaJobsError, RuntimeError):
    """``sa-jobs bench`` could not finish a measurement (a worker process died, jobs were
    left unfinished); the message says which."""


class PeriodicJobNotFoundError(SaJobsError, LookupError):
    """No periodic job of that name is in the database."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"no periodic job named {name!r} in the database; a worker registers its periodic "
            "jobs when it starts (see `sa-jobs periodic list`)"
        )
