"""Fixtures for the acceptance tests: real worker processes and the table they write to."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine, text

from tests.acceptance.processes import WORKER_APP, WorkerProcessHandle
from tests.acceptance.worker_app import RUNS_DDL, RUNS_TABLE
from tests.factories import clear_workers_and_leader

Spawn = Callable[..., WorkerProcessHandle]


@pytest.fixture
def runs_table(engine: Engine) -> Iterator[None]:
    with engine.begin() as connection:
        connection.execute(text(f"DROP TABLE IF EXISTS {RUNS_TABLE}"))
        connection.execute(text(RUNS_DDL))
    clear_workers_and_leader(engine)
    yield
    with engine.begin() as connection:
        connection.execute(text(f"DROP TABLE IF EXISTS {RUNS_TABLE}"))
    clear_workers_and_leader(engine)


@pytest.fixture
def spawn(
    database_url: URL, tmp_path: Path, runs_table: None, request: pytest.FixtureRequest
) -> Iterator[Spawn]:
    """Start worker processes (``worker_app`` unless ``app`` names another module); every
    one is killed at teardown if still alive, and its output shown if the test failed."""
    started: list[WorkerProcessHandle] = []

    def start(worker_id: str, app: str = WORKER_APP, **env: str) -> WorkerProcessHandle:
        log_path = tmp_path / f"{worker_id}.log"
        handle = WorkerProcessHandle(database_url, log_path, worker_id, env, app)
        started.append(handle)
        return handle

    try:
        yield start
    finally:
        for handle in started:
            handle.kill()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            for handle in started:
                print(f"--- output of worker {handle.worker_id} ---\n{handle.output()}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    setattr(item, "rep_" + report.when, report)
    return report
