"""Does sa_jobs stay fast on a big table? Each statement on an empty table and on a big one.

Production queues keep millions of finished rows (River #59, procrastinate #1454 at 13M
jobs). This script measures, on a throwaway database with the sa_jobs schema at
``heads``:

* fetch: the worker's fetch statement (``fetch_jobs``, batches of 10), and the same
  fetch under a queue concurrency limit that never binds (``fetch_limited``),
* single insert (``sa_jobs.insert`` + commit) and bulk insert (``insert_many`` of 1,000),
* one pass of each maintenance service: the scheduler promoting 1,000 due jobs, the
  rescuer rescuing 1,000 orphans, the cleaner deleting a batch (its ``limit`` per
  state: a batch written for it, and on the big table also the table's own backlog),
  the sequence repair restarting 100 stalled sequences,
* the release of a workflow step: ``complete_in`` of the first step of 100 two-step
  chains, each completion making its dependent available,

first on an empty table (only the rows the measurement itself needs), then on a table
with ``--rows`` finished rows (completed/cancelled/discarded, 80 % of them past their
retention, some with unique and sequence keys) plus ``--available`` available ones. It
prints each figure's ratio big/empty, and writes the ``EXPLAIN (ANALYZE, BUFFERS)`` plan
of every statement each measurement sends, on each table, to ``--plans``. The rounds
alternate between the two tables, so load from elsewhere weighs on both alike.

    python bench/big_tables.py                          # 10M rows: ~7 min on 2 cores
    python bench/big_tables.py --rows 200000 --available 10000   # a smoke test
    python bench/big_tables.py --database sa_jobs_big   # keep (or reuse) the big database

The rows are made by the server (``INSERT ... SELECT generate_series``, in chunks), not
sent from Python. Not a test: too slow for CI; the figures are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
from sqlalchemy import URL, Connection, Engine, create_engine, event, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._declare.options import DEFAULT_UNIQUE_STATES
from sa_jobs._table.models import states_bitmask
from sa_jobs._table.schema import Features
from sa_jobs.benchmark.noop import BenchNoop
from sa_jobs.benchmark.report import environment
from sa_jobs.devdb import Server, find_server, throwaway_database
from sa_jobs.worker.limited_fetch import fetch_limited, plan_limits
from sa_jobs.worker.maintenance.cleaner import Cleaner, Retention
from sa_jobs.worker.maintenance.rescuer import Rescuer
from sa_jobs.worker.maintenance.scheduler import Scheduler
from sa_jobs.worker.maintenance.sequence_repair import SequenceRepair
from sa_jobs.worker.producer import fetch_jobs

CHUNK = 1_000_000
FETCH_BATCH = 10
FETCHES = 100
SINGLES = 200
BULK = 1_000
DUE = 1_000
ORPHANS = 1_000
STALLED = 100
CLEANER_LIMIT = 10_000
CHAINS = 100

# Finished history: 90 % completed, 4 % cancelled, 6 % discarded; 80 % finalized 8 to
# 38 days ago (past every default retention), 20 % within the last day (kept). One in
# five holds a unique key (the default unique states include completed), one in ten
# has a sequence key (finished, so it holds no slot).
FINISHED_ROWS = """
INSERT INTO sa_job (kind, args, state, queue, priority, attempt, run_count, errors,
    scheduled_at, created_at, attempted_at, attempted_by, finalized_at,
    unique_key, unique_states, sequence_key)
SELECT 'kind_' || (i % 7), jsonb_build_object('account_id', i, 'trace_id', md5(i::text)),
    (CASE WHEN i % 100 < 90 THEN 'completed' WHEN i % 100 < 94 THEN 'cancelled'
          ELSE 'discarded' END)::sa_job_state,
    (ARRAY['default', 'mail', 'reports', 'default'])[1 + i % 4], 1 + i % 4, 1, 1,
    CASE WHEN i % 100 >= 94 THEN '[{"error": "boom", "attempt": 1}]'::jsonb
         ELSE '[]'::jsonb END,
    f - interval '1 minute', f - interval '1 minute', f - interval '1 second',
    ARRAY['worker-' || (i % 16)], f,
    CASE WHEN i % 5 = 0 THEN decode(md5(i::text), 'hex') END,
    CASE WHEN i % 5 = 0 THEN CAST(:bitmask AS bit(8)) END,
    CASE WHEN i % 10 = 1 THEN decode(md5('s' || (i % 10000)), 'hex') END
