"""Small worker mistakes of a first hour, each with a clear sa_jobs error or message
(issue 22): ``queues=`` as a list, a ``periodic_retire_after`` under the workers'
re-registration, the unserved-queue health finding, and what Ctrl-C says under
``sa-jobs work --processes``."""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine

import sa_jobs
from sa_jobs._act.queues import LIVE_WORKER_WINDOW
from sa_jobs._inspect.health import HealthLevel, HealthThresholds, evaluate
from sa_jobs.cli import processes
from sa_jobs.errors import InvalidOptionsError
from sa_jobs.worker.maintenance.loop import MIN_PERIODIC_RETIRE_AFTER
from sa_jobs.worker.maintenance.periodic import REGISTER_INTERVAL

ENGINE = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connected


@pytest.mark.parametrize(
    ("queues", "shown"),
    [
        (["mail"], "queues={'mail': 10}"),
        (("mail", "default"), "queues={'mail': 10, 'default': 10}"),
        ("mail", "queues={'mail': 10}"),
        (5, "queues={'default': 10}"),
    ],
)
def test_queues_that_are_not_a_mapping_get_the_dict_form(queues: object, shown: str) -> None:
    with pytest.raises(InvalidOptionsError) as caught:
        sa_jobs.Worker(ENGINE, queues=queues)  # type: ignore[arg-type]
    assert caught.value.option == "queues"
    assert "must map each queue to its concurrency" in str(caught.value)
    assert shown in str(caught.value)


def test_queues_set_later_are_checked_the_same_way() -> None:
    worker = sa_jobs.Worker(ENGINE)
    with pytest.raises(InvalidOptionsError, match=r"queues=\{'mail': 10\}"):
        worker.queues = ["mail"]  # type: ignore[assignment]
    assert worker.queues == {"default": 10}


def test_periodic_retire_after_under_two_registrations_is_refused() -> None:
    assert MIN_PERIODIC_RETIRE_AFTER == 2 * REGISTER_INTERVAL == 120
    with pytest.raises(InvalidOptionsError) as caught:
        sa_jobs.MaintenanceConfig(periodic_retire_after=60)
    assert caught.value.option == "periodic_retire_after"
    message = str(caught.value)
    assert "under the minimum of 120 s" in message
    assert "mark their periodic jobs seen every 60 s" in message
    assert sa_jobs.MaintenanceConfig(periodic_retire_after=120).periodic_retire_after == 120


def test_a_live_worker_is_one_the_rescuer_would_not_take_for_gone() -> None:
    assert LIVE_WORKER_WINDOW.total_seconds() == sa_jobs.MaintenanceConfig().rescue_after


def test_an_unserved_queue_is_a_warning_only_past_its_threshold() -> None:
    thresholds = HealthThresholds(unserved_age_warning=dt.timedelta(seconds=60))
    young = {"mail": dt.timedelta(seconds=59)}
    old = {"mail": dt.timedelta(minutes=12), "images": dt.timedelta(seconds=61)}

    assert evaluate([], None, thresholds, unserved=young) == (HealthLevel.OK, ())
    level, findings = evaluate([], None, thresholds, unserved=old)
    assert level is HealthLevel.WARNING
    assert [f.figure for f in findings] == ["unserved_queue", "unserved_queue"]
    assert "queue 'mail' has had an available job waiting for 12 min" in findings[0].message
    assert "Worker(engine, queues={'mail': N})" in findings[0].message


def test_unserved_age_warning_must_be_positive() -> None:
    with pytest.raises(InvalidOptionsError, match="unserved_age_warning"):
        HealthThresholds(unserved_age_warning=dt.timedelta(0))


def test_the_processes_parent_says_what_a_second_ctrl_c_does(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The parent passes a first Ctrl-C on to its worker processes and says that a
    second one cancels their running jobs."""
    caplog.set_level(logging.INFO, logger="sa_jobs.cli")
    # Each child exits 0 on SIGINT, once its handler is in place (it says so with a file).
    child = [
        sys.executable,
        "-c",
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *_: sys.exit(0))\n"
        f"open(os.path.join({str(tmp_path)!r}, str(os.getpid())), 'w').close()\n"
        "time.sleep(30)\n",
    ]

    def interrupt() -> None:
        deadline = time.monotonic() + 20
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt)
    sender.start()
    code = processes.supervise(child, 2, until_idle=False)
    sender.join()

    assert code == 0
    [said] = [r.getMessage() for r in caplog.records if "passing it to" in r.getMessage()]
    assert said == (
        "SIGINT: passing it to 2 worker processes (they finish their running jobs; a second "
        "SIGINT or SIGTERM (Ctrl-C again) cancels them)"
    )
