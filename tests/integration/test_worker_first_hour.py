"""Small worker messages of a first hour, against the real database (issue 22): what a
first Ctrl-C says, which keyword a worker's two engines on two databases blame, and what
``sa-jobs work --until-idle`` says about queues it left alone."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading

import pytest
from sqlalchemy import URL, Engine, create_engine
from sqlalchemy.ext.asyncio import create_async_engine

import sa_jobs
from sa_jobs import Job
from sa_jobs.cli import main
from sa_jobs.errors import InvalidOptionsError
from tests.helpers import FAST_MAINTENANCE, add_job, url_text
from tests.integration.cli_worker_app import QUEUE, Touch

APP = "tests.integration.cli_worker_app:make_worker"


@sa_jobs.job_args(kind="fhq_slow")
class Slow:
    pass


def test_a_first_ctrl_c_says_that_a_second_cancels_the_running_jobs(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    started, release = threading.Event(), threading.Event()
    worker = sa_jobs.Worker(engine, maintenance=FAST_MAINTENANCE, poll_interval=0.1)

    @worker.handler(Slow)
    def slow(job: Job[Slow]) -> None:
        started.set()
        release.wait(10)

    def interrupt() -> None:
        if started.wait(10):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, once
            release.set()

    add_job(engine, Slow())
    caplog.set_level(logging.INFO, logger="sa_jobs.worker")
    sender = threading.Thread(target=interrupt)
    sender.start()
    result = worker.run_until_idle()  # in the main thread: it handles SIGINT itself
    sender.join()

    assert result.stopped_early and result.worked == 1  # the running job finished
    [said] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("SIGINT")]
    assert said == (
        "SIGINT: finishing running jobs, then stopping; a second SIGINT or SIGTERM "
        "(Ctrl-C again) cancels them, and they go back to 'available' without spending "
        "an attempt"
    )


def test_a_sync_engine_on_another_database_blames_sync_engine(
    database_url: URL, core_only_url: URL
) -> None:
    async_on_a = create_async_engine(database_url.set(drivername="postgresql+psycopg_async"))
    sync_on_b = create_engine(core_only_url)
    worker = sa_jobs.Worker(async_on_a, sync_engine=sync_on_b)

    @worker.handler(Slow)
    def slow(job: Job[Slow]) -> None:
        pass

    try:
        with pytest.raises(InvalidOptionsError) as caught:
            worker.start()
        assert not worker.is_running
    finally:
        sync_on_b.dispose()
        asyncio.run(async_on_a.dispose())
    assert caught.value.option == "sync_engine"
    message = str(caught.value)
    assert message.startswith("sync_engine: the sync_engine you passed reaches another database")
    assert f"{core_only_url.database!r} at {_server(core_only_url)}" in message
    assert f"not {database_url.database!r} at {_server(database_url)}" in message
    assert "derived" not in message  # nothing was


def test_work_until_idle_says_what_it_left_in_queues_it_does_not_serve(
    database_url: URL,
    engine: Engine,
    no_workers_or_leader: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_job(engine, Touch(label="waits"))  # in the app's own queue, which -q replaces
    caplog.set_level(logging.INFO)

    code = main(["work", APP, "--url", url_text(database_url), "-q", "default", "--until-idle"])

    assert code == 0  # serving some queues only is a normal deployment
    said = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith(
            f"idle, but available jobs remain in queues this worker does not serve: {QUEUE!r} (1)"
        )
        for m in said
    ), said
    assert f"idle: 0 attempts worked, 1 available in {QUEUE!r} (not served here)" in said


def test_work_with_a_misspelt_queue_warns_and_names_the_known_ones(
    database_url: URL,
    engine: Engine,
    no_workers_or_leader: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_job(engine, Touch(label="waits"))
    caplog.set_level(logging.INFO)

    url = url_text(database_url)
    assert main(["work", APP, "--url", url, "-q", "cli_worker_ap", "--until-idle"]) == 0

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    [typo] = [m for m in warnings if "is unknown" in m]
    assert typo.startswith("queue 'cli_worker_ap' is unknown")
    assert f"known queues: {QUEUE}, default" in typo


def _server(url: URL) -> str:
    """``host:port`` as the messages name the test server (not always 127.0.0.1:5432)."""
    return f"{url.host}:{url.port or 5432}"
