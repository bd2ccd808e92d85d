"""Worker subprocesses for the acceptance tests, and what their handlers recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, select, text

from sa_jobs.models import Job, WorkerProcess
from sa_jobs.states import JobState
from tests.acceptance.worker_app import RUNS_TABLE

WORKER_APP = Path(__file__).with_name("worker_app.py")


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class WorkerProcessHandle:
    """One ``worker_app.py`` process; its output goes to a log file shown on failure."""

    def __init__(self, url: URL, log_path: Path, worker_id: str, env: dict[str, str]) -> None:
        self.worker_id = worker_id
        self.log_path = log_path
        environment = {
            **os.environ,
            "SA_JOBS_TEST_URL": url.render_as_string(hide_password=False),
            "SA_JOBS_TEST_WORKER_ID": worker_id,
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self._log = log_path.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, str(WORKER_APP)],
            env=environment,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parents[2],
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self, engine: Engine, timeout: float = 15) -> None:
        """Wait for the worker's heartbeat row (written before its first fetch)."""

        def ready() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(f"worker exited early:\n{self.output()}")
            with engine.connect() as connection:
                return bool(
                    connection.scalar(
                        select(WorkerProcess.id).where(WorkerProcess.id == self.worker_id)
                    )
                )

        wait_for(ready, timeout, f"worker {self.worker_id} to heartbeat")

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.worker_id} still running after {timeout} s:\n{self.output()}"
            ) from None

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def kill(self) -> None:
        """Make sure the process is gone (SIGKILL if still running)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)
        self._log.close()


def runs(engine: Engine, job_id: int | None = None) -> list[Any]:
    """Rows the handlers wrote: ``(job_id, attempt, pid, event)`` in order."""
    query = f"SELECT job_id, attempt, pid, event FROM {RUNS_TABLE}"
    params: dict[str, Any] = {}
    if job_id is not None:
        query += " WHERE job_id = :job_id"
        params["job_id"] = job_id
    with engine.connect() as connection:
        return connection.execute(text(query + " ORDER BY seq"), params).all()


def started(engine: Engine, job_id: int, attempt: int) -> bool:
    return any(r.attempt == attempt and r.event == "start" for r in runs(engine, job_id))


def job_states(engine: Engine) -> dict[int, JobState]:
    with engine.connect() as connection:
        return {job_id: state for job_id, state in connection.execute(select(Job.id, Job.state))}


def get_job(engine: Engine, job_id: int) -> Any:
    with engine.connect() as connection:
        return connection.execute(select(Job.__table__).where(Job.id == job_id)).one()
