"""Every error sa_jobs raises.

All of them derive from :class:`SaJobsError`; where an error resembles a builtin
(bad input is a ``ValueError``, a missing thing is a ``LookupError``) it also
derives from that builtin, so existing ``except`` clauses keep working. Each
message says what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta as _timedelta

from sa_jobs._base.durations import MAX_DELAY, delay_seconds


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


class InvalidWorkflowError(SaJobsError, ValueError):
    """A workflow cannot be inserted as declared (a step waiting for something that is
    not an earlier step of it, two steps with one name, an empty workflow, a callback that
    is not job args...). Raised before anything is written."""


class WorkflowNotFoundError(SaJobsError, LookupError):
    """No workflow has the given id."""

    def __init__(self, workflow_id: int) -> None:
        self.workflow_id = workflow_id
        super().__init__(
            f"no workflow with id {workflow_id}; use the id insert_workflow() returned"
        )


class UnknownStepError(SaJobsError, LookupError):
    """``job.output_of(name)`` named no step of the job's workflow."""

    def __init__(self, job_id: int, step: str, workflow_id: int | None) -> None:
        self.job_id = job_id
        self.step = step
        self.workflow_id = workflow_id
        where = (
            f"workflow {workflow_id} has no step named {step!r}"
            if workflow_id is not None
            else f"job {job_id} is not a step or callback of a workflow"
        )
        super().__init__(f"{where}; output_of() takes a step name (Workflow.add(name=...))")


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


class JobDiscard(SaJobsError):
    """Raise from a handler to discard the job at once (no more attempts), as if its
    attempts had run out: it ends ``discarded``, where a cancelled job ends ``cancelled``."""

    def __init__(self, reason: str = "discarded by its handler") -> None:
        self.reason = reason
        super().__init__(reason)


class RowMissingError(SaJobsError, LookupError):
    """A referenced row (``sa_jobs.Ref``) does not exist: ``ref.load(session)`` found
    nothing, or the worker found it gone before the handler ran."""

    def __init__(self, model: str, table: str, pk: tuple[object, ...]) -> None:
        self.model = model
        self.table = table
        self.pk = pk
        shown = repr(pk[0]) if len(pk) == 1 else repr(pk)
        super().__init__(f"{model} {shown} does not exist (no row in table {table!r})")


class JobSnooze(SaJobsError):
    """Raise from a handler to run the job again after ``delay``, without spending an
    attempt.

    ``delay`` is a timedelta or a number of seconds; longer than
    :data:`sa_jobs._base.durations.MAX_DELAY` (365 days) is clamped to it.

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


class InvalidOutputError(SaJobsError, ValueError):
    """A job's output cannot be stored: it does not convert to the kind's ``output=``
    type, is not JSON that ``jsonb`` keeps as it is, or is larger than the cap. From a
    handler's return value it fails that attempt (retried per the retry policy)."""


class OutputTooLargeError(InvalidOutputError):
    """A job's output encodes to more bytes than the cap allows."""

    def __init__(self, kind: str, size: int, limit: int) -> None:
        self.kind = kind
        self.size = size
        self.limit = limit
        super().__init__(
            f"the output of kind {kind!r} encodes to {size} bytes of JSON, over the cap of "
            f"{limit} bytes; store large results elsewhere (a table, object storage) and "
            "return a reference, or raise the cap (Worker(max_output_bytes=...) or "
            "job_args(max_output_bytes=...))"
        )


class WaitError(SaJobsError):
    """The base of what :func:`sa_jobs.wait_for` raises when a job ended without output
    to return, or did not end in time."""

    def __init__(self, job_id: int, message: str) -> None:
        self.job_id = job_id
        super().__init__(message)


class JobDiscardedError(WaitError):
    """The awaited job was discarded: its attempts ran out (``errors`` holds them)."""

    def __init__(self, job_id: int, errors: list[dict[str, object]]) -> None:
        self.errors = errors
        last = errors[-1].get("error") if errors else None
        super().__init__(
            job_id,
            f"job {job_id} was discarded after {len(errors)} failed attempt(s)"
            + (f"; the last error: {last}" if last else "")
            + "; retry it (sa_jobs.retry_job) to wait again",
        )


class JobCancelledWaitError(WaitError):
    """The awaited job was cancelled; ``reason`` is why, when it was recorded."""

    def __init__(self, job_id: int, reason: str | None, metadata: dict[str, object]) -> None:
        self.reason = reason
        self.metadata = metadata
        super().__init__(
            job_id,
            f"job {job_id} was cancelled"
            + (f": {reason}" if reason else "")
            + "; it has no output",
        )


class WaitTimeoutError(WaitError, TimeoutError):
    """The awaited job did not finish within the timeout; ``state`` is where it was."""

    def __init__(self, job_id: int, state: str, timeout: float) -> None:
        self.state = state
        self.timeout = timeout
        super().__init__(
            job_id,
            f"job {job_id} did not finish within {timeout:g} s; it is {state!r}. Wait again "
            "with a longer timeout, or look at it with `sa-jobs jobs show "
            f"{job_id}`",
        )
