"""``sa-jobs queue pause|resume|list`` and the filtered ``sa-jobs jobs delete|retry|cancel``,
in-process against the test database."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from sa_jobs import Job, JobState
from sa_jobs._table.service_tables import JobQueue, PeriodicState
from sa_jobs.cli.filtered_actions import age
from tests.factories import make_job
from tests.helpers import CliRun

Run = CliRun


def states(engine: Engine) -> dict[int, JobState]:
    with engine.connect() as connection:
        return dict(connection.execute(select(Job.id, Job.state).order_by(Job.id)).all())


def paused(engine: Engine) -> dict[str, bool]:
    with engine.connect() as connection:
        rows = connection.execute(select(JobQueue.name, JobQueue.paused_at.is_not(None)))
        return {name: flag for name, flag in rows}


def test_queue_pause_list_resume(cli: Run, engine: Engine) -> None:
    make_job(engine, queue="mail")
    assert cli("queue", "list")[1] == "no queue has been paused (every queue is active)\n"

    code, out, _ = cli("queue", "pause", "mail")
    assert code == 0 and re.match(r"queue 'mail': paused since \d{4}-.* UTC\n", out)
    assert paused(engine) == {"mail": True}

    code, out, _ = cli("queue", "list")
    assert code == 0
    assert out.splitlines()[0].split() == [
        "queue",
        "state",
        "paused_at",
        "(UTC)",
        "updated_at",
        "(UTC)",
    ]
    assert out.splitlines()[1].split()[:2] == ["mail", "paused"]

    assert cli("queue", "resume", "mail")[1] == "queue 'mail': active\n"
    assert paused(engine) == {"mail": False}


def test_queue_list_and_periodic_list_print_json(cli: Run, engine: Engine) -> None:
    # Like sa-jobs stats and health: --json for scripts.
    make_job(engine, queue="mail")
    assert json.loads(cli("queue", "list", "--json")[1]) == []
    cli("queue", "pause", "mail")
    code, out, _ = cli("queue", "list", "--json")
    assert code == 0
    [mail] = json.loads(out)
    assert mail["name"] == "mail" and mail["paused"] is True
    assert dt.datetime.fromisoformat(mail["paused_at"]).tzinfo is not None

    assert json.loads(cli("periodic", "list", "--json")[1]) == []
    due = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    with Session(engine) as session, session.begin():
        session.add(PeriodicState(name="nightly", schedule="0 3 * * *", next_run_at=due))
    code, out, _ = cli("periodic", "list", "--json")
    assert code == 0
    [nightly] = json.loads(out)
    assert nightly["name"] == "nightly" and nightly["schedule"] == "0 3 * * *"
    assert dt.datetime.fromisoformat(nightly["next_run_at"]) == due
    assert nightly["last_run_at"] is None and nightly["last_job_id"] is None


def test_queue_pause_of_an_unknown_queue_fails_with_one_line_unless_allowed(
    cli: Run, engine: Engine
) -> None:
    code, _, err = cli("queue", "pause", "mial")
    assert code == 1 and err.startswith("sa-jobs: ") and err.count("\n") == 1
    assert "'mial'" in err and paused(engine) == {}
    assert cli("queue", "pause", "mial", "--allow-unknown")[0] == 0
    assert paused(engine) == {"mial": True}


def test_jobs_delete_by_filter_commits_batch_by_batch(cli: Run, engine: Engine) -> None:
    old = [
        make_job(engine, state=JobState.COMPLETED, finalized_at=-dt.timedelta(days=3))
        for _ in range(5)
    ]
    running = make_job(engine, state=JobState.RUNNING)
    kept = make_job(engine, state=JobState.COMPLETED)

    code, out, err = cli(
        "jobs", "delete", "--state", "completed", "--finalized-before", "2d", "--batch-size", "2"
    )

    assert (code, out, err) == (0, "deleted 5 jobs\n", "")
    assert states(engine) == {running: JobState.RUNNING, kept: JobState.COMPLETED}
    assert len(old) == 5


def test_jobs_cancel_and_retry_by_filter(cli: Run, engine: Engine) -> None:
    waiting = [make_job(engine, queue="mail") for _ in range(3)]
    running = make_job(engine, queue="mail", state=JobState.RUNNING)

    code, out, _ = cli("jobs", "cancel", "--queue", "mail")
    assert code == 0
    assert out.startswith("cancelled 4 jobs (1 of them running: cancel requested")

    assert cli("jobs", "retry", "--queue", "mail", "--state", "cancelled")[1] == "retried 3 jobs\n"
    assert states(engine) == {
        **dict.fromkeys(waiting, JobState.AVAILABLE),
        running: JobState.RUNNING,
    }


def test_jobs_delete_without_a_filter_or_with_id_and_filter_is_a_usage_error(
    cli: Run, engine: Engine
) -> None:
    job = make_job(engine, state=JobState.COMPLETED)
    code, _, err = cli("jobs", "delete")
    assert code == 2 and "would match every job" in err
    code, _, err = cli("jobs", "retry", str(job), "--state", "completed")
    assert code == 2 and "not both" in err
    code, _, err = cli("jobs", "delete", "--state", "running")
    assert code == 1 and "cancel them first" in err
    assert states(engine) == {job: JobState.COMPLETED}


def test_ages_on_the_command_line() -> None:
    assert age("7d") == dt.timedelta(days=7)
    assert age("90s") == dt.timedelta(seconds=90)
    assert age("90") == dt.timedelta(seconds=90)  # the same syntax as sa-jobs stats' durations
    assert age("1.5h") == dt.timedelta(minutes=90)
    assert age("2026-01-31T00:00:00+00:00") == dt.datetime(2026, 1, 31, tzinfo=dt.UTC)
    for bad in ("7 days", "2026-01-31T00:00:00", "-3d"):
        with pytest.raises(Exception, match="neither an age"):
            age(bad)
