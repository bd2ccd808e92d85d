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
  ``retryable`` and ``running``, per queue;
* ``sa_jobs_queue_oldest_available_seconds{queue}`` — how long the oldest available job
  of each queue has been due.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import (
    CompoundSelect,
    Engine,
    Float,
    cast,
    extract,
    func,
    literal,
    select,
    union_all,
)

from sa_jobs.hooks import AttemptResult, InsertHook, InsertingJob, WorkHook
from sa_jobs.models import Job
from sa_jobs.states import InsertAction, JobState

__all__ = ["DEFAULT_BUCKETS", "PrometheusMetrics", "QueueCollector", "queue_depth"]

log = logging.getLogger("sa_jobs.prometheus")

#: Attempt duration buckets, in seconds: from a no-op to the default one-minute timeout.
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

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
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        engine: Engine | None = None,
        namespace: str = "sa_jobs",
        buckets: Sequence[float] = DEFAULT_BUCKETS,
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
            self.queues = QueueCollector(engine, namespace)
            registry.register(self.queues)

    def after_insert(self, jobs: Sequence[InsertingJob], error: BaseException | None) -> None:
        for job in jobs:
            if job.action is InsertAction.INSERTED:
                self.inserted.labels(job.kind, job.queue).inc()

    def after_work(self, job: Job[Any], result: AttemptResult) -> None:
        kind, queue = job.kind, job.queue
        self.attempts.labels(kind, queue, result.outcome).inc()
        self.duration.labels(kind, queue).observe(result.duration)


def queue_depth() -> CompoundSelect[Any]:
    """Per queue and state: the jobs waiting or running, and for ``available`` how many
    seconds the oldest has been due.

    One ``SELECT`` per state, each matching a partial index of that state (the fetch
    index holds ``queue`` and ``scheduled_at``, so available jobs are counted from the
    index alone); the jobs' finished history is never read. ``sa_jobs.stats`` may serve
    this later.
    """
    parts = []
    for state in DEPTH_STATES:
        oldest: Any = (
            extract("epoch", func.now() - func.min(Job.scheduled_at))
            if state is JobState.AVAILABLE
            else literal(None, Float)
        )
        parts.append(
            select(
                Job.queue,
                literal(state.value).label("state"),
                func.count().label("jobs"),
                cast(oldest, Float).label("oldest"),
            )
            .where(Job.state == state)
            .group_by(Job.queue)
        )
    return union_all(*parts)


class QueueCollector(Collector):
    """The queue gauges, read with :func:`queue_depth` at each scrape.

    A scrape that cannot reach the database (or runs past ``SCRAPE_TIMEOUT_MS``) logs a
    warning and reports no queue gauges rather than failing the whole scrape.
    """

    def __init__(self, engine: Engine, namespace: str = "sa_jobs") -> None:
        self.engine = engine
        self.namespace = namespace

    def describe(self) -> Iterable[Metric]:
        # Given so that registering does not run a query (the registry would call
        # collect() to learn the names otherwise).
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        depth, oldest = self._families()
        try:
            with self.engine.begin() as connection:
                connection.execute(
                    select(func.set_config("statement_timeout", str(SCRAPE_TIMEOUT_MS), True))
                )
                rows = connection.execute(queue_depth()).all()
        except Exception as exc:
            log.warning("could not read the queue gauges: %s", exc)
            return
        for row in rows:
            depth.add_metric([row.queue, row.state], row.jobs)
            if row.oldest is not None:
                oldest.add_metric([row.queue], max(row.oldest, 0.0))
        yield depth
        yield oldest

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                f"{self.namespace}_queue_jobs",
                "Jobs waiting or running, per queue and state.",
                labels=["queue", "state"],
            ),
            GaugeMetricFamily(
                f"{self.namespace}_queue_oldest_available_seconds",
                "How long the oldest available job of each queue has been due.",
                labels=["queue"],
            ),
        )
