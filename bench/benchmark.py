"""What ``sa-jobs bench`` does not cover: the insert paths side by side, and uniqueness.

``sa-jobs bench`` (``sa_jobs/benchmark/``) measures what a user wants to know on their
own server: single and bulk enqueue rates, worked jobs/s with given queues and
processes, the worker's CPU per job and enqueue -> start latency, each against the
raw-SQL floor with ``--floor``. This script keeps the measurements the project needs
besides those, on the same kind of throwaway database and against the same floor
statements (``sa_jobs.benchmark.floor``):

* every single-insert path (``sa_jobs.insert``, ``session.add(enqueue())``,
  ``conn.execute(insert_job())``) and SQLAlchemy's own ``text()`` INSERT as a reference,
  best of ``--repeat`` interleaved rounds;
* ``insert_many`` of 1,000 against the ``unnest`` floor and against ``COPY`` (which
  returns no ids), and how many statements one ``insert_many`` sends;
* what a unique insert costs against a plain one, single and bulk, with and without TTL
  locks, the two taking turns insert by insert (see ``paired``).

    python bench/benchmark.py                 # both, a few minutes on 2 cores
    python bench/benchmark.py --quick         # smaller sizes, for a smoke test
    python bench/benchmark.py --only bulk --repeat 5 --json out.json

It waits (a bounded time) for other load on the machine to die down before each round;
``--no-wait`` skips that.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import URL, Engine, bindparam, create_engine, event, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs.benchmark.floor import INSERT as FLOOR_INSERT
from sa_jobs.benchmark.floor import INSERT_UNNEST as FLOOR_INSERT_UNNEST
from sa_jobs.benchmark.floor import conninfo
from sa_jobs.benchmark.noop import KIND
from sa_jobs.benchmark.noop import BenchNoop as Noop
from sa_jobs.benchmark.report import environment
from sa_jobs.devdb import find_server, throwaway_database

QUEUE = "default"


@sa_jobs.job_args(kind="bench_unique", unique=sa_jobs.UniqueOpts(by_args=True))
class UniqueNoop:
    """The same job, unique by its args: measures what uniqueness costs an insert."""

    seq: int = 0


TTL = timedelta(hours=1)


@sa_jobs.job_args(kind="bench_unique_ttl", unique=sa_jobs.UniqueOpts(by_args=True, ttl=TTL))
class UniqueTtlNoop:
    """Unique with Faktory's TTL lock, which inserts release once it has expired."""

    seq: int = 0


def args_json(seq: int) -> str:
    return json.dumps({"seq": seq}, separators=(",", ":"))


#: The bulk insert's second floor; returns no ids, so it is shown, not aimed at.
FLOOR_COPY = "COPY sa_job (kind, args, queue) FROM STDIN"


# --------------------------------------------------------------------------- results


