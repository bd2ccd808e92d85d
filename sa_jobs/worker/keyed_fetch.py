"""Fetching a fair or key-limited queue: the limits' locks and counts, a cap per key,
then the keyed statement (:mod:`.keyed_statement`, whose docstring says how it walks the
keys), the starts recorded per key, and the process's cursor moved on.

A queue is fetched here when it is fair (``sa_jobs.Queue(n, fair_by=[...])``) or has a
limit by key (``ConcurrencyLimit(..., by_args=[...])``); :func:`plan_keyed` says which,
and checks the kinds the worker handles against the key. The soundness argument is the
one of :mod:`.limited_fetch`: a limit by key has an advisory lock of its own, taken
before the per-key count, so every fetch of the queue counts what the earlier ones took.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
from sqlalchemy import Connection, Engine, Interval, Text, bindparam, delete, func, select
from sqlalchemy.dialects.postgresql import insert

from sa_jobs._base.states import JobState
from sa_jobs._declare.limits import Limit
from sa_jobs._declare.option_checks import DEFAULT_QUEUE
from sa_jobs._declare.partitions import KeySpec, check_fields_declared
from sa_jobs._declare.queue_config import Queue
from sa_jobs._table.job_loading import detached_job_builder
from sa_jobs._table.models import Job, state_is
from sa_jobs._table.partition_tables import KeyRateWindow
from sa_jobs._table.schema import Features
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.worker.handlers import Handler
from sa_jobs.worker.keyed_statement import (
    KeyedShape,
    fetched_keyed_columns,
    jobs_fetch_keyed,
    next_cursor,
)
from sa_jobs.worker.limited_fetch import (
    Allowance,
    QueueLimits,
    ScopeRule,
    limits_usage,
    lock_scopes,
    record_starts,
    window_of,
)
from sa_jobs.worker.opening import GENERIC_PLANS, opened_transaction
from sa_jobs.worker.producer import in_start_order

__all__ = ["KeyCaps", "KeyedQueue", "fetch_keyed", "key_usage", "plan_keyed"]


@attrs.define
class KeyedQueue:
    """What a keyed fetch of one queue needs: its limits (if any), its weights, and where
    this process's walk starts next (one producer fetches a queue at a time)."""

    queue: str
    limits: QueueLimits | None = None
    weights: dict[str, int] = attrs.field(factory=dict)
    cursor: str | None = None


@functools.cache
def key_usage(rule: ScopeRule) -> Any:
    """Per key of ``rule``'s queue: its running jobs (a concurrency rule) or its starts in
    the windows ending inside the period (``:at`` bound; a rate rule). Only keys with
    some: the running set is bounded by every worker's slots, the windows by the starts
    of one period. Sound only after the rule's lock, in a later statement."""
    if rule.max_running is not None and rule.per is None:
        return (
            select(Job.partition_key, func.count())
            .where(
                state_is(Job.state, JobState.RUNNING),
                Job.queue == bindparam("scope_name", rule.scope.name, Text),
                Job.partition_key.is_not(None),
            )
            .group_by(Job.partition_key)
        )
    at = bindparam("at", type_=KeyRateWindow.window_end.type)
    return (
        select(KeyRateWindow.partition_key, func.sum(KeyRateWindow.starts))
        .where(
            KeyRateWindow.scope == bindparam("rule_key", rule.key, Text),
            KeyRateWindow.window_end > at - bindparam("per", rule.per, Interval),
        )
        .group_by(KeyRateWindow.partition_key)
    )