FROM (
    SELECT i, CASE WHEN i % 10 < 8
                   THEN now() - interval '8 days' - (i % 2592000) * interval '1 second'
                   ELSE now() - (i % 80000) * interval '1 second' END AS f
    FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i
) AS s
"""

AVAILABLE_ROWS = """
INSERT INTO sa_job (kind, args, queue, priority, scheduled_at)
SELECT 'kind_' || (i % 7), jsonb_build_object('account_id', i), :queue, 1 + i % 4,
    now() - interval '1 hour' + i * interval '1 millisecond'
FROM generate_series(1, CAST(:n AS bigint)) AS i
"""

EXPIRED_ROWS = """
INSERT INTO sa_job (kind, args, state, queue, attempt, run_count, finalized_at)
SELECT 'kind_0', '{}'::jsonb, st, 'clean', 1, 1, now() - interval '60 days'
FROM generate_series(1, CAST(:n AS bigint)) AS i,
     unnest(ARRAY['completed', 'cancelled', 'discarded']::sa_job_state[]) AS st
"""

DUE_ROWS = """
INSERT INTO sa_job (kind, args, state, queue, scheduled_at)
SELECT 'kind_0', '{}'::jsonb, 'scheduled', 'sched', now() - interval '1 minute'
FROM generate_series(1, CAST(:n AS bigint)) AS i
"""

ORPHAN_ROWS = """
INSERT INTO sa_job (kind, args, state, queue, attempt, run_count, attempted_at, attempted_by)
SELECT 'kind_0', '{}'::jsonb, 'running', 'resc', 1, 1, now() - interval '1 hour',
    ARRAY['gone-worker']
FROM generate_series(1, CAST(:n AS bigint)) AS i
"""

STALLED_ROWS = """
INSERT INTO sa_job (kind, args, state, queue, sequence_key)
SELECT 'kind_0', '{}'::jsonb, 'pending', 'seq', decode(md5('stalled' || i || :salt), 'hex')
FROM generate_series(1, CAST(:n AS bigint)) AS i
"""


PUT_BACK = """
UPDATE sa_job SET state = 'available', attempt = 0, run_count = 0, attempted_at = NULL,
    attempted_by = NULL
