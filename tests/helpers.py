"""What every test tier shares, except rows written directly (those are :mod:`tests.factories`).

* **Databases**: throwaway databases migrated to a target, engines that are disposed of,
  URLs as text.
* **Waiting** with deadlines, instead of sleeping and hoping: for a predicate, an event, a
  job's state, or the database clock to pass a moment.
* **Statements** an engine or a connection sends, recorded.
* **Jobs** inserted and read through fresh sessions (each in a committed transaction of
  its own), and moved on the way a worker moves them: fetched, finished as the completer
  finishes them, passed through one maintenance step.
* **The test worker**: short polls, short grace, fast maintenance; the signals of its
  background services (their passes, an idle producer, returned stuck handlers); and a
  table for its handlers' database effects.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import attrs
import psycopg
from sqlalchemy import URL, Connection, Engine, create_engine, event, func, select, text
from sqlalchemy import insert as core_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import InsertResult, Job, JobState, MaintenanceConfig, Worker
from sa_jobs._act.complete import finish_in
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._table.models import job_table
from sa_jobs.devdb import Server, throwaway_database
from sa_jobs.worker.notifier import INSERT_CHANNEL
from sa_jobs.worker.producer import Producer, fetch_jobs
from sa_jobs.worker.run import WorkerRun
from sa_jobs.worker.service import Service

T = TypeVar("T")

#: The ``cli`` fixture (tests/conftest.py): run ``sa-jobs ARGV`` in-process, get
#: ``(exit code, stdout, stderr)``.
CliRun = Callable[..., tuple[int, str, str]]

# ------------------------------------------------------------------ databases


@contextlib.contextmanager
def migrated_database(server: Server, prefix: str, *targets: str) -> Iterator[URL]:
    """A new database on ``server`` migrated to each of ``targets`` (default ``heads``);
    dropped on exit."""
    with throwaway_database(server, prefix=prefix) as url:
        with engine_at(url) as engine:
            for target in targets or ("heads",):
                sa_jobs.migrate(engine, target)
        yield url


@contextlib.contextmanager
def engine_at(url: URL | str, **options: Any) -> Iterator[Engine]:
    """An engine for ``url``, disposed of on exit."""
    engine = create_engine(url, **options)
    try:
        yield engine
    finally:
        engine.dispose()


@contextlib.contextmanager
def migrated_engine(server: Server, prefix: str, *targets: str) -> Iterator[Engine]:
    """An engine on a new database migrated as :func:`migrated_database` does."""
    with migrated_database(server, prefix, *targets) as url, engine_at(url) as engine:
        yield engine


def url_text(url: URL) -> str:
    """The URL as text, password included (for a subprocess or another library)."""
    return url.render_as_string(hide_password=False)


def libpq_url(url: URL) -> str:
    """The URL as libpq (and so ``psycopg.connect``) takes it: no SQLAlchemy driver name."""
    return url_text(url.set(drivername="postgresql"))


@contextlib.contextmanager
def insert_listener(url: URL) -> Iterator[psycopg.Connection[Any]]:
    """A connection of its own, listening to the channel inserts notify (what wakes
    workers)."""
    with psycopg.connect(libpq_url(url), autocommit=True) as connection:
        connection.execute(f"LISTEN {INSERT_CHANNEL}")
        yield connection


def notified_queues(listener: psycopg.Connection[Any], timeout: float = 0.3) -> list[str]:
    """The queues named by the insert notifications that arrive within ``timeout`` s."""
    return [n.payload for n in listener.notifies(timeout=timeout, stop_after=None)]


def empty_job_table(bind: Engine | Connection) -> None:
    """Delete every job and restart the ids; forget every periodic job's state, every
    queue control (pauses) and the rate limits' counts, where those branches are
    installed."""
    if isinstance(bind, Connection):
        _empty_tables(bind)
        return
    with bind.begin() as connection:
        _empty_tables(connection)


#: Tables every test starts without rows (those of branches not installed are skipped);
#: the ids of the first three restart at 1, as ``TRUNCATE ... RESTART IDENTITY`` did.
_RESTARTED = ("sa_job", "sa_job_workflow", "sa_job_dep")
_EMPTIED = (
    *_RESTARTED,
    "sa_job_periodic",
    "sa_job_queue",
    "sa_job_rate_window",
    "sa_job_key_rate_window",
)

#: At most this many jobs are deleted; more are truncated (fresh statistics, no dead rows
#: left behind by a test of large tables for the next one's plans).
_DELETE_AT_MOST = 2000

#: One round trip. Nearly every test leaves a few rows: deleting them costs ~2 ms where
#: TRUNCATE (new files for sa_job and its 14 indexes, and for each other table) cost ~30
#: ms, in each of ~1,300 tests.
_EMPTY_TABLES = text(
    f"""
