"""Worker subprocesses for the acceptance tests, and what their handlers recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, select, text

from sa_jobs._table.service_tables import WorkerProcess
from tests.acceptance.worker_app import RUNS_TABLE
from tests.helpers import url_text, wait_until

#: The repository's root: the processes run there, so ``tests`` is importable.
ROOT = Path(__file__).parents[2]
WORKER_APP = "tests.acceptance.worker_app"


class WorkerProcessHandle:
    """One worker process (``python -m app``, :data:`WORKER_APP` by default); its output
    goes to a log file shown on failure."""

    def __init__(
        self,
        url: URL,
        log_path: Path,
        worker_id: str,
        env: dict[str, str],
        app: str = WORKER_APP,
    ) -> None:
        self.worker_id = worker_id
        self.log_path = log_path
        environment = {
            **os.environ,
            "SA_JOBS_TEST_URL": url_text(url),
            "SA_JOBS_TEST_WORKER_ID": worker_id,
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self._log = log_path.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", app],
            env=environment,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def heartbeating(self, engine: Engine) -> bool:
        """Is the worker's heartbeat row there (written before its first fetch)?"""
        if self.popen.poll() is not None:
            raise AssertionError(f"worker {self.worker_id} exited early:\n{self.output()}")
        with engine.connect() as connection:
            return bool(
                connection.scalar(
                    select(WorkerProcess.id).where(WorkerProcess.id == self.worker_id)
                )
            )

    def wait_ready(self, engine: Engine, timeout: float = 15) -> None:
        """Wait for the worker's heartbeat row."""
        wait_until(
            lambda: self.heartbeating(engine),
            timeout=timeout,
            interval=0.05,
            what=f"worker {self.worker_id} to heartbeat",
        )

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.worker_id} still running after {timeout} s:\n{self.output()}"
            ) from None

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM (if still running) and wait for the exit code."""
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait_logged(self, fragment: str, timeout: float = 5) -> None:
        """Wait until the worker's output says ``fragment``."""
        wait_until(
            lambda: fragment in self.output(),
            timeout=timeout,
            interval=0.05,
            what=f"worker {self.worker_id} to log {fragment!r}",
        )

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
