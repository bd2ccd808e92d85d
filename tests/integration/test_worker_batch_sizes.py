"""Fetch and completion batches adapt to the load (issue 15): a busy worker fetches and
completes many jobs per statement; an idle one fetches, runs and completes a single job
at once, not after some batching timer."""

from __future__ import annotations

import functools
import statistics
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import sa_jobs
import sa_jobs.worker.run as run_module
from sa_jobs import Job, JobState
from sa_jobs.worker.completer import BatchCompleter
from tests.factories import job_row
from tests.helpers import (
    add_jobs,
    count_jobs,
    is_finish_statement,
    make_worker,
    running,
    sent_statements,
    wait_idle,
    wait_listening,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")


@sa_jobs.job_args(kind="batch_sizes_noop")
class Noop:
    n: int = 0


def _recording_fetches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch the worker's producers fetch from now on."""
    sizes: list[int] = []
    real = run_module.fetch_jobs

    def fetch(*args: Any, **kwargs: Any) -> list[Job[Any]]:
        jobs = real(*args, **kwargs)
        if jobs:
            sizes.append(len(jobs))
        return jobs

    monkeypatch.setattr(run_module, "fetch_jobs", fetch)
    return sizes


def test_a_busy_worker_fetches_and_completes_many_jobs_per_statement(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    total = 400
    add_jobs(engine, [Noop(n=i) for i in range(total)])
    fetched = _recording_fetches(monkeypatch)
    worker = make_worker(engine, queues={"default": 10})
    worker.handler(Noop)(lambda job: None)

    with sent_statements(engine, is_finish_statement) as finishes:
        worker.run_until_idle()

    assert count_jobs(engine, JobState.COMPLETED) == total
    assert sum(fetched) == total
    # Busy: the slots free up while the producer fetches, so it fetches several at a
    # time (never more than the 10 slots), not one job per statement.
    assert max(fetched) <= 10
    assert statistics.mean(fetched) > 2, fetched
    completed = [len(params["sa_jobs_completed_ids"]) for _, params in finishes]
    assert sum(completed) == total
    assert statistics.mean(completed) > 2, completed


def test_an_idle_worker_starts_and_completes_a_single_job_at_once(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A completion interval far longer than the test: a single outcome that waited for a
    # batch to fill up would show.
    monkeypatch.setattr(run_module, "BatchCompleter", functools.partial(BatchCompleter, interval=5))
    fetched = _recording_fetches(monkeypatch)
    started = threading.Event()
    worker = make_worker(engine, queues={"default": 10}, poll_interval=30)  # NOTIFY only
    worker.handler(Noop)(lambda job: started.set())

    with running(worker):
        wait_listening(worker)
        wait_idle(worker)
        with Session(engine, expire_on_commit=False) as session, session.begin():
            job = sa_jobs.insert(session, Noop()).job
        committed = time.monotonic()
        assert started.wait(5)
        took_to_start = time.monotonic() - committed
        wait_until(
            lambda: job_row(engine, job.id).state is JobState.COMPLETED,
            timeout=2.5,  # half the completion interval
            what="the job's completion to be written",
        )
        took_to_complete = time.monotonic() - committed

    assert fetched == [1]
    assert took_to_start < 1.0, took_to_start  # typically a few ms
    assert took_to_complete < 2.5, took_to_complete
