"""Sequences against a real database: one active job per key, in id order, halting.

Sections follow the feature: how the key is built; the first job of an idle sequence is
available at once and the others wait; the database itself refuses a second active job;
every finishing path (the worker's completer, ``complete_in``, the rescuer,
``cancel_job``) promotes the next job *in its own transaction*; halting and resuming
in every combination of flags; the repair pass; the cleaner; unique options; a
database without the sequence branch; concurrent inserters.

"Works the jobs" below means :func:`drain`: fetch like a worker, complete with
:func:`~sa_jobs._act.complete.finish_in` like the completer, repeat — and never run a
maintenance pass, so a promotion that did not happen where it should shows up as a
job left behind.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg.errors
import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import InsertManyParams, InsertOpts, Job, JobState, SequenceOpts, UniqueOpts
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._declare.options import REQUIRED_UNIQUE_STATES
from sa_jobs._insert.sequence import _lock_number_sql, lock_number
from sa_jobs._table.models import job_table
from sa_jobs._table.schema import SEQUENCE_BRANCH, installed_branches
from sa_jobs.devdb import Server, throwaway_database
from sa_jobs.errors import InvalidOptionsError, SchemaMissingError, UniqueConflictError
from sa_jobs.worker import Retention
from sa_jobs.worker.maintenance.cleaner import Cleaner
from sa_jobs.worker.maintenance.rescuer import Rescuer
from sa_jobs.worker.maintenance.scheduler import Scheduler
from sa_jobs.worker.maintenance.sequence_repair import SequenceRepair
from sa_jobs.worker.producer import fetch_jobs
from tests.factories import clear_workers_and_leader, job_row
from tests.helpers import (
    INSERT_PATHS,
    NO_MAINTENANCE,
    add_job,
    add_jobs,
    cancel,
    engine_at,
    fetch_one,
    finish_outcomes,
    finish_run,
    insert_through,
    job_states,
    make_worker,
    retry,
    run_once,
    running,
    wait_for_state,
    wait_past,
    wait_until,
    xmin,
)


@sa_jobs.job_args(kind="test_sequence.by_kind", sequence=SequenceOpts())
class ByKind:
    n: int = 0


@sa_jobs.job_args(kind="test_sequence.other_by_kind", sequence=SequenceOpts())
class OtherByKind:
    n: int = 0


@sa_jobs.job_args(kind="test_sequence.customer", sequence=SequenceOpts(by_args=True))
class Customer:
    customer_id: int = sa_jobs.field(sequence=True)
    note: str = ""


@sa_jobs.job_args(kind="test_sequence.invoice")
class Invoice:
    customer_id: int = sa_jobs.field(sequence=True)
    note: str = ""


@sa_jobs.job_args(kind="test_sequence.all_args", sequence=SequenceOpts(by_args=True))
class AllArgs:
    a: int = 0
    b: int = 0


@sa_jobs.job_args(kind="test_sequence.plain")
class Plain:
    n: int = 0


ACTIVE = ("available", "running", "retryable", "scheduled")
CUSTOMER_AND_INVOICE = SequenceOpts(by_args=True, exclude_kind=True)


# ------------------------------------------------------------------ helpers


def state(engine: Engine, job_id: int) -> JobState:
    return job_states(engine)[job_id]


def slot_holders(engine: Engine) -> list[int]:
    with engine.connect() as connection:
        return list(
            connection.scalars(
                select(job_table.c.id).where(job_table.c.sequence_slot).order_by(job_table.c.id)
            )
        )


def sequence_key(engine: Engine, job_id: int) -> bytes | None:
    with engine.connect() as connection:
        key = connection.scalar(select(job_table.c.sequence_key).where(job_table.c.id == job_id))
    return bytes(key) if key is not None else None


def assert_one_active_per_sequence(engine: Engine) -> None:
    with engine.connect() as connection:
        crowded = connection.execute(
            text(
                "SELECT sequence_key, array_agg(id ORDER BY id) FROM sa_job"
                " WHERE sequence_key IS NOT NULL AND state::text = ANY(:active)"
                " GROUP BY sequence_key HAVING count(*) > 1"
            ),
            {"active": list(ACTIVE)},
        ).all()
    assert crowded == [], f"sequences with several active jobs: {crowded}"


def stalled_sequences(engine: Engine) -> list[list[int]]:
    """Pending jobs of sequences nobody holds: what only the repair pass would restart."""
    with engine.connect() as connection:
        return [
            list(ids)
            for (ids,) in connection.execute(
                text(
                    "SELECT array_agg(id ORDER BY id) FROM sa_job w"
                    " WHERE sequence_key IS NOT NULL AND state = 'pending' AND NOT EXISTS"
                    " (SELECT FROM sa_job h WHERE h.sequence_key = w.sequence_key"
                    "  AND h.sequence_slot) GROUP BY sequence_key"
                )
            )
        ]


def fetch(engine: Engine, queue: str = "default", limit: int = 100) -> list[Job]:
    return fetch_jobs(engine, queue, limit, "test-sequence")


def drain(engine: Engine, queues: tuple[str, ...] = ("default",)) -> list[int]:
    """Work every available job as a worker would, with no maintenance pass in between.

    Each round fetches everything available and completes it in one batch (as the
    batched completer does). Returns the ids in the order they started.
    """
    started: list[int] = []
    for _ in range(10_000):
        jobs = [job for queue in queues for job in fetch(engine, queue)]
        if not jobs:
            return started
        assert_one_active_per_sequence(engine)
        started += [job.id for job in jobs]
        finish_outcomes(engine, [Outcome.completed(job) for job in jobs])
    raise AssertionError("drain did not finish")


def repair(engine: Engine) -> int:
    return run_once(engine, SequenceRepair())


def sql(engine: Engine, statement: str, **params: Any) -> None:
    with engine.begin() as connection:
        connection.execute(text(statement), params)


# ------------------------------------------------------------------ the key


def test_sequence_opts_puts_every_job_of_the_kind_in_one_sequence(engine: Engine) -> None:
    first, second = add_job(engine, ByKind(1)), add_job(engine, ByKind(2))
    other = add_job(engine, OtherByKind(1))

    assert sequence_key(engine, first) == sequence_key(engine, second)
    assert sequence_key(engine, other) != sequence_key(engine, first)
    assert job_states(engine) == {
        first: JobState.AVAILABLE,
        second: JobState.PENDING,
        other: JobState.AVAILABLE,
    }


def test_by_args_uses_only_the_fields_marked_sequence(engine: Engine) -> None:
    a = add_job(engine, Customer(1, "a"))
    b = add_job(engine, Customer(1, "b"))
    c = add_job(engine, Customer(2, "a"))

    assert sequence_key(engine, a) == sequence_key(engine, b) != sequence_key(engine, c)
    assert job_states(engine) == {a: JobState.AVAILABLE, b: JobState.PENDING, c: JobState.AVAILABLE}


def test_by_args_without_marked_fields_uses_all_args(engine: Engine) -> None:
    a = add_job(engine, AllArgs(1, 1))
    b = add_job(engine, AllArgs(1, 2))
    c = add_job(engine, AllArgs(1, 1))

    assert sequence_key(engine, a) == sequence_key(engine, c) != sequence_key(engine, b)
    assert job_states(engine) == {a: JobState.AVAILABLE, b: JobState.AVAILABLE, c: JobState.PENDING}


def test_the_key_is_the_documented_digest_of_its_canonical_bytes(engine: Engine) -> None:
    job_id = add_job(engine, Customer(7, "ignored"))
    canonical = 'sa_jobs:sequence:v1\nkind="test_sequence.customer"\nargs={"customer_id":7}'

    assert sequence_key(engine, job_id) == hashlib.sha256(canonical.encode()).digest()


def test_by_queue_makes_one_sequence_per_queue(engine: Engine) -> None:
    per_queue = SequenceOpts(by_queue=True)
    a1 = add_job(engine, Plain(1), queue="a", sequence=per_queue)
    b1 = add_job(engine, Plain(2), queue="b", sequence=per_queue)
    a2 = add_job(engine, Plain(3), queue="a", sequence=per_queue)
    # Without by_queue the queue does not matter: one sequence across queues.
    x = add_job(engine, Plain(4), queue="a", sequence=SequenceOpts())
    y = add_job(engine, Plain(5), queue="b", sequence=SequenceOpts())

    assert sequence_key(engine, a1) == sequence_key(engine, a2) != sequence_key(engine, b1)
    assert sequence_key(engine, x) == sequence_key(engine, y)
    assert job_states(engine) == {
        a1: JobState.AVAILABLE,
        b1: JobState.AVAILABLE,
        a2: JobState.PENDING,
        x: JobState.AVAILABLE,
        y: JobState.PENDING,
    }


def test_exclude_kind_lets_several_kinds_share_one_sequence(engine: Engine) -> None:
    customer = add_job(engine, Customer(1), sequence=CUSTOMER_AND_INVOICE)
    invoice = add_job(engine, Invoice(1), sequence=CUSTOMER_AND_INVOICE)
    other_customer = add_job(engine, Invoice(2), sequence=CUSTOMER_AND_INVOICE)
    kind_kept = add_job(engine, Invoice(1), sequence=SequenceOpts(by_args=True))

    assert sequence_key(engine, customer) == sequence_key(engine, invoice)
    assert len({sequence_key(engine, j) for j in (customer, other_customer, kind_kept)}) == 3
    assert job_states(engine) == {
        customer: JobState.AVAILABLE,
        invoice: JobState.PENDING,
        other_customer: JobState.AVAILABLE,
        kind_kept: JobState.AVAILABLE,
    }


def test_exclude_kind_alone_is_refused_naming_what_to_add() -> None:
    with pytest.raises(InvalidOptionsError) as caught:
        SequenceOpts(exclude_kind=True)
    assert caught.value.option == "exclude_kind"
    assert "by_args" in str(caught.value) and "by_queue" in str(caught.value)
    assert isinstance(caught.value, sa_jobs.SaJobsError)
    # Either dimension makes it valid.
    SequenceOpts(exclude_kind=True, by_args=True)
    SequenceOpts(exclude_kind=True, by_queue=True)


def test_a_bad_sequence_option_is_refused_before_any_sql() -> None:
    with pytest.raises(InvalidOptionsError, match="sequence"):
        InsertOpts(sequence=UniqueOpts())  # type: ignore[arg-type]


def test_continue_flags_are_stored_and_not_part_of_the_key(engine: Engine) -> None:
    plain = add_job(engine, Customer(1))
    flagged = add_job(
        engine,
        Customer(1),
        sequence=SequenceOpts(by_args=True, continue_on_cancelled=True, continue_on_discarded=True),
    )
    assert sequence_key(engine, plain) == sequence_key(engine, flagged)
    row = job_row(engine, flagged)
    assert (row.sequence_continue_on_cancelled, row.sequence_continue_on_discarded) == (True, True)
    row = job_row(engine, plain)
    assert (row.sequence_continue_on_cancelled, row.sequence_continue_on_discarded) == (
        False,
        False,
    )


def test_the_call_site_overrides_the_kind_and_unsequenced_jobs_are_left_alone(
    engine: Engine,
) -> None:
    unsequenced = [add_job(engine, Plain(1)), add_job(engine, Plain(1))]
    called = add_job(engine, Plain(1), sequence=SequenceOpts())

    assert [sequence_key(engine, j) for j in unsequenced] == [None, None]
    assert sequence_key(engine, called) is not None
    assert set(job_states(engine).values()) == {JobState.AVAILABLE}
    assert slot_holders(engine) == [called]


def test_lock_numbers_computed_in_python_and_in_sql_agree(engine: Engine) -> None:
    # Inserters lock lock_number(key) from Python; finishers compute it in SQL. They must agree
    # (including keys whose first byte has the high bit set: signed int4).
    ids = add_jobs(engine, [Customer(n) for n in range(64)])
    with engine.connect() as connection:
        rows = connection.execute(
            select(job_table.c.sequence_key, _lock_number_sql(job_table.c.sequence_key)).where(
                job_table.c.id.in_(ids)
            )
        ).all()
    assert any(bytes(key)[0] >= 0x80 for key, _ in rows)
    assert all(lock_number("\\x" + bytes(key).hex()) == number for key, number in rows)


# ------------------------------------------------------------------ inserting


@pytest.mark.parametrize("path", INSERT_PATHS)
def test_the_first_job_of_an_idle_sequence_is_available_at_once_the_rest_wait(
    engine: Engine, path: str
) -> None:
    ids = [insert_through(engine, path, Customer(1, str(n)))[0] for n in range(3)]

    assert [state(engine, i) for i in ids] == [
        JobState.AVAILABLE,
        JobState.PENDING,
        JobState.PENDING,
    ]
    assert slot_holders(engine) == [ids[0]]
    assert drain(engine) == ids


def test_the_returned_job_reflects_its_sequence_state(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        first = sa_jobs.insert(session, Customer(1)).job
        second = sa_jobs.insert(session, Customer(1)).job
        assert (first.state, second.state) == (JobState.AVAILABLE, JobState.PENDING)


def test_a_future_first_job_is_scheduled_and_holds_the_slot(engine: Engine) -> None:
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    first = add_job(engine, Customer(1), scheduled_at=later)
    second = add_job(engine, Customer(1))

    assert job_states(engine) == {first: JobState.SCHEDULED, second: JobState.PENDING}
    assert slot_holders(engine) == [first]
    assert drain(engine) == []


def test_a_promoted_job_due_later_becomes_scheduled_not_available(engine: Engine) -> None:
    first = add_job(engine, Customer(1))
    in_an_hour = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    later = add_job(engine, Customer(1), scheduled_at=in_an_hour)
    finish_run(engine, fetch_one(engine))

    assert job_states(engine) == {first: JobState.COMPLETED, later: JobState.SCHEDULED}
    assert slot_holders(engine) == [later]


def test_insert_many_with_several_jobs_of_one_sequence_gives_the_slot_to_the_first(
    engine: Engine,
) -> None:
    ids = add_jobs(engine, [Customer(1, "a"), Customer(2, "a"), Customer(1, "b"), Customer(1, "c")])

    assert [state(engine, i) for i in ids] == [
        JobState.AVAILABLE,
        JobState.AVAILABLE,
        JobState.PENDING,
        JobState.PENDING,
    ]
    assert slot_holders(engine) == [ids[0], ids[1]]
    assert drain(engine) == [ids[0], ids[1], ids[2], ids[3]]


def test_insert_many_with_per_item_options_and_batches(engine: Engine) -> None:
    items = [
        InsertManyParams(Plain(n), InsertOpts(sequence=SequenceOpts(by_queue=True), queue=q))
        for n, q in enumerate(["a", "b", "a", "b", "a"])
    ]
    with Session(engine) as session, session.begin():
        ids = [r.job.id for r in sa_jobs.insert_many(session, items, batch_size=2)]

    assert [state(engine, i) for i in ids] == [
        JobState.AVAILABLE,
        JobState.AVAILABLE,
        JobState.PENDING,
        JobState.PENDING,
        JobState.PENDING,
    ]
    assert drain(engine, ("a", "b")) == ids


def test_several_enqueued_jobs_of_one_sequence_in_one_flush(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        jobs = [sa_jobs.enqueue(Customer(1, str(n))) for n in range(3)]
        session.add_all(reversed(jobs))  # the flush keeps enqueue order, not add order
        session.flush()
        ids = [job.id for job in jobs]

    assert ids == sorted(ids)
    assert [state(engine, i) for i in ids] == [
        JobState.AVAILABLE,
        JobState.PENDING,
        JobState.PENDING,
    ]


def test_a_sequence_whose_jobs_all_completed_is_idle_again(engine: Engine) -> None:
    add_jobs(engine, [Customer(1), Customer(1)])
    drain(engine)
    third = add_job(engine, Customer(1))

    assert state(engine, third) is JobState.AVAILABLE


def test_a_rolled_back_insert_leaves_the_sequence_idle(engine: Engine) -> None:
    with Session(engine) as session:
        sa_jobs.insert(session, Customer(1))
        session.rollback()
    job_id = add_job(engine, Customer(1))

    assert job_states(engine) == {job_id: JobState.AVAILABLE}


# ------------------------------------------------------------------ the database's guarantee


def test_the_database_refuses_to_make_a_waiting_job_active(engine: Engine) -> None:
    # The "impossible to break" proof: no code path is involved, only SQL.
    first, second = add_job(engine, Customer(1)), add_job(engine, Customer(1))

    for active in ACTIVE:
        with pytest.raises(IntegrityError) as caught, engine.begin() as connection:
            connection.execute(
                text(f"UPDATE sa_job SET state = '{active}' WHERE id = :id"), {"id": second}
            )
        assert isinstance(caught.value.orig, psycopg.errors.CheckViolation)
        assert "sequence_active_holds_slot" in str(caught.value.orig)

    # Claiming the slot as well hits the one-holder index instead.
    with pytest.raises(IntegrityError) as caught, engine.begin() as connection:
        connection.execute(
            text("UPDATE sa_job SET state = 'available', sequence_slot = true WHERE id = :id"),
            {"id": second},
        )
    assert isinstance(caught.value.orig, psycopg.errors.UniqueViolation)
    assert "sa_job_sequence_slot_idx" in str(caught.value.orig)

    assert job_states(engine) == {first: JobState.AVAILABLE, second: JobState.PENDING}


def test_the_database_refuses_a_second_slot_holder_even_when_the_first_is_halted(
    engine: Engine,
) -> None:
    first, second = add_job(engine, Customer(1)), add_job(engine, Customer(1))
    finish_run(engine, fetch_one(engine), Ending.CANCELLED)
    assert slot_holders(engine) == [first]

    with pytest.raises(IntegrityError) as caught, engine.begin() as connection:
        connection.execute(
            text("UPDATE sa_job SET state = 'available', sequence_slot = true WHERE id = :id"),
            {"id": second},
        )
    assert isinstance(caught.value.orig, psycopg.errors.UniqueViolation)


def test_a_hand_written_row_cannot_join_a_busy_sequence_as_active(engine: Engine) -> None:
    first = add_job(engine, Customer(1))
    key = sequence_key(engine, first)

    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.execute(
            job_table.insert().values(kind="test_sequence.customer", sequence_key=key)
        )
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.execute(
            job_table.insert().values(
                kind="test_sequence.customer", sequence_key=key, sequence_slot=True
            )
        )


# ------------------------------------------------------------------ promotion: the worker


@pytest.fixture
def no_repair(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Turn the repair pass into a no-op that remembers what it would have restarted."""
    would_restart: list[int] = []
    original = SequenceRepair.run_once

    def recording(self: SequenceRepair, connection: Any) -> int:
        savepoint = connection.begin_nested()
        try:
            would_restart.append(original(self, connection))
        finally:
            savepoint.rollback()
        return 0

    monkeypatch.setattr(SequenceRepair, "run_once", recording)
    return would_restart


