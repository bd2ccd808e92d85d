"""``sa-jobs migrate``: what it applied, ``--status`` per branch, ``--sql`` without a
database, and ``$SA_JOBS_MIGRATE_TARGET``."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import psycopg
import pytest
from sqlalchemy import URL, create_engine, inspect, text

import sa_jobs
from sa_jobs._table.schema import BRANCHES
from sa_jobs.cli import main
from sa_jobs.devdb import Server, throwaway_database
from tests.helpers import libpq_url, url_text

NOWHERE = "postgresql://nobody@127.0.0.1:1/nowhere"
ALL_REVISIONS = [
    "sajobs_core_0001",
    "sajobs_core_0002",
    "sajobs_core_0003",
    "sajobs_core_0004",
    "sajobs_core_0005",
    "sajobs_core_0006",
    "sajobs_unique_0001",
    "sajobs_unique_0002",
    "sajobs_sequence_0001",
    "sajobs_job_key_0001",
    "sajobs_job_key_0002",
    "sajobs_periodic_0001",
    "sajobs_periodic_0002",
    "sajobs_queue_0001",
    "sajobs_limits_0001",
    "sajobs_workflow_0001",
    "sajobs_workflow_0002",
    "sajobs_output_0001",
    "sajobs_fairness_0001",
    "sajobs_refs_0001",
]

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def blank_url(pg_server: Server) -> Iterator[URL]:
    with throwaway_database(pg_server, prefix="sa_jobs_test_cli_migrate") as url:
        yield url


@pytest.fixture
def cli(blank_url: URL, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """``cli("migrate", "--status")`` on a database of its own, in-process."""
    monkeypatch.delenv("SA_JOBS_MIGRATE_TARGET", raising=False)
    url = url_text(blank_url)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main([*argv, "--url", url])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def tables(url: URL) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def status_rows(out: str) -> dict[str, tuple[str, str]]:
    lines = out.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["branch", "installed", "pending"]
    rows = {}
    for line in lines[1 : 1 + len(BRANCHES)]:
        branch, installed, pending = re.split(r"\s{2,}", line)
        rows[branch] = (installed, pending)
    return rows


# ---------------------------------------------------------------------- what migrate applied


def test_migrate_lists_what_it_applied_then_says_already_up_to_date(cli: Run) -> None:
    code, out, err = cli("migrate")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert [line.split()[1] for line in lines[:-1]] == ALL_REVISIONS
    assert all(line.startswith("applied ") for line in lines[:-1])
    assert lines[0].startswith("applied sajobs_core_0001 - sa_jobs core: the job table")
    assert lines[-1] == "sa_jobs schema upgraded to heads"

    assert cli("migrate") == (
        0,
        "sa_jobs schema already up to date (heads): nothing to apply\n",
        "",
    )


def test_migrate_one_branch_then_the_rest_applies_only_whats_missing(cli: Run) -> None:
    _, out, _ = cli("migrate", "--target", "sa_jobs_unique@head")
    applied = [line.split()[1] for line in out.splitlines()[:-1]]
    # The unique branch stands on the core's first revision only.
    assert applied == ["sajobs_core_0001", "sajobs_unique_0001", "sajobs_unique_0002"]

    _, out, _ = cli("migrate")
    applied = [line.split()[1] for line in out.splitlines()[:-1]]
    assert applied == [
        *ALL_REVISIONS[1:6],
        "sajobs_sequence_0001",
        "sajobs_job_key_0001",
        "sajobs_job_key_0002",
        "sajobs_periodic_0001",
        "sajobs_periodic_0002",
        "sajobs_queue_0001",
        "sajobs_limits_0001",
        "sajobs_workflow_0001",
        "sajobs_workflow_0002",
        "sajobs_output_0001",
        "sajobs_fairness_0001",
        "sajobs_refs_0001",
    ]


def test_downgrade_lists_what_it_removed(cli: Run, blank_url: URL) -> None:
    cli("migrate")

    code, out, _ = cli("migrate", "--downgrade", "sa_jobs_job_key@base")

    assert code == 0
    assert out.splitlines() == [
        "removed sajobs_job_key_0002 - sa_jobs job_key: a keyed job counts its replacements "
        "(Graphile's ``revision``).",
        "removed sajobs_job_key_0001 - sa_jobs job_key: Graphile Worker's job keys.",
        "sa_jobs schema downgraded to sa_jobs_job_key@base",
    ]
    code, out, _ = cli("migrate", "--downgrade", "base")
    assert code == 0
    assert out.splitlines()[-1] == "sa_jobs schema downgraded to base"
    assert "sa_job" not in tables(blank_url)


def test_the_target_comes_from_the_environment_unless_given(
    cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SA_JOBS_MIGRATE_TARGET", "sa_jobs_core@head")

    _, out, _ = cli("migrate")
    assert out.splitlines()[-1] == "sa_jobs schema upgraded to sa_jobs_core@head"
    _, out, _ = cli("migrate", "--target", "sa_jobs_sequence@head")
    assert out.splitlines() == [
        "applied sajobs_sequence_0001 - sa_jobs sequence: sequence key and slot columns, the "
        "slot index, the pending index.",
        "sa_jobs schema upgraded to sa_jobs_sequence@head",
    ]


# ---------------------------------------------------------------------- --status


def test_status_shows_each_branch_installed_and_pending(cli: Run) -> None:
    code, out, err = cli("migrate", "--status")
    assert (code, err) == (0, "")
    assert status_rows(out) == {
        "sa_jobs_core": ("-", ", ".join(ALL_REVISIONS[:6])),
        "sa_jobs_unique": ("-", "sajobs_unique_0001, sajobs_unique_0002"),
        "sa_jobs_sequence": ("-", "sajobs_sequence_0001"),
        "sa_jobs_job_key": ("-", "sajobs_job_key_0001, sajobs_job_key_0002"),
        "sa_jobs_periodic": ("-", "sajobs_periodic_0001, sajobs_periodic_0002"),
        "sa_jobs_queue": ("-", "sajobs_queue_0001"),
        "sa_jobs_limits": ("-", "sajobs_limits_0001"),
        "sa_jobs_output": ("-", "sajobs_output_0001"),
        "sa_jobs_workflow": ("-", "sajobs_workflow_0001, sajobs_workflow_0002"),
        "sa_jobs_fairness": ("-", "sajobs_fairness_0001"),
        "sa_jobs_refs": ("-", "sajobs_refs_0001"),
    }
    assert out.splitlines()[-1] == "20 revisions pending: run sa-jobs migrate"

    cli("migrate", "--target", "sajobs_core_0002")
    cli("migrate", "--target", "sajobs_unique_0001")
    _, out, _ = cli("migrate", "--status")
    assert status_rows(out) == {
        "sa_jobs_core": (
            "sajobs_core_0002",
            "sajobs_core_0003, sajobs_core_0004, sajobs_core_0005, sajobs_core_0006",
        ),
        "sa_jobs_unique": ("sajobs_unique_0001", "sajobs_unique_0002"),
        "sa_jobs_sequence": ("-", "sajobs_sequence_0001"),
        "sa_jobs_job_key": ("-", "sajobs_job_key_0001, sajobs_job_key_0002"),
        "sa_jobs_periodic": ("-", "sajobs_periodic_0001, sajobs_periodic_0002"),
        "sa_jobs_queue": ("-", "sajobs_queue_0001"),
        "sa_jobs_limits": ("-", "sajobs_limits_0001"),
        "sa_jobs_output": ("-", "sajobs_output_0001"),
        "sa_jobs_workflow": ("-", "sajobs_workflow_0001, sajobs_workflow_0002"),
        "sa_jobs_fairness": ("-", "sajobs_fairness_0001"),
        "sa_jobs_refs": ("-", "sajobs_refs_0001"),
    }
    assert out.splitlines()[-1] == "17 revisions pending: run sa-jobs migrate"

    cli("migrate")
    _, out, _ = cli("migrate", "--status")
    assert status_rows(out) == {
        "sa_jobs_core": ("sajobs_core_0006", "-"),
        "sa_jobs_unique": ("sajobs_unique_0002", "-"),
        "sa_jobs_sequence": ("sajobs_sequence_0001", "-"),
        "sa_jobs_job_key": ("sajobs_job_key_0002", "-"),
        "sa_jobs_periodic": ("sajobs_periodic_0002", "-"),
        "sa_jobs_queue": ("sajobs_queue_0001", "-"),
        "sa_jobs_limits": ("sajobs_limits_0001", "-"),
        "sa_jobs_output": ("sajobs_output_0001", "-"),
        "sa_jobs_workflow": ("sajobs_workflow_0002", "-"),
        "sa_jobs_fairness": ("sajobs_fairness_0001", "-"),
        "sa_jobs_refs": ("sajobs_refs_0001", "-"),
    }
    assert out.splitlines()[-1] == "up to date"


def test_status_reads_an_applications_alembic_version(cli: Run, blank_url: URL) -> None:
    """Installed through the app's own Alembic env: its alembic_version has the record."""
    engine = create_engine(blank_url)
    sa_jobs.migrate(engine, "sa_jobs_core@head")
    with engine.begin() as connection:
        connection.execute(text("ALTER TABLE sa_jobs_alembic_version RENAME TO alembic_version"))
        connection.execute(text("INSERT INTO alembic_version VALUES ('app_0001')"))
    engine.dispose()

    code, out, _ = cli("migrate", "--status")

    assert code == 0
    assert status_rows(out)["sa_jobs_core"] == ("sajobs_core_0006", "-")
    assert status_rows(out)["sa_jobs_unique"] == ("-", "sajobs_unique_0001, sajobs_unique_0002")
    assert (
        out.splitlines()[-1]
        == "(recorded in alembic_version (your application's Alembic environment))"
    )


