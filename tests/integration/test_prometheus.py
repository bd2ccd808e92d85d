"""Prometheus metrics (sa_jobs.prometheus) after a real worker ran jobs: insert and attempt
counters by kind, queue and outcome, the duration histogram, and the queue gauges read
from the database at scrape time — on the registry passed, never the global one."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job
from sa_jobs.errors import InvalidOptionsError, JobSnooze
from sa_jobs.hooks import INSERT_HOOKS, add_insert_hook
from sa_jobs.prometheus import PrometheusMetrics, QueueCollector
from tests.helpers import NO_DELAY, make_worker


@sa_jobs.job_args(kind="prom_task", queue="prom")
class Task:
    how: str = "return"


@pytest.fixture(autouse=True)
def _no_insert_hooks() -> Iterator[None]:
    INSERT_HOOKS.active = ()
    yield
    INSERT_HOOKS.active = ()


def test_metrics_after_a_worker_ran_jobs(engine: Engine) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry, engine=engine)
    add_insert_hook(metrics)
    with Session(engine) as session, session.begin():
        session.add_all(sa_jobs.enqueue(Task()) for _ in range(3))
        sa_jobs.insert(session, Task(how="raise"), max_attempts=1)
        sa_jobs.insert(session, Task(how="raise"), max_attempts=2)
        sa_jobs.insert(session, Task(how="snooze"))
        sa_jobs.insert_many(session, [Task(), Task()], queue="waiting")  # nobody works it

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("sa_jobs_jobs_inserted_total", kind="prom_task", queue="prom") == 6
    assert value("sa_jobs_jobs_inserted_total", kind="prom_task", queue="waiting") == 2
    assert value("sa_jobs_queue_jobs", queue="prom", state="available") == 6
    assert value("sa_jobs_queue_jobs", queue="waiting", state="available") == 2
    oldest = value("sa_jobs_queue_oldest_available_seconds", queue="waiting")
    assert oldest is not None and 0 <= oldest < 60

    worker = make_worker(engine, queues={"prom": 5}, hooks=[metrics], retry_policy=NO_DELAY)

    snoozed: set[int] = set()

    @worker.handler(Task)
    def handle(job: Job[Task]) -> None:
        if job.args.how == "raise":
            raise ValueError("no")
        if job.args.how == "snooze" and job.id not in snoozed:  # a snooze keeps attempt 1
            snoozed.add(job.id)
            raise JobSnooze(0)

    worker.run_until_idle()

    def attempts(outcome: str) -> float | None:
        return value("sa_jobs_attempts_total", kind="prom_task", queue="prom", outcome=outcome)

    # 3 plain + the snoozed one's second run; the 2-attempt failure fails, then is discarded.
    assert attempts("completed") == 4
    assert attempts("snoozed") == 1
    assert attempts("failed") == 1
    assert attempts("discarded") == 2
    runs = value("sa_jobs_attempt_duration_seconds_count", kind="prom_task", queue="prom")
    assert runs == 8
    assert value("sa_jobs_queue_jobs", queue="prom", state="available") is None
    assert value("sa_jobs_queue_jobs", queue="waiting", state="available") == 2
    # Nothing went to the process-wide registry.
    assert prometheus_client.REGISTRY.get_sample_value("sa_jobs_attempts_total", {}) is None
    assert b"sa_jobs_attempts_total" not in generate_latest(prometheus_client.REGISTRY)


def test_a_scrape_that_cannot_reach_the_database_reports_the_counters_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    unreachable = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    PrometheusMetrics(registry, engine=unreachable)

    with caplog.at_level(logging.WARNING, logger="sa_jobs.prometheus"):
        text = generate_latest(registry).decode()

    assert "sa_jobs_attempts_total" in text
    assert "sa_jobs_queue_jobs{" not in text
    assert "could not read the queue gauges" in caplog.text


def test_registering_the_collector_runs_no_query() -> None:
    registry = CollectorRegistry()

    class Counting(QueueCollector):
        calls = 0

        def collect(self):  # type: ignore[no-untyped-def]
            Counting.calls += 1
            return super().collect()

    registry.register(Counting(create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")))
    assert Counting.calls == 0


def test_the_queue_gauges_estimate_a_backlog_past_the_exact_limit(engine: Engine) -> None:
    # The same capped count as sa_jobs.stats(): a backlog is not counted row by row at
    # every scrape, and the gauges say which states are estimates.
    registry = CollectorRegistry()
    PrometheusMetrics(registry, engine=engine, exact_limit=5)
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Task() for _ in range(12)], queue="backlog")
        sa_jobs.insert_many(session, [Task() for _ in range(3)], queue="small")

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("sa_jobs_queue_jobs_estimated", state="available") == 1
    assert value("sa_jobs_queue_jobs_estimated", state="running") == 0
    backlog = value("sa_jobs_queue_jobs", queue="backlog", state="available")
    small = value("sa_jobs_queue_jobs", queue="small", state="available")
    assert backlog is not None and small is not None
    assert backlog + small >= 6  # never below what the capped count saw
    assert value("sa_jobs_queue_oldest_available_seconds", queue="backlog") is not None
    assert value("sa_jobs_queue_oldest_available_seconds", queue="small") is not None


def test_the_paused_gauge_names_paused_queues(engine: Engine) -> None:
    registry = CollectorRegistry()
    PrometheusMetrics(registry, engine=engine)
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, Task(), queue="held")
        sa_jobs.insert(session, Task(), queue="resumed")
        sa_jobs.pause_queue(session, "held")
        sa_jobs.pause_queue(session, "resumed")
        sa_jobs.resume_queue(session, "resumed")

    assert registry.get_sample_value("sa_jobs_queue_paused", {"queue": "held"}) == 1
    assert registry.get_sample_value("sa_jobs_queue_paused", {"queue": "resumed"}) == 0
    assert registry.get_sample_value("sa_jobs_queue_paused", {"queue": "prom"}) is None


def test_a_bad_exact_limit_is_refused_when_built(engine: Engine) -> None:
    with pytest.raises(InvalidOptionsError, match="exact_limit"):
        PrometheusMetrics(CollectorRegistry(), engine=engine, exact_limit=0)