@pytest.mark.parametrize(
    ("completer", "with_session"),
    [("batch", False), ("inline", False), ("batch", True)],
    ids=["batch", "inline", "handler-session"],
)
def test_the_worker_promotes_the_next_job_in_the_completing_transaction(
    engine: Engine, no_repair: list[int], completer: str, with_session: bool
) -> None:
    # The next job is in a queue this worker does not serve, so nobody fetches it: we
    # see it exactly as the completion left it.
    clear_workers_and_leader(engine)
    first = add_job(engine, ByKind(1))
    second = add_job(engine, ByKind(2), queue="elsewhere")
    worker = make_worker(engine, completer=completer, maintenance=NO_MAINTENANCE)

    if with_session:

        @worker.handler(ByKind)
        def work_in_session(job: Job, session: Session) -> None:
            session.execute(text("SELECT 1"))

    else:

        @worker.handler(ByKind)
        def work(job: Job) -> None:
            pass

    with running(worker):
        wait_for_state(engine, first, JobState.COMPLETED)
        assert state(engine, second) is JobState.AVAILABLE
        assert xmin(engine, second) == xmin(engine, first)
    assert slot_holders(engine) == [second]
    assert sum(no_repair) == 0


def test_a_worker_works_a_long_sequence_in_order_without_any_maintenance_pass(
    engine: Engine, no_repair: list[int]
) -> None:
    clear_workers_and_leader(engine)
    ids = add_jobs(engine, [Customer(n % 2, str(n)) for n in range(20)])
    intervals: dict[int, tuple[float, float]] = {}
    worker = make_worker(engine, queues={"default": 8}, maintenance=NO_MAINTENANCE)

    @worker.handler(Customer)
    def work(job: Job) -> None:
        start = time.monotonic()
        time.sleep(0.005)  # the job's work: a run that overlapped another would show
        intervals[job.id] = (start, time.monotonic())

    with running(worker):
        wait_until(
            lambda: set(job_states(engine).values()) == {JobState.COMPLETED},
            timeout=15,
            what="every job to complete",
        )
    assert sum(no_repair) == 0
    for customer in (0, 1):
        mine = [job_id for n, job_id in enumerate(ids) if n % 2 == customer]
        by_start = sorted(mine, key=lambda job_id: intervals[job_id][0])
        assert by_start == mine
        for earlier, later in itertools.pairwise(by_start):
            assert intervals[earlier][1] <= intervals[later][0]


