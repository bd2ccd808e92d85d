"""Limits across processes: how many jobs of a queue or kind may run at once, and how
many may start per period, counted over every worker process.

Declared in the worker's configuration, as River Pro and Oban Pro do::

    Worker(engine, queues={"mail": 10, "api": 5}, limits=[
        sa_jobs.ConcurrencyLimit(queue="mail", max_running=5),
        sa_jobs.ConcurrencyLimit(kind=SendEmail, max_running=2),
        sa_jobs.RateLimit(queue="api", max_starts=100, per=timedelta(minutes=1)),
    ])

Each value is checked where it is built, and the worker checks the set against its queues
when it is constructed; nothing is written either way. The fetch that enforces them is
:mod:`sa_jobs.worker.limited_fetch`; ``docs/queues.md`` ("Limits") says why it is sound.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Collection, Iterable, Mapping
from typing import Literal

import attrs

from sa_jobs._declare.args import check_kind, default_registry
from sa_jobs._declare.option_checks import check_positive_count, check_queue
from sa_jobs._declare.partitions import (
    KeySpec,
    check_field_names,
    check_metadata_key,
    key_spec_of,
)
from sa_jobs.errors import InvalidOptionsError

__all__ = [
    "MAX_LIMIT",
    "MAX_RATE_PERIOD",
    "MIN_RATE_PERIOD",
    "ConcurrencyLimit",
    "Limit",
    "LimitScope",
    "RateLimit",
    "check_worker_limits",
    "unhandled_kind_limits",
]

#: The largest ``max_running`` / ``max_starts`` (they are bound as PostgreSQL integers).
MAX_LIMIT = 2**31 - 1
#: A rate period under a second would be decided by clock resolution and fetch latency
#: rather than by the limit; longer than a year is a typo.
MIN_RATE_PERIOD = dt.timedelta(seconds=1)
MAX_RATE_PERIOD = dt.timedelta(days=365)


@attrs.frozen
class LimitScope:
    """What a limit counts: the jobs of one queue (``by="queue"``) or of one kind."""

    by: Literal["queue", "kind"]
    name: str

    @property
    def key(self) -> str:
        """The scope as one string (``queue:mail``, ``kind:send_email``): the rate
        windows' ``scope`` column and the input of the advisory lock's number."""
        return f"{self.by}:{self.name}"

    def __str__(self) -> str:
        return f"{self.by} {self.name!r}"


def _kind_name(kind: object) -> str | None:
    return None if kind is None else check_kind(kind)


def _key_fields(fields: object) -> tuple[str, ...] | None:
    return None if fields is None else check_field_names("by_args", fields)


def _metadata_key(name: object) -> str | None:
    return None if name is None else check_metadata_key("by_metadata", name)


def _check_keyed(
    option: str, kind: str | None, by_args: tuple[str, ...] | None, by_metadata: str | None
) -> KeySpec | None:
    """The limit's key, if it counts by one (``by_args`` or ``by_metadata``)."""
    spec = key_spec_of(by_args, by_metadata, "by_args", "by_metadata")
    if spec is None:
        return None
    if kind is not None:
        # Refused, not deferred: docs/dev/decisions.md ("Limits by key are per queue
        # only") says why a (kind, key) cap does not fit the keyed walk's bounded cost.
        raise InvalidOptionsError(
            spec.describe().partition("=")[0],
            f"{option} by key counts the jobs of a queue (queue=...), not of a kind: put "
            "the kind's jobs in a queue of their own (job_args(queue=...)) and limit that "
            "queue by key",
        )
    return spec


def _scope_of(option: str, queue: str | None, kind: str | None) -> LimitScope:
    if (queue is None) == (kind is None):
        raise InvalidOptionsError(
            option,
            "name exactly one of queue= or kind= (a limit counts the jobs of one queue, "
            f"or of one kind in every queue), got queue={queue!r}, kind={kind!r}",
        )
    if queue is not None:
        return LimitScope("queue", check_queue(queue))
    assert kind is not None  # checked by the field's converter (args.check_kind)
    return LimitScope("kind", kind)


