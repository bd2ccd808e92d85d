"""The shipped Alembic scripts: they agree with the models, undo themselves, tolerate
concurrent deploys, ship in the wheel, and their absence is reported clearly.

Every test makes its own throwaway database (none uses the shared migrated one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Connection, Engine, create_engine, inspect, select, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs._table.schema import VERSION_TABLE
from sa_jobs._table.service_tables import WorkerProcess
from sa_jobs.devdb import Server, throwaway_database
from sa_jobs.errors import SchemaManagedElsewhereError, SchemaMissingError
from tests.forked import alembic_main, process_context, run_forked
from tests.helpers import engine_at, migrated_engine, url_text

REPO = Path(__file__).resolve().parents[2]

#: What the core migration creates besides the table (the models do not describe these).
CORE_OBJECTS = {"table": "sa_job", "type": "sa_job_state", "function": "sa_job_notify_insert"}


@sa_jobs.job_args(kind="migration_tests.send_report")
class SendReport:
    report_id: int


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def blank_url(pg_server: Server) -> Iterator[URL]:
    """A new, empty database: nothing migrated."""
    with throwaway_database(pg_server, prefix="sa_jobs_migration") as url:
        yield url


@pytest.fixture
def blank_engine(blank_url: URL) -> Iterator[Engine]:
    with engine_at(blank_url) as engine:
        yield engine


def shipped_scripts() -> ScriptDirectory:
    """sa_jobs' scripts, found the way an application's env finds them."""
    config = Config()
    config.set_main_option("script_location", "sa_jobs:migrations")
    return ScriptDirectory.from_config(config)


def current_heads(engine: Engine, version_table: str = VERSION_TABLE) -> set[str]:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": version_table})
        return set(context.get_current_heads())


# Alembic keeps its (emptied) version table after `downgrade base`; it is Alembic's, not ours.
VERSION_TABLES = ("alembic_version", VERSION_TABLE)

# Each query lists one kind of object in the public schema; the first column names the
# table the object belongs to (or the object itself), so version tables can be left out.
CATALOG_QUERIES = {
    "relations": """
        SELECT relname, relkind, reloptions FROM pg_class
        WHERE relnamespace = 'public'::regnamespace AND relkind NOT IN ('i', 'I', 'c', 't')
    """,
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
          AND a.attnum > 0 AND NOT a.attisdropped
    """,
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
        WHERE connamespace = 'public'::regnamespace
    """,
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "types": """
        SELECT t.typname, t.typtype,
               array_agg(e.enumlabel ORDER BY e.enumsortorder) FILTER (WHERE e.oid IS NOT NULL)
        FROM pg_type t LEFT JOIN pg_enum e ON e.enumtypid = t.oid
        WHERE t.typnamespace = 'public'::regnamespace AND t.typtype IN ('e', 'd', 'r', 'm')
        GROUP BY t.typname, t.typtype
    """,
    "functions": """
        SELECT proname, pg_get_function_identity_arguments(oid), prosrc FROM pg_proc
        WHERE pronamespace = 'public'::regnamespace
    """,
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
    """,
}


def schema_snapshot(
    engine: Engine, ignore: tuple[str, ...] = VERSION_TABLES
) -> dict[str, list[tuple[Any, ...]]]:
    """Everything in the public schema as PostgreSQL itself describes it, version tables aside."""
    with engine.connect() as connection:
        return {
            kind: sorted(
                tuple(row) for row in connection.execute(text(query)) if row[0] not in ignore
            )
            for kind, query in CATALOG_QUERIES.items()
        }


def object_exists(connection: Connection, kind: str, name: str) -> bool:
    query = {
        "table": "SELECT to_regclass(:name) IS NOT NULL",
        "type": "SELECT to_regtype(:name) IS NOT NULL",
        "function": "SELECT EXISTS (SELECT FROM pg_proc WHERE proname = :name)",
    }[kind]
    return bool(connection.execute(text(query), {"name": name}).scalar_one())