# ------------------------------------------------------------------ promotion: complete_in


def test_complete_in_promotes_the_next_job_inside_the_callers_transaction(
    engine: Engine,
) -> None:
    first, second = add_job(engine, Customer(1)), add_job(engine, Customer(1))
    job = fetch_one(engine)

    with Session(engine) as session:
        sa_jobs.complete_in(session, job)
        inside = session.execute(
            select(job_table.c.id, job_table.c.state).where(job_table.c.id.in_([first, second]))
        ).all()
        assert dict(inside) == {first: JobState.COMPLETED, second: JobState.AVAILABLE}
        # Not committed: everyone else still sees the old state.
        assert job_states(engine) == {first: JobState.RUNNING, second: JobState.PENDING}
        session.commit()

    assert job_states(engine) == {first: JobState.COMPLETED, second: JobState.AVAILABLE}
    assert xmin(engine, first) == xmin(engine, second)
    assert slot_holders(engine) == [second]


def test_complete_in_rolled_back_changes_nothing(engine: Engine) -> None:
    first, second = add_job(engine, Customer(1)), add_job(engine, Customer(1))
    job = fetch_one(engine)

    with Session(engine) as session:
        sa_jobs.complete_in(session, job)
        session.rollback()

    assert job_states(engine) == {first: JobState.RUNNING, second: JobState.PENDING}
    assert slot_holders(engine) == [first]
    # The run can still complete normally afterwards.
    finish_run(engine, job)
    assert state(engine, second) is JobState.AVAILABLE