WHERE state = 'running' AND attempted_at IS NOT NULL AND attempted_by = :worker
"""


@attrs.frozen
class Case:
    """One measurement: ``setup`` (untimed) returns the first id it made (or 0);
    ``run`` is timed; ``teardown`` (untimed) gets that id back."""

    name: str
    unit: str
    ops: int
    setup: Callable[[Engine], int]
    run: Callable[[Engine], object]
    teardown: Callable[[Engine, int], None] = lambda _engine, _first: None


def _exec(engine: Engine, sql: str, **params: Any) -> None:
    with engine.begin() as connection:
        connection.execute(text(sql), params)


def _next_id(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.scalar(text("SELECT coalesce(max(id), 0) + 1 FROM sa_job")) or 1)


def _rows(sql: str, **params: Any) -> Callable[[Engine], int]:
    def setup(engine: Engine) -> int:
        first = _next_id(engine)
        _exec(engine, sql, **params)
        return first

    return setup


def _delete_from(queue: str) -> Callable[[Engine, int], None]:
    # By id range: the big table has no index on queue alone.
    def teardown(engine: Engine, first: int) -> None:
        _exec(engine, "DELETE FROM sa_job WHERE id >= :first AND queue = :q", first=first, q=queue)

    return teardown


def _in_transaction(action: Callable[[Connection], object]) -> Callable[[Engine], object]:
    def run(engine: Engine) -> object:
        with engine.begin() as connection:
            return action(connection)

    return run


def cases(features: Features) -> list[Case]:
    def fetch(engine: Engine) -> None:
        for _ in range(FETCHES):
            fetch_jobs(engine, "default", FETCH_BATCH, "bench-fetch", features=features)

    def singles(engine: Engine) -> None:
        for seq in range(SINGLES):
            with Session(engine) as session:
                sa_jobs.insert(session, BenchNoop(seq=seq), queue="ins")
                session.commit()

    def bulk(engine: Engine) -> None:
        with Session(engine) as session:
            sa_jobs.insert_many(session, [BenchNoop(seq=seq) for seq in range(BULK)], queue="ins")
            session.commit()

    def fetched_teardown(engine: Engine, first: int) -> None:
        # The fetch takes the oldest available jobs, which on the big table are its own
        # 100,000 rather than the round's: put them back, or they stay running and the
        # rescuer's measurement (and the next run on a kept database) finds them.
        _exec(engine, PUT_BACK, worker=["bench-fetch"])
        _exec(engine, "DELETE FROM sa_job WHERE id >= :first AND queue = 'default'", first=first)

    # Far above the batch: it never binds, so the work per job is the plain fetch's plus
    # the limit's lock and count of the queue's running jobs.
    limit = sa_jobs.ConcurrencyLimit(queue="default", max_running=10**9)
    limits = plan_limits([limit], ["default"])["default"]

    def fetch_limit(engine: Engine) -> None:
        for _ in range(FETCHES):
            fetch_limited(engine, limits, FETCH_BATCH, "bench-fetch", features=features)

    first_steps: list[Any] = []  # fetched (running) by the setup, completed by the run

    def chains(engine: Engine) -> int:
        first = _next_id(engine)
        with Session(engine) as session, session.begin():
            for seq in range(CHAINS):
                workflow = sa_jobs.Workflow("bench")
                step = workflow.add(BenchNoop(seq=seq), queue="wf")
                workflow.add(BenchNoop(seq=seq), after=[step], queue="wf")
                sa_jobs.insert_workflow(session, workflow)
        first_steps[:] = fetch_jobs(engine, "wf", CHAINS, "bench-wf", features=features)
        assert len(first_steps) == CHAINS
        return first

    def release(engine: Engine) -> None:
        for job in first_steps:
            with Session(engine) as session, session.begin():
                sa_jobs.complete_in(session, job)

    def chains_teardown(engine: Engine, first: int) -> None:
        _delete_from("wf")(engine, first)
        _exec(engine, "DELETE FROM sa_job_dep")  # only this case's rows: the fill adds none
        _exec(engine, "DELETE FROM sa_job_workflow")

    clean = _in_transaction(Cleaner(Retention(), CLEANER_LIMIT, features=features).run_once)
    return [
        Case(
            "fetch",
            f"fetch of {FETCH_BATCH}",
            FETCHES,
            _rows(AVAILABLE_ROWS, n=FETCH_BATCH * FETCHES, queue="default"),
            fetch,
            fetched_teardown,
        ),
        Case(
            "fetch_limited",
            f"fetch of {FETCH_BATCH}",
            FETCHES,
            _rows(AVAILABLE_ROWS, n=FETCH_BATCH * FETCHES, queue="default"),
            fetch_limit,
            fetched_teardown,
        ),
        Case("workflow_release", "complete_in + commit", CHAINS, chains, release, chains_teardown),
        Case("insert_single", "insert + commit", SINGLES, lambda _e: 0, singles),
        Case("insert_bulk", f"insert_many of {BULK}", 1, lambda _e: 0, bulk),
        Case(
            "scheduler",
            f"pass promoting {DUE}",
            1,
            _rows(DUE_ROWS, n=DUE),
            _in_transaction(Scheduler(features=features).run_once),
            _delete_from("sched"),
        ),
        Case(
            "rescuer",
            f"pass rescuing {ORPHANS}",
            1,
            _rows(ORPHAN_ROWS, n=ORPHANS),
            _in_transaction(Rescuer(60.0, features=features).run_once),
            _delete_from("resc"),
        ),
        Case(
            "cleaner",
            f"pass deleting {CLEANER_LIMIT} per state",
            1,
            _rows(EXPIRED_ROWS, n=CLEANER_LIMIT),
            clean,
        ),
        Case(
            "cleaner_backlog",
            f"pass deleting {CLEANER_LIMIT} per state",
            1,
            _rows(EXPIRED_ROWS, n=CLEANER_LIMIT),  # the big table: its backlog instead
            clean,
        ),
        Case(
            "sequence_repair",
            f"pass restarting {STALLED}",
            1,
            lambda e: 0,  # a fresh salt per round (see measure)
            _in_transaction(SequenceRepair().run_once),
            _delete_from("seq"),
        ),
    ]


def _setup_for(case: Case, big: bool, round_no: int) -> Callable[[Engine], int]:
    if case.name == "cleaner_backlog" and big:
        # The big table's own backlog: its expired rows, as old as 38 days, the states
        # interleaved as they were written — so a batch of the rarer states (cancelled,
        # discarded) is spread over thousands of pages. (The "cleaner" case deletes the
        # same packed batch on both tables, older than the backlog, so it goes first.)
        return lambda _e: 0
    if case.name == "sequence_repair":
        return _rows(STALLED_ROWS, n=STALLED, salt=f"{int(big)}-{round_no}")
    return case.setup


def one_round(engine: Engine, case: Case, *, big: bool, round_no: int) -> float:
    """Seconds per op of one timed round."""
    first = _setup_for(case, big, round_no)(engine)
    start = time.perf_counter()
    case.run(engine)
    elapsed = time.perf_counter() - start
    case.teardown(engine, first)
    return elapsed / case.ops


def measure(empty: Engine, big: Engine, case: Case, rounds: int) -> tuple[float, float]:
    """Median seconds per op on each table over ``rounds`` rounds, after one untimed
    warm-up; the rounds alternate between the tables, so other load on the machine
    weighs on both alike."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for round_no in range(rounds + 1):
        for engine, is_big in ((empty, False), (big, True)):
            seconds = one_round(engine, case, big=is_big, round_no=round_no)
            if round_no:
                times[is_big].append(seconds)
    return statistics.median(times[False]), statistics.median(times[True])