class KeyCaps:
    """What each key may still start in this fetch: the least any rule by key allows."""

    def __init__(
        self,
        connection: Connection,
        limits: QueueLimits | None,
        at: Any,
        counted: Mapping[Any, list[Any]] | None = None,
    ) -> None:
        """``counted``: the rows of counts already read (by :func:`_keyed_transaction`),
        by statement; the others are run here."""
        self.default: int | None = None
        self.caps: dict[str, int] = {}
        if limits is None:
            return
        for rule in limits.keyed:
            parts: list[tuple[int, Any, dict[str, Any]]] = []
            if rule.max_running is not None:
                running = ScopeRule(rule.scope, max_running=rule.max_running, by_key=True)
                parts.append((rule.max_running, key_usage(running), {}))
            if rule.max_starts is not None:
                rated = ScopeRule(rule.scope, max_starts=rule.max_starts, per=rule.per, by_key=True)
                parts.append((rule.max_starts, key_usage(rated), {"at": at}))
            for most, statement, params in parts:
                self.default = most if self.default is None else min(self.default, most)
                rows = counted.get(statement) if counted else None
                if rows is None:
                    rows = list(connection.execute(statement, params))
                for key, used in rows:
                    left = most - int(used)
                    self.caps[key] = min(self.caps.get(key, left), left)

    def params(self, fetch_limit: int) -> dict[str, Any]:
        default = fetch_limit if self.default is None else min(self.default, fetch_limit)
        capped = {key: left for key, left in self.caps.items() if 0 < left < default}
        return {
            "full_keys": [key for key, left in self.caps.items() if left <= 0],
            "capped_keys": list(capped),
            "key_caps": list(capped.values()),
            "default_cap": default,
        }


def _record_key_starts(
    connection: Connection, limits: QueueLimits, at: Any, jobs: list[Job[Any]]
) -> None:
    """Count ``jobs`` in the per-key windows of the rate rules by key; drop old windows."""
    keys = Counter(job.partition_key for job in jobs if job.partition_key is not None)
    for rule in limits.keyed:
        if rule.per is None or not keys:
            continue
        start, end = window_of(at, rule.per)
        rows = [
            {
                "scope": rule.key,
                "partition_key": key,
                "window_start": start,
                "window_end": end,
                "keep_until": end + rule.per,
                "starts": count,
            }
            for key, count in sorted(keys.items())
        ]
        connection.execute(_count_key_starts(), rows)
        connection.execute(
            delete(KeyRateWindow).where(
                KeyRateWindow.scope == rule.key, KeyRateWindow.keep_until < at
            )
        )


@functools.cache
def _count_key_starts() -> Any:
    statement = insert(KeyRateWindow)
    excluded = statement.excluded
    return statement.on_conflict_do_update(
        index_elements=[
            KeyRateWindow.scope,
            KeyRateWindow.window_start,
            KeyRateWindow.partition_key,
        ],
        set_={
            "starts": KeyRateWindow.starts + excluded.starts,
            "window_end": func.greatest(KeyRateWindow.window_end, excluded.window_end),
            "keep_until": func.greatest(KeyRateWindow.keep_until, excluded.keep_until),
        },
    )


def _needs_usage(limits: QueueLimits) -> bool:
    """Whether the fetch needs :func:`limits_usage`: a limit not by key to count, or a
    rate by key (whose windows need the count's time). Concurrency limits by key alone
    are counted by :class:`KeyCaps` only: one round trip fewer, and the jobs' start time
    is the database's ``now()``, as in a plain fetch."""
    return any(not rule.by_key or rule.per is not None for rule in limits.rules)


@functools.cache
def _builder(features: Features) -> Callable[[Sequence[Any]], Job[Any]]:
    return detached_job_builder(fetched_keyed_columns(features))


_NO_KINDS: dict[str, Any] = {"full_kinds": [], "capped_kinds": [], "kind_caps": []}


def _running_counts(limits: QueueLimits | None) -> tuple[Any, ...]:
    """The per-key running counts that can be read in the opening query: all of them
    when the fetch needs no :func:`limits_usage` (whose time a rate by key needs)."""
    if limits is None or _needs_usage(limits):
        return ()
    return tuple(
        key_usage(ScopeRule(rule.scope, max_running=rule.max_running, by_key=True))
        for rule in limits.keyed
        if rule.max_running is not None
    )


@contextmanager
def _keyed_transaction(
    engine: Engine, limits: QueueLimits | None
) -> Iterator[tuple[Connection, dict[Any, list[Any]]]]:
    """A transaction holding the limits' locks (if any), committed when the block ends,
    and the per-key counts read with them (by statement; see :class:`KeyCaps`).

    BEGIN, the generic-plan setting, the locks and the per-key running counts go as one
    query on psycopg 3 (:func:`~sa_jobs.worker.opening.opened_transaction`): BEGIN, fetch,
    COMMIT for a fair queue or one limited by key, as the plain fetch. Sound as separate
    statements are: the server runs them in order, each on a snapshot of its own (READ
    COMMITTED), so each count begins after the locks are held."""
    counts = _running_counts(limits)
    locks = () if limits is None else (lock_scopes(limits),)
    with opened_transaction(engine, locks + counts, settings=GENERIC_PLANS) as (
        connection,
        reads,
    ):
        yield (
            connection,
            {count: read.rows for count, read in zip(counts, reads[len(locks) :], strict=True)},
        )