DO $$
DECLARE
    name text;
    seq text;
    large boolean := (
        SELECT count(*) >= {_DELETE_AT_MOST} FROM (SELECT FROM sa_job LIMIT {_DELETE_AT_MOST}) AS s
    );
BEGIN
    FOREACH name IN ARRAY ARRAY{list(_EMPTIED)!r} LOOP
        CONTINUE WHEN to_regclass(name) IS NULL;
        IF large AND name <> 'sa_job_queue' THEN
            EXECUTE format('TRUNCATE %I', name);
        ELSE
            EXECUTE format('DELETE FROM %I', name);
        END IF;
        CONTINUE WHEN name <> ALL (ARRAY{list(_RESTARTED)!r});
        FOR seq IN
            SELECT pg_get_serial_sequence(name, attname) FROM pg_attribute
            WHERE attrelid = name::regclass AND attnum > 0 AND NOT attisdropped
        LOOP
            CONTINUE WHEN seq IS NULL;
            PERFORM setval(seq, 1, false);
        END LOOP;
    END LOOP;
END $$
"""
)


def _empty_tables(connection: Connection) -> None:
    connection.execute(_EMPTY_TABLES)


# ------------------------------------------------------------------ waiting


def wait_until(
    predicate: Callable[[], T], *, timeout: float = 5.0, interval: float = 0.01, what: str = ""
) -> T:
    """Poll until ``predicate()`` is truthy; return it. Fails the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def eventually(predicate: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Poll ``predicate`` until it is true; whether it became true within ``timeout``
    (for assertions that also want to say what did not happen)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def wait_event(flag: threading.Event, what: str, timeout: float = 5.0) -> None:
    assert flag.wait(timeout), f"timed out after {timeout} s waiting for {what}"


def wait_for_state(engine: Engine, job_id: int, state: JobState, *, timeout: float = 5.0) -> Job:
    """Wait until the job is in ``state``; return it as the database has it then."""
    last: list[Job] = []

    def reached() -> bool:
        last[:] = [get_job(engine, job_id)]
        return last[0].state is state

    try:
        wait_until(reached, timeout=timeout, interval=0.02)
    except AssertionError:
        seen = last[0].state.value if last else "nothing"
        raise AssertionError(
            f"job {job_id} did not become {state.value} within {timeout} s (last: {seen})"
        ) from None
    return last[0]


# ------------------------------------------------------------------ the database clock


def db_now(bind: Engine | Connection) -> dt.datetime:
    """The database clock (``clock_timestamp``: the real time, not a transaction's start)."""
    if isinstance(bind, Connection):
        value = bind.scalar(select(func.clock_timestamp()))
    else:
        with bind.connect() as connection:
            value = connection.scalar(select(func.clock_timestamp()))
    assert value is not None
    return value


def wait_past(engine: Engine, moment: dt.datetime, *, timeout: float = 5.0) -> None:
    """Wait until the database clock has passed ``moment`` (a deadline stored in a row: a
    job's due time, a lock's or a lease's expiry)."""
    what = f"the database clock to pass {moment}"
    wait_until(lambda: db_now(engine) > moment, timeout=timeout, what=what)


# ------------------------------------------------------------------ statements


@contextlib.contextmanager
def _on_statements(
    through: Engine | Connection, on_statement: Callable[[str, Any], None]
) -> Iterator[None]:
    lock = threading.Lock()

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        with lock:
            on_statement(statement, parameters)

    event.listen(through, "before_cursor_execute", record)
    try:
        yield
    finally:
        event.remove(through, "before_cursor_execute", record)


@contextlib.contextmanager
def recorded_statements(
    through: Engine | Connection, keep: Callable[[str], bool] | None = None
) -> Iterator[list[str]]:
    """The SQL of every statement sent ``through`` the engine or connection inside the
    block (only those ``keep`` accepts, if given). The list fills as statements go, so a
    test can read it, or clear it, meanwhile."""
    seen: list[str] = []

    def on_statement(statement: str, _parameters: Any) -> None:
        if keep is None or keep(statement):
            seen.append(statement)

    with _on_statements(through, on_statement):
        yield seen


@contextlib.contextmanager
def sent_statements(
    through: Engine | Connection, keep: Callable[[str], bool] | None = None
) -> Iterator[list[tuple[str, Any]]]:
    """As :func:`recorded_statements`, with the parameters: ``(statement, parameters)``
    exactly as the driver got them."""
    seen: list[tuple[str, Any]] = []

    def on_statement(statement: str, parameters: Any) -> None:
        if keep is None or keep(statement):
            seen.append((statement, parameters))

    with _on_statements(through, on_statement):
        yield seen


def is_finish_statement(statement: str) -> bool:
    """Is this a finish statement (what the completer writes outcomes with)?"""
    # sa_jobs._act.complete: [WITH ...] UPDATE sa_job SET state=CAST(CASE ...
    # FROM jsonb_to_recordset(...) AS outcome(...), or for a batch of completions
    # UPDATE sa_job SET state=... FROM unnest(...) AS outcome(id, run)
    return "UPDATE sa_job SET state=" in statement and "AS outcome(" in statement


def finish_statements(engine: Engine) -> contextlib.AbstractContextManager[list[str]]:
    """Every finish statement sent through ``engine`` inside the block."""
    return recorded_statements(engine, keep=is_finish_statement)


# ------------------------------------------------------------------ jobs through fresh sessions

#: The public insert paths :func:`insert_through` knows.
INSERT_PATHS = ("enqueue", "insert", "insert_many", "insert_job")


def insert_one(engine: Engine, args: object, **options: Any) -> InsertResult:
    """One ``sa_jobs.insert`` in a committed transaction of its own; its result (the job
    stays loaded)."""
    with Session(engine, expire_on_commit=False) as session, session.begin():
        return sa_jobs.insert(session, args, **options)


def add_job(engine: Engine, args: object, **options: Any) -> int:
    """Insert one job in a committed transaction of its own; returns its id."""
    return insert_one(engine, args, **options).job.id


def add_jobs(engine: Engine, args: list[object], **options: Any) -> list[int]:
    """``sa_jobs.insert_many`` in a committed transaction of its own; the ids in order."""
    with Session(engine) as session, session.begin():
        return [result.job.id for result in sa_jobs.insert_many(session, args, **options)]


def insert_through(
    bind: Session | Engine, path: str, args: object, **options: Any
) -> tuple[int, bool]:
    """Insert one job through the public path ``path`` (one of :data:`INSERT_PATHS`), in
    ``bind``'s transaction (a session) or a committed one of its own (an engine); returns
    ``(job id, unique_skipped_as_duplicate)``."""
    if isinstance(bind, Engine):
        with Session(bind) as session, session.begin():
            return insert_through(session, path, args, **options)
    session = bind
    if path == "enqueue":
        job = sa_jobs.enqueue(args, **options)
        session.add(job)
        session.flush()
        return job.id, job.unique_skipped_as_duplicate
    if path == "insert":
        result = sa_jobs.insert(session, args, **options)
        return result.job.id, result.unique_skipped_as_duplicate
    if path == "insert_many":
        (result,) = sa_jobs.insert_many(session, [args], **options)
        return result.job.id, result.unique_skipped_as_duplicate
    if path == "insert_job":
        row = session.execute(sa_jobs.insert_job(args, **options)).one()
        return int(row.id), row.unique_skipped_as_duplicate
    raise AssertionError(f"no insert path {path!r}")


def add_raw_job(engine: Engine, kind: str, args_json: Any, **columns: Any) -> int:
    """Insert a row by hand, bypassing args validation (e.g. args that no longer convert)."""
    with engine.begin() as connection:
        statement = (
            core_insert(job_table)
            .values(kind=kind, args=args_json, **columns)
            .returning(job_table.c.id)
        )
        return int(connection.execute(statement).scalar_one())


def get_job(engine: Engine, job_id: int) -> Job:
    """The job as the database has it now (a detached, fully loaded object)."""
    with Session(engine, expire_on_commit=False) as session:
        job = session.get(Job, job_id)
        assert job is not None, f"job {job_id} does not exist"
        return job


def job_states(engine: Engine) -> dict[int, JobState]:
    """Every job's state, by id."""
    with engine.connect() as connection:
        return dict(connection.execute(select(job_table.c.id, job_table.c.state)).all())


def count_jobs(bind: Engine | Session, state: JobState | None = None) -> int:
    """How many jobs there are (in ``state``, if given); a session counts inside its own
    transaction."""
    query = select(func.count()).select_from(Job)
    if state is not None:
        query = query.where(Job.state == state)
    if isinstance(bind, Session):
        return int(bind.scalar(query) or 0)
    with bind.connect() as connection:
        return int(connection.scalar(query) or 0)


def xmin(engine: Engine, job_id: int) -> str:
    """The transaction that last wrote the job's row."""
    with engine.connect() as connection:
        return str(
            connection.scalar(text("SELECT xmin::text FROM sa_job WHERE id = :id"), {"id": job_id})
        )


def cancel(engine: Engine, job_id: int) -> Job:
    """``sa_jobs.cancel_job`` in a committed transaction of its own; the job it returned."""
    with Session(engine, expire_on_commit=False) as session, session.begin():
        return sa_jobs.cancel_job(session, job_id)


def retry(engine: Engine, job_id: int) -> Job:
    """``sa_jobs.retry_job`` in a committed transaction of its own; the job it returned."""
    with Session(engine, expire_on_commit=False) as session, session.begin():
        return sa_jobs.retry_job(session, job_id)


def make_available(engine: Engine, job_id: int) -> None:
    """Force a rerun, as the rescuer would for a worker it presumed dead."""
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE sa_job SET state = 'available', scheduled_at = now() WHERE id = :id"),
            {"id": job_id},
        )