def test_complete_in_twice_promotes_once(engine: Engine) -> None:
    ids = add_jobs(engine, [Customer(1), Customer(1), Customer(1)])
    job = fetch_one(engine)
    for _ in range(2):
        with Session(engine) as session, session.begin():
            sa_jobs.complete_in(session, job)
    assert finish_run(engine, job) == []  # the worker's own completion afterwards: a no-op

    assert [state(engine, i) for i in ids] == [
        JobState.COMPLETED,
        JobState.AVAILABLE,
        JobState.PENDING,
    ]


@pytest.mark.parametrize("finisher", ["complete_in", "cancel_job"])
def test_a_job_inserted_while_the_finishing_transaction_was_open_is_promoted_available(
    engine: Engine, finisher: str
) -> None:
    opts = SequenceOpts(by_args=True, continue_on_cancelled=True)
    first = add_job(engine, Customer(1), sequence=opts)
    job = fetch_one(engine) if finisher == "complete_in" else None
    with Session(engine) as session:
        began = session.scalar(select(func.now()))  # the transaction begins: the handler's work
        wait_past(engine, began)  # the next job arrives later than the transaction's now()
        second = add_job(engine, Customer(1), sequence=opts)  # meanwhile, the next job arrives
        if job is not None:
            sa_jobs.complete_in(session, job)
        else:
            sa_jobs.cancel_job(session, first)
        session.commit()

    assert state(engine, second) is JobState.AVAILABLE


# ------------------------------------------------------------------ promotion: the rescuer


