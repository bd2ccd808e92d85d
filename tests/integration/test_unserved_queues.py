"""A queue no worker serves: its jobs wait forever and nothing fails, so everything that
could notice says so (issue 22, item 1).

The worker warns at start about a handler whose kind defaults to a queue it does not
serve, and about a queue nothing names (a typo); ``run_until_idle`` returns (and logs)
the available jobs left in queues it does not serve; ``stats()``, ``check_health()``,
``sa-jobs stats|health`` and the Prometheus gauges report queues with available jobs
that no live worker serves.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, func, insert, update
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs._inspect.health import HealthLevel, HealthThresholds
from sa_jobs._inspect.queue_stats import as_dict
from sa_jobs._table.service_tables import WorkerProcess
from sa_jobs.prometheus import PrometheusMetrics, read_queues
from sa_jobs.worker import IdleResult
from tests.factories import clear_workers_and_leader, make_job
from tests.helpers import FAST_MAINTENANCE, CliRun, add_job

MAIL = "fhq_mail"
WORKER_LOG = "sa_jobs.worker"


@sa_jobs.job_args(kind="fhq_send_email", queue=MAIL)
class SendEmail:
    to: str


@sa_jobs.job_args(kind="fhq_plain")
class Plain:
    n: int = 0


@pytest.fixture(autouse=True)
def _no_other_workers(engine: Engine) -> Iterator[None]:
    """Other tests' heartbeat rows would serve (or name) queues: none before, none after."""
    clear_workers_and_leader(engine)
    yield
    clear_workers_and_leader(engine)


def make_worker(engine: Engine, **options: object) -> sa_jobs.Worker:
    worker = sa_jobs.Worker(
        engine,
        maintenance=FAST_MAINTENANCE,
        poll_interval=0.1,
        **options,  # type: ignore[arg-type]
    )

    @worker.handler(SendEmail)
    def send(job: Job[SendEmail]) -> None:
        pass

    @worker.handler(Plain)
    def plain(job: Job[Plain]) -> None:
        pass

    return worker


def messages(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]


def live_worker_row(engine: Engine, worker_id: str, queues: list[str], *, age_s: float) -> None:
    """A heartbeat row of another process, its last heartbeat ``age_s`` seconds ago."""
    with engine.begin() as connection:
        connection.execute(
            insert(WorkerProcess).values(id=worker_id, hostname="elsewhere", pid=1, queues=queues)
        )
        connection.execute(
            update(WorkerProcess)
            .where(WorkerProcess.id == worker_id)
            .values(heartbeat_at=func.now() - dt.timedelta(seconds=age_s))
        )


def waiting_since(engine: Engine, seconds: float, queue: str = MAIL) -> int:
    """An available job of ``queue`` due ``seconds`` ago."""
    return make_job(engine, queue=queue, scheduled_at=dt.timedelta(seconds=-seconds))


# ---------------------------------------------------------------------- the worker


def test_a_worker_warns_once_about_a_kind_whose_queue_it_does_not_serve(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=WORKER_LOG)
    worker = make_worker(engine)  # serves "default"; SendEmail goes to fhq_mail

    worker.run_until_idle()
    worker.run_until_idle()  # a second start says nothing new

    [warning] = messages(caplog, logging.WARNING, "fhq_send_email")
    assert "fhq_send_email -> 'fhq_mail'" in warning
    assert "serves queues 'default'" in warning
    assert "queues={'default': 10, 'fhq_mail': 10}" in warning
    assert "-q default=10 -q fhq_mail=10" in warning
    assert "fhq_plain" not in warning  # its kind's queue is served


