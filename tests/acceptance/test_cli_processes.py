"""``sa-jobs work --processes N``: real processes and real signals.

The parent runs ``tests/integration/cli_worker_app.py``'s worker in two children; the
tests read the children's pids from the parent's log and the worker ids from the jobs'
``attempted_by``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine, select
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from tests.helpers import url_text, wait_for_state, wait_until
from tests.integration.cli_worker_app import QUEUE, Linger, Rendezvous

pytestmark = pytest.mark.slow

Start = Callable[..., "Parent"]

APP_DIR = Path(__file__).parents[1] / "integration"
#: Generous for a loaded machine; a clean stop takes about a second.
STOP_TIMEOUT = 30


class Parent:
    """``sa-jobs work --processes 2`` as a subprocess, its log in a file."""

    def __init__(self, url: URL, log_path: Path, *argv: str, **variables: str) -> None:
        self.log_path = log_path
        env = {k: v for k, v in os.environ.items() if not k.startswith("SA_JOBS_")}
        env.update(SA_JOBS_DATABASE_URL=url_text(url), PYTHONUNBUFFERED="1", **variables)
        command = [sys.executable, "-m", "sa_jobs.cli", "work", "cli_worker_app:make_worker"]
        with log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                [*command, *argv], cwd=APP_DIR, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def children(self) -> list[int]:
        """The children's pids, once the parent has logged them."""
        found: list[int] = []

        def logged() -> bool:
            match = re.search(r"started 2 worker processes: pids (\d+), (\d+)", self.output())
            if match:
                found[:] = [int(match[1]), int(match[2])]
            return bool(match)

        wait_until(logged, timeout=15, interval=0.05, what="the parent to start its children")
        return found

    def wait(self, timeout: float = STOP_TIMEOUT) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.output()}") from None


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.fixture
def start(database_url: URL, tmp_path: Path, no_workers_or_leader: None) -> Iterator[Start]:
    started: list[Parent] = []
    pids: list[int] = []

    def make(*argv: str, **variables: str) -> Parent:
        parent = Parent(database_url, tmp_path / f"parent{len(started)}.log", *argv, **variables)
        started.append(parent)
        return parent

    yield make
    for parent in started:
        if parent.popen.poll() is None:
            parent.popen.kill()
            parent.popen.wait()
        for pair in re.findall(r"pids (\d+), (\d+)", parent.output()):
            pids.extend(int(pid) for pid in pair)
    for pid in pids:  # never leave a worker behind, whatever the test did
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def insert_lingers(engine: Engine, count: int, seconds: float) -> list[int]:
    with Session(engine) as session, session.begin():
        return [sa_jobs.insert(session, Linger(seconds=seconds)).job.id for _ in range(count)]


def worker_ids(engine: Engine, job_ids: list[int]) -> set[str]:
    with engine.connect() as connection:
        rows = connection.scalars(select(Job.attempted_by).where(Job.id.in_(job_ids))).all()
    return {worker for attempted_by in rows for worker in attempted_by or ()}


def test_two_processes_both_work_and_stop_cleanly_on_sigterm(start: Start, engine: Engine) -> None:
    # One job at a time per child, so both must take some of these.
    parent = start("--processes", "2", "-q", f"{QUEUE}=1")
    children = parent.children()
    jobs = insert_lingers(engine, 6, 0.2)
    for job_id in jobs:
        wait_for_state(engine, job_id, JobState.COMPLETED, timeout=30)
    assert len(worker_ids(engine, jobs)) == 2, parent.output()

    # A job still running when SIGTERM comes: the signal reaches its child, which lets it
    # finish (a first signal), and the parent waits for that.
    [last] = insert_lingers(engine, 1, 1.0)
    wait_for_state(engine, last, JobState.RUNNING, timeout=30)
    began = time.monotonic()
    parent.popen.send_signal(signal.SIGTERM)

    assert parent.wait() == 0, parent.output()
    assert time.monotonic() - began < STOP_TIMEOUT
    assert all(gone(pid) for pid in children), parent.output()
    assert wait_for_state(engine, last, JobState.COMPLETED).state is JobState.COMPLETED
    log = parent.output()
    assert "SIGTERM: passing it to 2 worker processes" in log
    assert log.count("SIGTERM: finishing running jobs, then stopping") == 2, log
    assert "Traceback" not in log


