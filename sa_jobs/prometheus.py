"""Prometheus metrics for sa_jobs, built on :mod:`sa_jobs.hooks` (extra ``prometheus``).

:class:`PrometheusMetrics` is both an insert hook and a work hook, and registers its
metrics on the registry it is given — never on ``prometheus_client``'s global one
unless that is the registry passed::

    metrics = PrometheusMetrics(registry, engine=engine)
    sa_jobs.add_insert_hook(metrics)
    worker = sa_jobs.Worker(engine, hooks=[metrics])

Counted by the hooks, in this process:

* ``sa_jobs_jobs_inserted_total{kind, queue}`` — jobs an insert wrote (a duplicate
  skipped or a job key's existing job met is not a new job). Counted when the statement
  ran: a transaction rolled back later is not subtracted.
* ``sa_jobs_attempts_total{kind, queue, outcome}`` — attempts ended, ``outcome`` one of
  ``completed``, ``failed`` (will retry), ``discarded`` (failed with no attempts left),
  ``cancelled``, ``snoozed``, ``returned`` (given back by a shutdown).
* ``sa_jobs_attempt_duration_seconds{kind, queue}`` — a histogram of handler run time.

Read from the database at each scrape, when an ``engine`` is given (the same figures
from any process, so scrape one):

* ``sa_jobs_queue_jobs{queue, state}`` — jobs ``available``, ``scheduled``,
  ``retryable`` and ``running``, per queue: exact up to ``exact_limit`` per state,
  estimated past it (:mod:`sa_jobs._inspect.job_counts`, shared with :func:`sa_jobs.stats`);
* ``sa_jobs_queue_jobs_estimated{state}`` — 1 when that state's figures are estimates;
* ``sa_jobs_queue_oldest_available_seconds{queue}`` — how long the oldest available job
  of each queue has been due;
* ``sa_jobs_queue_paused{queue}`` — 1 for a paused queue, 0 for one resumed (with the
  ``sa_jobs_queue`` branch), so an oldest-age alert can leave paused queues out;
* ``sa_jobs_queue_unserved{queue}`` — for each queue with available jobs, 1 when no
  live worker serves it (none lists it in a heartbeat younger than the rescuer's default
  60 s) and it is not paused, else 0: its jobs wait until a worker serves it
  (:func:`sa_jobs._act.queues.unserved_queues`, as ``sa-jobs health`` judges it);
* ``sa_jobs_queue_workflow_steps_pending{queue}`` — workflow steps waiting for their
  dependencies, per queue (with the ``sa_jobs_workflow`` branch): counted through the
  partial index holding only those steps, capped at ``exact_limit + 1`` per queue.
* with the ``sa_jobs_fairness`` branch, for each queue whose available jobs have
  partition keys (fair or limited by key): ``sa_jobs_queue_keys{queue}`` — how many keys
  have available jobs; ``sa_jobs_key_available_jobs{queue, key}`` and
  ``sa_jobs_key_oldest_available_seconds{queue, key}`` — for the ten keys with the most
  available jobs (:mod:`sa_jobs._inspect.key_stats`: bounded work at any number of keys, and at
  most ten series per queue).
* ``sa_jobs_worker_stuck_threads{worker}`` — for each live worker whose handler threads
  stuck past their timeout reached its ``stuck_thread_limit`` (its slots stay taken
  from then on): how many are stuck. No series while no worker is there; alert on any.

With ``read_engine=`` (a streaming standby) the scrape reads those figures there, behind
the replay-lag guard of :mod:`sa_jobs._base.replicas` (docs/operations.md, "Reads from a
replica"), and adds:

* ``sa_jobs_replica_lag_seconds`` — how far behind the replica was at the scrape (absent
  when the read engine reaches a server not in recovery);
* ``sa_jobs_replica_replay_paused`` — 1 when its WAL replay is paused;
* ``sa_jobs_replica_fallback`` — 1 when it was past ``max_replica_lag`` and the scrape
  read the primary instead (``on_replica_lag="fall_back"``, the default); with
  ``"report"`` the figures stay the replica's and this stays 0.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine, func, select

from sa_jobs._act.queues import unserved_queues
from sa_jobs._base.replicas import DEFAULT_MAX_LAG, OnLag, ReplicaReads, ReplicaStatus
from sa_jobs._base.states import InsertAction, JobState
from sa_jobs._inspect.health import stuck_workers
from sa_jobs._inspect.job_counts import (
    EXACT_LIMIT,
    StateCounts,
    check_exact_limit,
    count_jobs,
    oldest_available,
    pending_steps,
)
from sa_jobs._inspect.key_stats import QueueKeys, queue_keys
from sa_jobs._table.models import Job
from sa_jobs._table.schema import Features
from sa_jobs._table.service_tables import JobQueue
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.hooks import AttemptResult, InsertHook, InsertingJob, WorkHook

__all__ = ["DEFAULT_BUCKETS", "PrometheusMetrics", "QueueCollector", "QueueFigures", "read_queues"]

log = logging.getLogger("sa_jobs.prometheus")

DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
"""Attempt duration buckets, in seconds: from a no-op to the default one-minute timeout."""

#: The states ``sa_jobs_queue_jobs`` reports: what is waiting or running.
DEPTH_STATES = (JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE, JobState.RUNNING)

#: How long a scrape's query may run before PostgreSQL stops it.
SCRAPE_TIMEOUT_MS = 5_000


class PrometheusMetrics(InsertHook, WorkHook):
    """Counters, a histogram, and (with ``engine``) queue gauges, on ``registry``.

    Args:
        registry: Where the metrics are registered; pass ``prometheus_client.REGISTRY``
            to use the global one.
        engine: With an engine, the queue depth and oldest-age gauges are read from the
            database at each scrape.
        namespace: The metrics' name prefix.
        buckets: The attempt duration histogram's buckets, in seconds.
        exact_limit: The queue gauges count each state exactly up to this many jobs and
            estimate past it (as :func:`sa_jobs.stats` does).
        read_engine: A streaming standby of ``engine``'s database: the gauges are read
            there (see the module).
        max_replica_lag: Seconds it may be behind (default 5).
        on_replica_lag: Past it, ``"fall_back"`` (read ``engine``) or ``"report"``.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        engine: Engine | None = None,
        namespace: str = "sa_jobs",
        buckets: Sequence[float] = DEFAULT_BUCKETS,
        exact_limit: int = EXACT_LIMIT,
        read_engine: Engine | None = None,
        max_replica_lag: float = DEFAULT_MAX_LAG,
        on_replica_lag: OnLag = "fall_back",
    ) -> None:
        if read_engine is not None and engine is None:
            raise InvalidOptionsError(
                "read_engine", "needs engine= too: the primary, where a lagging replica falls back"
            )
        self.inserted = Counter(
            "jobs_inserted",
            "Jobs written by inserts in this process.",
            ["kind", "queue"],
            namespace=namespace,
            registry=registry,
        )
        self.attempts = Counter(
            "attempts",
            "Attempts ended in this process, by outcome.",
            ["kind", "queue", "outcome"],
            namespace=namespace,
            registry=registry,
        )
        self.duration = Histogram(
            "attempt_duration_seconds",
            "How long handlers ran, per attempt.",
            ["kind", "queue"],
            namespace=namespace,
            registry=registry,
            buckets=buckets,
        )
        self.queues: QueueCollector | None = None
        if engine is not None:
            replica = (
                None
                if read_engine is None
                else ReplicaReads(read_engine, max_lag=max_replica_lag, on_lag=on_replica_lag)
            )
            self.queues = QueueCollector(
                engine, namespace, exact_limit=exact_limit, replica=replica
            )
            registry.register(self.queues)

    def after_insert(self, jobs: Sequence[InsertingJob], error: BaseException | None) -> None:
        for job in jobs:
            if job.action is InsertAction.INSERTED:
                self.inserted.labels(job.kind, job.queue).inc()

    def after_work(self, job: Job[Any], result: AttemptResult) -> None:
        kind, queue = job.kind, job.queue
        self.attempts.labels(kind, queue, result.outcome).inc()
        self.duration.labels(kind, queue).observe(result.duration)