def orphan(engine: Engine) -> Job:
    """Fetch the available job for a worker that vanished an hour ago (no heartbeat row)."""
    job = fetch_jobs(engine, "default", 1, "vanished-worker")[0]
    sql(
        engine,
        "UPDATE sa_job SET attempted_at = now() - interval '1 hour' WHERE id = :id",
        id=job.id,
    )
    return job


def test_a_rescued_job_with_attempts_left_is_retryable_and_keeps_the_slot(engine: Engine) -> None:
    clear_workers_and_leader(engine)
    first, second = add_job(engine, Customer(1)), add_job(engine, Customer(1))
    orphan(engine)

    assert run_once(engine, Rescuer(1.0)) == 1
    assert job_states(engine) == {first: JobState.RETRYABLE, second: JobState.PENDING}
    assert slot_holders(engine) == [first]


@pytest.mark.parametrize("continue_on_discarded", [False, True])
def test_a_rescued_job_without_attempts_left_is_discarded_and_halts_unless_told(
    engine: Engine, continue_on_discarded: bool
) -> None:
    clear_workers_and_leader(engine)
    opts = SequenceOpts(by_args=True, continue_on_discarded=continue_on_discarded)
    first = add_job(engine, Customer(1), sequence=opts, max_attempts=1)
    second = add_job(engine, Customer(1), sequence=opts)
    orphan(engine)

    assert run_once(engine, Rescuer(1.0)) == 1
    if continue_on_discarded:
        assert job_states(engine) == {first: JobState.DISCARDED, second: JobState.AVAILABLE}
        assert xmin(engine, first) == xmin(engine, second)
        assert slot_holders(engine) == [second]
    else:
        assert job_states(engine) == {first: JobState.DISCARDED, second: JobState.PENDING}
        assert slot_holders(engine) == [first]
        assert repair(engine) == 0


@pytest.mark.parametrize("continue_on_cancelled", [False, True])
def test_a_rescued_job_someone_tried_to_cancel_is_cancelled_and_halts_unless_told(
    engine: Engine, continue_on_cancelled: bool
) -> None:
    clear_workers_and_leader(engine)
    opts = SequenceOpts(by_args=True, continue_on_cancelled=continue_on_cancelled)
    first = add_job(engine, Customer(1), sequence=opts)
    second = add_job(engine, Customer(1), sequence=opts)
    orphan(engine)
    assert cancel(engine, first).state is JobState.RUNNING  # only marked: its worker is gone

    assert run_once(engine, Rescuer(1.0)) == 1
    expected_next = JobState.AVAILABLE if continue_on_cancelled else JobState.PENDING
    assert job_states(engine) == {first: JobState.CANCELLED, second: expected_next}


# ------------------------------------------------------------------ promotion: cancel_job


def test_cancelling_a_waiting_job_does_not_halt_the_sequence(engine: Engine) -> None:
    first, second, third = add_jobs(engine, [Customer(1), Customer(1), Customer(1)])

    assert cancel(engine, second).state is JobState.CANCELLED
    assert slot_holders(engine) == [first]
    assert drain(engine) == [first, third]
    assert state(engine, second) is JobState.CANCELLED


@pytest.mark.parametrize("continue_on_cancelled", [False, True])
def test_cancelling_the_slot_holder_halts_unless_continue_on_cancelled(
    engine: Engine, continue_on_cancelled: bool
) -> None:
    opts = SequenceOpts(by_args=True, continue_on_cancelled=continue_on_cancelled)
    first, second, third = add_jobs(engine, [Customer(1), Customer(1), Customer(1)], sequence=opts)

    assert cancel(engine, first).state is JobState.CANCELLED
    if continue_on_cancelled:
        assert job_states(engine) == {
            first: JobState.CANCELLED,
            second: JobState.AVAILABLE,
            third: JobState.PENDING,
        }
        assert xmin(engine, first) == xmin(engine, second)
        assert drain(engine) == [second, third]
    else:
        assert job_states(engine) == {
            first: JobState.CANCELLED,
            second: JobState.PENDING,
            third: JobState.PENDING,
        }
        assert slot_holders(engine) == [first]
        assert repair(engine) == 0
        assert drain(engine) == []


def test_cancelling_a_running_holder_halts_when_its_run_ends(engine: Engine) -> None:
    first, second = add_job(engine, Customer(1)), add_job(engine, Customer(1))
    job = fetch_one(engine)

    assert cancel(engine, first).state is JobState.RUNNING
    assert state(engine, second) is JobState.PENDING
    # The handler notices and fails; the attempt ends cancelled, and the sequence halts.
    assert finish_run(engine, job, Ending.FAILED) == [(job.id, JobState.CANCELLED)]
    assert job_states(engine) == {first: JobState.CANCELLED, second: JobState.PENDING}
    assert slot_holders(engine) == [first]


def test_cancelling_a_scheduled_holder_passes_the_slot_when_told(engine: Engine) -> None:
    opts = SequenceOpts(by_args=True, continue_on_cancelled=True)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    first = add_job(engine, Customer(1), sequence=opts, scheduled_at=later)
    second = add_job(engine, Customer(1), sequence=opts)

    cancel(engine, first)
    assert job_states(engine) == {first: JobState.CANCELLED, second: JobState.AVAILABLE}


# ------------------------------------------------------------------ halting and resuming


def _fail(engine: Engine, how: str) -> None:
    job = fetch_one(engine)
    if how == "cancel":
        assert finish_run(engine, job, Ending.CANCELLED) == [(job.id, JobState.CANCELLED)]
    else:
        assert finish_run(engine, job, Ending.FAILED) == [(job.id, JobState.DISCARDED)]


