"""Fetching: order, SKIP LOCKED, many workers at once, NOTIFY wake-ups, scheduled jobs."""

from __future__ import annotations

import collections
import datetime as dt
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Engine, create_engine, select, text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import DetachedInstanceError

import sa_jobs
import sa_jobs.worker.run as worker_module
from sa_jobs import Job, JobState, MaintenanceConfig, Worker
from sa_jobs.worker.producer import fetch_jobs
from tests.factories import job_row, make_job, seconds
from tests.helpers import (
    FAST_RESCUE,
    count_jobs,
    db_now,
    job_states,
    make_worker,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("no_workers_or_leader")


@sa_jobs.job_args(kind="test_fetch_work")
class Work:
    n: int = 0
    sleep: float = 0.0


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """Workers a test starts; all stopped (in parallel) at teardown, whatever happened."""
    started: list[Worker] = []
    yield started
    stoppers = [threading.Thread(target=w.stop, kwargs={"cancel": True}) for w in started]
    for thread in stoppers:
        thread.start()
    for thread in stoppers:
        thread.join(30)


def all_states(engine: Engine) -> collections.Counter[JobState]:
    return collections.Counter(job_states(engine).values())


# ------------------------------------------------------------------ the fetch query


def test_fetch_order_is_priority_then_scheduled_at_then_id(engine: Engine) -> None:
    t0 = db_now(engine)
    # (priority, seconds before t0); inserted in a scrambled order, ties on purpose.
    spec = [(2, 10), (1, 5), (1, 20), (4, 30), (1, 5), (2, 20), (3, 1), (1, 20)]
    ids = {
        make_job(engine, queue="order", priority=p, scheduled_at=t0 - seconds(s)): (p, -s)
        for p, s in spec
    }
    expected = sorted(ids, key=lambda job_id: (*ids[job_id], job_id))

    # One at a time, so the order is the database's, not a sort after the fetch.
    taken = []
    while jobs := fetch_jobs(engine, "order", 1, "w"):
        taken.extend(job.id for job in jobs)
    assert taken == expected


def test_fetch_limit_takes_the_first_jobs_in_order(engine: Engine) -> None:
    t0 = db_now(engine)
    low = [make_job(engine, queue="lim", priority=4, scheduled_at=t0 - seconds(60)) for _ in "ab"]
    high = [make_job(engine, queue="lim", priority=1, scheduled_at=t0) for _ in "abc"]
    assert [job.id for job in fetch_jobs(engine, "lim", 3, "w")] == high
    assert [job.id for job in fetch_jobs(engine, "lim", 3, "w")] == low
    assert fetch_jobs(engine, "lim", 3, "w") == []


def test_fetch_marks_jobs_running_for_the_worker(engine: Engine) -> None:
    fresh = make_job(engine, queue="mark")
    retried = make_job(engine, queue="mark", attempt=2, attempted_by=["w1", "w2"])
    jobs = fetch_jobs(engine, "mark", 10, "w3")
    assert {job.id for job in jobs} == {fresh, retried}
    now = db_now(engine)
    for job_id, attempt, attempted_by in ((fresh, 1, ["w3"]), (retried, 3, ["w1", "w2", "w3"])):
        row = job_row(engine, job_id)
        assert row.state is JobState.RUNNING
        assert row.attempt == attempt
        assert row.attempted_by == attempted_by
        assert row.attempted_at is not None
        assert now - dt.timedelta(seconds=5) < row.attempted_at <= now
    # The detached jobs handed to the worker say the same.
    by_id = {job.id: job for job in jobs}
    assert by_id[retried].attempt == 3
    assert by_id[retried].attempted_by == ["w1", "w2", "w3"]


def test_fetched_jobs_behave_like_the_orm_loaded_jobs_of_a_closed_session(engine: Engine) -> None:
    # fetch_jobs builds its Job objects from Core rows (sa_jobs._table.job_loading); a handler
    # must not be able to tell them from what Session + select(Job) leaves behind.
    job_id = make_job(
        engine, kind="test_fetch_work", queue="detached", args={"n": 7}, metadata={"a": 1}
    )
    (job,) = fetch_jobs(engine, "detached", 1, "w")
    with Session(engine) as session:
        loaded = session.get(Job, job_id)
        assert loaded is not None
        session.expunge(loaded)
    for column in sa_inspect(Job).column_attrs:
        if column.key in loaded.__dict__:
            assert getattr(job, column.key) == getattr(loaded, column.key), column.key
    state = sa_inspect(job)
    assert state.detached and state.key == sa_inspect(loaded).key
    assert not state.modified
    # What the ORM leaves unloaded stays unloaded, except sequence_key and workflow_id,
    # which the fetch returns on purpose (the completer skips sequence work for
    # unsequenced jobs, and writes plain jobs' outcomes without a transaction).
    assert state.unloaded == sa_inspect(loaded).unloaded - {"sequence_key", "workflow_id"}
    assert job.sequence_key is None
    assert job.workflow_id is None
    assert job.args == Work(n=7)
    with pytest.raises(DetachedInstanceError):
        _ = job.job_key  # a deferred column: not loaded, as with the ORM
    # A handler's session can take it in, change it and flush only what changed.
    with Session(engine) as session, session.begin():
        attached = session.merge(job)
        attached.priority = 3
    assert job_row(engine, job_id).priority == 3
    with Session(engine) as session, session.begin():
        session.add(job)
        assert job.job_key is None  # attached: the deferred column loads now


def test_fetch_takes_only_due_available_jobs_of_its_queue(engine: Engine) -> None:
    due = make_job(engine, queue="mine")
    make_job(engine, queue="other")
    make_job(engine, queue="mine", scheduled_at=seconds(60))  # available but not due yet
    for state in JobState:
        if state is not JobState.AVAILABLE:
            make_job(engine, queue="mine", state=state, scheduled_at=-seconds(60))
    assert [job.id for job in fetch_jobs(engine, "mine", 100, "w")] == [due]
    assert fetch_jobs(engine, "mine", 100, "w") == []


def test_fetch_skips_a_row_locked_elsewhere_without_waiting(engine: Engine) -> None:
    locked = make_job(engine, queue="lock")
    free = make_job(engine, queue="lock")
    with engine.connect() as holder, holder.begin():
        holder.execute(select(Job.id).where(Job.id == locked).with_for_update())
        started = time.monotonic()
        jobs = fetch_jobs(engine, "lock", 10, "w")
        assert time.monotonic() - started < 2
        assert [job.id for job in jobs] == [free]
    assert [job.id for job in fetch_jobs(engine, "lock", 10, "w")] == [locked]


def test_concurrent_fetchers_get_disjoint_jobs(engine: Engine) -> None:
    total, fetchers = 600, 12
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Work(n=i) for i in range(total)], queue="skip")
    barrier = threading.Barrier(fetchers)
    got: dict[str, list[int]] = {}
    failures: list[BaseException] = []

    def fetcher(name: str) -> None:
        mine: list[int] = []
        try:
            barrier.wait()
            while jobs := fetch_jobs(engine, "skip", 5, name):
                mine.extend(job.id for job in jobs)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)
        got[name] = mine

    threads = [threading.Thread(target=fetcher, args=(f"f{i}",)) for i in range(fetchers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    every = [job_id for ids in got.values() for job_id in ids]
    assert len(every) == len(set(every)) == total
    assert sum(1 for ids in got.values() if ids) > 1, "the fetchers did not overlap at all"
    with engine.connect() as connection:
        rows = connection.execute(select(Job.id, Job.state, Job.attempt, Job.attempted_by)).all()
    owner = {job_id: name for name, ids in got.items() for job_id in ids}
    for job_id, state, attempt, attempted_by in rows:
        assert (state, attempt, attempted_by) == (JobState.RUNNING, 1, [owner[job_id]])


# ------------------------------------------------------------------ workers


class Recorder:
    """What handlers saw: runs per job id, and peak concurrency per (worker, queue)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: collections.Counter[int] = collections.Counter()
        self.running: collections.Counter[tuple[str, str]] = collections.Counter()
        self.peak: collections.Counter[tuple[str, str]] = collections.Counter()
        self.by_worker: collections.Counter[str] = collections.Counter()
        self.started_at: dict[int, float] = {}

    def handler(self, job: Job) -> None:
        assert job.attempted_by is not None
        key = (job.attempted_by[-1], job.queue)
        with self.lock:
            self.started_at.setdefault(job.id, time.monotonic())
            self.runs[job.id] += 1
            self.by_worker[key[0]] += 1
            self.running[key] += 1
            self.peak[key] = max(self.peak[key], self.running[key])
        try:
            if job.args.sleep:
                time.sleep(job.args.sleep)  # the job's work: it holds its slot meanwhile
        finally:
            with self.lock:
                self.running[key] -= 1


def recording_worker(
    engine: Engine,
    recorder: Recorder,
    queues: dict[str, int],
    *,
    worker_id: str,
    poll_interval: float = 1.0,
    maintenance: MaintenanceConfig = FAST_RESCUE,
) -> Worker:
    """A worker whose handler of ``Work`` reports to ``recorder``."""
    worker = make_worker(
        engine,
        queues=queues,
        poll_interval=poll_interval,
        maintenance=maintenance,
        worker_id=worker_id,
    )
    worker.handler(Work)(recorder.handler)
    return worker


def test_many_workers_run_every_job_exactly_once(database_url: URL, engine: Engine) -> None:
    total = 2000
    queues = {"fa": 4, "fb": 2}
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(
            session,
            [Work(n=i, sleep=0.002) for i in range(total)],
            queue="fa",
            batch_size=total,
        )
        # A third of them in the second queue.
        session.execute(text("UPDATE sa_job SET queue = 'fb' WHERE id % 3 = 0"))

    recorder = Recorder()
    engines = [create_engine(database_url, pool_size=10, max_overflow=10) for _ in range(4)]
    workers = [
        recording_worker(e, recorder, queues, worker_id=f"many-{i}") for i, e in enumerate(engines)
    ]
    try:
        for worker in workers:
            worker.start()
        wait_until(
            lambda: count_jobs(engine, JobState.COMPLETED) == total,
            timeout=60,
            what="all jobs completed",
        )
    finally:
        stoppers = [threading.Thread(target=w.stop) for w in workers]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join(30)
        for e in engines:
            e.dispose()

    assert len(recorder.runs) == total
    assert set(recorder.runs.values()) == {1}, "some job ran more than once"
    assert all_states(engine) == {JobState.COMPLETED: total}
    with engine.connect() as connection:
        assert set(connection.scalars(select(Job.attempt))) == {1}
    # Every worker took part, and none ran more of a queue at once than its concurrency.
    assert set(recorder.by_worker) == {w.id for w in workers}
    for (_worker_id, queue), peak in recorder.peak.items():
        assert peak <= queues[queue], (queue, peak)


def test_per_queue_concurrency_is_reached_and_never_exceeded(
    engine: Engine, workers: list[Worker]
) -> None:
    queues = {"ca": 3, "cb": 2}
    with Session(engine) as session, session.begin():
        for queue in queues:
            sa_jobs.insert_many(session, [Work(n=i, sleep=0.1) for i in range(12)], queue=queue)
    recorder = Recorder()
    worker = recording_worker(engine, recorder, queues, worker_id="conc")
    workers.append(worker)
    worker.start()
    wait_until(
        lambda: count_jobs(engine, JobState.COMPLETED) == 24, timeout=30, what="all jobs completed"
    )
    assert recorder.peak == {("conc", "ca"): 3, ("conc", "cb"): 2}


def test_notify_starts_a_job_at_once_when_polling_is_slow(
    engine: Engine, workers: list[Worker]
) -> None:
    recorder = Recorder()
    # Polling every 10 s: only the insert trigger's NOTIFY can start jobs quickly.
    worker = recording_worker(engine, recorder, {"lat": 1}, worker_id="lat", poll_interval=10)
    workers.append(worker)
    worker.start()

    def enqueue(n: int) -> tuple[int, float]:
        with Session(engine, expire_on_commit=False) as session:
            session.begin()
            job = sa_jobs.insert(session, Work(n=n), queue="lat").job
            before_commit = time.monotonic()
            session.commit()
        return job.id, before_commit

    # Warm up: this one starts only after the worker listens (or after its first fetch,
    # which happens once it listens).
    warm_id, _ = enqueue(-1)
    wait_until(lambda: warm_id in recorder.started_at, timeout=10, what="the warm-up job")

    latencies = []
    for n in range(20):
        job_id, committed = enqueue(n)
        wait_until(
            lambda job_id=job_id: job_id in recorder.started_at,
            timeout=3,
            what=f"job {n} to start",
        )
        latencies.append(recorder.started_at[job_id] - committed)
        wait_idle(worker, "lat")  # the next job is woken by its NOTIFY, not found by a busy loop
    assert statistics.median(latencies) < 0.05, latencies
    assert max(latencies) < 1.0, latencies


def test_scheduled_job_waits_for_its_time_then_is_promoted_and_run(
    engine: Engine, workers: list[Worker]
) -> None:
    due_in = 1.0
    with Session(engine, expire_on_commit=False) as session, session.begin():
        scheduled_at = db_now(engine) + seconds(due_in)
        job = sa_jobs.insert(session, Work(), queue="later", scheduled_at=scheduled_at).job
    assert job.state is JobState.SCHEDULED
    assert fetch_jobs(engine, "later", 10, "early") == []

    recorder = Recorder()
    # Slow polling: the scheduler's promotion (and its NOTIFY) is what starts the job.
    worker = recording_worker(engine, recorder, {"later": 1}, worker_id="sched", poll_interval=10)
    workers.append(worker)
    worker.start()
    time.sleep(due_in / 2)  # half its delay passes in real time, and it must not run yet
    assert job.id not in recorder.runs, "a job ran before its scheduled time"
    assert job_row(engine, job.id).state is JobState.SCHEDULED

    wait_until(lambda: job_row(engine, job.id).state is JobState.COMPLETED, what="the job to run")
    row = job_row(engine, job.id)
    assert row.attempt == 1
    assert row.attempted_at >= scheduled_at
    assert row.attempted_at - scheduled_at < dt.timedelta(seconds=1)


def test_jobs_fetched_by_a_commit_whose_reply_was_lost_are_not_lost(
    engine: Engine, workers: list[Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fetch = worker_module.fetch_jobs
    lost: list[int] = []

    def fetch_losing_the_first_reply(*args: Any, **kwargs: Any) -> list[Job]:
        jobs = real_fetch(*args, **kwargs)
        if jobs and not lost:
            lost.extend(job.id for job in jobs)
            raise OperationalError("COMMIT", {}, Exception("server closed the connection"))
        return jobs

    monkeypatch.setattr(worker_module, "fetch_jobs", fetch_losing_the_first_reply)
    recorder = Recorder()
    worker = recording_worker(engine, recorder, {"lost": 1}, worker_id="lost-reply")
    workers.append(worker)
    worker.start()
    with Session(engine) as session, session.begin():
        job_id = sa_jobs.insert(session, Work(), queue="lost").job.id
    wait_until(lambda: lost == [job_id], what="the fetch to lose its reply")
    # rescue_after is 1 s: a few seconds is plenty for any recovery to happen.
    wait_until(
        lambda: job_row(engine, job_id).state is JobState.COMPLETED,
        what=f"job {job_id} to be worked (it is {job_row(engine, job_id).state})",
    )


def test_jobs_of_a_dead_process_are_rescued_when_its_successor_reuses_the_worker_id(
    engine: Engine, workers: list[Worker]
) -> None:
    orphan = make_job(
        engine,
        kind="test_fetch_work",
        queue="reused",
        state=JobState.RUNNING,
        attempt=1,
        attempted_by=["pod-0"],
        attempted_at=-seconds(30),
    )
    recorder = Recorder()
    worker = recording_worker(engine, recorder, {"reused": 1}, worker_id="pod-0")
    workers.append(worker)
    worker.start()
    wait_until(
        lambda: job_row(engine, orphan).state is JobState.COMPLETED,
        what=f"the orphaned job to be rescued and run (it is {job_row(engine, orphan).state})",
    )
