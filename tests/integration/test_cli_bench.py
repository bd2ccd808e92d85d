"""``sa-jobs bench``: a small run with the floor against the test server, and one-line
errors for bad options (before anything connects)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from sa_jobs.cli import main
from sa_jobs.devdb import Server
from tests.helpers import url_text

#: Nothing listens here: an option refused with this URL was refused before connecting.
NOWHERE = "postgresql://nobody@127.0.0.1:1/nowhere"

#: What a drain cost the database per worked job (dbcost.py); the server's CPU is there
#: because the test server runs on this host.
DB_COST = [
    "db_statements_per_job",
    "db_round_trips_per_job",
    "db_wal_bytes_per_job",
    "db_backend_cpu_per_job",
    "db_server_cpu_per_job",
]
#: --floor-threads: the best of four drains against the workplace's floor, and the cost
#: figures at the same fetch size.
THREADS = [
    "worked_best",
    "worker_cpu_per_job_best",
    "worker_cpu_per_job_same_batch",
    *(key.replace("db_", "threads_") for key in DB_COST),
]
FIGURES = [
    "enqueue_single",
    "enqueue_single_async",
    "enqueue_single_unique",
    "enqueue_bulk",
    "enqueue_bulk_fast",
    "enqueue_bulk_unique",
    "worked",
    "worker_cpu_per_job",
    *DB_COST,
    "latency_p50",
    "latency_p90",
    "latency_p99",
    "args_check",
    "args_check_typical",
    "args_check_share",
    "args_check_bulk_share",
    "fetch_plain",
    "fetch_fair",
    "fetch_key_limited",
    "fetch_fair_ratio",
    "fetch_key_limited_ratio",
    "fetch_queue_limited",
    "fetch_key_limited_vs_queue_limited",
    "worked_limits_none",
    "worked_limits_other",
    "worked_limits_nonbinding",
    "worked_limits_other_ratio",
    "worked_limits_nonbinding_ratio",
    "workflow_insert",
    "workflow_insert_plain",
    "workflow_insert_ratio",
    "workflow_fan_worked",
    "workflow_fan_plain_worked",
    "workflow_fan_ratio",
    "workflow_fan_worker",
    "workflow_fan_plain_worker",
    "workflow_fan_worker_ratio",
    "workflow_chain_release_p50",
    "workflow_plain_next_p50",
]
#: Figures about sa_jobs alone (the unique inserts against the plain ones, the args
#: check against the enqueues), which have no floor of their own.
WITHOUT_FLOOR = ("_unique", "args_check", "fetch_", "workflow_", "worked_limits")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("SA_JOBS_DATABASE_URL", "DATABASE_URL", "SA_JOBS_LOG_LEVEL"):
        monkeypatch.delenv(variable, raising=False)


def database_exists(server: Server, name: str) -> bool:
    engine = create_engine(server.url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            found = connection.scalar(
                text("SELECT count(*) FROM pg_database WHERE datname = :name"), {"name": name}
            )
        return bool(found)
    finally:
        engine.dispose()


@pytest.mark.slow
def test_a_small_run_with_the_floor_reports_every_figure_and_its_ratio_from_the_same_run(
    pg_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    argv = ["bench", "--jobs", "200", "--floor", "--floor-threads", "4", "--json", str(out)]
    code = main([*argv, "--url", url_text(pg_server.url)])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr

    document = json.loads(out.read_text())
    assert document["format"] == 1
    assert document["settings"] == {
        "jobs": 200,
        "singles": 200,
        "samples": 200,
        "queues": {"default": 10},
        "processes": 1,
        "handler": "sync",
        "floor": True,
        "floor_threads": 4,
        "batch": 1000,
        "phases": ["single", "worked", "latency", "fetch", "limits", "workflows"],
    }
    figures = {figure["key"]: figure for figure in document["figures"]}
    at = FIGURES.index(DB_COST[-1]) + 1
    assert list(figures) == FIGURES[:at] + THREADS + FIGURES[at:]
    for key, figure in figures.items():
        assert figure["sa_jobs"] > 0, key
        if any(part in key for part in WITHOUT_FLOOR):
            assert figure["floor"] is None and figure["ratio"] is None, key
            continue
        assert figure["floor"] > 0, key
        # The ratio is the quotient of the two figures the same document holds.
        assert figure["ratio"] == pytest.approx(figure["sa_jobs"] / figure["floor"]), key
    assert [figures[f"latency_p{q}"]["sa_jobs"] for q in (50, 90, 99)] == sorted(
        figures[f"latency_p{q}"]["sa_jobs"] for q in (50, 90, 99)
    )
    assert figures["worker_cpu_per_job"]["higher_is_better"] is False
    assert_database_costs_are_sane(figures)
    assert figures["worked"]["higher_is_better"] is True
    # The check's share is its time over the per-job time of the enqueues it names.
    per_single = 1e6 / figures["enqueue_single"]["sa_jobs"]
    assert figures["args_check_share"]["sa_jobs"] == pytest.approx(
        100 * figures["args_check_typical"]["sa_jobs"] / per_single
    )
    per_bulk = 1e6 / figures["enqueue_bulk"]["sa_jobs"]
    assert figures["args_check_bulk_share"]["sa_jobs"] == pytest.approx(
        100 * figures["args_check"]["sa_jobs"] / per_bulk
    )
    assert "args check (typical args) / single enqueue" in stdout

    # The printed table is the same run: each line ends with the JSON's ratio.
    for figure in figures.values():
        if figure["ratio"] is None:
            continue
        line = next(line for line in stdout.splitlines() if line.startswith(figure["label"]))
        printed = re.search(r"([\d.]+)x$", line)
        assert printed is not None, line
        assert float(printed.group(1)) == pytest.approx(figure["ratio"], abs=0.006)
    assert "sa-jobs bench: single enqueue" in stderr

    # The throwaway database is gone; the server's own were not touched.
    database = document["environment"]["database"]
    assert database.startswith("sa_jobs_bench_")
    assert not database_exists(pg_server, database)


def assert_database_costs_are_sane(figures: dict[str, dict[str, Any]]) -> None:
    """The floor's counts are known by construction; sa_jobs' are bounded by its design."""
    for prefix, batch in (("db_", 10), ("threads_", 100)):
        statements = figures[f"{prefix}statements_per_job"]
        trips = figures[f"{prefix}round_trips_per_job"]
        # The floor fetches up to `batch` jobs a statement and completes them in one
        # more, in autocommit: at least two statements a batch, each one round trip;
        # fetches of nothing at the end (every 5 ms while others finish) add a few.
        assert 2 / batch <= statements["floor"] < 1, prefix
        assert trips["floor"] == statements["floor"], prefix
        # sa_jobs works in transactions: BEGIN and COMMIT are round trips, not statements.
        assert trips["sa_jobs"] > statements["sa_jobs"] > 0, prefix
        # Every completion writes WAL; the server's CPU includes the drain's backends'.
        assert figures[f"{prefix}wal_bytes_per_job"]["floor"] > 0, prefix
        for side in ("sa_jobs", "floor"):
            backends = figures[f"{prefix}backend_cpu_per_job"][side]
            assert 0 < backends <= figures[f"{prefix}server_cpu_per_job"][side] + 1e-9, prefix
    best = figures["worked_best"]["label"]
    assert re.search(r"best of 50/100/200/500 slots \((50|100|200|500)\) against 4 threads", best)


@pytest.mark.slow
def test_several_processes_queues_and_an_async_handler_drain_every_job_without_a_floor(
    pg_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    argv = ["bench", "--jobs", "60", "--singles", "5", "--samples", "5", "--processes", "2"]
    argv += ["--handler", "async", "-q", "a=2", "-q", "b", "--concurrency", "3"]
    code = main([*argv, "--json", str(out), "--url", url_text(pg_server.url)])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr

    document = json.loads(out.read_text())
    settings = document["settings"]
    assert (settings["queues"], settings["processes"], settings["handler"]) == (
        {"a": 2, "b": 3},
        2,
        "async",
    )
    figures = {figure["key"]: figure for figure in document["figures"]}
    assert list(figures) == FIGURES
    # The drain checks every job ended completed; without --floor there is no ratio.
    assert all(f["sa_jobs"] > 0 and f["floor"] is None for f in figures.values())
    assert all(f["ratio"] is None for f in figures.values())
    assert "worked no-op jobs, 2 processes, async handler" in stdout
    assert "ratio" not in stdout


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--jobs", "0"], "--jobs: must be at least 1, got 0"),
        (["--jobs", "many"], "--jobs: 'many' is not a whole number"),
        (["--processes", "-2"], "--processes: must be at least 1"),
        (["--samples", "0"], "--samples: must be at least 1"),
        (["-q", "default=0"], "the concurrency after '=' must be a whole number"),
        (["-q", "=3"], "is not a queue"),
        (["--handler", "threads"], "invalid choice: 'threads'"),
        (["-q", "mail", "-q", "mail=3"], "queue 'mail' is named twice"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2_before_connecting(
    options: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["bench", *options, "--url", NOWHERE])
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("sa-jobs"), err
    assert err.count("\n") == 1, err
    assert fragment in err


def test_a_json_file_that_cannot_be_written_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "out.json"
    assert main(["bench", "--json", str(missing), "--url", NOWHERE]) == 2
    assert capsys.readouterr().err == (
        f"sa-jobs: --json {missing}: directory {missing.parent} does not exist\n"
    )
    assert main(["bench", "--json", str(tmp_path), "--url", NOWHERE]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_an_unreachable_server_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "--jobs", "10", "--url", NOWHERE]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sa-jobs: cannot reach the database"), err
    assert err.count("\n") == 1


def test_only_runs_the_parts_named_and_the_limits_drains_report_their_ratios(
    pg_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    argv = ["bench", "--jobs", "50", "--only", "limits", "--json", str(out)]
    code = main([*argv, "--url", url_text(pg_server.url)])
    _, stderr = capsys.readouterr()
    assert code == 0, stderr
    document = json.loads(out.read_text())
    assert document["settings"]["phases"] == ["limits"]
    figures = {figure["key"]: figure["sa_jobs"] for figure in document["figures"]}
    assert list(figures) == [key for key in FIGURES if key.startswith("worked_limits")]
    # Each drain checked that all 50 jobs ended completed; the ratios are of its rates.
    assert figures["worked_limits_other_ratio"] == pytest.approx(
        figures["worked_limits_none"] / figures["worked_limits_other"]
    )
    assert figures["worked_limits_nonbinding_ratio"] == pytest.approx(
        figures["worked_limits_none"] / figures["worked_limits_nonbinding"]
    )
