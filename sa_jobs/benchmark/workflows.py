"""What workflows cost, against plain jobs of the same run (issue 24's speed aims).

One thread, the worker's own fetch (:func:`fetch_jobs`, 10 a time) and completer write
(:func:`write_outcomes`, which releases the dependents in the completion's transaction),
so the figures are the database work, not a worker's threads. Variants take turns, round
after round, each on an empty table; the medians of the rounds are reported:

* **insert** — ``insert_workflow`` of an ``n``-step workflow (1 → n-2 → 1: every middle
  step waits for the first, the last for every middle one) against ``insert_many`` of
  ``n`` plain jobs, jobs per second (aim: at least 0.5x);
* **fan-out/fan-in** — the 1 → n → 1 workflow drained against ``n + 2`` plain jobs
  drained, jobs per second (aim: at least 0.7x): this way, and by a running
  :class:`~sa_jobs.Worker` with ``WORKER_SLOTS`` slots and a no-op handler, clocked from
  the insert's commit until every job is completed (the worker's producer, executor and
  completer batches, which is how a user's jobs are worked);
* **chain** — a ``m``-step chain worked one step at a time: from the commit of a step's
  completion until a fetch returns the next step, p50 (aim: at most 5 ms); beside it the
  same for plain jobs (the next one is there already), which is the fetch's own time.

``n`` and ``m`` are 1,000 unless the run enqueues fewer jobs (``--jobs``; ``m`` is at most
a fifth of them).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._base.records import Outcome
from sa_jobs._table.schema import Features
from sa_jobs.benchmark.report import Figure
from sa_jobs.worker.completer import write_outcomes
from sa_jobs.worker.producer import fetch_jobs

__all__ = ["FAN", "ROUNDS", "figures"]

#: Steps of the inserted workflow, and middle steps of the fan-out/fan-in.
FAN = 1_000
#: Steps of the chain (issue 24's aim is stated for a 1,000-step chain).
CHAIN = 1_000
ROUNDS = 3
BATCH = 10
QUEUE = "sa_jobs_bench_workflow"
#: Slots of the worker that drains the fan-out/fan-in and its plain jobs.
WORKER_SLOTS = 10


@sa_jobs.job_args(kind="sa_jobs_bench_step", queue=QUEUE)
class BenchStep:
    n: int = 0


def _reset(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text("TRUNCATE sa_job, sa_job_workflow, sa_job_dep"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE sa_job, sa_job_workflow, sa_job_dep"))


def _plain(engine: Engine, n: int) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_many(session, [BenchStep(i) for i in range(n)])


def _fan(engine: Engine, middle: int) -> None:
    wf = sa_jobs.Workflow("bench fan")
    root = wf.add(BenchStep(-1), name="root")
    steps = [wf.add(BenchStep(i), after=[root]) for i in range(middle)]
    wf.add(BenchStep(-2), name="join", after=steps)
    with Session(engine) as session, session.begin():
        sa_jobs.insert_workflow(session, wf)


def _chain(engine: Engine, m: int) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_workflow(session, sa_jobs.chain(*(BenchStep(i) for i in range(m))))


def _timed(action: Callable[[], object]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def _drain(engine: Engine, features: Features, expected: int) -> float:
    """Seconds to fetch and complete every job, ``BATCH`` at a time, one thread."""
    done = 0
    began = time.perf_counter()
    while jobs := fetch_jobs(engine, QUEUE, BATCH, "bench", features=features):
        write_outcomes(engine, [Outcome.completed(job) for job in jobs], features)
        done += len(jobs)
    elapsed = time.perf_counter() - began
    if done != expected:
        raise RuntimeError(f"drained {done} jobs, expected {expected}: a step was not released")
    return elapsed


def _worked(engine: Engine, insert: Callable[[], object]) -> float:
    """Seconds from the commit of ``insert`` until every job is completed, polled every
    2 ms (a running worker works them)."""
    insert()
    began = time.perf_counter()
    unfinished = text("SELECT EXISTS (SELECT FROM sa_job WHERE state <> 'completed')")
    with engine.connect() as connection:
        while connection.execute(unfinished).scalar():
            connection.rollback()
            if time.perf_counter() - began > 60:
                raise RuntimeError("the worker did not finish the jobs within 60 s")
            time.sleep(0.002)
    return time.perf_counter() - began


def _worked_by_worker(engine: Engine, n: int, rounds: int, samples: dict[str, list[float]]) -> None:
    """The fan-out/fan-in and its plain jobs worked by a running worker, in turns."""
    worker = sa_jobs.Worker(engine, queues={QUEUE: WORKER_SLOTS}, worker_id="sa_jobs_bench")
    worker.handler(BenchStep)(lambda job: None)
    worker.start()
    try:
        _worked(engine, lambda: _fan(engine, 8))  # warm up, untimed
        for _ in range(rounds):
            _reset(engine)
            samples["worker_plain"].append((n + 2) / _worked(engine, lambda: _plain(engine, n + 2)))
            _reset(engine)
            samples["worker_fan"].append((n + 2) / _worked(engine, lambda: _fan(engine, n)))
    finally:
        worker.stop()


def _next_after_commit(engine: Engine, features: Features, m: int) -> list[float]:
    """Work ``m`` jobs one at a time; for each completion but the last, the seconds from
    its commit until a fetch returned the next job."""
    waits: list[float] = []
    for worked in range(m):
        began = time.perf_counter()
        while not (jobs := fetch_jobs(engine, QUEUE, 1, "bench", features=features)):
            # Not released by the completion's commit: poll until it shows up.
            if time.perf_counter() - began > 5:
                raise RuntimeError(f"job {worked + 1} of {m} was not released within 5 s")
        if worked:
            waits.append(time.perf_counter() - began)
        write_outcomes(engine, [Outcome.completed(jobs[0])], features)
    return waits


def figures(engine: Engine, jobs: int, say: Callable[[str], None]) -> list[Figure]:
    """The workflow figures and their ratios to plain jobs; ``jobs`` bounds the sizes."""
    n = max(10, min(FAN, jobs))
    m = max(5, min(CHAIN, jobs // 5))
    # A small run (a smoke test of the command) measures each case once.
    rounds = ROUNDS if jobs >= FAN else 1
    say(f"workflows: insert and drain 1 -> {n:,} -> 1, a {m}-step chain, {rounds} rounds")
    with engine.connect() as connection:
        features = Features.of(connection)
    if not features.workflow:
        return []
    samples: dict[str, list[float]] = {
        name: []
        for name in (
            *("insert_plain", "insert_wf", "drain_plain", "drain_fan", "chain", "plain"),
            *("worker_plain", "worker_fan"),
        )
    }
    _reset(engine)
    _plain(engine, 10)  # warm up, untimed: connections, statement caches
    _fan(engine, 8)
    for _ in range(rounds):
        _reset(engine)
        samples["insert_plain"].append(n / _timed(lambda: _plain(engine, n)))
        _reset(engine)
        samples["insert_wf"].append(n / _timed(lambda: _fan(engine, n - 2)))
        _reset(engine)
        _plain(engine, n + 2)
        samples["drain_plain"].append((n + 2) / _drain(engine, features, n + 2))
        _reset(engine)
        _fan(engine, n)
        samples["drain_fan"].append((n + 2) / _drain(engine, features, n + 2))
        _reset(engine)
        _chain(engine, m)
        samples["chain"].append(statistics.median(_next_after_commit(engine, features, m)))
        _reset(engine)
        _plain(engine, m)
        samples["plain"].append(statistics.median(_next_after_commit(engine, features, m)))
    _reset(engine)
    _worked_by_worker(engine, n, rounds, samples)
    _reset(engine)
    median = {name: statistics.median(values) for name, values in samples.items()}
    return [
        Figure(
            "workflow_insert",
            f"insert_workflow, {n:,} steps (1 -> n-2 -> 1)",
            "jobs/s",
            median["insert_wf"],
        ),
        Figure(
            "workflow_insert_plain",
            f"insert_many, {n:,} plain jobs",
            "jobs/s",
            median["insert_plain"],
        ),
        Figure(
            "workflow_insert_ratio",
            "workflow / plain insert, jobs/s (aim: >= 0.5)",
            "x",
            median["insert_wf"] / median["insert_plain"],
        ),
        Figure(
            "workflow_fan_worked",
            f"worked, 1 -> {n:,} -> 1, {BATCH}/fetch, 1 thread",
            "jobs/s",
            median["drain_fan"],
        ),
        Figure(
            "workflow_fan_plain_worked",
            f"worked, {n + 2:,} plain jobs, same way",
            "jobs/s",
            median["drain_plain"],
        ),
        Figure(
            "workflow_fan_ratio",
            "fan-out/fan-in / plain, 1 thread, jobs/s",
            "x",
            median["drain_fan"] / median["drain_plain"],
        ),
        Figure(
            "workflow_fan_worker",
            f"worked by a Worker ({WORKER_SLOTS} slots), 1 -> {n:,} -> 1",
            "jobs/s",
            median["worker_fan"],
        ),
        Figure(
            "workflow_fan_plain_worker",
            f"worked by a Worker ({WORKER_SLOTS} slots), {n + 2:,} plain jobs",
            "jobs/s",
            median["worker_plain"],
        ),
        Figure(
            "workflow_fan_worker_ratio",
            "fan-out/fan-in / plain, by a Worker, jobs/s (aim: >= 0.7)",
            "x",
            median["worker_fan"] / median["worker_plain"],
        ),
        Figure(
            "workflow_chain_release_p50",
            f"{m:,}-step chain: completion commit -> next step fetched, p50 (aim: <= 5 ms)",
            "ms",
            median["chain"] * 1e3,
            higher_is_better=False,
        ),
        Figure(
            "workflow_plain_next_p50",
            "plain jobs: completion commit -> next job fetched, p50",
            "ms",
            median["plain"] * 1e3,
            higher_is_better=False,
        ),
    ]
