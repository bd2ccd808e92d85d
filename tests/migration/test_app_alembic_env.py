"""sa_jobs in an application's own Alembic environment, command by command.

Each test writes a throwaway application (its own ``alembic.ini``, ``env.py`` and a first
revision labelled ``myapp`` that creates an app table) and runs the real ``alembic``
command line on it, as ``docs/migrations.md`` tells users to, each command in a process
of its own forked from the test's (:mod:`tests.forked`), so with this checkout's sa_jobs
(the wheel test in ``test_migrations.py`` covers the installed wheel and its script).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from alembic.config import Config
from alembic.operations.ops import DowngradeOps, MigrationScript, UpgradeOps
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Engine, inspect, text

from sa_jobs import alembic_env
from sa_jobs._table.schema import MIGRATIONS_DIR
from sa_jobs.devdb import Server, throwaway_database
from tests.forked import alembic_main, run_forked
from tests.helpers import engine_at, url_text

REPO = Path(__file__).resolve().parents[2]
SHIPPED_VERSIONS = MIGRATIONS_DIR / "versions"

#: The recipe's alembic.ini; {versions} is where sa_jobs' scripts are found.
ALEMBIC_INI = """\
[alembic]
script_location = %(here)s
version_locations = %(here)s/versions {versions}
path_separator = space
# Run env.py for every `alembic revision`, so its hooks apply without --autogenerate too.
revision_environment = true
"""

#: The recipe's env.py; {hooks} and {check} are empty for an env that uses plain Alembic
#: only.
ENV_PY = """\
import logging

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

# Alembic's INFO lines, as the default alembic.ini shows them.
logging.basicConfig(level=logging.INFO, format="%(levelname)s [%(name)s] %(message)s")

engine = sa.create_engine(context.get_x_argument(as_dictionary=True)["url"])
with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=[app_metadata, sa_jobs.metadata],
        {hooks}
    )
    with context.begin_transaction():
        {check}
        context.run_migrations()
    connection.commit()
"""

HOOKS = """\
process_revision_directives=alembic_env.process_revision_directives,
        on_version_apply=alembic_env.on_version_apply,"""

APP_REVISION = """\
import sqlalchemy as sa
from alembic import op

revision = "app_0001"
down_revision = None
branch_labels = ("myapp",)
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

#: What a later sa_jobs release might add to the core branch. A function, which
#: autogenerate does not compare, so an up-to-date database still shows no difference.
LATER_CORE_REVISION = """\
from alembic import op

revision = "sajobs_core_9999"
down_revision = {down!r}
branch_labels = None
depends_on = None


def upgrade():
    op.execute("CREATE FUNCTION sa_job_later_release() RETURNS int LANGUAGE sql AS 'SELECT 1'")


def downgrade():
    op.execute("DROP FUNCTION sa_job_later_release()")
"""

#: A column each feature branch adds, to see that a branch is installed.
FEATURE_COLUMNS = {"unique_key", "sequence_key", "job_key"}


@attrs.frozen
class App:
    """A throwaway application with its own Alembic environment."""

    home: Path
    url: URL
    engine: Engine
    hooks: bool

    @property
    def versions(self) -> Path:
        return self.home / "versions"

    def _alembic(self, *args: str) -> subprocess.CompletedProcess[str]:
        # Alembic's command line (what the ``alembic`` script calls) in a process of its
        # own, forked from this one: the checkout's sa_jobs and the same Alembic, already
        # imported (a fresh interpreter spent 1-2 s per command importing them again).
        argv = ["-x", f"url={url_text(self.url)}", *args]
        return run_forked(alembic_main, "alembic", argv, cwd=self.home)

    def alembic(self, *args: str) -> str:
        """Run ``alembic *args``; it must succeed. Returns what it printed."""
        result = self._alembic(*args)
        output = f"$ alembic {' '.join(args)}\n{result.stdout}\n{result.stderr}"
        assert result.returncode == 0, output
        return output

    def alembic_fails(self, *args: str) -> str:
        """Run ``alembic *args``; it must fail. Returns what it printed (Alembic prints
        its one-line ``FAILED: ...`` to stdout)."""
        result = self._alembic(*args)
        assert result.returncode != 0, f"$ alembic {' '.join(args)}\n{result.stdout}"
        return result.stdout + result.stderr

    def script(self) -> ScriptDirectory:
        return ScriptDirectory.from_config(Config(str(self.home / "alembic.ini")))

    def current(self) -> set[str]:
        """The revisions recorded in the app's ``alembic_version``."""
        with self.engine.connect() as connection:
            return set(MigrationContext.configure(connection).get_current_heads())

    def tables(self) -> set[str]:
        return set(inspect(self.engine).get_table_names())

    def job_columns(self) -> set[str]:
        return {column["name"] for column in inspect(self.engine).get_columns("sa_job")}

    def new_revisions(self, before: set[Path]) -> list[Path]:
        return sorted(set(self.versions.glob("*.py")) - before)