# ------------------------------------------------------------------ as a worker moves jobs


def fetch_one(engine: Engine, queue: str = "default", worker_id: str = "test-fetcher") -> Job:
    """Take the next due job of ``queue`` as a worker would: ``running``, attempt + 1."""
    jobs = fetch_jobs(engine, queue, 1, worker_id)
    assert len(jobs) == 1, f"no available job in {queue!r} to fetch"
    return jobs[0]


def finish_outcomes(engine: Engine, outcomes: Sequence[Outcome]) -> list[tuple[int, JobState]]:
    """Write outcomes in a transaction of their own, as the worker's completer writes them
    (:func:`~sa_jobs._act.complete.finish_in`); the ``(id, new state)`` of each job it changed."""
    with engine.begin() as connection:
        return finish_in(connection, outcomes)


def complete_running(engine: Engine) -> None:
    """Mark every running job completed, in one statement: frees a limit's slots between
    fetches without a worker or a completer."""
    with engine.begin() as connection:
        connection.execute(
            job_table.update()
            .where(job_table.c.state == JobState.RUNNING)
            .values(state=JobState.COMPLETED, finalized_at=func.now())
        )


def finish_run(
    engine: Engine, job: Job, ending: Ending = Ending.COMPLETED, **details: Any
) -> list[tuple[int, JobState]]:
    """Write the outcome of ``job``'s run (the run it was fetched for) as the completer
    does; ``details`` are the outcome's ``delay`` and ``error``. An empty list: the
    outcome changed nothing (the run was not current any more)."""
    return finish_outcomes(engine, [Outcome(job.id, job.run_count, ending, **details)])


