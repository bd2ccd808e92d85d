"""``sa-jobs``: the jobs commands in-process against the test database, ``work`` as a
subprocess that is stopped with SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import Job, JobState
from sa_jobs.cli import main
from sa_jobs.devdb import Server, throwaway_database
from tests.factories import job_row, make_job
from tests.helpers import CliRun, url_text, wait_for_state

HERE = Path(__file__).parent

Run = CliRun


def table_rows(out: str) -> list[list[str]]:
    """The cells of ``jobs list`` output (columns are two or more spaces apart)."""
    lines = out.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == [
        "id",
        "kind",
        "queue",
        "state",
        "attempt",
        "scheduled_at (UTC)",
        "last error",
    ]
    return [re.split(r"\s{2,}", line) for line in lines[1:] if not line.startswith("(")]


def assert_one_line_error(err: str, *fragments: str) -> None:
    assert err.startswith("sa-jobs: ")
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


# ---------------------------------------------------------------------- jobs list


def test_list_without_jobs_says_so(cli: Run) -> None:
    assert cli("jobs", "list") == (0, "no jobs\n", "")


def test_list_shows_newest_first_with_attempts_and_the_first_line_of_the_last_error(
    cli: Run, engine: Engine
) -> None:
    first = make_job(engine, kind="alpha", queue="q1")
    errors = [
        {"attempt": 1, "error": "ValueError: an older error"},
        {"attempt": 2, "error": "KeyError: 'x'\nand a second line that is not shown"},
    ]
    second = make_job(
        engine, kind="beta", state=JobState.RETRYABLE, attempt=2, max_attempts=5, errors=errors
    )
    long_error = [{"attempt": 1, "error": "RuntimeError: " + "x" * 200}]
    third = make_job(
        engine, kind="alpha", queue="q2", state=JobState.DISCARDED, attempt=1, errors=long_error
    )

    code, out, err = cli("jobs", "list")

    assert (code, err) == (0, "")
    rows = table_rows(out)
    assert [row[:5] for row in rows] == [
        [str(third), "alpha", "q2", "discarded", "1/25"],
        [str(second), "beta", "default", "retryable", "2/5"],
        [str(first), "alpha", "q1", "available", "0/25"],
    ]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\+00:00", rows[0][5])
    assert rows[0][6] == "RuntimeError: " + "x" * 43 + "..."
    assert rows[1][6] == "KeyError: 'x'"
    assert len(rows[2]) == 6  # no error: the trailing blank cell is trimmed


def test_list_filters_by_state_queue_and_kind_and_stops_at_the_limit(
    cli: Run, engine: Engine
) -> None:
    a = make_job(engine, kind="alpha", queue="q1")
    b = make_job(engine, kind="beta", queue="q1", state=JobState.RETRYABLE, attempt=1)
    c = make_job(engine, kind="alpha", queue="q2", state=JobState.COMPLETED, attempt=1)

    def ids(*argv: str) -> list[int]:
        code, out, err = cli("jobs", "list", *argv)
        assert (code, err) == (0, "")
        return [int(row[0]) for row in table_rows(out)]

    assert ids("--state", "available", "--state", "retryable") == [b, a]
    assert ids("--queue", "q2") == [c]
    assert ids("--kind", "alpha") == [c, a]
    assert ids("--kind", "alpha", "--queue", "q1") == [a]
    assert cli("jobs", "list", "--state", "cancelled") == (0, "no jobs\n", "")

    _, out, _ = cli("jobs", "list", "--limit", "2")
    assert [int(row[0]) for row in table_rows(out)] == [c, b]
    assert out.splitlines()[-1] == "(more jobs match; showing the newest 2, see --limit)"
    _, out, _ = cli("jobs", "list", "--limit", "3")
    assert "more jobs match" not in out


def test_list_rejects_an_unknown_state(cli: Run) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli("jobs", "list", "--state", "sleeping")
    assert exit_info.value.code == 2


# ---------------------------------------------------------------------- jobs show


def test_show_prints_every_column_the_args_as_json_and_errors_with_traces(
    cli: Run, engine: Engine
) -> None:
    trace = 'Traceback (most recent call last):\n  File "app.py", line 3\nRuntimeError: boom\n'
    job_id = make_job(
        engine,
        kind="alpha",
        args={"b": [1, 2], "a": "x"},
        state=JobState.RETRYABLE,
        attempt=1,
        attempted_by=["host-1"],
        metadata={"note": "hi"},
        errors=[
            {"attempt": 1, "error": "RuntimeError: boom", "trace": trace, "at": "2030-01-01"},
            {"attempt": 2, "error": "JobTimeoutError: job 1 timed out"},
        ],
    )

    code, out, err = cli("jobs", "show", str(job_id))

    assert (code, err) == (0, "")
    lines = out.splitlines()
    labels = {line.split()[0] for line in lines if line and not line.startswith(" ")}
    for column in Job.__table__.columns:
        assert column.name in labels or f"{column.name}:" in labels, column.name
    assert re.search(rf"^id +{job_id}$", out, re.M)
    assert re.search(r"^state +retryable$", out, re.M)
    assert re.search(r"^attempted_by +host-1$", out, re.M)
    assert re.search(r"^finalized_at +-$", out, re.M)
    assert re.search(r"^tags +-$", out, re.M)
    assert 'args:\n  {\n    "a": "x",\n    "b": [\n      1,\n      2\n    ]\n  }\n' in out
    assert 'metadata:\n  {\n    "note": "hi"\n  }\n' in out
    assert out.endswith(
        "errors (2):\n"
        "  attempt 1 at 2030-01-01: RuntimeError: boom\n"
        "    Traceback (most recent call last):\n"
        '      File "app.py", line 3\n'
        "    RuntimeError: boom\n"
        "  attempt 2: JobTimeoutError: job 1 timed out\n"
    )


def test_show_a_job_without_errors(cli: Run, engine: Engine) -> None:
    job_id = make_job(engine)
    code, out, _ = cli("jobs", "show", str(job_id))
    assert code == 0
    assert out.endswith("errors: none\n")


def test_show_an_unknown_job_fails_with_one_line(cli: Run) -> None:
    code, out, err = cli("jobs", "show", "999")
    assert (code, out) == (1, "")
    assert_one_line_error(err, "no job with id 999")


# ---------------------------------------------------------------------- jobs retry


def test_retry_revives_a_discarded_job_with_one_more_attempt(cli: Run, engine: Engine) -> None:
    job_id = make_job(engine, state=JobState.DISCARDED, attempt=3, max_attempts=3)

    assert cli("jobs", "retry", str(job_id)) == (0, f"job {job_id}: available (attempt 3/4)\n", "")

    row = job_row(engine, job_id)
    assert (row.state, row.finalized_at, row.max_attempts) == (JobState.AVAILABLE, None, 4)


def test_retry_of_a_running_job_fails_with_one_line_and_changes_nothing(
    cli: Run, engine: Engine
) -> None:
    job_id = make_job(engine, state=JobState.RUNNING, attempt=1)

    code, out, err = cli("jobs", "retry", str(job_id))

    assert (code, out) == (1, "")
    assert_one_line_error(err, f"cannot retry job {job_id}", "running")
    assert job_row(engine, job_id).state is JobState.RUNNING


def test_retry_of_an_unknown_job_fails_with_one_line(cli: Run) -> None:
    code, out, err = cli("jobs", "retry", "12345")
    assert (code, out) == (1, "")
    assert_one_line_error(err, "no job with id 12345")


# ---------------------------------------------------------------------- jobs cancel


def test_cancel_of_a_waiting_job_cancels_it(cli: Run, engine: Engine) -> None:
    job_id = make_job(engine, state=JobState.RETRYABLE, attempt=1)

    assert cli("jobs", "cancel", str(job_id)) == (0, f"job {job_id}: cancelled\n", "")
    assert job_row(engine, job_id).state is JobState.CANCELLED


def test_cancel_of_a_running_job_asks_its_worker(cli: Run, engine: Engine) -> None:
    job_id = make_job(engine, state=JobState.RUNNING, attempt=1)

    code, out, err = cli("jobs", "cancel", str(job_id))

    assert (code, err) == (0, "")
    assert out == f"job {job_id}: running (cancel requested: its worker will interrupt it)\n"
    assert "cancel_attempted_at" in job_row(engine, job_id).metadata


def test_cancel_of_a_finished_job_leaves_it_alone(cli: Run, engine: Engine) -> None:
    job_id = make_job(engine, state=JobState.COMPLETED, attempt=1)

    code, out, _ = cli("jobs", "cancel", str(job_id))

    assert (code, out) == (0, f"job {job_id}: completed (already finished: nothing to cancel)\n")
    assert job_row(engine, job_id).state is JobState.COMPLETED


def test_cancel_of_an_unknown_job_fails_with_one_line(cli: Run) -> None:
    code, out, err = cli("jobs", "cancel", "4242")
    assert (code, out) == (1, "")
    assert_one_line_error(err, "no job with id 4242")


# ---------------------------------------------------------------------- finding the database


def test_the_url_comes_from_the_environment_without_url(
    database_url: URL,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job_id = make_job(engine)
    monkeypatch.delenv("SA_JOBS_DATABASE_URL", raising=False)
    monkeypatch.setenv("DATABASE_URL", url_text(database_url))

    assert main(["jobs", "list"]) == 0
    assert table_rows(capsys.readouterr().out)[0][0] == str(job_id)


def test_no_database_configured_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for variable in ("SA_JOBS_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(variable, raising=False)

    assert main(["jobs", "list"]) == 1
    assert_one_line_error(capsys.readouterr().err, "pass --url or set SA_JOBS_DATABASE_URL")


def test_an_unreachable_database_fails_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "list", "--url", "postgresql://postgres@127.0.0.1:1/nowhere"]) == 1
    assert_one_line_error(capsys.readouterr().err, "cannot reach the database")


def test_a_database_without_the_schema_says_to_migrate(
    pg_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    with throwaway_database(pg_server, prefix="sa_jobs_test_empty") as url:
        code = main(["jobs", "show", "1", "--url", url_text(url)])
    assert code == 1
    assert_one_line_error(capsys.readouterr().err, "sa-jobs migrate")


@pytest.mark.parametrize(
    "url",
    ["postgres://::not-a-port", "not a url at all", "postgresql+nodriver://x@localhost/db"],
    ids=["bad-port", "garbage", "unknown-driver"],
)
def test_a_url_that_cannot_be_used_fails_with_one_line_without_echoing_it(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["jobs", "list", "--url", url]) == 1
    err = capsys.readouterr().err
    assert_one_line_error(err)
    assert "URL" in err


@pytest.mark.parametrize("job_id", ["99999999999999999999999", "0", "-3", "seven"])
def test_a_job_id_out_of_range_fails_with_one_line(
    job_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["jobs", "show", job_id, "--url", "postgresql://nobody@127.0.0.1:1/x"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "is not a job id" in err


def test_an_unknown_revision_fails_with_one_line(
    pg_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    with throwaway_database(pg_server, prefix="sa_jobs_test_cli") as url:
        code = main(["migrate", "--target", "no_such_rev", "--url", url_text(url)])
    assert code == 1
    assert_one_line_error(capsys.readouterr().err, "no_such_rev")


def test_migrate_over_a_schema_installed_by_another_alembic_env_fails_with_one_line(
    pg_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    with throwaway_database(pg_server, prefix="sa_jobs_test_cli") as url:
        engine = create_engine(url)
        sa_jobs.migrate(engine)
        with engine.begin() as connection:
            connection.execute(text("DROP TABLE sa_jobs_alembic_version"))
        engine.dispose()
        code = main(["migrate", "--url", url_text(url)])
    assert code == 1
    assert_one_line_error(capsys.readouterr().err, "another Alembic environment")


# ---------------------------------------------------------------------- work


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon", "'no_colon' is not MODULE:ATTRIBUTE"),
        ("no_such_module_anywhere:worker", "cannot import module 'no_such_module_anywhere'"),
        ("tests.integration.cli_worker_app:missing", "has no attribute 'missing'"),
        ("tests.integration.cli_worker_app:not_a_worker", "is an int, not a sa_jobs.Worker"),
    ],
)
def test_work_explains_a_target_it_cannot_use(
    target: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["work", target]) == 1
    assert_one_line_error(capsys.readouterr().err, message)


@pytest.mark.slow
def test_work_runs_jobs_until_sigterm_and_lets_the_running_one_finish(
    database_url: URL, engine: Engine, tmp_path: Path
) -> None:
    from tests.integration.cli_worker_app import Linger, Touch

    with Session(engine) as session, session.begin():
        touch_id = sa_jobs.insert(session, Touch(label="first")).job.id
    env = {
        **os.environ,
        "SA_JOBS_DATABASE_URL": url_text(database_url),
        "PYTHONUNBUFFERED": "1",
    }
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    # -P: no implicit current directory on sys.path, so `sa-jobs work` must add it itself.
    command = [sys.executable, "-P", "-m", "sa_jobs.cli", "work", "cli_worker_app:make_worker"]
    with out_path.open("w") as out, err_path.open("w") as err:
        process = subprocess.Popen(command, cwd=HERE, env=env, stdout=out, stderr=err)
    try:
        wait_for_state(engine, touch_id, JobState.COMPLETED, timeout=20)
        with Session(engine) as session, session.begin():
            linger_id = sa_jobs.insert(session, Linger(seconds=1.0)).job.id
        wait_for_state(engine, linger_id, JobState.RUNNING, timeout=20)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    stderr = err_path.read_text()
    assert code == 0, stderr
    assert job_row(engine, linger_id).state is JobState.COMPLETED
    assert out_path.read_text() == "touched first\nlingered 1.0 s\n"
    log_line = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO +sa_jobs\.worker: "
    assert re.search(log_line + r"worker \S+ started", stderr, re.M), stderr
    assert re.search(log_line + r"SIGTERM: finishing running jobs", stderr, re.M), stderr
    assert re.search(log_line + r"worker \S+ stopped", stderr, re.M), stderr
    assert "Traceback" not in stderr
