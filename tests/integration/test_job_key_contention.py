"""No lost requests: job keys under contention (Graphile Worker's issue #580 must not exist).

Graphile's ``add_job`` can return null when a worker locks the key's job between the
statement's snapshot and its ``ON CONFLICT`` check. sa_jobs runs another round for such
rows (``sa_jobs._insert.job_key.insert_keyed``), whose detach step now sees the running holder.

First the races, made deterministic: a second transaction holds the row an add needs
(a worker starting the holder, a worker completing it, another add of the same key,
``remove_job``) until the add is seen waiting on its lock, then commits or rolls back.

Then the contention test: several real workers fetch and complete while 16 threads add a
handful of keys many times, with array payloads carrying unique event ids, through every
insert path. Every add must return a result whose job carries its event; at the end every
event was in exactly one job that ran, and every job ran exactly once (the handlers never
fail, so no at-least-once retry may run one twice).
"""

from __future__ import annotations

import collections
import datetime as dt
import importlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import URL, Connection, Engine, create_engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import (
    InsertAction,
    InsertManyParams,
    InsertOpts,
    Job,
    JobKeyMode,
    JobState,
)
from sa_jobs._act.complete import finish_in
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._base.states import JOB_KEY_REPLACED_KEY
from sa_jobs._insert.job_key import RemoveOutcome
from sa_jobs._insert.job_key import rounds as key_rounds
from sa_jobs.worker.producer import jobs_fetch_available
from tests.factories import clear_workers_and_leader, job_row
from tests.helpers import fast_maintenance, insert_one, make_worker, wait_until


@sa_jobs.job_args(kind="jkc_events", list_payload=True)
class Events:
    events: list[str] = []


KEY = "contended"
# The module that writes rows (``sa_jobs.insert`` is the function).
insert_module = importlib.import_module("sa_jobs._insert.insert")


# ------------------------------------------------------------------ helpers


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """For each keyed group an insert path wrote: (statements it took, statements it
    needs without a race — one per repeat of a key)."""
    taken: list[tuple[int, int]] = []
    lock = threading.Lock()
    real = insert_module.insert_keyed

    def counting(rows: Any, mode: Any, run_round: Any, key_of: Any) -> Any:
        count = [0]

        def counted(batch: Any, m: Any) -> Any:
            count[0] += 1
            return run_round(batch, m)

        try:
            return real(rows, mode, counted, key_of)
        finally:
            with lock:
                taken.append((count[0], len(key_rounds(rows))))

    monkeypatch.setattr(insert_module, "insert_keyed", counting)
    return taken


def add_events(engine: Engine, events: list[str], **options: Any) -> sa_jobs.InsertResult:
    """Add ``events`` under the contended key, in a committed transaction of its own."""
    return insert_one(engine, Events(events), job_key=KEY, **options)


def start_in(connection: Connection, worker_id: str = "racing-worker") -> list[Any]:
    """Start due jobs in ``connection``'s (open) transaction, as a worker's fetch does."""
    fetch = jobs_fetch_available()
    params = {"fetch_queue": "default", "fetch_limit": 10, "fetch_worker_id": worker_id}
    return list(connection.execute(fetch, params))


def lock_waiters(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(
            connection.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                )
            )
            or 0
        )