@attrs.frozen
class QueueFigures:
    """What one scrape reads: the counts (:class:`~sa_jobs._inspect.job_counts.StateCounts`),
    the oldest available age per queue (seconds), which queues are paused (None
    without the ``sa_jobs_queue`` branch), and which of the queues with available jobs
    no live worker serves; the pending workflow steps per queue (None without the
    ``sa_jobs_workflow`` branch)."""

    counts: StateCounts
    oldest: Mapping[str, float]
    paused: Mapping[str, bool] | None
    unserved: frozenset[str] = frozenset()
    pending_steps: Mapping[str, int] | None = None
    keys: Mapping[str, QueueKeys] = attrs.field(factory=dict)
    stuck: Mapping[str, tuple[int, int]] = attrs.field(factory=dict)


def read_queues(connection: Connection, exact_limit: int = EXACT_LIMIT) -> QueueFigures:
    """The queue gauges' figures, through :mod:`sa_jobs._inspect.job_counts`: each state counted
    through its own partial index and capped at ``exact_limit`` (estimated past it), the
    oldest age by a skip scan of the fetch index — bounded work, however big the backlog
    or the history."""
    features = Features.of(connection)
    oldest = oldest_available(connection)
    counts = count_jobs(
        connection, DEPTH_STATES, exact_limit, features=features, available_queues=oldest
    )
    paused = None
    if features.queue:
        paused = {
            name: paused_at is not None
            for name, paused_at in connection.execute(select(JobQueue.name, JobQueue.paused_at))
        }
    return QueueFigures(
        counts=counts,
        oldest={queue: age.total_seconds() for queue, age in oldest.items()},
        paused=paused,
        unserved=frozenset(unserved_queues(connection, oldest)),
        pending_steps=pending_steps(connection, exact_limit) if features.workflow else None,
        keys=_keys(connection, oldest, exact_limit) if features.fairness else {},
        stuck=stuck_workers(connection),
    )