def fail_run(
    engine: Engine, job: Job, *, delay: float, error: str = "Boom: failed"
) -> list[tuple[int, JobState]]:
    """Fail ``job``'s run with an error recorded; due again after ``delay`` seconds if it
    has attempts left."""
    record = {"attempt": job.attempt, "error": error}
    return finish_run(engine, job, Ending.FAILED, delay=delay, error=record)


class MaintenanceStep(Protocol):
    """A maintenance service's step: a scheduler, rescuer, cleaner, repair pass..."""

    def run_once(self, connection: Connection) -> int: ...


def run_once(engine: Engine, step: MaintenanceStep) -> int:
    """One pass of a maintenance step in a transaction of its own; what it returned (how
    many jobs it moved)."""
    with engine.begin() as connection:
        return step.run_once(connection)


# ------------------------------------------------------------------ the test worker


def fast_maintenance(**overrides: Any) -> MaintenanceConfig:
    """:data:`FAST_MAINTENANCE` with some intervals changed."""
    return attrs.evolve(FAST_MAINTENANCE, **overrides)


#: Heartbeats, leadership and the scheduler fast enough for tests (rescue stays > 2x).
FAST_MAINTENANCE = MaintenanceConfig(
    heartbeat_interval=0.2, rescue_after=1.0, leader_ttl=0.5, scheduler_interval=0.05
)