class InThread:
    """Run ``function`` in a thread; ``result()`` joins and returns (or raises)."""

    def __init__(self, function: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = function()
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self, timeout: float = 10.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the thread is still blocked"
        if self._error is not None:
            raise self._error
        return self._value

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def blocked(engine: Engine, thread: InThread) -> None:
    """Wait until ``thread`` is waiting on a row lock held by the test."""
    wait_until(lambda: lock_waiters(engine) >= 1 or not thread.alive, timeout=10, what="a lock")
    assert thread.alive, "the add did not wait for the other transaction"


# ------------------------------------------------------------------ the races, one by one


def test_a_holder_started_mid_statement_is_detached_by_a_second_round(
    engine: Engine, rounds: list[tuple[int, int]]
) -> None:
    # Issue #580: the add's snapshot sees an available holder; a worker starts it before
    # the ON CONFLICT check, so the DO UPDATE declines (the row is running now). Graphile
    # returns null here; sa_jobs must run a second round and create a new job.
    holder = add_events(engine, ["e1"]).job.id
    rounds.clear()
    with engine.connect() as worker_tx:
        worker_tx.begin()
        (started,) = start_in(worker_tx)
        assert started.id == holder
        adding = InThread(lambda: add_events(engine, ["e2"]))
        blocked(engine, adding)
        worker_tx.commit()
    result = adding.result()
    assert result is not None
    assert result.action is InsertAction.INSERTED
    assert result.job.id != holder
    assert result.job.args_json == ["e2"]
    assert rounds == [(2, 1)]  # the first round came back empty-handed
    old = job_row(engine, holder)
    assert (old.state, old.job_key, old.max_attempts) == ("running", None, 1)
    assert JOB_KEY_REPLACED_KEY in old.metadata
    assert job_row(engine, result.job.id).job_key == KEY


@pytest.mark.parametrize("mode", [JobKeyMode.REPLACE, JobKeyMode.PRESERVE_RUN_AT])
def test_a_holder_started_mid_statement_with_every_path(
    engine: Engine, mode: JobKeyMode, rounds: list[tuple[int, int]]
) -> None:
    holder = add_events(engine, ["e1"]).job.id

    def through_enqueue() -> list[Any]:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            job = sa_jobs.enqueue(Events(["e2"]), job_key=KEY, job_key_mode=mode)
            session.add(job)
            session.flush()
            return [(job.insert_action, job.id, job.args_json)]

    def through_insert_many() -> list[Any]:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            results = sa_jobs.insert_many(
                session, [Events(["e3"]), Events(["e4"])], job_key=KEY, job_key_mode=mode
            )
            return [(r.action, r.job.id, list(r.job.args_json)) for r in results]

    for path, expected_events in ((through_enqueue, ["e2"]), (through_insert_many, None)):
        with engine.connect() as worker_tx:
            worker_tx.begin()
            (started,) = start_in(worker_tx)
            assert started.id == holder
            adding = InThread(path)
            blocked(engine, adding)
            worker_tx.commit()
        results = adding.result()
        assert results[0][0] is InsertAction.INSERTED
        assert results[0][1] != holder
        if expected_events is not None:
            assert results[0][2] == expected_events
        else:
            assert [r[0] for r in results] == [InsertAction.INSERTED, InsertAction.REPLACED]
            assert results[1][2] == ["e3", "e4"]
        assert job_row(engine, holder).job_key is None
        holder = results[0][1]
    # insert_many: the key's first use took two statements, its repeat one.
    assert rounds[-1] == (3, 2)


def test_a_holder_completed_mid_statement_leaves_the_key_free(
    engine: Engine, rounds: list[tuple[int, int]]
) -> None:
    # The add's snapshot sees a running holder; its worker completes it (releasing the
    # key) before the detach step locks it: nothing to detach, a plain insert.
    add_events(engine, ["e1"])
    with engine.begin() as connection:
        (started,) = start_in(connection)
    rounds.clear()
    with engine.connect() as worker_tx:
        worker_tx.begin()
        finish_in(worker_tx, [Outcome(started.id, started.run_count, Ending.COMPLETED)])
        adding = InThread(lambda: add_events(engine, ["e2"]))
        blocked(engine, adding)
        worker_tx.commit()
    result = adding.result()
    assert result.action is InsertAction.INSERTED
    assert result.job.id != started.id
    assert rounds == [(1, 1)]
    done = job_row(engine, started.id)
    assert (done.state, done.job_key, done.max_attempts) == ("completed", None, 25)
    assert JOB_KEY_REPLACED_KEY not in done.metadata


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_two_first_adds_of_a_key(engine: Engine, outcome: str) -> None:
    with engine.connect() as connection:
        other_tx = Session(bind=connection, expire_on_commit=False)
        transaction = connection.begin()
        first = sa_jobs.insert(other_tx, Events(["e1"]), job_key=KEY)
        assert first.action is InsertAction.INSERTED
        adding = InThread(lambda: add_events(engine, ["e2"]))
        blocked(engine, adding)
        if outcome == "commit":
            transaction.commit()
        else:
            transaction.rollback()
        other_tx.close()
    result = adding.result()
    if outcome == "commit":
        assert (result.action, result.job.id) == (InsertAction.REPLACED, first.job.id)
        assert result.job.args_json == ["e1", "e2"]
    else:
        assert result.action is InsertAction.INSERTED
        assert result.job.args_json == ["e2"]


def test_an_add_waits_for_a_replace_of_the_same_key(engine: Engine) -> None:
    holder = add_events(engine, ["e1"]).job.id
    with engine.connect() as connection:
        other_tx = Session(bind=connection, expire_on_commit=False)
        transaction = connection.begin()
        assert sa_jobs.insert(other_tx, Events(["e2"]), job_key=KEY).action == "replaced"
        adding = InThread(lambda: add_events(engine, ["e3"]))
        blocked(engine, adding)
        transaction.commit()
        other_tx.close()
    result = adding.result()
    assert (result.action, result.job.id) == (InsertAction.REPLACED, holder)
    assert result.job.args_json == ["e1", "e2", "e3"]


def test_remove_job_waits_for_a_starting_worker(engine: Engine) -> None:
    holder = add_events(engine, ["e1"]).job.id

    def remove() -> RemoveOutcome:
        with Session(engine) as session, session.begin():
            return sa_jobs.remove_job(session, KEY)

    with engine.connect() as worker_tx:
        worker_tx.begin()
        start_in(worker_tx)
        removing = InThread(remove)
        blocked(engine, removing)
        worker_tx.commit()
    assert removing.result() is RemoveOutcome.WILL_NOT_RUN_AGAIN
    row = job_row(engine, holder)
    assert (row.state, row.job_key, row.max_attempts) == ("running", None, 1)


def test_an_add_waits_for_remove_job(engine: Engine) -> None:
    holder = add_events(engine, ["e1"]).job.id
    with engine.connect() as connection:
        other_tx = Session(bind=connection)
        transaction = connection.begin()
        assert sa_jobs.remove_job(other_tx, KEY) is RemoveOutcome.REMOVED
        adding = InThread(lambda: add_events(engine, ["e2"]))
        blocked(engine, adding)
        transaction.commit()
        other_tx.close()
    result = adding.result()
    assert result.action is InsertAction.INSERTED
    assert result.job.id != holder
    assert result.job.args_json == ["e2"]


# ------------------------------------------------------------------ the contention test

THREADS = 16
ADDS_PER_THREAD = 50
KEYS = [f"key-{i}" for i in range(4)]
WORKERS = 3


@pytest.fixture
def contention_engine(engine: Engine, database_url: URL) -> Iterator[Engine]:
    """A pool big enough for the adders and the workers (``engine`` empties the table)."""
    engine = create_engine(database_url, pool_size=24, max_overflow=16)
    yield engine
    engine.dispose()


class Adder:
    """One thread's adds: every call's events, action and the job it returned."""

    def __init__(self, engine: Engine, index: int, mode: JobKeyMode, start: threading.Event):
        self.engine = engine
        self.index = index
        self.mode = mode
        self.start = start
        self.random = random.Random(index)
        #: (event, key, action, job id, returned args)
        self.results: list[tuple[str, str, InsertAction, int, list[str]]] = []
        self.error: BaseException | None = None

    def opts(self, key: str) -> InsertOpts:
        scheduled_at = None
        if self.mode is JobKeyMode.PRESERVE_RUN_AT and self.random.random() < 0.7:
            # A short batching window: the scheduler makes the job due.
            scheduled_at = dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=20)
        return InsertOpts(job_key=key, job_key_mode=self.mode, scheduled_at=scheduled_at)

    def run(self) -> None:
        try:
            assert self.start.wait(10)
            for n in range(ADDS_PER_THREAD):
                key = self.random.choice(KEYS)
                path = self.random.choice(["insert", "insert", "enqueue", "insert_many"])
                event = f"t{self.index}-{n}"
                getattr(self, path)(key, event)
        except BaseException as exc:
            self.error = exc

    def record(self, event: str, key: str, action: Any, job_id: Any, args: Any) -> None:
        assert action in (InsertAction.INSERTED, InsertAction.REPLACED), action
        assert isinstance(job_id, int)
        self.results.append((event, key, action, job_id, list(args)))

    def insert(self, key: str, event: str) -> None:
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            result = sa_jobs.insert(session, Events([event]), self.opts(key))
        assert result is not None and result.job is not None
        self.record(event, key, result.action, result.job.id, result.job.args_json)

    def enqueue(self, key: str, event: str) -> None:
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            job = sa_jobs.enqueue(Events([event]), self.opts(key))
            session.add(job)
            session.flush()
            self.record(event, key, job.insert_action, job.id, job.args_json)

    def insert_many(self, key: str, event: str) -> None:
        # Two events for one key in one batch (a repeat: two rounds).
        events = [event, f"{event}b"]
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            results = sa_jobs.insert_many(
                session, [InsertManyParams(Events([e]), self.opts(key)) for e in events]
            )
            returned = [(r.action, r.job.id, list(r.job.args_json)) for r in results]
        assert len(returned) == 2
        for e, (action, job_id, args) in zip(events, returned, strict=True):
            self.record(e, key, action, job_id, args)
        assert returned[1][0] is InsertAction.REPLACED  # the repeat met the first
        assert returned[0][1] == returned[1][1]