@pytest.mark.parametrize("recover", ["retry_halted", "retry_later"])
@pytest.mark.parametrize("how", ["cancel", "discard"])
@pytest.mark.parametrize("continue_on_discarded", [False, True], ids=["cd0", "cd1"])
@pytest.mark.parametrize("continue_on_cancelled", [False, True], ids=["cc0", "cc1"])
def test_halting_and_resuming(
    engine: Engine,
    continue_on_cancelled: bool,
    continue_on_discarded: bool,
    how: str,
    recover: str,
) -> None:
    opts = SequenceOpts(
        by_args=True,
        continue_on_cancelled=continue_on_cancelled,
        continue_on_discarded=continue_on_discarded,
    )
    first = add_job(engine, Customer(1, "1"), sequence=opts, max_attempts=1)
    second, third = add_jobs(engine, [Customer(1, "2"), Customer(1, "3")], sequence=opts)
    other = add_job(engine, Customer(2, "unrelated"), sequence=opts, queue="other")
    assert fetch_one(engine, "other").id == other
    continues = continue_on_cancelled if how == "cancel" else continue_on_discarded
    failed = JobState.CANCELLED if how == "cancel" else JobState.DISCARDED

    _fail(engine, how)

    if continues:
        assert (state(engine, first), state(engine, second)) == (failed, JobState.AVAILABLE)
        assert xmin(engine, first) == xmin(engine, second)
        assert slot_holders(engine) == [second, other]
    else:
        assert (state(engine, first), state(engine, second)) == (failed, JobState.PENDING)
        assert slot_holders(engine) == [first, other]
        assert repair(engine) == 0  # a halt is not a stall: maintenance leaves it alone
    assert state(engine, third) is JobState.PENDING
    # A job inserted now queues behind, halted or not.
    fourth = add_job(engine, Customer(1, "4"), sequence=opts)
    assert state(engine, fourth) is JobState.PENDING

    retried = retry(engine, first if recover == "retry_halted" else second)

    if recover == "retry_halted":
        expected = (
            [first, second, third, fourth] if not continues else [second, first, third, fourth]
        )
        assert retried.state is (JobState.AVAILABLE if not continues else JobState.PENDING)
    else:
        expected = [second, third, fourth]
        assert retried.state is JobState.AVAILABLE
    assert_one_active_per_sequence(engine)
    # The other sequence was never affected, and is worked alongside.
    assert drain(engine) == expected
    final = job_states(engine)
    assert final[other] is JobState.RUNNING  # fetched above, never finished
    skipped = {first} if recover == "retry_later" else set()
    for job_id in (first, second, third, fourth):
        assert final[job_id] is (failed if job_id in skipped else JobState.COMPLETED)


def test_a_halted_sequence_does_not_affect_others(engine: Engine) -> None:
    first = add_job(engine, Customer(1))
    waiting = add_job(engine, Customer(1))
    finish_run(engine, fetch_one(engine), Ending.CANCELLED)

    others = add_jobs(engine, [Customer(2), Customer(3), Customer(2)])
    assert drain(engine) == others
    assert job_states(engine)[waiting] is JobState.PENDING
    assert slot_holders(engine) == [first]


def test_a_retried_retryable_holder_keeps_the_slot(engine: Engine) -> None:
    first, second = add_job(engine, Customer(1)), add_job(engine, Customer(1))
    finish_run(engine, fetch_one(engine), Ending.FAILED)
    assert state(engine, first) is JobState.RETRYABLE

    assert retry(engine, first).state is JobState.AVAILABLE
    assert retry(engine, second).state is JobState.PENDING  # the holder is active: it waits
    assert slot_holders(engine) == [first]
    assert drain(engine) == [first, second]


# ------------------------------------------------------------------ the repair pass


def test_the_repair_pass_restarts_a_sequence_whose_holder_was_deleted(engine: Engine) -> None:
    first, second, third = add_jobs(engine, [Customer(1), Customer(1), Customer(1)])
    sql(engine, "DELETE FROM sa_job WHERE id = :id", id=first)
    assert stalled_sequences(engine) == [[second, third]]

    assert repair(engine) == 1
    assert job_states(engine) == {second: JobState.AVAILABLE, third: JobState.PENDING}
    assert repair(engine) == 0
    assert drain(engine) == [second, third]


def test_the_repair_pass_restarts_many_stalled_sequences_at_once(engine: Engine) -> None:
    ids = add_jobs(engine, [Customer(n % 5) for n in range(15)])
    sql(engine, "DELETE FROM sa_job WHERE sequence_slot")

    assert repair(engine) == 5
    assert stalled_sequences(engine) == []
    assert sorted(drain(engine)) == ids[5:]


def test_run_until_idle_runs_the_repair_pass(engine: Engine) -> None:
    clear_workers_and_leader(engine)
    first, second = add_job(engine, Customer(1)), add_job(engine, Customer(1))
    sql(engine, "DELETE FROM sa_job WHERE id = :id", id=first)
    worker = make_worker(engine)
    done: list[int] = []

    @worker.handler(Customer)
    def work(job: Job) -> None:
        done.append(job.id)

    worker.run_until_idle(timeout=30)
    assert done == [second]


def test_the_repair_pass_restarts_a_sequence_whose_holder_was_completed_by_hand(
    engine: Engine,
) -> None:
    first, second = add_job(engine, Customer(1)), add_job(engine, Customer(1))
    sql(
        engine,
        "UPDATE sa_job SET state = 'completed', finalized_at = now() WHERE id = :id",
        id=first,
    )

    assert repair(engine) == 1
    assert state(engine, second) is JobState.AVAILABLE


# ------------------------------------------------------------------ the cleaner


@pytest.mark.parametrize("how", ["cancel", "discard"])
def test_the_cleaner_keeps_the_job_that_halted_its_sequence(engine: Engine, how: str) -> None:
    done = add_job(engine, Customer(1), max_attempts=1)
    drain(engine)
    halting = add_job(engine, Customer(1), max_attempts=1)
    waiting = add_job(engine, Customer(1))
    _fail(engine, how)
    # A cancelled job that never held the slot goes like any other.
    add_job(engine, Customer(2))
    loose = add_job(engine, Customer(2))
    cancel(engine, loose)
    sql(
        engine,
        "UPDATE sa_job SET finalized_at = now() - interval '30 days'"
        " WHERE finalized_at IS NOT NULL",
    )
    hour = dt.timedelta(hours=1)

    with engine.begin() as connection:
        deleted = Cleaner(Retention(hour, hour, hour)).run_once(connection)

    assert deleted == 2
    remaining = job_states(engine)
    assert done not in remaining and loose not in remaining
    assert remaining[halting] in (JobState.CANCELLED, JobState.DISCARDED)
    assert remaining[waiting] is JobState.PENDING
    assert repair(engine) == 0  # still halted, as before the cleaning
    retry(engine, halting)
    started = drain(engine)
    assert started.index(halting) < started.index(waiting)


