"""Insert options: what a caller may set, how it is validated, and how it is resolved.

Precedence is River's: the call site wins over the args class's declared defaults, which
win over the library defaults. Every check runs when the options are built, before any
SQL is sent, so bad input never leaves a half-written batch behind.
"""

from __future__ import annotations

import datetime as dt
import difflib
import enum
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

import attrs

from sa_jobs._base.durations import MAX_TTL, check_instant
from sa_jobs._base.states import JobState
from sa_jobs._declare.option_checks import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    check_max_attempts,
    check_metadata,
    check_priority,
    check_queue,
    check_scheduled_at,
    check_tags,
    check_text,
    check_timeout,
)
from sa_jobs.errors import InvalidOptionsError

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_QUEUE",
    "DEFAULT_UNIQUE_STATES",
    "REQUIRED_UNIQUE_STATES",
    "UNSET",
    "InsertOptions",
    "InsertOpts",
    "JobKeyMode",
    "KindDefaults",
    "ResolvedInsert",
    "SequenceOpts",
    "UniqueOpts",
]


class _Unset:
    """Marks an option nobody set (``None`` is a meaningful timeout: no limit)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


def validate_kind_defaults(defaults: KindDefaults) -> None:
    """Fail at declaration time on a bad per-kind default."""
    if defaults.queue is not None:
        check_queue(defaults.queue)
    if defaults.priority is not None:
        check_priority(defaults.priority)
    if defaults.max_attempts is not None:
        check_max_attempts(defaults.max_attempts)
    if defaults.tags is not None:
        check_tags(defaults.tags)
    if defaults.timeout is not UNSET:
        check_timeout(defaults.timeout)
    if defaults.unique is not None:
        check_unique(defaults.unique)
    if defaults.sequence is not None:
        check_sequence(defaults.sequence)


def check_unique(unique: object) -> UniqueOpts:
    if not isinstance(unique, UniqueOpts):
        raise InvalidOptionsError(
            "unique", f"must be a sa_jobs.UniqueOpts, got {type(unique).__name__}"
        )
    return unique


# --------------------------------------------------------------------------- unique jobs

#: The states in which a unique job blocks duplicates unless ``by_state`` says otherwise:
#: every state but cancelled and discarded (River's default).
DEFAULT_UNIQUE_STATES: frozenset[JobState] = frozenset(JobState) - {
    JobState.CANCELLED,
    JobState.DISCARDED,
}
#: States every custom ``by_state`` must keep: the transitions between them (insert,
#: schedule, fetch) have no way to resolve a conflict.
REQUIRED_UNIQUE_STATES: frozenset[JobState] = frozenset(
    {JobState.AVAILABLE, JobState.PENDING, JobState.RUNNING, JobState.SCHEDULED}
)


def _unique_states(value: Iterable[JobState | str] | None) -> frozenset[JobState] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise InvalidOptionsError("by_state", "must be a list of states, not a string")
    if not isinstance(value, Iterable):
        raise InvalidOptionsError("by_state", f"must be a list of states, got {value!r}")
    try:
        states = frozenset(JobState(state) for state in value)
    except ValueError as exc:
        raise InvalidOptionsError("by_state", str(exc)) from None
    if not states:
        return None  # River: an empty list means the default states
    missing = REQUIRED_UNIQUE_STATES - states
    if missing:
        names = ", ".join(sorted(state.value for state in missing))
        raise InvalidOptionsError(
            "by_state",
            f"must include {names}: sa_jobs cannot resolve a uniqueness conflict on the "
            "transitions between available, pending, running and scheduled",
        )
    return states


def _at_least_a_second(option: str) -> Any:
    """River's ByPeriod and Faktory's unique_for are whole seconds at least."""

    def validator(_instance: Any, _attribute: Any, value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, dt.timedelta):
            raise InvalidOptionsError(option, f"must be a timedelta, got {value!r}")
        if value < dt.timedelta(seconds=1):
            raise InvalidOptionsError(option, f"must be at least 1 second, got {value}")

    return validator


def _ttl(_instance: Any, attribute: Any, value: Any) -> None:
    _at_least_a_second("ttl")(_instance, attribute, value)
    if value is not None and value > MAX_TTL:
        raise InvalidOptionsError(
            "ttl", f"{value} is longer than the longest TTL lock, {MAX_TTL.days} days"
        )


def _until(_instance: Any, _attribute: Any, value: Any) -> None:
    if value not in ("success", "start"):
        raise InvalidOptionsError("until", f"must be 'success' or 'start', got {value!r}")


@attrs.frozen
class UniqueOpts:
    """Which jobs count as duplicates of each other (River's UniqueOpts, Faktory's lock).

    The kind is always part of the key (unless ``exclude_kind``); each option set adds a
    dimension and so *relaxes* uniqueness. ``UniqueOpts()`` with nothing set means no
    uniqueness at all.

    Attributes:
        by_args: Include the encoded args — all of them, or only the fields marked
            ``sa_jobs.field(unique=True)`` (nested attrs classes included) if any are.
            A marked field holding an attrs class that marks fields of its own
            contributes only those.
        by_period: Include the insert time (or ``scheduled_at``) floored to a multiple of
            this period, counted from the Unix epoch in UTC. At least 1 second.
        by_queue: Include the queue.
        by_state: States in which a job blocks duplicates. Default (also for ``[]``): all
            but cancelled and discarded, and with a ``ttl`` not completed either. Must
            include available, pending, running and scheduled.
        exclude_kind: Leave the kind out, so different kinds share keys.
        ttl: Faktory's ``unique_for``: the job stops blocking duplicates ``ttl`` after
            the later of its insert and its ``scheduled_at``, even if it has not
            finished. From 1 second to 365 days.
        until: ``"success"`` (default): the lock follows ``by_state``; ``"start"``: the
            lock is released when the job starts, and a retry never retakes it.
    """

    by_args: bool = False
    by_period: dt.timedelta | None = attrs.field(
        default=None, validator=_at_least_a_second("by_period")
    )
    by_queue: bool = False
    by_state: frozenset[JobState] | None = attrs.field(default=None, converter=_unique_states)
    exclude_kind: bool = False
    ttl: dt.timedelta | None = attrs.field(default=None, validator=_ttl)
    until: str = attrs.field(default="success", validator=_until)

    @property
    def is_empty(self) -> bool:
        return not (
            self.by_args
            or self.by_period is not None
            or self.by_queue
            or self.by_state is not None
            or self.exclude_kind
            or self.ttl is not None
            or self.until != "success"
        )

    @property
    def states(self) -> frozenset[JobState]:
        """The states in which a job blocks its duplicates.

        ``by_state`` when given. Otherwise River's default — every state but cancelled
        and discarded — except that with a ``ttl`` a completed job does not block
        either: Faktory's lock ends "after the TTL or after the job has successfully
        processed".
        """
        if self.by_state is not None:
            return self.by_state
        if self.ttl is not None:
            return DEFAULT_UNIQUE_STATES - {JobState.COMPLETED}
        return DEFAULT_UNIQUE_STATES


# --------------------------------------------------------------------------- sequences


@attrs.frozen
class SequenceOpts:
    """Run jobs one at a time, in id order, per sequence key (River Pro's sequences).

    ``SequenceOpts()`` sequences all jobs of the kind together; each option narrows the
    key so more sequences run in parallel.

    Attributes:
        by_args: Include the encoded args — all of them, or only the fields marked
            ``sa_jobs.field(sequence=True)`` if the class marks any.
        by_queue: Include the queue.
        exclude_kind: Leave the kind out, so several kinds share one sequence.
        continue_on_cancelled: A cancelled job does not halt its sequence.
        continue_on_discarded: A discarded job does not halt its sequence.
    """

    by_args: bool = False
    by_queue: bool = False
    exclude_kind: bool = False
    continue_on_cancelled: bool = False
    continue_on_discarded: bool = False

    def __attrs_post_init__(self) -> None:
        if self.exclude_kind and not (self.by_args or self.by_queue):
            raise InvalidOptionsError(
                "exclude_kind",
                "with neither by_args nor by_queue, excluding the kind would put every "
                "sequenced job of every kind in one sequence; add by_args or by_queue",
            )


def check_sequence(sequence: object) -> SequenceOpts:
    if not isinstance(sequence, SequenceOpts):
        raise InvalidOptionsError(
            "sequence", f"must be a sa_jobs.SequenceOpts, got {type(sequence).__name__}"
        )
    return sequence


# --------------------------------------------------------------------------- job keys

MAX_JOB_KEY_LENGTH = 512


class JobKeyMode(enum.StrEnum):
    """What adding a job does to an existing job with the same key."""

    #: Overwrite the unlocked job with the new values (a debounce with ``scheduled_at``).
    REPLACE = "replace"
    #: Overwrite it but keep its ``scheduled_at`` (a throttle / fixed batching window).
    PRESERVE_RUN_AT = "preserve_run_at"
    #: Return the existing job untouched, even running or failed. Dangerous: the add
    #: may cause no work at all.
    UNSAFE_DEDUPE = "unsafe_dedupe"


def check_job_key(job_key: object) -> str:
    if not isinstance(job_key, str) or not job_key:
        raise InvalidOptionsError("job_key", f"must be a non-empty string, got {job_key!r}")
    if len(job_key) > MAX_JOB_KEY_LENGTH:
        raise InvalidOptionsError(
            "job_key", f"is {len(job_key)} characters; the limit is {MAX_JOB_KEY_LENGTH}"
        )
    check_text("job_key", job_key)
    return job_key


def _job_key_mode(value: object) -> JobKeyMode | None:
    if value is None:
        return None
    try:
        return JobKeyMode(str(value))
    except ValueError:
        modes = ", ".join(mode.value for mode in JobKeyMode)
        raise InvalidOptionsError(
            "job_key_mode", f"must be one of {modes}, got {value!r}"
        ) from None


def _optional(check: Any) -> Any:
    def validator(_instance: Any, _attribute: Any, value: Any) -> None:
        if value is not None:
            check(value)

    return validator


def _tags_or_none(value: Any) -> tuple[str, ...] | None:
    return None if value is None else check_tags(value)


@attrs.frozen
class KindDefaults:
    """Per-kind insert defaults declared on the args class (``@sa_jobs.job_args``).

    ``None`` means "not set here": the call site may set it, otherwise the library
    default applies (queue ``"default"``, priority 1, 25 attempts, no tags).
    """

    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    tags: tuple[str, ...] | None = None
    timeout: dt.timedelta | Any | None = UNSET
    unique: UniqueOpts | None = None
    sequence: SequenceOpts | None = None


@attrs.frozen
class InsertOpts:
    """Per-call insert options; ``None`` means "use the kind's default, else the library's".

    Attributes:
        queue: Queue name, 1-128 characters. Library default ``"default"``.
        priority: 1 (most urgent) to 4. Library default 1.
        max_attempts: Attempts before the job is discarded, at least 1. Library default 25.
        tags: Free-form labels (at most 64, each 1-255 characters). Library default none.
        metadata: A JSON object stored with the job, for your own bookkeeping.
        scheduled_at: When the job becomes due (time-zone aware). A future time makes the
            job ``scheduled``; omitted or past means ``available`` now (database clock).
        unique: Uniqueness for this job, overriding the kind's; ``UniqueOpts()`` turns the
            kind's uniqueness off for this call.
        sequence: The sequence this job joins, overriding the kind's.
        job_key: Graphile Worker's job key (1-512 characters): adding a job with the key
            of an existing one replaces it (see ``job_key_mode``).
        job_key_mode: ``replace`` (default), ``preserve_run_at`` or ``unsafe_dedupe``.
    """

    queue: str | None = attrs.field(default=None, validator=_optional(check_queue))
    priority: int | None = attrs.field(default=None, validator=_optional(check_priority))
    max_attempts: int | None = attrs.field(default=None, validator=_optional(check_max_attempts))
    tags: tuple[str, ...] | None = attrs.field(default=None, converter=_tags_or_none)
    metadata: Mapping[str, Any] | None = attrs.field(
        default=None, validator=_optional(check_metadata)
    )
    scheduled_at: dt.datetime | None = attrs.field(
        default=None, validator=_optional(check_scheduled_at)
    )
    unique: UniqueOpts | None = attrs.field(default=None, validator=_optional(check_unique))
    sequence: SequenceOpts | None = attrs.field(default=None, validator=_optional(check_sequence))
    job_key: str | None = attrs.field(default=None, validator=_optional(check_job_key))
    job_key_mode: JobKeyMode | None = attrs.field(default=None, converter=_job_key_mode)

    def resolve(self, declared: KindDefaults) -> ResolvedInsert:
        """Combine with a kind's declared defaults and the library defaults."""
        return ResolvedInsert(
            queue=_first(self.queue, declared.queue, DEFAULT_QUEUE),
            priority=_first(self.priority, declared.priority, DEFAULT_PRIORITY),
            max_attempts=_first(self.max_attempts, declared.max_attempts, DEFAULT_MAX_ATTEMPTS),
            tags=_first(self.tags, declared.tags, ()),
            metadata=dict(self.metadata) if self.metadata is not None else {},
            scheduled_at=self.scheduled_at,
            unique=self.unique if self.unique is not None else declared.unique,
            sequence=self.sequence if self.sequence is not None else declared.sequence,
            job_key=self.job_key,
            job_key_mode=self.job_key_mode or JobKeyMode.REPLACE,
        ).checked()


class InsertOptions(TypedDict, total=False):
    """The keyword form of :class:`InsertOpts`, for ``**options`` parameters
    (``sa_jobs.insert(session, args, priority=2)``): mypy checks each name and type."""

    queue: str | None
    priority: int | None
    max_attempts: int | None
    tags: Iterable[str] | None
    metadata: Mapping[str, Any] | None
    scheduled_at: dt.datetime | None
    unique: UniqueOpts | None
    sequence: SequenceOpts | None
    job_key: str | None
    job_key_mode: JobKeyMode | str | None


def insert_opts(opts: InsertOpts | None, options: Mapping[str, Any]) -> InsertOpts:
    """The options of a call: an ``InsertOpts``, keywords, or both (keywords win).

    Raises:
        InvalidOptionsError: an unknown keyword (with the closest known one), or a value
            its check refuses.
    """
    unknown = sorted(set(options) - _INSERT_OPTION_NAMES)
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, _INSERT_OPTION_NAMES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise InvalidOptionsError(
            name,
            f"is not an insert option; {hint}the options are "
            + ", ".join(sorted(_INSERT_OPTION_NAMES)),
        )
    if opts is not None and options:
        return attrs.evolve(opts, **options)
    if options:
        return InsertOpts(**options)
    return opts if opts is not None else InsertOpts()


_INSERT_OPTION_NAMES = frozenset(attrs.fields_dict(InsertOpts))


def _first(*values: Any) -> Any:
    return next(value for value in values if value is not None)


@attrs.frozen
class ResolvedInsert:
    """Fully resolved column values for one job row (everything but the args)."""

    queue: str
    priority: int
    max_attempts: int
    tags: tuple[str, ...]
    metadata: dict[str, Any]
    scheduled_at: dt.datetime | None
    unique: UniqueOpts | None = None
    sequence: SequenceOpts | None = None
    job_key: str | None = None
    job_key_mode: JobKeyMode = JobKeyMode.REPLACE

    def checked(self) -> ResolvedInsert:
        """Refuse combinations whose meaning would be ambiguous, or whose values the
        database could store but not give back."""
        ttl = self.unique.ttl if self.unique is not None else None
        if ttl is not None and self.scheduled_at is not None:
            try:
                check_instant(self.scheduled_at, plus=ttl)
            except ValueError as exc:
                raise InvalidOptionsError("scheduled_at", str(exc)) from None
        if self.job_key is not None and self.unique is not None and not self.unique.is_empty:
            raise InvalidOptionsError(
                "job_key",
                "cannot be combined with unique options: a job key already keeps one job per "
                "key (and replaces it), uniqueness would skip the insert instead; pick one, "
                "or pass unique=UniqueOpts() to turn the kind's uniqueness off",
            )
        if self.job_key is not None and self.sequence is not None:
            raise InvalidOptionsError(
                "job_key",
                "cannot be combined with a sequence: replacing a job would reorder its "
                "sequence; use one or the other",
            )
        return self