def test_a_child_that_dies_stops_the_others_and_the_parent_fails(
    start: Start, engine: Engine
) -> None:
    parent = start("--processes", "2")
    first, second = parent.children()
    wait_until(
        lambda: parent.output().count("started: queues") == 2,
        timeout=30,
        interval=0.05,
        what="both workers to start",
    )

    os.kill(first, signal.SIGKILL)

    assert parent.wait() == 1, parent.output()
    assert gone(second)
    log = parent.output()
    assert f"worker process {first} was killed by SIGKILL" in log
    assert "stopping the other worker processes (none is restarted)" in log
    assert f"worker process {second} exited" in log


def test_children_stop_when_the_parent_is_killed(start: Start, engine: Engine) -> None:
    parent = start("--processes", "2")
    children = parent.children()
    wait_until(
        lambda: parent.output().count("started: queues") == 2,
        timeout=30,
        interval=0.05,
        what="both workers to start",
    )

    parent.popen.kill()
    parent.popen.wait()

    wait_until(
        lambda: all(gone(pid) for pid in children),
        timeout=STOP_TIMEOUT,
        interval=0.1,
        what="the orphaned children to stop",
    )
    assert parent.output().count("is gone: stopping") == 2


def test_processes_and_until_idle_from_the_environment(start: Start, engine: Engine) -> None:
    """Two processes, one job at a time each, until idle: all from SA_JOBS_* variables.
    The children inherit SA_JOBS_PROCESSES=2 but are told --processes 1, so exactly one
    parent starts children. Each job waits until both children are registered, so the
    first child to start cannot work them all before the second one is up."""
    with Session(engine) as session, session.begin():
        jobs = [sa_jobs.insert(session, Rendezvous(workers=2)).job.id for _ in range(2)]

    parent = start(SA_JOBS_PROCESSES="2", SA_JOBS_UNTIL_IDLE="true", SA_JOBS_QUEUES=f"{QUEUE}=1")

    assert parent.wait() == 0, parent.output()
    with engine.connect() as connection:
        states = connection.scalars(select(Job.state).where(Job.id.in_(jobs))).all()
    assert states == [JobState.COMPLETED] * 2
    assert len(worker_ids(engine, jobs)) == 2, parent.output()
    log = parent.output()
    assert log.count("started 2 worker processes") == 1, log
    assert log.count(f"started: queues {{'{QUEUE}': 1}}") == 2, log


def test_sigterm_during_until_idle_lets_the_running_job_finish(
    start: Start, engine: Engine
) -> None:
    [long_job] = insert_lingers(engine, 1, 1.0)
    [waiting] = insert_lingers(engine, 1, 0.1)

    parent = start("--until-idle", "-q", f"{QUEUE}=1")
    wait_for_state(engine, long_job, JobState.RUNNING, timeout=30)
    parent.popen.send_signal(signal.SIGTERM)

    assert parent.wait() == 0, parent.output()
    assert wait_for_state(engine, long_job, JobState.COMPLETED).state is JobState.COMPLETED
    # Stopped before the queue was idle: the next job stays queued for the next run.
    assert wait_for_state(engine, waiting, JobState.AVAILABLE).state is JobState.AVAILABLE
    log = parent.output()
    assert "SIGTERM: finishing running jobs, then stopping" in log
    assert "stopped before the queues were idle" in log
    assert "Traceback" not in log


def test_no_until_idle_on_the_command_line_wins_over_the_environment(
    start: Start, engine: Engine
) -> None:
    [job] = insert_lingers(engine, 1, 0.1)

    parent = start("--no-until-idle", SA_JOBS_UNTIL_IDLE="1")
    wait_for_state(engine, job, JobState.COMPLETED, timeout=30)
    # With --until-idle it would be gone about now (idle is noticed within milliseconds).
    time.sleep(2)
    assert parent.popen.poll() is None, parent.output()

    parent.popen.send_signal(signal.SIGTERM)
    assert parent.wait() == 0, parent.output()