# ------------------------------------------------------------------ with unique options

BY_ARGS = UniqueOpts(by_args=True)


def test_a_unique_duplicate_does_not_join_the_sequence(engine: Engine) -> None:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        first = sa_jobs.insert(session, Customer(1, "a"), unique=BY_ARGS)
        again = sa_jobs.insert(session, Customer(1, "a"), unique=BY_ARGS)
        other = sa_jobs.insert(session, Customer(1, "b"), unique=BY_ARGS)

    assert again.unique_skipped_as_duplicate and again.job.id == first.job.id
    assert job_states(engine) == {first.job.id: JobState.AVAILABLE, other.job.id: JobState.PENDING}
    assert drain(engine) == [first.job.id, other.job.id]


def test_a_duplicate_of_a_waiting_job_is_skipped_and_the_order_kept(engine: Engine) -> None:
    ids = add_jobs(engine, [Customer(1, "a"), Customer(1, "b")], unique=BY_ARGS)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        results = sa_jobs.insert_many(session, [Customer(1, "b"), Customer(1, "c")], unique=BY_ARGS)
    assert [r.unique_skipped_as_duplicate for r in results] == [True, False]
    assert results[0].job.id == ids[1]
    assert drain(engine) == [*ids, results[1].job.id]


@pytest.mark.parametrize("path", ["insert_many", "enqueue"])
def test_a_skipped_duplicate_first_in_a_batch_does_not_stall_an_idle_sequence(
    engine: Engine, path: str
) -> None:
    done = add_job(engine, Customer(1, "a"), unique=BY_ARGS)
    assert drain(engine) == [done]  # completed: still blocks duplicates by default

    with Session(engine) as session, session.begin():
        if path == "insert_many":
            results = sa_jobs.insert_many(
                session, [Customer(1, "a"), Customer(1, "b")], unique=BY_ARGS
            )
            skipped, new = (r.unique_skipped_as_duplicate for r in results), results[1].job.id
        else:
            jobs = [sa_jobs.enqueue(Customer(1, n), unique=BY_ARGS) for n in ("a", "b")]
            session.add_all(jobs)
            session.flush()
            skipped, new = (j.unique_skipped_as_duplicate for j in jobs), jobs[1].id
        assert list(skipped) == [True, False]

    assert stalled_sequences(engine) == []
    assert state(engine, new) is JobState.AVAILABLE


NO_RETRYABLE = UniqueOpts(by_args=True, by_state=REQUIRED_UNIQUE_STATES | {JobState.COMPLETED})


def _retryable_holder_with_a_waiting_duplicate(
    engine: Engine, opts: SequenceOpts
) -> tuple[int, int]:
    """A retryable holder out of its unique states, and a duplicate waiting behind it."""
    first = add_job(engine, Customer(1, "a"), unique=NO_RETRYABLE, sequence=opts)
    finish_run(engine, fetch_one(engine), Ending.FAILED, delay=0.0)
    duplicate = add_job(engine, Customer(1, "a"), unique=NO_RETRYABLE, sequence=opts)
    assert duplicate != first
    assert job_states(engine) == {first: JobState.RETRYABLE, duplicate: JobState.PENDING}
    return first, duplicate


def test_a_retryable_holder_discarded_for_a_unique_conflict_halts_its_sequence(
    engine: Engine,
) -> None:
    first, duplicate = _retryable_holder_with_a_waiting_duplicate(
        engine, SequenceOpts(by_args=True)
    )
    run_once(engine, Scheduler())

    assert job_states(engine) == {first: JobState.DISCARDED, duplicate: JobState.PENDING}
    assert slot_holders(engine) == [first]
    # Skipping the discarded job resumes the sequence from the duplicate.
    assert retry(engine, duplicate).state is JobState.AVAILABLE
    with pytest.raises(UniqueConflictError):
        retry(engine, first)


def test_a_retryable_holder_discarded_for_a_unique_conflict_continues_when_told(
    engine: Engine,
) -> None:
    clear_workers_and_leader(engine)
    first, duplicate = _retryable_holder_with_a_waiting_duplicate(
        engine, SequenceOpts(by_args=True, continue_on_discarded=True)
    )
    worker = make_worker(engine)
    done: list[int] = []

    @worker.handler(Customer)
    def work(job: Job) -> None:
        done.append(job.id)

    worker.run_until_idle(timeout=30)  # scheduler, repair pass, fetch: everything it has
    assert job_states(engine) == {first: JobState.DISCARDED, duplicate: JobState.COMPLETED}
    assert done == [duplicate]


def _finisher_against_a_unique_inserter(
    engine: Engine, target: int, finisher: Callable[[], object]
) -> None:
    """Run ``finisher`` (which ends ``target``) while an inserter of the same sequence holds
    the sequence lock and then inserts a unique duplicate of ``target``.

    A finisher that locks the row before the sequence closes a cycle with the inserter
    (sequence lock -> ON CONFLICT waits for the row), and PostgreSQL aborts one of them.
    """
    errors: list[BaseException] = []

    with Session(engine) as inserter:
        sa_jobs.insert(inserter, Customer(1, "x"), unique=BY_ARGS)  # holds the sequence lock

        def finish_it() -> None:
            try:
                finisher()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=finish_it)
        thread.start()
        wait_until(lambda: _waiting_on_advisory_lock(engine), what="the finisher to wait")
        try:
            duplicate = sa_jobs.insert(inserter, Customer(1, "a"), unique=BY_ARGS)
            assert duplicate.unique_skipped_as_duplicate
            inserter.commit()
        except Exception as exc:
            errors.append(exc)
            inserter.rollback()
        thread.join(10)

    assert errors == []


def test_cancel_job_does_not_deadlock_with_a_unique_inserter_of_its_sequence(
    engine: Engine,
) -> None:
    target = add_job(engine, Customer(1, "a"), unique=BY_ARGS)
    _finisher_against_a_unique_inserter(engine, target, lambda: cancel(engine, target))
    assert state(engine, target) is JobState.CANCELLED