def fetch_keyed(
    engine: Engine, plan: KeyedQueue, free: int, worker_id: str, *, features: Features
) -> list[Job[Any]]:
    """Fetch up to ``free`` jobs of ``plan.queue`` round-robin by key, within its limits
    (the locks and counts of :mod:`.limited_fetch`, and a cap per key); in start order.
    Moves ``plan.cursor`` past the last key taken from."""
    limits = plan.limits
    with _keyed_transaction(engine, limits) as (connection, counted):
        at = None
        kinds = _NO_KINDS
        fetch_limit = free
        if limits is not None and _needs_usage(limits):
            usage = connection.execute(limits_usage(limits)).one()._mapping
            at = usage["at"]
            allowance = Allowance(limits, usage, free)
            kinds = allowance.params()
            fetch_limit = kinds.pop("fetch_limit")
        if fetch_limit <= 0:
            return []
        caps = KeyCaps(connection, limits, at, counted)
        key_params = caps.params(fetch_limit)
        params = {
            **kinds,
            **key_params,
            "fetch_queue": plan.queue,
            "fetch_limit": fetch_limit,
            "fetch_worker_id": worker_id,
            "fetch_at": at,
            "cursor": plan.cursor,
            "walk_limit": fetch_limit + len(key_params["full_keys"]),
            "weighted_keys": list(plan.weights),
            "key_weights": list(plan.weights.values()),
        }
        shape = KeyedShape(
            capped=limits is not None and bool(limits.keyed),
            weighted=bool(plan.weights),
            kinds=bool(kinds["full_kinds"] or kinds["capped_kinds"]),
        )
        build = _builder(features)
        rows = connection.execute(jobs_fetch_keyed(features, shape), params).all()
        jobs = [build(row) for row in rows]
        if limits is not None and at is not None and jobs:
            record_starts(connection, limits, at, jobs)
            _record_key_starts(connection, limits, at, jobs)
    plan.cursor = next_cursor(plan.cursor, [job.partition_key for job in jobs])
    return in_start_order(jobs)


def plan_keyed(
    queues: Mapping[str, int],
    fair: Mapping[str, Queue],
    limits: Iterable[Limit],
    limited: Mapping[str, QueueLimits],
    handlers: Iterable[Handler],
) -> dict[str, KeyedQueue]:
    """The queues fetched by key (fair, or with a limit by key), checked against the
    kinds the worker handles: each kind whose jobs go to such a queue by default must be
    keyed by the same fields (``job_args(partition_by=...)``), or its jobs would carry no
    key and escape the limit or the rotation.

    Raises:
        InvalidOptionsError: a fair queue and a limit by key naming different fields, or
            a handled kind of the queue without those fields or that key.
    """
    fields: dict[str, tuple[str, KeySpec]] = {}
    for queue, settings in fair.items():
        fair_spec = settings.key_spec
        assert fair_spec is not None
        described = fair_spec.describe("fair_by", "fair_by_metadata")
        fields[queue] = (f"Queue({described}) of queue {queue!r}", fair_spec)
    for limit in limits:
        spec = limit.key_spec
        if spec is None or limit.queue is None:
            continue
        option = f"{type(limit).__name__}({spec.describe()}) on queue {limit.queue!r}"
        named = fields.setdefault(limit.queue, (option, spec))
        if named[1] != spec:
            raise InvalidOptionsError(
                spec.describe().partition("=")[0],
                f"{option} and {named[0]} name different keys; a job has one partition "
                "key, so name the same",
            )
    handled = list(handlers)
    plans = {}
    for queue in queues:
        if queue not in fields:
            continue
        option, names = fields[queue]
        for handler in handled:
            kind = handler.kind
            if (kind.defaults.queue or DEFAULT_QUEUE) == queue:
                check_fields_declared(
                    option, names, kind.name, kind.args_class, kind.partition_spec
                )
        weights = fair[queue].weights if queue in fair else {}
        plans[queue] = KeyedQueue(queue, limited.get(queue), dict(weights))
    return plans