def assert_core_objects(engine: Engine, *, present: bool) -> None:
    with engine.connect() as connection:
        found = {kind: object_exists(connection, kind, name) for kind, name in CORE_OBJECTS.items()}
    assert found == dict.fromkeys(CORE_OBJECTS, present)


def run(command: list[str | Path], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a command; on failure the assertion shows everything it printed."""
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True
    )
    output = f"$ {' '.join(map(str, command))}\n{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, output
    return result.stdout


# ----------------------------------------------------------------- models and scripts agree


def test_autogenerate_finds_no_difference_at_heads(blank_engine: Engine) -> None:
    sa_jobs.migrate(blank_engine)

    with blank_engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            # migrate() keeps its own version table; an env configured like it does not
            # mistake that table for one the models forgot.
            opts={"version_table": VERSION_TABLE, "compare_server_default": True},
        )
        diff = compare_metadata(context, sa_jobs.metadata)

    assert diff == []


def test_migrations_build_what_the_models_describe_even_where_autogenerate_is_blind(
    pg_server: Server, blank_engine: Engine
) -> None:
    # Alembic compares neither enum labels, CHECK constraint expressions nor partial-index
    # predicates, so the empty diff above says nothing about them. Here PostgreSQL
    # describes both schemas: the migrated one and one made by metadata.create_all().
    sa_jobs.migrate(blank_engine)
    migrated = schema_snapshot(blank_engine)

    with (
        throwaway_database(pg_server, prefix="sa_jobs_create_all") as url,
        engine_at(url) as engine,
    ):
        sa_jobs.metadata.create_all(engine)
        created = schema_snapshot(engine)

    # Functions and triggers (the insert notification) live only in the migrations.
    for kind in ("functions", "triggers"):
        migrated.pop(kind)
        created.pop(kind)
    assert migrated == created


def test_project_alembic_env_upgrades_to_heads_and_finds_nothing_to_generate(
    blank_url: URL, blank_engine: Engine
) -> None:
    # The repository's own alembic.ini, as a developer runs it from the checkout.
    env = {**os.environ, "SA_JOBS_DATABASE_URL": url_text(blank_url)}
    env.pop("DATABASE_URL", None)

    def alembic(*argv: str) -> None:
        # Alembic's command line in a process forked from this one (tests/forked.py):
        # the same as `python -m alembic` without importing everything again.
        result = run_forked(alembic_main, "alembic", argv, cwd=REPO, env=env)
        assert result.returncode == 0, (
            f"$ alembic {' '.join(argv)}\n{result.stdout}\n{result.stderr}"
        )

    alembic("upgrade", "heads")
    assert current_heads(blank_engine, "alembic_version") == set(shipped_scripts().get_heads())
    alembic("check")  # exits non-zero on any difference

    alembic("downgrade", "base")
    assert_core_objects(blank_engine, present=False)


# --------------------------------------------------------------------------- downgrades


def test_every_revision_downgrades_to_exactly_the_schema_before_it(blank_engine: Engine) -> None:
    # Up one revision at a time, remembering the schema before each; then down one at a
    # time, expecting each earlier schema back. Comparing only at base would miss a
    # feature's downgrade that forgets a column the core downgrade later drops anyway.
    order = [script.revision for script in reversed(list(shipped_scripts().walk_revisions()))]
    before: list[tuple[set[str], dict[str, list[tuple[Any, ...]]]]] = []
    for revision in order:
        before.append((current_heads(blank_engine), schema_snapshot(blank_engine)))
        sa_jobs.migrate(blank_engine, revision)
    at_heads = schema_snapshot(blank_engine)
    assert current_heads(blank_engine) == set(shipped_scripts().get_heads())
    assert_core_objects(blank_engine, present=True)

    for revision, (heads, snapshot) in zip(reversed(order), reversed(before), strict=True):
        # "<rev>@-1" steps that one head down; a bare "-1" is ambiguous once branches exist.
        sa_jobs.downgrade(blank_engine, f"{revision}@-1")
        assert current_heads(blank_engine) == heads, f"downgrading {revision}"
        assert schema_snapshot(blank_engine) == snapshot, f"downgrading {revision}"

    assert current_heads(blank_engine) == set()
    assert_core_objects(blank_engine, present=False)

    sa_jobs.migrate(blank_engine)
    assert schema_snapshot(blank_engine) == at_heads


def job_table_options(engine: Engine) -> list[str] | None:
    with engine.connect() as connection:
        options: list[str] | None = connection.scalar(
            text("SELECT reloptions FROM pg_class WHERE oid = 'sa_job'::regclass")
        )
    return options


def test_core_0005_sets_the_job_tables_vacuum_threshold_and_its_downgrade_resets_it(
    blank_engine: Engine,
) -> None:
    sa_jobs.migrate(blank_engine, "sajobs_core_0004")
    assert job_table_options(blank_engine) is None  # PostgreSQL's defaults

    sa_jobs.migrate(blank_engine, "sajobs_core_0005")
    assert job_table_options(blank_engine) == ["autovacuum_vacuum_scale_factor=0.01"]

    sa_jobs.downgrade(blank_engine, "sajobs_core_0004")
    assert job_table_options(blank_engine) is None


# --------------------------------------------------------------------------- concurrent deploys

MIGRATORS = 4


def _migrate_with_the_others(url: str, start: Any) -> None:
    engine = create_engine(url)
    with engine.connect():
        pass  # connect first, so that every process starts migrating at the same moment
    start.wait()
    sa_jobs.migrate(engine)
    engine.dispose()


def test_concurrent_migrators_install_the_schema_once(blank_url: URL, blank_engine: Engine) -> None:
    # Separate processes, as in a deploy. Threads would also race inside Alembic itself,
    # whose `context` and `op` proxies are module globals.
    context = process_context()
    with context.Manager() as manager, ProcessPoolExecutor(MIGRATORS, mp_context=context) as pool:
        start = manager.Barrier(MIGRATORS, timeout=60)
        futures = [
            pool.submit(_migrate_with_the_others, url_text(blank_url), start)
            for _ in range(MIGRATORS)
        ]
        failures = [future.exception() for future in futures]

    assert failures == [None] * MIGRATORS
    with blank_engine.connect() as connection:
        versions = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
        assert sorted(versions) == sorted(shipped_scripts().get_heads())
    assert_core_objects(blank_engine, present=True)


# --------------------------------------------------------------------------- missing schema


def test_insert_into_an_unmigrated_database_says_to_run_sa_jobs_migrate(
    blank_engine: Engine,
) -> None:
    with Session(blank_engine) as session, pytest.raises(SchemaMissingError) as raised:
        sa_jobs.insert(session, SendReport(report_id=1))

    assert "sa-jobs migrate" in str(raised.value)


def test_flushing_an_enqueued_job_into_an_unmigrated_database_says_to_run_sa_jobs_migrate(
    blank_engine: Engine,
) -> None:
    with Session(blank_engine) as session:
        session.add(sa_jobs.enqueue(SendReport(report_id=1)))
        with pytest.raises(SchemaMissingError) as raised:
            session.flush()

    assert "sa-jobs migrate" in str(raised.value)


def test_migrate_installs_the_schema_from_a_package_under_a_path_with_a_colon(
    tmp_path: Path, blank_url: URL, blank_engine: Engine
) -> None:
    # Alembic split version_locations on ":" (path_separator=os), so sa_jobs installed
    # under such a path used to find no scripts and silently install nothing.
    home = tmp_path / "site:packages"
    shutil.copytree(
        REPO / "sa_jobs", home / "sa_jobs", ignore=shutil.ignore_patterns("__pycache__")
    )
    site_packages = sysconfig.get_paths()["purelib"]
    # -S: no site hooks, so the editable install of the checkout cannot win; PYTHONPATH
    # cannot name the directory either (it is split on ":" too).
    script = (
        f"import sys; sys.path[:0] = [{str(home)!r}, {site_packages!r}]\n"
        "import sqlalchemy, sa_jobs\n"
        f"assert sa_jobs.__file__.startswith({str(home)!r}), sa_jobs.__file__\n"
        f"engine = sqlalchemy.create_engine({url_text(blank_url)!r})\n"
        "sa_jobs.migrate(engine)\n"
    )
    run([sys.executable, "-S", "-W", "error", "-c", script], cwd=tmp_path)
    assert {"sa_job", "sa_job_worker", "sa_job_leader"} <= set(
        inspect(blank_engine).get_table_names()
    )
    assert current_heads(blank_engine) == set(shipped_scripts().get_heads())


def test_migrate_refuses_a_schema_another_alembic_environment_installed(
    blank_engine: Engine,
) -> None:
    sa_jobs.migrate(blank_engine)
    with blank_engine.begin() as connection:  # as if the app's own env had run the scripts
        connection.execute(text(f"DROP TABLE {VERSION_TABLE}"))
    with pytest.raises(SchemaManagedElsewhereError, match="alembic upgrade heads"):
        sa_jobs.migrate(blank_engine)
    assert VERSION_TABLE not in inspect(blank_engine).get_table_names()


# --------------------------------------------------------------------------- migrations for users

APP_ALEMBIC_INI = """\
[alembic]
script_location = %(here)s
# The application's own revisions, then the scripts inside the installed sa_jobs.
version_locations = %(here)s/versions sa_jobs:migrations/versions
path_separator = space
"""

APP_ENV_PY = """\
import sqlalchemy as sa
from alembic import context

import sa_jobs
from sa_jobs import alembic_env

app_metadata = sa.MetaData()
sa.Table(
    "app_invoice",
    app_metadata,
    sa.Column("number", sa.Text, primary_key=True),
    sa.Column("total_cents", sa.BigInteger, nullable=False),
)
target_metadata = [app_metadata, sa_jobs.metadata]

engine = sa.create_engine(context.get_x_argument(as_dictionary=True)["url"])
with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        process_revision_directives=alembic_env.process_revision_directives,
        on_version_apply=alembic_env.on_version_apply,
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
"""

APP_REVISION = """\
import sqlalchemy as sa
from alembic import op

revision = "app_0001"
down_revision = None
branch_labels = ("app",)
depends_on = None


def upgrade():
    op.create_table(
        "app_invoice",
        sa.Column("number", sa.Text, primary_key=True),
        sa.Column("total_cents", sa.BigInteger, nullable=False),
    )


def downgrade():
    op.drop_table("app_invoice")
"""


@pytest.mark.slow
def test_an_app_alembic_env_runs_the_migrations_shipped_in_the_wheel(
    tmp_path: Path, pg_server: Server, blank_url: URL, blank_engine: Engine
) -> None:
    wheels, venv, app = tmp_path / "wheels", tmp_path / "venv", tmp_path / "app"
    # The sdist, then the wheel built from it (build's default): what a packager does.
    run([sys.executable, "-m", "build", "--outdir", wheels, REPO], cwd=tmp_path)
    (wheel,) = wheels.glob("sa_jobs-*.whl")
    (sdist,) = wheels.glob("sa_jobs-*.tar.gz")
    license_text = (REPO / "LICENSE").read_text()
    assert "MIT License" in license_text
    with tarfile.open(sdist) as archive:
        member = archive.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/LICENSE")
        assert member is not None
        assert member.read().decode() == license_text
    # The dashboard's templates and stylesheet ship too (no build step, no CDN).
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
        (licensed,) = [name for name in shipped if name.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(licensed).decode() == license_text
    dashboard = REPO / "sa_jobs" / "dashboard"
    expected = [*dashboard.glob("templates/*.html"), dashboard / "static" / "dashboard.css"]
    assert len(expected) > 5
    for path in expected:
        assert path.relative_to(REPO).as_posix() in shipped, path
    # A venv without pip of its own, filled by this interpreter's pip (--python): the
    # same install of the wheel and its declared dependencies, without the seconds
    # ensurepip and byte-compiling every dependency took (Python compiles on import).
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-compile"]
    run([*pip, wheel], cwd=tmp_path)

    # Only the venv: no PYTHONPATH, and a working directory away from the checkout.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTHON")}
    installed = run(
        [python, "-c", "import sa_jobs; print(sa_jobs.__file__)"], cwd=tmp_path, env=env
    )
    assert Path(installed.strip()).is_relative_to(venv)

    (app / "versions").mkdir(parents=True)
    (app / "alembic.ini").write_text(APP_ALEMBIC_INI)
    (app / "env.py").write_text(APP_ENV_PY)
    shutil.copy(REPO / "alembic" / "script.py.mako", app / "script.py.mako")
    (app / "versions" / "app_0001_invoice.py").write_text(APP_REVISION)
    alembic: list[str | Path] = [venv / "bin" / "alembic", "-x", f"url={url_text(blank_url)}"]

    run([*alembic, "upgrade", "heads"], cwd=app, env=env)
    tables = set(inspect(blank_engine).get_table_names())
    assert {"app_invoice", "sa_job"} <= tables
    # Both branches are recorded in the app's own version table; sa-jobs migrate (and
    # its sa_jobs_alembic_version table) played no part.
    assert VERSION_TABLE not in tables
    assert current_heads(blank_engine, "alembic_version") == {
        "app_0001",
        *shipped_scripts().get_heads(),
    }
    # The same schema as sa-jobs migrate makes, names included, though this env has other
    # metadata (and no naming convention) for Alembic to apply to the scripts' names.
    with migrated_engine(pg_server, "sa_jobs_reference") as reference:
        expected = schema_snapshot(reference)
    assert schema_snapshot(blank_engine, ignore=(*VERSION_TABLES, "app_invoice")) == expected
    run([*alembic, "check"], cwd=app, env=env)
    # The env.py hooks ship in the wheel too: a plain `revision` lands on the app's branch.
    run([*alembic, "revision", "--autogenerate", "-m", "nothing new"], cwd=app, env=env)
    (generated,) = set((app / "versions").glob("*.py")) - {app / "versions" / "app_0001_invoice.py"}
    assert "Revises: app_0001\n" in generated.read_text()
    run([*alembic, "upgrade", "heads"], cwd=app, env=env)
    # sa-jobs migrate must not try to install the schema a second time.
    refused = subprocess.run(
        [venv / "bin" / "sa-jobs", "migrate", "--url", url_text(blank_url)],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "another Alembic environment" in refused.stderr

    run([*alembic, "downgrade", "base"], cwd=app, env=env)
    assert set(inspect(blank_engine).get_table_names()) == {"alembic_version"}
    assert_core_objects(blank_engine, present=False)


def test_core_0006_adds_the_stuck_thread_columns_and_a_worker_runs_without_them(
    blank_engine: Engine,
) -> None:
    """A worker of this release on a database not yet at sajobs_core_0006 heartbeats
    without the columns, and health, stats and the ORM row read there; at 0006 the
    heartbeat writes them."""

    def heartbeat_columns() -> set[str]:
        with blank_engine.connect() as connection:
            return set(
                connection.scalars(
                    text(
                        "SELECT column_name FROM information_schema.columns "
                        "WHERE table_name = 'sa_job_worker'"
                    )
                )
            )

    sa_jobs.migrate(blank_engine, "sajobs_core_0005")
    assert "stuck_threads" not in heartbeat_columns()
    worker = sa_jobs.Worker(blank_engine, queues={"default": 1})
    worker.start()
    try:
        with Session(blank_engine) as session:
            assert sa_jobs.check_health(session).stuck_workers == {}
            assert len(sa_jobs.stats(session).workers) == 1
            assert session.scalars(select(WorkerProcess)).one().id == worker.id
    finally:
        worker.stop()

    sa_jobs.migrate(blank_engine, "sajobs_core_0006")
    assert {"stuck_threads", "stuck_thread_limit"} <= heartbeat_columns()
    worker = sa_jobs.Worker(blank_engine, queues={"default": 3})
    worker.start()
    try:
        with blank_engine.connect() as connection:
            row = connection.execute(
                select(WorkerProcess.stuck_threads, WorkerProcess.stuck_thread_limit)
            ).one()
        assert tuple(row) == (0, 3)
    finally:
        worker.stop()
    sa_jobs.downgrade(blank_engine, "sajobs_core_0005")
    assert "stuck_threads" not in heartbeat_columns()
