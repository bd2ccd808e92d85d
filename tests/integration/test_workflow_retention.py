"""Retention of workflows: the cleaner deletes a finished workflow's steps, their edges and
(once no step is left) the workflow row with its callbacks still pending, in its bounded
batches; an unfinished workflow keeps its finished steps (their outputs), edges and row.
``delete_jobs`` leaves no orphan either."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs.errors import JobCancel
from sa_jobs.worker.maintenance.cleaner import Cleaner, Retention
from tests.helpers import job_states, make_worker


@sa_jobs.job_args(kind="wfret_step", output=int)
class Step:
    n: int = 0
    fail: bool = False


@sa_jobs.job_args(kind="wfret_done")
class Done:
    what: str = ""


def _handle(job: Job[Step]) -> int:
    if job.args.fail:
        raise JobCancel("failed on purpose")
    return job.args.n


def _finished_ok() -> sa_jobs.Workflow:
    wf = sa_jobs.Workflow("ok", on_success=Done("s"), on_complete=Done("c"))
    a = wf.add(Step(1), name="a")
    b = wf.add(Step(2), name="b", after=[a])
    c = wf.add(Step(3), name="c", after=[a])
    wf.add(Step(4), name="d", after=[b, c])
    return wf


def _finished_failed() -> sa_jobs.Workflow:
    # b fails: d is cancelled by the cascade, on_success stays pending for ever.
    wf = sa_jobs.Workflow("failed", on_success=Done("s"), on_failure=Done("f"))
    a = wf.add(Step(1), name="a")
    b = wf.add(Step(2, fail=True), name="b", after=[a])
    wf.add(Step(4), name="d", after=[a, b])
    return wf


def _unfinished() -> sa_jobs.Workflow:
    # a completes; b waits for its time (an hour): the workflow is unfinished.
    wf = sa_jobs.Workflow("unfinished", on_complete=Done("c"))
    a = wf.add(Step(1), name="a")
    wf.add(Step(2), name="later", after=[a], scheduled_at=_in_an_hour())
    return wf


def _in_an_hour() -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)


def _orphans(connection: Connection) -> dict[str, int]:
    return {
        "edges": connection.scalar(
            text(
                "SELECT count(*) FROM sa_job_dep d WHERE NOT EXISTS "
                "(SELECT 1 FROM sa_job j WHERE j.id = d.depends_on_id) OR NOT EXISTS "
                "(SELECT 1 FROM sa_job j WHERE j.id = d.job_id)"
            )
        ),
        "empty finished workflows": connection.scalar(
            text(
                "SELECT count(*) FROM sa_job_workflow w WHERE w.unfinished = 0 AND NOT EXISTS "
                "(SELECT 1 FROM sa_job j WHERE j.workflow_id = w.id)"
            )
        ),
        "pending callbacks of no workflow": connection.scalar(
            text(
                "SELECT count(*) FROM sa_job j WHERE j.state = 'pending' "
                "AND j.metadata ? 'workflow_callback' AND NOT EXISTS (SELECT 1 "
                "FROM sa_job_workflow w "
                "WHERE w.id = (j.metadata->'workflow_callback'->>'workflow_id')::bigint)"
            )
        ),
    }


def _age_finished_jobs(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE sa_job SET finalized_at = now() - interval '30 days' "
                "WHERE finalized_at IS NOT NULL"
            )
        )


def test_the_cleaner_deletes_finished_workflows_whole_and_keeps_unfinished_ones(
    engine: Engine,
) -> None:
    with Session(engine) as session, session.begin():
        sa_jobs.insert_workflow(session, _finished_ok())
        failed = sa_jobs.insert_workflow(session, _finished_failed())
        unfinished = sa_jobs.insert_workflow(session, _unfinished())
        plain = sa_jobs.insert(session, Done("plain")).job.id
    worker = make_worker(engine)
    worker.handler(Step)(_handle)
    worker.handler(Done)(lambda job: None)
    worker.run_until_idle()
    states = job_states(engine)
    assert states[failed.callbacks["on_success"]] is JobState.PENDING
    assert states[unfinished["a"]] is JobState.COMPLETED
    assert states[unfinished["later"]] is JobState.SCHEDULED
    _age_finished_jobs(engine)

    # Small batches: every pass is bounded, and the passes together leave no orphan.
    cleaner = Cleaner(Retention(), limit=3)
    passes = []
    while True:
        with engine.begin() as connection:
            passes.append(cleaner.run_once(connection))
        if passes[-1] == 0:
            break
    assert max(passes) <= 3 * 3 and len(passes) > 2

    with engine.connect() as connection:
        assert _orphans(connection) == {
            "edges": 0,
            "empty finished workflows": 0,
            "pending callbacks of no workflow": 0,
        }
        workflows = set(connection.scalars(text("SELECT id FROM sa_job_workflow")))
        edges = connection.execute(text("SELECT depends_on_id, job_id FROM sa_job_dep")).all()
    # The finished workflows went whole (steps, callbacks, edges, rows); the unfinished
    # one kept its completed step (a later step reads its output), its edge and its row.
    assert workflows == {unfinished.id}
    assert [tuple(edge) for edge in edges] == [(unfinished["a"], unfinished["later"])]
    assert set(job_states(engine)) == {
        unfinished["a"],
        unfinished["later"],
        *unfinished.callbacks.values(),
    }
    assert plain not in job_states(engine)

    # Once it finishes, it goes like the others.
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE sa_job SET scheduled_at = now(), state = 'available' WHERE id = :id"),
            {"id": unfinished["later"]},
        )
    worker.run_until_idle()
    _age_finished_jobs(engine)
    with engine.begin() as connection:
        # (The worker's own maintenance may have taken the first step already.)
        while cleaner.run_once(connection):
            pass
        assert connection.scalar(text("SELECT count(*) FROM sa_job_workflow")) == 0
        assert connection.scalar(text("SELECT count(*) FROM sa_job_dep")) == 0
    assert job_states(engine) == {}


def test_delete_jobs_leaves_no_orphan_edges_or_workflows(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        done = sa_jobs.insert_workflow(session, _finished_failed())
        waiting = sa_jobs.insert_workflow(session, _finished_ok())
    worker = make_worker(engine)
    worker.handler(Step)(_handle)
    worker.handler(Done)(lambda job: None)
    with Session(engine) as session, session.begin():
        # Work only the first workflow: take the second's first step out of reach.
        session.execute(
            text(
                "UPDATE sa_job SET state = 'scheduled', scheduled_at = now() + interval '1 hour' "
                "WHERE id = :id"
            ),
            {"id": waiting["a"]},
        )
    worker.run_until_idle()
    with Session(engine) as session, session.begin():
        sa_jobs.delete_jobs(
            session, kind="wfret_step", state=[JobState.COMPLETED, JobState.CANCELLED]
        )
        # An unfinished workflow's waiting steps deleted: it finishes (as cancelled) and,
        # with no step left, goes too.
        sa_jobs.delete_jobs(session, kind="wfret_step")
    with engine.connect() as connection:
        assert _orphans(connection) == {
            "edges": 0,
            "empty finished workflows": 0,
            "pending callbacks of no workflow": 0,
        }
        assert connection.scalar(text("SELECT count(*) FROM sa_job_workflow")) == 0
        assert connection.scalar(text("SELECT count(*) FROM sa_job_dep")) == 0
    assert done.id != waiting.id
