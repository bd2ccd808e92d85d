"""The two finish statements agree: a batch of plain completions, written with the
arrays of :func:`~sa_jobs._act.complete.completed_statement`, leaves every row exactly as the
general JSON statement (:func:`~sa_jobs._act.complete.finish_statement`) would."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import Engine, select, text, update

from sa_jobs._act.complete import (
    COMPLETED_IDS_PARAM,
    COMPLETED_RUNS_PARAM,
    OUTCOMES_PARAM,
    completed_statement,
    finish_in,
    finish_statement,
    outcomes_json,
)
from sa_jobs._base.records import Ending, Outcome
from sa_jobs._base.states import CANCEL_ATTEMPTED_KEY, JOB_KEY_REPLACED_KEY, JobState
from sa_jobs._table.models import Job
from tests.factories import job_row, make_job
from tests.helpers import (
    is_finish_statement,
    sent_statements,
    sessions_waiting_for_a_lock,
    wait_until,
)

#: name -> (make_job options, the run the outcome names); every situation a finish
#: statement tells apart.
SITUATIONS: dict[str, tuple[dict[str, Any], int]] = {
    "plain": ({}, 0),
    "cancel requested": ({"metadata": {CANCEL_ATTEMPTED_KEY: "2026-01-01T00:00:00Z"}}, 0),
    "job key taken by a new add": ({"metadata": {JOB_KEY_REPLACED_KEY: "x"}}, 0),
    "no attempts left": ({"attempt": 3, "max_attempts": 3}, 0),
    "another run": ({}, 7),
    "not running any more": ({"state": JobState.AVAILABLE}, 0),
}
#: Columns the two statements may set to different instants.
INSTANTS = ("finalized_at", "scheduled_at")


def _twins(engine: Engine, situation: str, n: int) -> int:
    options, _ = SITUATIONS[situation]
    job_id = make_job(engine, **{"state": JobState.RUNNING, **options})
    with engine.begin() as connection:  # a job key for the statements to release
        connection.execute(update(Job).where(Job.id == job_id).values(job_key=f"k-{n}"))
    return job_id


def _comparable(row: Any) -> dict[str, Any]:
    values = dict(row._mapping)
    for name in ("id", "created_at", "attempted_at", "job_key", *INSTANTS):
        values.pop(name)
    return values


@pytest.mark.parametrize("sequence", [False, True])
def test_completed_batches_end_as_the_general_statement_ends_them(
    engine: Engine, sequence: bool
) -> None:
    general = {name: _twins(engine, name, 2 * i) for i, name in enumerate(SITUATIONS)}
    arrays = {name: _twins(engine, name, 2 * i + 1) for i, name in enumerate(SITUATIONS)}

    def outcomes(ids: dict[str, int]) -> list[Outcome]:
        return [Outcome(ids[name], run, Ending.COMPLETED) for name, (_, run) in SITUATIONS.items()]

    with engine.begin() as connection:
        by_json = connection.execute(
            finish_statement(sequence=sequence, job_key=True),
            {OUTCOMES_PARAM: outcomes_json(outcomes(general))},
        ).all()
        done = outcomes(arrays)
        by_arrays = connection.execute(
            completed_statement(sequence=sequence, job_key=True),
            {
                COMPLETED_IDS_PARAM: [o.job_id for o in done],
                COMPLETED_RUNS_PARAM: [o.run for o in done],
            },
        ).all()

    names = {job_id: name for name, job_id in general.items()}
    names.update({job_id: name for name, job_id in arrays.items()})
    assert sorted((names[i], s) for i, s in by_json) == sorted((names[i], s) for i, s in by_arrays)
    assert {names[i] for i, _ in by_arrays} == {
        "plain",
        "cancel requested",
        "job key taken by a new add",
        "no attempts left",
    }
    for name in SITUATIONS:
        one, other = job_row(engine, general[name]), job_row(engine, arrays[name])
        assert _comparable(one) == _comparable(other), name
        assert (one.job_key is None) == (other.job_key is None), name
        for instant in INSTANTS:
            assert (getattr(one, instant) is None) == (getattr(other, instant) is None), name


def test_a_batch_of_completions_is_sent_as_arrays_and_any_other_as_json(engine: Engine) -> None:
    done = [make_job(engine, state=JobState.RUNNING) for _ in range(3)]
    failed = make_job(engine, state=JobState.RUNNING)
    with sent_statements(engine) as sent, engine.begin() as connection:
        finish_in(connection, [Outcome(job_id, 0, Ending.COMPLETED) for job_id in done[:2]])
        finish_in(
            connection,
            [
                Outcome(done[2], 0, Ending.COMPLETED),
                Outcome(failed, 0, Ending.FAILED, delay=1.0, error={"error": "boom"}),
            ],
        )
    finishes = [(sql, params) for sql, params in sent if is_finish_statement(sql)]
    assert len(finishes) == 2
    assert COMPLETED_IDS_PARAM in finishes[0][1] and OUTCOMES_PARAM not in finishes[0][1]
    assert OUTCOMES_PARAM in finishes[1][1]
    states = [job_row(engine, job_id).state for job_id in [*done, failed]]
    assert states == [JobState.COMPLETED] * 3 + [JobState.RETRYABLE]


@pytest.mark.parametrize("ending", [Ending.COMPLETED, Ending.FAILED])
def test_a_batch_locks_its_rows_in_id_order_so_a_bulk_action_cannot_deadlock_it(
    engine: Engine, ending: Ending
) -> None:
    # A bulk action (cancel_jobs, delete_jobs, ...) locks its rows in id order. A batch
    # written in completion order locked the later job first, then waited for the earlier
    # one the action held while the action waited for the later one: found as a deadlock
    # by the bulk-action race tests on PostgreSQL 18.
    first = make_job(engine, state=JobState.RUNNING)
    second = make_job(engine, state=JobState.RUNNING)
    with engine.begin() as connection:
        # Enough rows for the plan a real table gets (a nested loop over the outcomes, a
        # primary key lookup each); over a few rows a hash join locks in physical order.
        connection.execute(
            text(
                "INSERT INTO sa_job (kind, args, queue, state, finalized_at)"
                " SELECT 'filler', '{}', 'filler', 'completed', now()"
                " FROM generate_series(1, 5000)"
            )
        )
        connection.execute(text("ANALYZE sa_job"))
    delay = 60.0 if ending is Ending.FAILED else None
    batch = [Outcome(second, 0, ending, delay=delay), Outcome(first, 0, ending, delay=delay)]
    failures: list[BaseException] = []

    def write() -> None:
        try:
            with engine.begin() as connection:
                finish_in(connection, batch)
        except BaseException as exc:
            failures.append(exc)

    writer = threading.Thread(target=write)
    with engine.connect() as action:
        action.execute(select(Job.id).where(Job.id == first).with_for_update())
        writer.start()
        wait_until(lambda: sessions_waiting_for_a_lock(engine) == 1, timeout=10, what="the writer")
        # The action moves on to the second row: the writer must not be holding it.
        action.execute(text("SET LOCAL lock_timeout = '5s'"))
        action.execute(select(Job.id).where(Job.id == second).with_for_update())
        action.commit()
    writer.join(timeout=10)
    assert failures == []
    with engine.connect() as connection:
        states = set(connection.scalars(select(Job.state).where(Job.id.in_([first, second]))))
    assert states == {JobState.COMPLETED if ending is Ending.COMPLETED else JobState.RETRYABLE}