#: The pre-check the recipe calls before run_migrations().
CHECK = "alembic_env.check_downgrade(context)"


def make_app(
    home: Path, url: URL, engine: Engine, *, hooks: bool, versions: str, check: bool = True
) -> App:
    (home / "versions").mkdir(parents=True)
    (home / "alembic.ini").write_text(ALEMBIC_INI.format(versions=versions))
    env_py = ENV_PY.format(hooks=HOOKS if hooks else "", check=CHECK if hooks and check else "")
    (home / "env.py").write_text(env_py)
    shutil.copy(REPO / "alembic" / "script.py.mako", home / "script.py.mako")
    (home / "versions" / "app_0001_invoice.py").write_text(APP_REVISION)
    return App(home, url, engine, hooks)


@pytest.fixture
def blank(pg_server: Server) -> Iterator[tuple[URL, Engine]]:
    with (
        throwaway_database(pg_server, prefix="sa_jobs_app_env") as url,
        engine_at(url) as engine,
    ):
        yield url, engine


@pytest.fixture(params=[True, False], ids=["with_hooks", "plain_alembic"])
def app(request: pytest.FixtureRequest, tmp_path: Path, blank: tuple[URL, Engine]) -> App:
    """The recipe's app; with sa_jobs' env.py hooks, and without (plain Alembic)."""
    return make_app(
        tmp_path / "app", *blank, hooks=request.param, versions="sa_jobs:migrations/versions"
    )


@pytest.fixture
def hooked_app(tmp_path: Path, blank: tuple[URL, Engine]) -> App:
    return make_app(tmp_path / "app", *blank, hooks=True, versions="sa_jobs:migrations/versions")


def sa_jobs_heads(script: ScriptDirectory) -> set[str]:
    return {
        head for head in script.get_heads() if head not in alembic_env.application_heads(script)
    }


def branch_head(app: App, label: str) -> str:
    (head,) = app.script().get_revisions(f"{label}@head")
    assert head is not None
    return head.revision


def revision_file(path: Path) -> tuple[object, list[str]]:
    """A generated revision's ``down_revision`` and the statements of ``upgrade()`` and
    ``downgrade()`` (``pass`` for an empty one), as the source says."""
    module = ast.parse(path.read_text())
    down: object = None
    bodies: list[str] = []
    for node in module.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id == "down_revision":
                down = ast.literal_eval(node.value)
        if isinstance(node, ast.FunctionDef) and node.name in ("upgrade", "downgrade"):
            bodies += [ast.unparse(statement) for statement in node.body]
    return down, bodies


# --------------------------------------------------------------------------- the recipe


def test_upgrade_heads_installs_the_app_and_every_sa_jobs_branch(app: App) -> None:
    app.alembic("upgrade", "heads")

    assert app.current() == {"app_0001", *sa_jobs_heads(app.script())}
    assert {"app_invoice", "sa_job", "sa_job_worker", "sa_job_leader"} <= app.tables()
    assert app.job_columns() >= FEATURE_COLUMNS
    # Both in the app's own version table: sa-jobs migrate's played no part.
    assert "sa_jobs_alembic_version" not in app.tables()


def test_plain_upgrade_head_is_refused_by_alembic_and_heads_is_the_command(app: App) -> None:
    # Documented as the one command that has no plain form: Alembic resolves "head"
    # before env.py runs. If a future Alembic accepted it, the docs should say so.
    assert "Multiple head revisions" in app.alembic_fails("upgrade", "head")
    assert app.current() == set()


def test_autogenerate_on_the_app_branch_proposes_nothing_for_sa_jobs(app: App) -> None:
    app.alembic("upgrade", "heads")
    before = set(app.versions.glob("*.py"))
    shipped = set(SHIPPED_VERSIONS.glob("*.py"))

    app.alembic("revision", "--autogenerate", "--head", "myapp@head", "-m", "nothing new")

    (generated,) = app.new_revisions(before)
    assert revision_file(generated) == ("app_0001", ["pass", "pass"])
    assert set(SHIPPED_VERSIONS.glob("*.py")) == shipped
    app.alembic("upgrade", "heads")
    assert "No new upgrade operations detected" in app.alembic("check")