class Table:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(
        self,
        metric: str,
        ours: float,
        floor: float,
        unit: str,
        *,
        higher_is_better: bool = True,
        note: str = "",
    ) -> None:
        ratio = ours / floor if floor else float("nan")
        row = {
            "metric": metric,
            "sa_jobs": ours,
            "floor": floor,
            "unit": unit,
            "ratio": ratio,
            "higher_is_better": higher_is_better,
            "note": note,
        }
        self.rows.append(row)
        print(f"  {_format_row(row)}", flush=True)

    def render(self) -> str:
        lines = [_HEADER, "-" * len(_HEADER)]
        lines += [_format_row(row) for row in self.rows]
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = [
            "| metric | sa_jobs | floor (raw psycopg) | ratio to floor | note |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        for row in self.rows:
            lines.append(
                f"| {row['metric']} | {_num(row['sa_jobs'])} {row['unit']} "
                f"| {_num(row['floor'])} {row['unit']} | {row['ratio']:.2f}x | {row['note']} |"
            )
        return "\n".join(lines)


_HEADER = f"{'metric':<44} {'sa_jobs':>12} {'floor':>12} {'unit':<8} {'ratio':>7}  note"


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _format_row(row: dict[str, Any]) -> str:
    return (
        f"{row['metric']:<44} {_num(row['sa_jobs']):>12} {_num(row['floor']):>12} "
        f"{row['unit']:<8} {row['ratio']:>6.2f}x  {row['note']}"
    )


# --------------------------------------------------------------------------- helpers


def reset(engine: Engine) -> None:
    """Empty the table and checkpoint, so every measurement starts from the same place."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("TRUNCATE sa_job RESTART IDENTITY"))
        connection.execute(text("CHECKPOINT"))


def loop_rate(count: int, one: Callable[[int], None]) -> float:
    """Warm up with 50 calls, then time ``count`` calls of ``one(seq)``."""
    for seq in range(-50, 0):
        one(seq)
    started = time.perf_counter()
    for seq in range(count):
        one(seq)
    return count / (time.perf_counter() - started)


class Quiet:
    """Waits (a bounded time) for other load on the machine to die down before a run.

    The figures are ratios to a floor measured minutes apart, so a neighbour's test run
    landing on one side only would skew them; every wait and every give-up is reported.
    """

    def __init__(
        self, enabled: bool, threshold: float = 0.25, limit: float = 15.0, budget: float = 120.0
    ) -> None:
        self.enabled = enabled
        self.threshold = threshold
        self.limit = limit
        self.budget = budget
        self.waited = 0.0
        self.gave_up = 0

    @staticmethod
    def busy(window: float = 0.5) -> float:
        """Fraction of all CPUs busy over ``window`` seconds (from /proc/stat)."""

        def sample() -> tuple[int, int]:
            with open("/proc/stat") as stat:
                fields = [int(v) for v in stat.readline().split()[1:]]
            idle = fields[3] + fields[4]  # idle + iowait
            return idle, sum(fields)

        try:
            idle0, total0 = sample()
            time.sleep(window)
            idle1, total1 = sample()
        except OSError:
            return 0.0
        return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)

    def wait(self) -> None:
        if not self.enabled or self.waited >= self.budget:
            return
        started = time.monotonic()
        while (busy := self.busy()) > self.threshold:
            if time.monotonic() - started > self.limit or self.waited >= self.budget:
                self.gave_up += 1
                print(f"    (machine still {busy:.0%} busy after {self.limit:.0f} s; going on)")
                break
        self.waited += time.monotonic() - started


def interleaved(
    repeat: int,
    variants: dict[str, Callable[[], float]],
    before_each: Callable[[], None],
    quiet: Quiet,
) -> dict[str, float]:
    """Run every variant once per round, ``repeat`` rounds; keep each one's best rate.

    Interleaving puts the floor and sa_jobs under the same conditions in every round.
    """
    best: dict[str, float] = {}
    for _ in range(repeat):
        for name, measure in variants.items():
            before_each()
            quiet.wait()
            best[name] = max(best.get(name, 0.0), measure())
    return best


def paired(
    rounds: int,
    steps: int,
    variants: dict[str, Callable[[int], None]],
    before_each: Callable[[], None],
    quiet: Quiet,
) -> dict[str, float]:
    """Take turns step by step; return each variant's total seconds over all rounds.

    For a ratio between two ways of doing the same work. This VM's speed drifts by a
    third within a minute, so timing each variant in a block of its own decides the
    ratio by where the drift lands; taking turns step by step gives both the same
    machine. ``step(i)`` does the i-th unit of work (one insert, one batch).

    The order within each turn is shuffled (seeded, so runs are comparable): in a fixed
    order the garbage collector's full collections, which fire after a set number of
    allocations, fell on the same variant turn after turn and moved the bulk ratio by
    a tenth. Collections still happen and are paid for; they just land by chance.
    """
    spent = dict.fromkeys(variants, 0.0)
    order = list(variants.items())
    shuffler = random.Random(0x5A10B5)
    for _ in range(rounds):
        before_each()
        gc.collect()
        quiet.wait()
        for _name, step in order:
            step(-1)  # warm-up
        for i in range(steps):
            shuffler.shuffle(order)
            for name, step in order:
                started = time.perf_counter()
                step(i)
                spent[name] += time.perf_counter() - started
    return spent


#: The unique cases measured against plain inserts: (row label, args class, note, and
#: whether the table holds one TTL lock that has expired, which makes every unique insert
#: probe its keys for expired locks to release; see release_expired_locks).
UNIQUE_CASES: tuple[tuple[str, type, str, bool], ...] = (
    ("unique", UniqueNoop, "by args, no TTL", False),
    ("unique with ttl", UniqueTtlNoop, "TTL locks held, none expired", False),
    ("unique with ttl", UniqueTtlNoop, "an expired TTL lock in the table: keys probed", True),
)


def hold_an_expired_lock(engine: Engine) -> None:
    past = datetime.now(UTC) - 2 * TTL
    with Session(engine) as session, session.begin():
        sa_jobs.insert(session, UniqueTtlNoop(-(10**9)), scheduled_at=past)


def unique_cost(
    table: Table,
    label: str,
    engine: Engine,
    repeat: int,
    steps: int,
    jobs_per_step: int,
    quiet: Quiet,
    step_with: Callable[[type], Callable[[int], None]],
) -> None:
    """A 'unique vs plain' row per case, from paired runs (rates: jobs per second)."""

    for which, unique_class, note, expired_lock in UNIQUE_CASES:

        def before_each(expired_lock: bool = expired_lock) -> None:
            reset(engine)
            if expired_lock:
                hold_an_expired_lock(engine)

        spent = paired(
            repeat,
            steps,
            {"plain": step_with(Noop), "unique": step_with(unique_class)},
            before_each,
            quiet,
        )
        count = steps * jobs_per_step * repeat
        table.add(
            f"{label}: {which} vs plain (paired)",
            count / spent["unique"],
            count / spent["plain"],
            "/s",
            note=f"aim >= 0.77x (unique costs <= 1.3x); {note}",
        )


# --------------------------------------------------------------------------- inserts


def bench_single_insert(
    url: URL, engine: Engine, n: int, repeat: int, quiet: Quiet, table: Table
) -> None:
    print(f"single insert: {n} jobs, one transaction each (best of {repeat})", flush=True)
    reference = text(
        "INSERT INTO sa_job (kind, args, queue) VALUES (:kind, :args, :queue) RETURNING id"
    ).bindparams(bindparam("args", type_=JSONB))

    def floor() -> float:
        with psycopg.connect(conninfo(url)) as conn:

            def one(seq: int) -> None:
                conn.execute(FLOOR_INSERT, (KIND, Jsonb({"seq": seq}), QUEUE)).fetchone()
                conn.commit()

            return loop_rate(n, one)

    def with_insert() -> float:
        def one(seq: int) -> None:
            with Session(engine) as session, session.begin():
                sa_jobs.insert(session, Noop(seq))

        return loop_rate(n, one)

    def with_enqueue() -> float:
        def one(seq: int) -> None:
            with Session(engine) as session, session.begin():
                session.add(sa_jobs.enqueue(Noop(seq)))

        return loop_rate(n, one)

    def with_insert_job() -> float:
        def one(seq: int) -> None:
            with engine.begin() as connection:
                connection.execute(sa_jobs.insert_job(Noop(seq))).one()

        return loop_rate(n, one)

    def with_sqlalchemy_text() -> float:
        def one(seq: int) -> None:
            with engine.begin() as connection:
                params = {"kind": KIND, "args": {"seq": seq}, "queue": QUEUE}
                connection.execute(reference, params).one()

        return loop_rate(n, one)

    rates = interleaved(
        repeat,
        {
            "floor": floor,
            "insert": with_insert,
            "enqueue": with_enqueue,
            "insert_job": with_insert_job,
            "text": with_sqlalchemy_text,
        },
        lambda: reset(engine),
        quiet,
    )
    floor_rate = rates["floor"]
    table.add("single insert/s: sa_jobs.insert(session)", rates["insert"], floor_rate, "/s")
    table.add("single insert/s: session.add(enqueue())", rates["enqueue"], floor_rate, "/s")
    table.add("single insert/s: conn.execute(insert_job())", rates["insert_job"], floor_rate, "/s")
    table.add(
        "single insert/s: SQLAlchemy text() INSERT",
        rates["text"],
        floor_rate,
        "/s",
        note="reference: SQLAlchemy alone, no sa_jobs code",
    )

    def single(args_class: type) -> Callable[[int], None]:
        def one(seq: int) -> None:
            with Session(engine) as session, session.begin():
                sa_jobs.insert(session, args_class(seq))

        return one

    unique_cost(table, "single insert/s", engine, repeat, n, 1, quiet, single)


@contextlib.contextmanager
def count_statements(engine: Engine) -> Iterator[list[str]]:
    statements: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", before)


def bench_bulk_insert(
    url: URL, engine: Engine, batches: int, repeat: int, quiet: Quiet, table: Table
) -> None:
    size = 1000
    total = batches * size
    print(f"bulk insert: {batches} x {size} jobs, one transaction each (best of {repeat})")

    def batch_rate(one: Callable[[int], None]) -> float:
        one(-size)  # warm-up
        started = time.perf_counter()
        for batch in range(batches):
            one(batch * size)
        return total / (time.perf_counter() - started)

    def floor_unnest() -> float:
        with psycopg.connect(conninfo(url)) as conn:

            def one(base: int) -> None:
                seqs = range(base, base + size)
                kinds, queues = [KIND] * size, [QUEUE] * size
                args = [Jsonb({"seq": seq}) for seq in seqs]
                conn.execute(FLOOR_INSERT_UNNEST, (kinds, args, queues)).fetchall()
                conn.commit()

            return batch_rate(one)

    def floor_copy() -> float:
        with psycopg.connect(conninfo(url)) as conn:

            def one(base: int) -> None:
                with conn.cursor() as cur, cur.copy(FLOOR_COPY) as copy:
                    for seq in range(base, base + size):
                        copy.write_row((KIND, args_json(seq), QUEUE))
                conn.commit()

            return batch_rate(one)

    def ours() -> float:
        def one(base: int) -> None:
            with Session(engine) as session, session.begin():
                sa_jobs.insert_many(session, [Noop(seq) for seq in range(base, base + size)])

        return batch_rate(one)

    rates = interleaved(
        repeat,
        {"unnest": floor_unnest, "copy": floor_copy, "ours": ours},
        lambda: reset(engine),
        quiet,
    )
    table.add(
        "bulk insert/s, 1,000/txn: insert_many",
        rates["ours"],
        rates["unnest"],
        "/s",
        note="floor: INSERT ... SELECT unnest() RETURNING id",
    )
    table.add(
        "bulk insert/s, 1,000/txn: insert_many",
        rates["ours"],
        rates["copy"],
        "/s",
        note="floor: COPY (returns no ids)",
    )

    def batch(args_class: type) -> Callable[[int], None]:
        def one(index: int) -> None:
            base = index * size
            with Session(engine) as session, session.begin():
                sa_jobs.insert_many(session, [args_class(seq) for seq in range(base, base + size)])

        return one

    unique_cost(table, "bulk insert/s, 1,000/txn", engine, repeat, batches, size, quiet, batch)
    with count_statements(engine) as statements, Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [Noop(seq) for seq in range(size)])
    table.add(
        "statements per insert_many of 1,000",
        len(statements),
        1,
        "stmts",
        higher_is_better=False,
        note="BEGIN/COMMIT not counted",
    )


# --------------------------------------------------------------------------- main


def machine() -> dict[str, str]:
    """``sa-jobs bench``'s description of the machine, plus the checkout's commit."""
    info = environment()
    root = Path(sa_jobs.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "not a git checkout"
    info["sa_jobs"] = f"{info['sa_jobs']} at {Path(sa_jobs.__file__).parent} (git {commit})"
    return info


MEASUREMENTS = ("single", "bulk")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--singles", type=int, help="jobs per single-insert measurement")
    parser.add_argument("--batches", type=int, help="batches of 1,000 per bulk measurement")
    parser.add_argument("--repeat", type=int, help="insert measurements: best of N rounds")
    parser.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="do not wait for other load on the machine to die down before each run",
    )
    parser.add_argument(
        "--only", action="append", choices=MEASUREMENTS, help="run only these (repeatable)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    quick = args.quick
    args.singles = args.singles or (300 if quick else 2_000)
    args.batches = args.batches or (3 if quick else 20)
    args.repeat = args.repeat or (1 if quick else 3)
    args.only = args.only or list(MEASUREMENTS)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    info = machine()
    for key, value in info.items():
        print(f"{key:>22}: {value}")
    table = Table()
    quiet = Quiet(args.wait)
    server = find_server()
    print(f"{'server':>22}: {server.source}")
    started = time.perf_counter()
    try:
        with throwaway_database(server, prefix="sa_jobs_bench") as url:
            engine = create_engine(url, pool_size=10, max_overflow=10)
            sa_jobs.migrate(engine)
            with engine.connect() as connection:
                info["postgresql"] = str(connection.scalar(text("SHOW server_version")))
            print(f"{'postgresql':>22}: {info['postgresql']}", flush=True)
            if "single" in args.only:
                bench_single_insert(url, engine, args.singles, args.repeat, quiet, table)
            if "bulk" in args.only:
                bench_bulk_insert(url, engine, args.batches, args.repeat, quiet, table)
            engine.dispose()
    finally:
        server.stop()
    info["load average at end"] = environment()["load_average"]
    info["seconds waited for a quiet machine"] = f"{quiet.waited:.0f} (gave up {quiet.gave_up}x)"
    print()
    print(table.render())
    print(f"\nratio = sa_jobs / floor; total {time.perf_counter() - started:.0f} s")
    print(f"load average at end: {info['load average at end']}")
    print(f"seconds waited for a quiet machine: {info['seconds waited for a quiet machine']}")
    print("worked jobs/s, CPU per job and latency: run sa-jobs bench --floor")
    if args.json:
        document: dict[str, Any] = {"machine": info, "args": vars(args) | {"json": str(args.json)}}
        document["rows"] = table.rows
        args.json.write_text(json.dumps(document, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