def test_status_of_tables_nobody_recorded_fails_with_one_line(cli: Run, blank_url: URL) -> None:
    engine = create_engine(blank_url)
    sa_jobs.migrate(engine)
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE sa_jobs_alembic_version"))
    engine.dispose()

    code, out, err = cli("migrate", "--status")

    assert (code, out) == (1, "")
    assert err.startswith("sa-jobs: ") and err.count("\n") == 1
    assert "another Alembic environment" in err


def test_status_and_sql_or_downgrade_do_not_mix(cli: Run) -> None:
    with pytest.raises(SystemExit) as exited:
        cli("migrate", "--status", "--sql")
    assert exited.value.code == 2
    code, _, err = cli("migrate", "--status", "--downgrade", "base")
    assert code == 2
    # (the first line of err is the argparse message above, not read until now)
    assert err.splitlines()[-1] == "sa-jobs: --status only reports; leave out --downgrade"


# ---------------------------------------------------------------------- --sql


def test_sql_needs_no_database(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for variable in ("SA_JOBS_DATABASE_URL", "DATABASE_URL", "SA_JOBS_MIGRATE_TARGET"):
        monkeypatch.delenv(variable, raising=False)

    assert main(["migrate", "--sql"]) == 0
    everything = capsys.readouterr().out
    assert main(["migrate", "--sql", "--url", NOWHERE, "--target", "sa_jobs_core@head"]) == 0
    core = capsys.readouterr().out

    assert everything.startswith("BEGIN;\n")
    assert everything.rstrip().endswith("COMMIT;")
    assert "CREATE TABLE sa_job (" in everything
    for revision in ALL_REVISIONS:
        assert f"'{revision}'" in everything, revision
    assert "CREATE TABLE sa_job (" in core
    assert "unique_key" in everything
    assert "unique_key" not in core
    assert "sajobs_unique_0001" not in core


def test_sql_writes_nothing_and_running_it_installs_the_schema(cli: Run, blank_url: URL) -> None:
    code, sql, err = cli("migrate", "--sql")
    assert (code, err) == (0, "")
    assert tables(blank_url) == set()

    # The printed script, run by hand (as a DBA would, with psql), is the real install:
    # afterwards sa-jobs finds every branch at its head and nothing left to do.
    with psycopg.connect(libpq_url(blank_url), autocommit=True) as connection:
        connection.execute(sql.encode())
    _, out, _ = cli("migrate", "--status")
    assert out.splitlines()[-1] == "up to date"
    assert cli("migrate")[1] == "sa_jobs schema already up to date (heads): nothing to apply\n"


def test_sql_downgrade_without_a_range_fails_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["migrate", "--sql", "--downgrade", "base"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sa-jobs: ") and err.count("\n") == 1
    assert "<fromrev>:<torev>" in err