def test_downgrading_the_app_one_step_leaves_sa_jobs_installed(app: App) -> None:
    app.alembic("upgrade", "heads")
    app.alembic("revision", "--head", "myapp@head", "-m", "second")
    app.alembic("upgrade", "heads")
    second = branch_head(app, "myapp")
    assert second != "app_0001"
    sa_jobs = sa_jobs_heads(app.script())
    assert app.current() == {second, *sa_jobs}

    app.alembic("downgrade", "myapp@-1")
    assert app.current() == {"app_0001", *sa_jobs}

    app.alembic("downgrade", "myapp@base")
    assert app.current() == sa_jobs
    assert "app_invoice" not in app.tables()
    assert app.job_columns() >= FEATURE_COLUMNS


def test_downgrading_sa_jobs_core_to_base_removes_sa_jobs_and_keeps_the_app(app: App) -> None:
    app.alembic("upgrade", "heads")

    app.alembic("downgrade", "sa_jobs_core@base")

    assert app.current() == {"app_0001"}
    assert app.tables() == {"alembic_version", "app_invoice"}
    with app.engine.connect() as connection:
        leftovers = connection.execute(
            text(
                "SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace "
                "UNION ALL SELECT typname FROM pg_type "
                "WHERE typnamespace = 'public'::regnamespace AND typname LIKE 'sa\\_job%'"
            )
        ).all()
    assert leftovers == []


# --------------------------------------------------------------------------- the hooks


def test_with_the_hooks_plain_revision_commands_land_on_the_app_branch(hooked_app: App) -> None:
    app = hooked_app
    app.alembic("upgrade", "heads")
    before = set(app.versions.glob("*.py"))

    app.alembic("revision", "--autogenerate", "-m", "nothing new")
    (generated,) = app.new_revisions(before)
    assert revision_file(generated) == ("app_0001", ["pass", "pass"])

    # Without --autogenerate too (revision_environment = true runs env.py).
    app.alembic("revision", "-m", "by hand")
    (by_hand,) = app.new_revisions(before | {generated})
    down, _ = revision_file(by_hand)
    assert down == generated.name.split("_", 1)[0]

    assert alembic_env.application_heads(app.script()) == [by_hand.name.split("_", 1)[0]]


def test_the_first_revision_of_an_app_that_adopts_alembic_with_sa_jobs(app: App) -> None:
    # No revision of the app's own yet. With the hooks the plain command is based on
    # base and written to the app's versions/; without, the docs' flags say so.
    (app.versions / "app_0001_invoice.py").unlink()
    app.alembic("upgrade", "heads")
    flags = [] if app.hooks else ["--head", "base", "--version-path", "versions"]

    app.alembic("revision", "--autogenerate", "--branch-label", "myapp", *flags, "-m", "invoices")

    (first,) = app.new_revisions(set())
    down, statements = revision_file(first)
    assert down is None
    # Only the app's table: sa_jobs' tables, already installed, are left alone.
    assert any("op.create_table('app_invoice'" in statement for statement in statements)
    assert not any("sa_job" in statement for statement in statements)
    assert app.script().get_revisions("myapp@head")[0] is not None
    app.alembic("upgrade", "heads")
    assert "app_invoice" in app.tables()


def test_current_and_history_name_the_app_branch_apart_from_sa_jobs(app: App) -> None:
    app.alembic("upgrade", "heads")

    current = app.alembic("current")
    history = app.alembic("history", "-r", "myapp@base:myapp@head")

    for head in ("app_0001", *sa_jobs_heads(app.script())):
        assert f"\n{head} (head)" in current
    assert "app_0001 (myapp) (head)" in history
    assert "sajobs_" not in history


def test_branches_can_be_installed_and_removed_one_by_one(app: App) -> None:
    app.alembic("upgrade", "myapp@head")
    assert app.current() == {"app_0001"}
    assert "sa_job" not in app.tables()

    app.alembic("upgrade", "sa_jobs_core@head")
    app.alembic("upgrade", "sa_jobs_unique@head")
    core, unique = branch_head(app, "sa_jobs_core"), branch_head(app, "sa_jobs_unique")
    assert app.current() == {"app_0001", core, unique}
    assert "unique_key" in app.job_columns()
    assert not {"sequence_key", "job_key"} & app.job_columns()

    app.alembic("downgrade", "sa_jobs_unique@base")
    assert app.current() == {"app_0001", core}
    assert "unique_key" not in app.job_columns()