def test_a_kind_whose_queue_another_live_worker_serves_is_only_mentioned(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    live_worker_row(engine, "mail-worker", [MAIL], age_s=1)
    caplog.set_level(logging.INFO, logger=WORKER_LOG)

    make_worker(engine).run_until_idle()

    assert not messages(caplog, logging.WARNING, "fhq_send_email")
    [note] = messages(caplog, logging.INFO, "fhq_send_email")
    assert "served by other live workers" in note


def test_a_worker_serving_a_kinds_queue_says_nothing(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=WORKER_LOG)
    make_worker(engine, queues={"default": 2, MAIL: 2}).run_until_idle()
    assert not messages(caplog, logging.WARNING, "queue")


def test_a_queue_nothing_names_is_called_a_likely_typo(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    add_job(engine, SendEmail(to="a@example.com"))  # fhq_mail is known: a job is in it
    caplog.set_level(logging.INFO, logger=WORKER_LOG)
    worker = make_worker(engine, queues={"default": 1, MAIL: 1, "fhq_mial": 1})

    worker.run_until_idle()
    worker.run_until_idle()

    [warning] = messages(caplog, logging.WARNING, "'fhq_mial' is unknown")
    assert "a typo?" in warning
    assert "known queues: default, fhq_mail" in warning
    assert "serves it anyway" in warning
    # The known queues drew no warning.
    assert not messages(caplog, logging.WARNING, "'fhq_mail' is unknown")
    assert not messages(caplog, logging.WARNING, "'default' is unknown")


def test_a_new_queue_with_a_control_row_or_a_worker_is_known(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.pause_queue(session, "fhq_paused_first", allow_unknown=True)
    live_worker_row(engine, "other", ["fhq_elsewhere"], age_s=1)
    caplog.set_level(logging.INFO, logger=WORKER_LOG)

    make_worker(
        engine, queues={"default": 1, MAIL: 1, "fhq_paused_first": 1, "fhq_elsewhere": 1}
    ).run_until_idle()

    assert not messages(caplog, logging.WARNING, "is unknown")


def test_run_until_idle_returns_and_logs_what_waits_in_queues_it_does_not_serve(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(engine)
    plain = [add_job(engine, Plain(n)) for n in range(3)]
    for n in range(2):
        add_job(engine, SendEmail(to=f"{n}@example.com"))
    add_job(engine, Plain(9), queue="fhq_held")
    with Session(engine) as session, session.begin():
        sa_jobs.pause_queue(session, "fhq_held")  # paused: left alone on purpose
    caplog.set_level(logging.INFO, logger=WORKER_LOG)

    result = worker.run_until_idle()

    assert result == IdleResult(worked=3, unserved={MAIL: 2}, stopped_early=False)
    with Session(engine) as session:
        assert {session.get_one(Job, i).state for i in plain} == {JobState.COMPLETED}
    [warning] = messages(caplog, logging.WARNING, "idle, but available jobs remain")
    assert "'fhq_mail' (2)" in warning
    assert "it serves 'default'" in warning
    assert "fhq_held" not in warning

    # Served, they are worked, and nothing is left.
    worker.queues = {"default": 2, MAIL: 2}
    assert worker.run_until_idle() == IdleResult(worked=2)


def test_run_until_idle_async_returns_the_same_result(engine: Engine) -> None:
    add_job(engine, SendEmail(to="x@example.com"))
    result = asyncio.run(make_worker(engine).run_until_idle_async())
    assert result.unserved == {MAIL: 1}


# ---------------------------------------------------------------------- stats, health


def test_stats_report_queues_with_available_jobs_and_no_live_worker(engine: Engine) -> None:
    add_job(engine, SendEmail(to="a@example.com"))
    add_job(engine, Plain())
    add_job(engine, Plain(), queue="fhq_held")
    with Session(engine) as session, session.begin():
        sa_jobs.pause_queue(session, "fhq_held")
    live_worker_row(engine, "default-worker", ["default"], age_s=2)
    # A worker silent for longer than the rescuer's default (60 s) serves nothing.
    live_worker_row(engine, "gone-mail-worker", [MAIL], age_s=90)

    with Session(engine) as session:
        found = sa_jobs.stats(session)

    assert found.unserved_queues == (MAIL,)
    assert as_dict(found)["unserved_queues"] == [MAIL]
    assert set(found.health.unserved_queues) == {MAIL}

    live_worker_row(engine, "mail-worker", [MAIL, "other"], age_s=0)
    with Session(engine) as session:
        assert sa_jobs.stats(session).unserved_queues == ()


def test_health_warns_once_an_unserved_queue_has_waited_past_the_threshold(
    engine: Engine,
) -> None:
    waiting_since(engine, 5)
    with Session(engine) as session:
        fresh = sa_jobs.check_health(session)
    # A job inserted a moment ago (or a worker still starting) is no finding.
    assert MAIL in fresh.unserved_queues
    assert fresh.level is HealthLevel.OK

    waiting_since(engine, 120)
    with Session(engine) as session:
        late = sa_jobs.check_health(session)
        later = sa_jobs.check_health(
            session, HealthThresholds(unserved_age_warning=dt.timedelta(minutes=5))
        )
    assert late.level is HealthLevel.WARNING
    [finding] = late.findings
    assert finding.figure == "unserved_queue"
    assert "queue 'fhq_mail'" in finding.message
    assert "no live worker serves it" in finding.message
    assert "-q fhq_mail=N" in finding.message
    assert later.level is HealthLevel.OK


def test_health_leaves_a_served_queue_alone_however_old_its_backlog(engine: Engine) -> None:
    waiting_since(engine, 600)
    live_worker_row(engine, "mail-worker", [MAIL], age_s=3)
    with Session(engine) as session:
        found = sa_jobs.check_health(session)
    assert found.unserved_queues == {}
    assert found.level is HealthLevel.OK


def test_sa_jobs_health_exits_3_and_stats_marks_the_queue(cli: CliRun, engine: Engine) -> None:
    waiting_since(engine, 120)

    code, out, _ = cli("health")
    assert code == 3
    assert "warning: queue 'fhq_mail' has had an available job waiting for" in out
    assert "queues no live worker serves: fhq_mail (oldest available" in out

    assert cli("health", "--unserved-age-warning", "10m")[0] == 0

    code, out, _ = cli("stats")
    assert code == 0
    assert "fhq_mail (no live worker)" in out


def test_the_prometheus_gauge_says_which_queues_no_live_worker_serves(engine: Engine) -> None:
    add_job(engine, SendEmail(to="a@example.com"))
    add_job(engine, Plain())
    live_worker_row(engine, "default-worker", ["default"], age_s=1)
    with engine.connect() as connection:
        assert read_queues(connection).unserved == frozenset({MAIL})

    registry = CollectorRegistry()
    PrometheusMetrics(registry, engine=engine)
    assert registry.get_sample_value("sa_jobs_queue_unserved", {"queue": MAIL}) == 1
    assert registry.get_sample_value("sa_jobs_queue_unserved", {"queue": "default"}) == 0