def _positive_count(option: str, value: object) -> int:
    return check_positive_count(
        option,
        value,
        maximum=MAX_LIMIT,
        hint="to stop a queue, pause it or leave it out of the worker's queues",
    )


@attrs.frozen
class ConcurrencyLimit:
    """At most ``max_running`` jobs of a queue, or of a kind, run at once across every
    worker process (not per process: that is the worker's ``queues`` concurrency).

    Attributes:
        max_running: The most jobs of the scope in ``running`` at any moment (>= 1).
        queue: Count the jobs of this queue (the worker must serve it), or
        kind: count the jobs of this kind (an args class or its kind string) in every
            queue the worker serves. Exactly one of the two.
        by_args: Count per partition key instead: at most ``max_running`` jobs **of each
            key** (the args fields named, which the kinds of the queue declare with
            ``job_args(partition_by=...)``). With ``queue=``.
        by_metadata: Count per partition key taken from this key of the jobs'
            metadata (the kinds declare ``job_args(partition_by_metadata=...)``); instead
            of ``by_args``.

    Raises:
        InvalidOptionsError: both or neither scope, or a limit under 1, or bad by_args.
    """

    max_running: int = attrs.field()
    queue: str | None = attrs.field(default=None, kw_only=True)
    kind: str | None = attrs.field(default=None, converter=_kind_name, kw_only=True)
    by_args: tuple[str, ...] | None = attrs.field(default=None, converter=_key_fields, kw_only=True)
    by_metadata: str | None = attrs.field(default=None, converter=_metadata_key, kw_only=True)

    def __attrs_post_init__(self) -> None:
        _scope_of("ConcurrencyLimit", self.queue, self.kind)
        _positive_count("max_running", self.max_running)
        _check_keyed("ConcurrencyLimit", self.kind, self.by_args, self.by_metadata)

    @property
    def key_spec(self) -> KeySpec | None:
        """What the limit counts by, if by key."""
        return _check_keyed("ConcurrencyLimit", self.kind, self.by_args, self.by_metadata)

    @property
    def scope(self) -> LimitScope:
        return _scope_of("ConcurrencyLimit", self.queue, self.kind)


def _period(value: object) -> dt.timedelta:
    if isinstance(value, bool) or not isinstance(value, dt.timedelta | int | float):
        raise InvalidOptionsError("per", f"must be a timedelta or seconds, got {value!r}")
    if not isinstance(value, dt.timedelta):
        if not math.isfinite(value):
            raise InvalidOptionsError("per", f"must be finite, got {value!r}")
        value = dt.timedelta(seconds=value)
    if not MIN_RATE_PERIOD <= value <= MAX_RATE_PERIOD:
        raise InvalidOptionsError(
            "per",
            f"must be from 1 second to 365 days, got {value}; for a finer rate, use a longer "
            "period with a proportionally larger max_starts",
        )
    return value


@attrs.frozen
class RateLimit:
    """At most ``max_starts`` jobs of a queue, or of a kind, start in any ``per``-long
    stretch of time (a sliding window), across every worker process.

    A start is a fetch: the moment a job becomes ``running``; a retry starts again and
    counts again. The accounting keeps counts per twentieth of the period, so the limit
    errs on the safe side by at most that much: under steady demand, a little over
    ``max_starts`` per ``1.05 * per``.

    Attributes:
        max_starts: The most starts in any ``per``-long stretch (>= 1).
        per: The window, a ``timedelta`` or seconds, from 1 second to 365 days.
        queue: Count the starts of this queue (the worker must serve it), or
        kind: count the starts of this kind (an args class or its kind string) in every
            queue the worker serves. Exactly one of the two.
        by_args: Count per partition key instead: at most ``max_starts`` starts **of
            each key** per ``per`` (see :class:`ConcurrencyLimit`). With ``queue=``.
        by_metadata: As ``by_args``, the key taken from the jobs' metadata.

    Raises:
        InvalidOptionsError: both or neither scope, a limit under 1, a period out of
            range, or bad by_args.
    """

    max_starts: int = attrs.field()
    per: dt.timedelta = attrs.field(converter=_period)
    queue: str | None = attrs.field(default=None, kw_only=True)
    kind: str | None = attrs.field(default=None, converter=_kind_name, kw_only=True)
    by_args: tuple[str, ...] | None = attrs.field(default=None, converter=_key_fields, kw_only=True)
    by_metadata: str | None = attrs.field(default=None, converter=_metadata_key, kw_only=True)

    def __attrs_post_init__(self) -> None:
        _scope_of("RateLimit", self.queue, self.kind)
        _positive_count("max_starts", self.max_starts)
        _check_keyed("RateLimit", self.kind, self.by_args, self.by_metadata)

    @property
    def key_spec(self) -> KeySpec | None:
        """What the limit counts by, if by key."""
        return _check_keyed("RateLimit", self.kind, self.by_args, self.by_metadata)

    @property
    def scope(self) -> LimitScope:
        return _scope_of("RateLimit", self.queue, self.kind)