#: Fast maintenance whose leader looks for orphaned jobs every 0.1 s too, so a test can
#: watch a dead process's jobs being rescued.
FAST_RESCUE = fast_maintenance(leader_ttl=0.6, scheduler_interval=0.1, rescuer_interval=0.1)

#: Heartbeats too slow to matter within a test: only NOTIFY can deliver a cancel fast.
SLOW_HEARTBEAT = fast_maintenance(heartbeat_interval=5.0, rescue_after=20.0, leader_ttl=10.0)

#: Maintenance that never runs within a test: whatever moves, the path under test moved.
NO_MAINTENANCE = MaintenanceConfig(
    heartbeat_interval=600,
    rescue_after=1800,
    leader_ttl=1200,
    scheduler_interval=600,
    rescuer_interval=600,
    cleaner_interval=600,
)


@attrs.frozen
class FixedDelay:
    """A retry policy: every failed attempt runs again after ``seconds``."""

    seconds: float = 0.0

    def next_delay(self, job: Job) -> dt.timedelta:
        return dt.timedelta(seconds=self.seconds)


#: Failed jobs are due again at once (``run_until_idle`` then works them to the end).
NO_DELAY = FixedDelay(0.0)
#: Failed jobs are not due again within any test.
AN_HOUR = FixedDelay(3600.0)


def make_worker(engine: Engine, **options: Any) -> Worker:
    """A worker for tests: short polls, short grace, fast maintenance; override anything."""
    settings: dict[str, Any] = {
        "queues": {"default": 5},
        "poll_interval": 0.05,
        "interrupt_grace": 0.3,
        "maintenance": FAST_MAINTENANCE,
        "job_timeout": 10.0,
    }
    settings.update(options)
    return Worker(engine, **settings)


@contextlib.contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """Start ``worker`` in the background; stop it (interrupting stragglers) on exit."""
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(cancel=True)


def wait_listening(worker: Worker, timeout: float = 5.0) -> None:
    """Wait until the worker's LISTEN connection is up (so a NOTIFY reaches it)."""
    assert worker.listening.wait(timeout), "the worker never started listening"


def _run_of(worker: Worker) -> WorkerRun:
    # The one place the tests reach into a running worker's private state.
    run = worker._run
    assert run is not None, "the worker is not running"
    return run


def fetching_stopped(worker: Worker) -> bool:
    """Whether a stop has reached the running worker's producers."""
    return _run_of(worker).stopping_fetch.is_set()


def worker_service(worker: Worker, name: str) -> Service:
    """A background service of a running worker: ``"maintenance"``, ``"notifier"``,
    ``"completer"`` (the batch one), ``"watchdog"`` or ``"producer:QUEUE"``."""
    run = _run_of(worker)
    if name.startswith("producer:"):
        return run.producers[name.removeprefix("producer:")]
    service = getattr(run, name)
    assert isinstance(service, Service), f"the worker's {name} is not a background service"
    return service