@pytest.mark.parametrize("check", [True, False], ids=["pre_check", "on_version_apply_only"])
def test_with_the_hooks_a_bare_downgrade_minus_one_is_refused_and_changes_nothing(
    tmp_path: Path, blank: tuple[URL, Engine], check: bool
) -> None:
    app = make_app(
        tmp_path / "app", *blank, hooks=True, versions="sa_jobs:migrations/versions", check=check
    )
    app.alembic("upgrade", "heads")
    installed = app.current()
    columns = app.job_columns()

    error = app.alembic_fails("downgrade", "-1")

    assert "ambiguous" in error
    assert "@-1" in error
    assert "sa_jobs_core@base" in error
    assert app.current() == installed
    assert app.job_columns() == columns
    assert "app_invoice" in app.tables()
    # With the pre-check, Alembic never announces a step it is not going to take.
    assert ("Running downgrade" in error) is not check


def test_with_the_hooks_downgrade_minus_one_from_a_single_installed_head_still_works(
    hooked_app: App,
) -> None:
    # Only the app's branch is installed: -1 is not ambiguous, and Alembic's meaning stands.
    app = hooked_app
    app.alembic("revision", "-m", "second")
    app.alembic("upgrade", "myapp@head")
    second = branch_head(app, "myapp")
    assert app.current() == {second}

    app.alembic("downgrade", "-1")

    assert app.current() == {"app_0001"}


def test_the_revision_hook_leaves_an_explicit_head_and_an_ambiguous_app_alone(
    tmp_path: Path, blank: tuple[URL, Engine]
) -> None:
    app = make_app(tmp_path / "app", *blank, hooks=True, versions="sa_jobs:migrations/versions")
    context = MigrationContext.configure(dialect_name="postgresql", opts={"script": app.script()})

    def directive(head: str | None) -> MigrationScript:
        script = MigrationScript("new", UpgradeOps(), DowngradeOps(), head=head)
        alembic_env.process_revision_directives(context, (), [script])
        return script

    assert directive(None).head == "app_0001"
    assert directive("head").head == "app_0001"
    assert directive("sa_jobs_core@head").head == "sa_jobs_core@head"

    # A second root of the app's own: which one to extend is the user's call.
    (app.versions / "app_0002_other.py").write_text(
        APP_REVISION.replace('"app_0001"', '"app_0002"').replace('("myapp",)', "None")
    )
    context = MigrationContext.configure(dialect_name="postgresql", opts={"script": app.script()})
    assert directive(None).head is None


# --------------------------------------------------------------------------- sa_jobs upgrades


def test_a_later_sa_jobs_release_that_adds_a_revision_upgrades_with_the_same_commands(
    tmp_path: Path, blank: tuple[URL, Engine]
) -> None:
    # sa_jobs' scripts from a copy standing for the installed package, so a release can
    # add one: a revision on the core branch, after the app has installed this one.
    package = tmp_path / "installed_sa_jobs_versions"
    shutil.copytree(SHIPPED_VERSIONS, package, ignore=shutil.ignore_patterns("__pycache__"))
    app = make_app(tmp_path / "app", *blank, hooks=True, versions=str(package))
    app.alembic("upgrade", "heads")
    (core_head,) = app.script().get_revisions("sa_jobs_core@head")
    assert core_head is not None

    (package / "sajobs_core_9999_later.py").write_text(
        LATER_CORE_REVISION.format(down=core_head.revision)
    )
    # The database is behind the new release: autogenerate says so rather than guess.
    assert "not up to date" in app.alembic_fails("revision", "--autogenerate", "-m", "x")

    app.alembic("upgrade", "heads")
    assert app.current() == {"app_0001", *sa_jobs_heads(app.script())}
    assert "sajobs_core_9999" in app.current()
    with app.engine.connect() as connection:
        assert connection.scalar(text("SELECT sa_job_later_release()")) == 1

    before = set(app.versions.glob("*.py"))
    app.alembic("revision", "--autogenerate", "-m", "after the upgrade")
    (generated,) = app.new_revisions(before)
    assert revision_file(generated) == ("app_0001", ["pass", "pass"])
    assert {path.name for path in package.glob("*.py")} == {
        path.name for path in SHIPPED_VERSIONS.glob("*.py")
    } | {"sajobs_core_9999_later.py"}

    app.alembic("upgrade", "heads")
    app.alembic("downgrade", "myapp@-1")
    assert "sajobs_core_9999" in app.current()

    app.alembic("downgrade", "sa_jobs_core@base")
    assert app.current() == {"app_0001"}
    assert "sa_job" not in app.tables()