Limit = ConcurrencyLimit | RateLimit


def check_worker_limits(limits: Iterable[object], queues: Mapping[str, int]) -> tuple[Limit, ...]:
    """The worker's ``limits``, checked against the queues it serves.

    Raises:
        InvalidOptionsError: something that is not a limit, a queue limit on a queue the
            worker does not serve, or two limits of one type on one scope.
    """
    if isinstance(limits, ConcurrencyLimit | RateLimit | str | bytes):
        raise InvalidOptionsError("limits", f"must be a list of limits, got {limits!r}")
    checked: list[Limit] = []
    seen: set[tuple[type, LimitScope, bool]] = set()
    keyed: dict[LimitScope, KeySpec] = {}
    for limit in limits:
        if not isinstance(limit, ConcurrencyLimit | RateLimit):
            raise InvalidOptionsError(
                "limits",
                f"expected sa_jobs.ConcurrencyLimit or sa_jobs.RateLimit, got {limit!r}",
            )
        scope = limit.scope
        if scope.by == "queue" and scope.name not in queues:
            raise InvalidOptionsError(
                "limits",
                f"{type(limit).__name__} names queue {scope.name!r}, which this worker does "
                f"not serve (its queues: {', '.join(sorted(queues))}); add the queue to "
                "queues= or drop the limit",
            )
        spec = limit.key_spec
        by_key = spec is not None
        if (type(limit), scope, by_key) in seen:
            what = " by key" if by_key else ""
            raise InvalidOptionsError(
                "limits", f"two {type(limit).__name__}s{what} for {scope}; keep one"
            )
        seen.add((type(limit), scope, by_key))
        if spec is not None:
            other = keyed.setdefault(scope, spec)
            if other != spec:
                raise InvalidOptionsError(
                    "limits",
                    f"limits by key on {scope} name {other.describe()} and {spec.describe()}; "
                    "a job has one partition key, so name the same",
                )
        checked.append(limit)
    return tuple(checked)


def unhandled_kind_limits(limits: Iterable[Limit], handled: Collection[str]) -> list[str]:
    """A warning for each kind limit on a kind none of ``handled`` (the kinds the worker
    has handlers for) is: most likely a typo, and a limit that silently does nothing.

    Not refused at construction: handlers are usually registered after the worker is
    built, so the worker checks when it starts (see ``docs/queues.md``, "Limits").
    """
    warnings = []
    for limit in limits:
        scope = limit.scope
        if scope.by != "kind" or scope.name in handled:
            continue
        if scope.name in default_registry:
            why = "a job args class declares it, but this worker has no handler for it"
        else:
            why = "no job args class declares it either (a typo?)"
        kinds = ", ".join(sorted(handled)) or "none"
        warnings.append(
            f"{type(limit).__name__} names kind {scope.name!r}, which no handler of this "
            f"worker runs ({why}; its handlers' kinds: {kinds}): the limit holds no job "
            "this worker works. Fix the kind, register its handler, or drop the limit"
        )
    return warnings