def wait_passes(worker: Worker, name: str, count: int = 2, *, timeout: float = 10.0) -> None:
    """Wait until the worker's service ``name`` (see :func:`worker_service`) has made
    ``count`` more passes of its loop. The first may have begun before the call: wait for
    two to be sure one whole pass ran after it."""
    service = worker_service(worker, name)
    assert service.wait_passes(count, timeout), (
        f"the worker's {name} made fewer than {count} passes in {timeout} s"
    )


def producer(worker: Worker, queue: str = "default") -> Producer:
    """The producer (the fetching thread) of one queue of a running worker."""
    return _run_of(worker).producers[queue]


def wait_idle(worker: Worker, queue: str = "default", *, timeout: float = 5.0) -> None:
    """Wait until the queue's producer is idle: its last fetch found nothing while no job
    of the queue was running, and it waits for a NOTIFY or its next poll."""
    fetcher = producer(worker, queue)
    wait_until(lambda: fetcher.drained, timeout=timeout, what=f"the {queue!r} producer to idle")


def stuck_total(worker: Worker) -> int:
    """How many handler threads of the running worker ever got stuck."""
    return _run_of(worker).pool.stuck_total


def wait_stuck_handlers_returned(worker: Worker, *, timeout: float = 5.0) -> None:
    """Wait until every handler the watchdog settled without its thread has returned, and
    so has whatever the thread did with its late result (a write, a commit)."""
    wait_until(
        lambda: worker.stuck_threads == 0, timeout=timeout, what="the stuck handlers to return"
    )


# ------------------------------------------------------------------ effects of handlers

EFFECT_TABLE = "sa_jobs_test_effect"


def reset_effects(engine: Engine) -> None:
    """Create (once) and empty the table handlers write their effects to."""
    with engine.begin() as connection:
        connection.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {EFFECT_TABLE} ("
                " job_id bigint NOT NULL, attempt int NOT NULL, note text NOT NULL DEFAULT '')"
            )
        )
        connection.execute(text(f"TRUNCATE {EFFECT_TABLE}"))


_INSERT_EFFECT = text(
    f"INSERT INTO {EFFECT_TABLE} (job_id, attempt, note) VALUES (:job_id, :attempt, :note)"
)


def write_effect(session: Session | Connection, job: Job, note: str = "") -> None:
    session.execute(_INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt, "note": note})


async def write_effect_async(session: AsyncSession, job: Job, note: str = "") -> None:
    await session.execute(_INSERT_EFFECT, {"job_id": job.id, "attempt": job.attempt, "note": note})


def effects(engine: Engine) -> list[tuple[int, int, str]]:
    """``(job_id, attempt, note)`` of every committed effect."""
    with engine.connect() as connection:
        rows = connection.execute(
            text(f"SELECT job_id, attempt, note FROM {EFFECT_TABLE} ORDER BY job_id, attempt")
        )
        return [(row.job_id, row.attempt, row.note) for row in rows]


def same_transaction(engine: Engine, job_id: int) -> bool:
    """True when the job row and its effect row were last written by one transaction."""
    with engine.connect() as connection:
        effect_xmins = connection.scalars(
            text(f"SELECT xmin::text FROM {EFFECT_TABLE} WHERE job_id = :id"), {"id": job_id}
        ).all()
    job_xmin = xmin(engine, job_id)
    return bool(effect_xmins) and all(x == job_xmin for x in effect_xmins)


def sessions_waiting_for_a_lock(engine: Engine) -> int:
    """How many other sessions of this database wait for a lock now (a test holding a
    transaction open waits for the other side to reach its racy point)."""
    with engine.connect() as connection:
        return int(
            connection.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                )
            )
            or 0
        )


def insert_workflow(engine: Engine, workflow: sa_jobs.Workflow) -> sa_jobs.InsertedWorkflow:
    """Insert ``workflow`` in a transaction of its own."""
    with Session(engine) as session, session.begin():
        return sa_jobs.insert_workflow(session, workflow)


def complete_now(engine: Engine, job: Job[Any]) -> None:
    """Complete a fetched job with ``complete_in``, in a transaction of its own."""
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, job)


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan, the root first."""
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(plan_nodes(child))
    return found