def test_the_rescuer_does_not_deadlock_with_a_unique_inserter_of_its_sequence(
    engine: Engine,
) -> None:
    clear_workers_and_leader(engine)
    target = add_job(engine, Customer(1, "a"), unique=BY_ARGS, max_attempts=1)
    orphan(engine)
    _finisher_against_a_unique_inserter(engine, target, lambda: run_once(engine, Rescuer(1.0)))
    assert state(engine, target) is JobState.DISCARDED


def _waiting_on_advisory_lock(engine: Engine) -> bool:
    with engine.connect() as connection:
        return bool(
            connection.scalar(
                text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            )
        )


# ------------------------------------------------------------------ without the sequence branch


def test_migrate_to_sa_jobs_core_head_installs_no_sequence_branch(pg_server: Server) -> None:
    with (
        throwaway_database(pg_server, prefix="sa_jobs_seq_core_target") as url,
        engine_at(url) as engine,
    ):
        sa_jobs.migrate(engine, "sa_jobs_core@head")
        with engine.connect() as connection:
            assert SEQUENCE_BRANCH not in installed_branches(connection)


SEQUENCED_INSERTS: dict[str, Callable[[Session], object]] = {
    "insert": lambda session: sa_jobs.insert(session, Plain(1), sequence=SequenceOpts()),
    "insert_many": lambda session: sa_jobs.insert_many(
        session, [Plain(1), Plain(2)], sequence=SequenceOpts()
    ),
    "enqueue": lambda session: (
        session.add(sa_jobs.enqueue(Plain(1), sequence=SequenceOpts())),
        session.flush(),
    ),
    "kind_default": lambda session: sa_jobs.insert(session, Customer(1)),
    "insert_job": lambda session: session.execute(
        sa_jobs.insert_job(Plain(1), sequence=SequenceOpts())
    ),
}


@pytest.mark.parametrize("path", SEQUENCED_INSERTS)
def test_a_sequenced_insert_without_the_sequence_branch_names_the_branch(
    core_only: Engine, path: str
) -> None:
    with Session(core_only) as session, pytest.raises(SchemaMissingError) as caught:
        SEQUENCED_INSERTS[path](session)
    assert caught.value.branch == SEQUENCE_BRANCH
    assert "sa_jobs_sequence" in str(caught.value)


def test_unsequenced_jobs_still_work_without_the_sequence_branch(core_only: Engine) -> None:
    clear_workers_and_leader(core_only)
    with Session(core_only) as session, session.begin():
        ids = [r.job.id for r in sa_jobs.insert_many(session, [Plain(1), Plain(2)])]
    with Session(core_only) as session, session.begin():
        sa_jobs.cancel_job(session, ids[1])
        sa_jobs.retry_job(session, ids[1])
    worker = make_worker(core_only)
    done: list[int] = []

    @worker.handler(Plain)
    def work(job: Job) -> None:
        done.append(job.id)

    worker.run_until_idle(timeout=30)
    assert sorted(done) == ids


# ------------------------------------------------------------------ concurrency


RACING_PATHS = ["insert", "insert_many", "enqueue"]


def run_at_once(actions: list[Callable[[], Any]]) -> list[Any]:
    """Run each action in a thread of its own, released together by a barrier; their results."""
    barrier = threading.Barrier(len(actions))
    errors: list[BaseException] = []
    results: list[Any] = []
    lock = threading.Lock()

    def run(action: Callable[[], Any]) -> None:
        try:
            barrier.wait(10)
            result = action()
            with lock:
                results.append(result)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(action,)) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    return results


def _insert_in_own_transaction(engine: Engine, path: str, args: object) -> Callable[[], int]:
    return lambda: insert_through(engine, path, args)[0]


@pytest.mark.parametrize("round_", range(3))
def test_inserts_into_an_idle_sequence_from_many_threads_at_once(
    engine: Engine, round_: int
) -> None:
    inserts = [
        _insert_in_own_transaction(engine, RACING_PATHS[i % 3], Customer(round_, f"thread {i}"))
        for i in range(16)
    ]
    ids = sorted(run_at_once(inserts))

    assert len(ids) == 16
    by_state = job_states(engine)
    assert [by_state[i] for i in ids] == [JobState.AVAILABLE] + [JobState.PENDING] * 15
    assert slot_holders(engine) == [ids[0]]
    # Worked with room for 100 at a time, they still come one by one, in id order.
    started: list[int] = []
    while batch := fetch(engine, limit=100):
        assert len(batch) == 1
        started.append(batch[0].id)
        finish_run(engine, batch[0])
    assert started == ids


def test_inserts_racing_the_completion_of_the_holder_never_stall_the_sequence(
    engine: Engine,
) -> None:
    add_job(engine, Customer(1, "seed"))
    for round_ in range(15):
        holder = fetch_one(engine)
        inserts = [
            _insert_in_own_transaction(engine, RACING_PATHS[i % 3], Customer(1, f"{round_}.{i}"))
            for i in range(6)
        ]
        run_at_once([functools.partial(finish_run, engine, holder), *inserts])

        assert stalled_sequences(engine) == [], f"round {round_}"
        assert_one_active_per_sequence(engine)
        assert state(engine, holder.id) is JobState.COMPLETED
    waiting = sorted(i for i, s in job_states(engine).items() if s is not JobState.COMPLETED)
    assert drain(engine) == waiting


def test_many_sequences_worked_by_concurrent_fetchers_keep_order(engine: Engine) -> None:
    ids = add_jobs(engine, [Customer(n % 10, str(n)) for n in range(200)])
    key_of = {job_id: n % 10 for n, job_id in enumerate(ids)}
    started: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def fetcher() -> None:
        try:
            idle_rounds = 0
            while idle_rounds < 20:
                jobs = fetch(engine, limit=3)
                if not jobs:
                    idle_rounds += 1
                    time.sleep(0.005)  # nothing for 20 rounds in a row (0.1 s): all done
                    continue
                idle_rounds = 0
                with lock:
                    started.extend(job.id for job in jobs)
                finish_outcomes(engine, [Outcome.completed(job) for job in jobs])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=fetcher) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(started) == ids
    for key in range(10):
        mine = [job_id for job_id in started if key_of[job_id] == key]
        assert mine == sorted(mine)