@contextmanager
def explained(engine: Engine) -> Iterator[list[str]]:
    """The plan of each statement (the first of each text) sent meanwhile.

    Each statement is first run under ``EXPLAIN (ANALYZE, BUFFERS)`` on the same cursor,
    in a savepoint rolled back at once, so it is planned and run in its real context and
    then runs for real as if nothing had happened.
    """
    seen: set[str] = set()
    found: list[str] = []

    def explain(_conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "sa_job" not in statement or not isinstance(parameters, dict):
            return
        # Short strings count; long ones (the rows of an insert) and other values (the
        # ids of a batch, a limited fetch's time, the job a completion finishes) do not.
        short = sorted((k, v) for k, v in parameters.items() if isinstance(v, str) and len(v) < 40)
        key = statement + repr(short)
        if key in seen:
            return
        seen.add(key)
        cursor.execute("SAVEPOINT sa_jobs_explain")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("ROLLBACK TO SAVEPOINT sa_jobs_explain")
        found.append(statement + "\n" + plan)

    event.listen(engine, "before_cursor_execute", explain)
    try:
        yield found
    finally:
        event.remove(engine, "before_cursor_execute", explain)


def plans(engine: Engine, case: Case, *, big: bool) -> str:
    """The plans of the statements one round of ``case`` sends."""
    first = _setup_for(case, big, 99)(engine)
    with explained(engine) as found:
        case.run(engine)
    case.teardown(engine, first)
    table = "big" if big else "empty"
    return f"=== {case.name}, {table} table ===\n" + "\n\n".join(found) + "\n"


def fill(engine: Engine, rows: int, available: int, say: Callable[[str], None]) -> None:
    bitmask = states_bitmask(frozenset(DEFAULT_UNIQUE_STATES))
    for lo in range(1, rows + 1, CHUNK):
        hi = min(lo + CHUNK - 1, rows)
        start = time.perf_counter()
        with engine.begin() as connection:
            connection.execute(text("SET LOCAL synchronous_commit = off"))
            connection.execute(text(FINISHED_ROWS), {"lo": lo, "hi": hi, "bitmask": bitmask})
        say(f"  rows {lo:,}..{hi:,} in {time.perf_counter() - start:.1f} s")
    _exec(engine, AVAILABLE_ROWS, n=available, queue="default")
    vacuum(engine)


def vacuum(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM (ANALYZE) sa_job"))
        connection.execute(text("CHECKPOINT"))


def run_all(
    empty: Engine, big: Engine, *, rounds: int, say: Callable[[str], None]
) -> dict[str, tuple[float, float]]:
    with big.connect() as connection:
        features = Features.of(connection)
    results = {}
    for case in cases(features):
        results[case.name] = measure(empty, big, case, rounds)
        ms = [f"{seconds * 1000:.3f}" for seconds in results[case.name]]
        say(f"  {case.name}: {ms[0]} ms empty, {ms[1]} ms big, per {case.unit}")
    return results


def table_size(engine: Engine) -> str:
    with engine.connect() as connection:
        return str(
            connection.scalar(
                text(
                    "SELECT pg_size_pretty(pg_table_size('sa_job')) || ' table, '"
                    " || pg_size_pretty(pg_indexes_size('sa_job')) || ' indexes'"
                )
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="finished rows")
    parser.add_argument("--available", type=int, default=100_000, help="available rows")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per figure")
    parser.add_argument("--plans", type=Path, default=Path("big_tables_plans.txt"))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--database",
        help="build the big table in this database and keep it; reuse it if it exists",
    )
    options = parser.parse_args()
    server = find_server()

    def say(line: str) -> None:
        print(line, flush=True)

    say(f"server: {server.source}")
    with (
        throwaway_database(server, prefix="sa_jobs_big_empty") as empty_url,
        _big_database(server.url, options.database) as (big_url, built),
    ):
        empty, big = create_engine(empty_url), create_engine(big_url)
        sa_jobs.migrate(empty)
        sa_jobs.migrate(big)
        if not built:
            say(f"filling: {options.rows:,} finished rows, {options.available:,} available")
            fill(big, options.rows, options.available, say)
        else:
            vacuum(big)
        vacuum(empty)
        size = table_size(big)
        say(f"big table: {size}")
        results = run_all(empty, big, rounds=options.rounds, say=say)
        with big.connect() as connection:
            features = Features.of(connection)
        options.plans.write_text(
            "".join(
                plans(engine, case, big=is_big)
                for case in cases(features)
                for engine, is_big in ((empty, False), (big, True))
            )
        )
        empty.dispose()
        big.dispose()
    say(f"\nplans: {options.plans}")
    say(f"{'measure':<16} {'empty ms':>10} {'big ms':>10} {'big/empty':>10}")
    for name, (on_empty, on_big) in results.items():
        ratio = on_big / on_empty
        flag = "" if ratio <= 1.5 else "  > 1.5x"
        say(f"{name:<16} {on_empty * 1000:>10.3f} {on_big * 1000:>10.3f} {ratio:>10.2f}{flag}")
    if options.json:
        report = {
            "settings": vars(options) | {"plans": str(options.plans), "json": str(options.json)},
            "environment": environment(),
            "big_table": size,
            "seconds_empty_big": results,
        }
        options.json.write_text(json.dumps(report, indent=2))


@contextmanager
def _big_database(server_url: URL, name: str | None) -> Iterator[tuple[URL, bool]]:
    """A throwaway database, or ``name`` kept for the next run (built: it had a table)."""
    if name is None:
        with throwaway_database(Server(server_url, "given"), prefix="sa_jobs_big") as url:
            yield url, False
        return
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        exists = connection.scalar(
            text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
        )
        if not exists:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = server_url.set(database=name)
    probe = create_engine(url)
    with probe.connect() as connection:
        built = bool(connection.scalar(text("SELECT to_regclass('sa_job') IS NOT NULL")))
    probe.dispose()
    yield url, built


if __name__ == "__main__":
    main()