def _keys(connection: Connection, queues: Iterable[str], exact_limit: int) -> dict[str, QueueKeys]:
    found = {}
    for queue in sorted(queues):
        keys = queue_keys(connection, queue, exact_limit)
        if keys is not None:
            found[queue] = keys
    return found


class QueueCollector(Collector):
    """The queue gauges, read with :func:`read_queues` at each scrape.

    A scrape that cannot reach the database (or runs past ``SCRAPE_TIMEOUT_MS``) logs a
    warning and reports no queue gauges rather than failing the whole scrape.
    """

    def __init__(
        self,
        engine: Engine,
        namespace: str = "sa_jobs",
        *,
        exact_limit: int = EXACT_LIMIT,
        replica: ReplicaReads | None = None,
    ) -> None:
        check_exact_limit(exact_limit)
        self.engine = engine
        self.replica = replica
        self.namespace = namespace
        self.exact_limit = exact_limit

    def describe(self) -> Iterable[Metric]:
        # Given so that registering does not run a query (the registry would call
        # collect() to learn the names otherwise).
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        depth, estimated, oldest, paused, unserved, steps, keys, key_jobs, key_oldest, stuck = (
            self._families()
        )
        status: ReplicaStatus | None = None
        try:
            with self._reading() as (connection, status):
                connection.execute(
                    select(func.set_config("statement_timeout", str(SCRAPE_TIMEOUT_MS), True))
                )
                found = read_queues(connection, self.exact_limit)
        except Exception as exc:
            log.warning("could not read the queue gauges: %s", exc)
            return
        if status is not None:
            yield from self._replica_families(status)
        for queue, by_state in sorted(found.counts.counts.items()):
            for state in DEPTH_STATES:
                if state in by_state:
                    depth.add_metric([queue, state.value], by_state[state])
        for state in DEPTH_STATES:
            estimated.add_metric([state.value], 1 if state in found.counts.estimated else 0)
        for queue, seconds in sorted(found.oldest.items()):
            oldest.add_metric([queue], seconds)
        for queue, is_paused in sorted((found.paused or {}).items()):
            paused.add_metric([queue], 1 if is_paused else 0)
        for queue in sorted(found.oldest):
            unserved.add_metric([queue], 1 if queue in found.unserved else 0)
        for queue, figures in sorted(found.keys.items()):
            keys.add_metric([queue], figures.keys)
            for key in figures.top:
                key_jobs.add_metric([queue, key.key], key.available)
                if key.oldest_available_age is not None:
                    key_oldest.add_metric(
                        [queue, key.key], key.oldest_available_age.total_seconds()
                    )
        for worker, (count, _limit) in sorted(found.stuck.items()):
            stuck.add_metric([worker], count)
        yield stuck
        yield depth
        yield estimated
        yield oldest
        if found.paused is not None:
            yield paused
        yield unserved
        if found.pending_steps is not None:
            for queue, n in sorted(found.pending_steps.items()):
                steps.add_metric([queue], n)
            yield steps
        if found.keys:
            yield keys
            yield key_jobs
            yield key_oldest

    @contextlib.contextmanager
    def _reading(self) -> Iterator[tuple[Connection, ReplicaStatus | None]]:
        if self.replica is None:
            with self.engine.begin() as connection:
                yield connection, None
            return
        with self.replica.reading(self.engine.begin) as (connection, status):
            yield connection, status

    def _replica_families(self, status: ReplicaStatus) -> Iterator[Metric]:
        if status.lag is not None:
            yield GaugeMetricFamily(
                f"{self.namespace}_replica_lag_seconds",
                "How far behind the read engine's replica was at this scrape.",
                value=status.lag,
            )
        yield GaugeMetricFamily(
            f"{self.namespace}_replica_replay_paused",
            "1 when the replica's WAL replay is paused.",
            value=1 if status.paused else 0,
        )
        yield GaugeMetricFamily(
            f"{self.namespace}_replica_fallback",
            "1 when the replica was past max_replica_lag and this scrape read the primary.",
            value=1 if status.source == "primary" else 0,
        )

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                f"{self.namespace}_queue_jobs",
                "Jobs waiting or running, per queue and state.",
                labels=["queue", "state"],
            ),
            GaugeMetricFamily(
                f"{self.namespace}_queue_jobs_estimated",
                "1 when the state's queue_jobs figures are estimates (past the exact limit).",
                labels=["state"],
            ),
            GaugeMetricFamily(
                f"{self.namespace}_queue_oldest_available_seconds",
                "How long the oldest available job of each queue has been due.",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                f"{self.namespace}_queue_paused",
                "1 for a paused queue, 0 for one resumed (queues ever paused).",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                f"{self.namespace}_queue_unserved",
                "1 for a queue with available jobs that no live worker serves (not paused).",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                f"{self.namespace}_queue_workflow_steps_pending",
                "Workflow steps waiting for their dependencies, per queue.",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                f"{self.namespace}_queue_keys",
                "Partition keys with available jobs, per queue whose jobs have keys.",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                f"{self.namespace}_key_available_jobs",
                "Available jobs of the ten keys with the most, per queue.",
                labels=["queue", "key"],
            ),
            GaugeMetricFamily(
                f"{self.namespace}_key_oldest_available_seconds",
                "How long the oldest available job of each listed key has been due.",
                labels=["queue", "key"],
            ),
            GaugeMetricFamily(
                f"{self.namespace}_worker_stuck_threads",
                "Stuck handler threads of each live worker that reached its "
                "stuck_thread_limit (restart it).",
                labels=["worker"],
            ),
        )
