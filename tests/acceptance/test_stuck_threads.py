"""A worker whose stuck handler threads reached ``stuck_thread_limit`` (issue 27, item 2):
real ``sa-jobs work`` processes running :mod:`tests.acceptance.stuck_worker_app`, whose
``Hang`` handler ignores its timeout.

It says so in ``sa-jobs health`` (exit 3, the worker named) and in the Prometheus
gauges, and under ``--processes N --replace-stuck`` the parent replaces the process with
a fresh one, which goes on working.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import prometheus_client
import pytest
from sqlalchemy import URL, Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.cli import main
from sa_jobs.prometheus import PrometheusMetrics
from tests.acceptance.stuck_worker_app import Hang, Quick
from tests.helpers import url_text, wait_for_state, wait_until

ROOT = Path(__file__).parents[2]
APP = "tests.acceptance.stuck_worker_app:make_worker"


class Work:
    """``sa-jobs work APP *argv`` as a subprocess, its output in a file."""

    def __init__(self, url: URL, log_path: Path, *argv: str) -> None:
        self.log_path = log_path
        env = {k: v for k, v in os.environ.items() if not k.startswith("SA_JOBS_")}
        env.update(SA_JOBS_DATABASE_URL=url_text(url), PYTHONUNBUFFERED="1")
        with log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "sa_jobs.cli", "work", APP, *argv],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
            )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.output()}") from None


@pytest.fixture
def work(database_url: URL, tmp_path: Path, no_workers_or_leader: None) -> Iterator[type]:
    started: list[Work] = []

    def make(*argv: str) -> Work:
        process = Work(database_url, tmp_path / f"work{len(started)}.log", *argv)
        started.append(process)
        return process

    yield make  # type: ignore[misc]
    for process in started:  # the whole group: children hang in Hang's sleep
        if process.popen.poll() is None:
            os.killpg(process.popen.pid, signal.SIGKILL)
            process.popen.wait()
        for pid in re.findall(r"pids? (\d+)", process.output()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def insert(engine: Engine, args: object) -> int:
    with Session(engine) as session, session.begin():
        return sa_jobs.insert(session, args).job.id


def stuck_workers(engine: Engine) -> dict[str, tuple[int, int]]:
    with Session(engine) as session:
        return dict(sa_jobs.check_health(session).stuck_workers)


def test_a_stuck_worker_says_so_in_health_and_the_metrics(
    work: type, engine: Engine, database_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    process = work()
    job_id = insert(engine, Hang(seconds=120))
    # Settled (discarded: one attempt) while its thread stays in the handler.
    wait_for_state(engine, job_id, sa_jobs.JobState.DISCARDED, timeout=30)
    wait_until(lambda: stuck_workers(engine), timeout=15, what="the heartbeat to say stuck")
    [(worker, figures)] = stuck_workers(engine).items()
    assert figures == (1, 1)

    assert main(["health", "--url", url_text(database_url)]) == 3
    out = capsys.readouterr().out
    assert f"worker {worker} has 1 handler threads stuck" in out, out
    assert "stuck_thread_limit is 1" in out

    registry = prometheus_client.CollectorRegistry()
    PrometheusMetrics(registry, engine=engine)
    assert registry.get_sample_value("sa_jobs_worker_stuck_threads", {"worker": worker}) == 1

    # Without --replace-stuck the process goes on (with its slot freed, one left).
    assert process.popen.poll() is None
    assert process.stop() == 0, process.output()[-3000:]


def test_replace_stuck_starts_a_fresh_process_in_its_place(work: type, engine: Engine) -> None:
    parent = work("--processes", "2", "--replace-stuck")
    wait_until(lambda: "started 2 worker processes" in parent.output(), timeout=20, what="children")
    job_id = insert(engine, Hang(seconds=120))
    wait_for_state(engine, job_id, sa_jobs.JobState.DISCARDED, timeout=30)
    wait_until(
        lambda: "in its place" in parent.output(),
        timeout=20,
        what="the stuck process to be replaced",
    )
    log = parent.output()
    replaced = re.search(r"worker process (\d+) stopped: its handler threads are stuck", log)
    assert replaced, log
    assert "stopping this process to be replaced by a fresh one" in log
    # The group goes on: two processes work, the stuck one is gone.
    assert parent.popen.poll() is None
    quick = [insert(engine, Quick(label=str(n))) for n in range(4)]
    for job_id in quick:
        wait_for_state(engine, job_id, sa_jobs.JobState.COMPLETED, timeout=30)
    assert parent.stop() == 0, parent.output()[-3000:]
    assert "Traceback" not in parent.output()