@pytest.mark.parametrize("mode", [JobKeyMode.REPLACE, JobKeyMode.PRESERVE_RUN_AT])
def test_no_add_is_lost_while_workers_fetch_and_many_threads_add_the_same_keys(
    contention_engine: Engine, mode: JobKeyMode, rounds: list[tuple[int, int]]
) -> None:
    engine = contention_engine
    clear_workers_and_leader(engine)
    runs: list[tuple[int, int, tuple[str, ...]]] = []
    runs_lock = threading.Lock()
    maintenance = fast_maintenance(rescue_after=30.0, scheduler_interval=0.01)
    workers = [
        make_worker(engine, queues={"default": 4}, poll_interval=0.01, maintenance=maintenance)
        for _ in range(WORKERS)
    ]
    for worker in workers:

        @worker.handler(Events)
        def handle(job: Job) -> None:
            with runs_lock:
                runs.append((job.id, job.attempt, tuple(job.args.events)))
            time.sleep(random.random() * 0.003)  # stay running while adds arrive

    go = threading.Event()
    adders = [Adder(engine, i, mode, go) for i in range(THREADS)]
    threads = [threading.Thread(target=adder.run, daemon=True) for adder in adders]
    for worker in workers:
        worker.start()
    try:
        for thread in threads:
            thread.start()
        go.set()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "an adder is stuck"

        def drained() -> bool:
            with engine.connect() as connection:
                return not connection.scalar(
                    text("SELECT count(*) FROM sa_job WHERE state <> 'completed'")
                )

        wait_until(drained, timeout=60, interval=0.05, what="every job to complete")
    finally:
        for worker in workers:
            worker.stop(cancel=True)

    # Every add returned a result (never None, never an exception) carrying its event.
    errors = [adder.error for adder in adders if adder.error is not None]
    assert not errors, errors
    results = [r for adder in adders for r in adder.results]
    events = [event for event, *_ in results]
    assert len(results) == len(set(events)) >= THREADS * ADDS_PER_THREAD
    for event, _key, action, job_id, args in results:
        assert event in args, f"{event} ({action}) is not in the returned job {job_id}: {args}"
        if action is InsertAction.INSERTED:
            assert args[0] == event

    with engine.connect() as connection:
        rows = list(connection.execute(text("SELECT * FROM sa_job ORDER BY id")))
    by_id = {row.id: row for row in rows}

    # Jobs are created only by inserted adds; replaced adds met one of those jobs.
    inserted = {job_id for _, _, action, job_id, _ in results if action is InsertAction.INSERTED}
    assert inserted == set(by_id)
    for event, _key, _action, job_id, _args in results:
        assert event in by_id[job_id].args, f"{event} is not in job {job_id}"

    # Every job completed, ran exactly once, and ran with the args it has now.
    assert {row.state for row in rows} == {JobState.COMPLETED.value}
    assert all(row.job_key is None for row in rows)
    per_job = collections.Counter(job_id for job_id, _, _ in runs)
    assert all(count == 1 for count in per_job.values()), per_job.most_common(3)
    assert set(per_job) == set(by_id)
    for job_id, attempt, ran_with in runs:
        assert attempt == 1
        assert list(ran_with) == by_id[job_id].args

    # Every event ran in exactly one job: none lost, none run twice.
    ran_events = collections.Counter(e for _, _, ran_with in runs for e in ran_with)
    assert set(ran_events) == set(events)
    assert all(count == 1 for count in ran_events.values())

    detached = sum(1 for row in rows if JOB_KEY_REPLACED_KEY in row.metadata)
    raced = sum(1 for taken, needed in rounds if taken > needed)
    print(
        f"\n{mode.value}: {len(results)} adds, {len(rows)} jobs, {detached} running jobs "
        f"replaced, {raced} adds met a holder that started mid-statement (issue #580)"
    )
