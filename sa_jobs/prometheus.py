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
  estimated past it (:mod:`sa_jobs.job_counts`, shared with :func:`sa_jobs.stats`);
* ``sa_jobs_queue_jobs_estimated{state}`` — 1 when that state's figures are estimates;
* ``sa_jobs_queue_oldest_available_seconds{queue}`` — how long the oldest available job
  of each queue has been due;
* ``sa_jobs_queue_paused{queue}`` — 1 for a paused queue, 0 for one resumed (with the
  ``sa_jobs_queue`` branch), so an oldest-age alert can leave paused queues out;
* ``sa_jobs_queue_unserved{queue}`` — for each queue with available jobs, 1 when no
  live worker serves it (none lists it in a heartbeat younger than the rescuer's default
  60 s) and it is not paused, else 0: its jobs wait until a worker serves it
  (:func:`sa_jobs.queues.unserved_queues`, as ``sa-jobs health`` judges it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine, func, select

from sa_jobs.hooks import AttemptResult, InsertHook, InsertingJob, WorkHook
from sa_jobs.job_counts import (
    EXACT_LIMIT,
    StateCounts,
    check_exact_limit,
    count_jobs,
    oldest_available,
)
from sa_jobs.models import Job, JobQueue
from sa_jobs.queues import unserved_queues
from sa_jobs.schema import Features
from sa_jobs.states import InsertAction, JobState

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
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        engine: Engine | None = None,
        namespace: str = "sa_jobs",
        buckets: Sequence[float] = DEFAULT_BUCKETS,
        exact_limit: int = EXACT_LIMIT,
    ) -> None:
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
            self.queues = QueueCollector(engine, namespace, exact_limit=exact_limit)
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
    """What one scrape reads: the counts (:class:`~sa_jobs.job_counts.StateCounts`),
    the oldest available age per queue (seconds), which queues are paused (None
    without the ``sa_jobs_queue`` branch), and which of the queues with available jobs
    no live worker serves."""

    counts: StateCounts
    oldest: Mapping[str, float]
    paused: Mapping[str, bool] | None
    unserved: frozenset[str] = frozenset()


def read_queues(connection: Connection, exact_limit: int = EXACT_LIMIT) -> QueueFigures:
    """The queue gauges' figures, through :mod:`sa_jobs.job_counts`: each state counted
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
    )


class QueueCollector(Collector):
    """The queue gauges, read with :func:`read_queues` at each scrape.

    A scrape that cannot reach the database (or runs past ``SCRAPE_TIMEOUT_MS``) logs a
    warning and reports no queue gauges rather than failing the whole scrape.
    """

    def __init__(
        self, engine: Engine, namespace: str = "sa_jobs", *, exact_limit: int = EXACT_LIMIT
    ) -> None:
        check_exact_limit(exact_limit)
        self.engine = engine
        self.namespace = namespace
        self.exact_limit = exact_limit

    def describe(self) -> Iterable[Metric]:
        # Given so that registering does not run a query (the registry would call
        # collect() to learn the names otherwise).
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        depth, estimated, oldest, paused, unserved = self._families()
        try:
            with self.engine.begin() as connection:
                connection.execute(
                    select(func.set_config("statement_timeout", str(SCRAPE_TIMEOUT_MS), True))
                )
                found = read_queues(connection, self.exact_limit)
        except Exception as exc:
            log.warning("could not read the queue gauges: %s", exc)
            return
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
        yield depth
        yield estimated
        yield oldest
        if found.paused is not None:
            yield paused
        yield unserved

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
        )
