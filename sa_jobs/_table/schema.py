"""Installing the schema: Alembic branches, :func:`migrate`, and missing-schema errors.

sa_jobs ships its Alembic scripts inside the package (``sa_jobs/migrations/versions``),
one branch per feature. An application that uses Alembic adds
``sa_jobs:migrations/versions`` to its ``version_locations``; one that does not calls
:func:`migrate` (or ``sa-jobs migrate``), which runs the same scripts and records them in
a version table of their own, ``sa_jobs_alembic_version``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import attrs
from sqlalchemy import Connection, Engine, Text, bindparam, column, event, func, select, text
from sqlalchemy import table as sql_table
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from sa_jobs._base.urls import require_postgresql
from sa_jobs.errors import InvalidOptionsError, SchemaManagedElsewhereError, SchemaMissingError

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = ["BRANCHES", "CORE_BRANCH", "VERSION_TABLE", "Features", "downgrade", "migrate"]

CORE_BRANCH = "sa_jobs_core"
UNIQUE_BRANCH = "sa_jobs_unique"
SEQUENCE_BRANCH = "sa_jobs_sequence"
JOB_KEY_BRANCH = "sa_jobs_job_key"
LIMITS_BRANCH = "sa_jobs_limits"
PERIODIC_BRANCH = "sa_jobs_periodic"
QUEUE_BRANCH = "sa_jobs_queue"
WORKFLOW_BRANCH = "sa_jobs_workflow"
OUTPUT_BRANCH = "sa_jobs_output"
FAIRNESS_BRANCH = "sa_jobs_fairness"
REFS_BRANCH = "sa_jobs_refs"
#: Every branch label, in the order ``sa-jobs migrate`` lists them.
BRANCHES = (
    CORE_BRANCH,
    UNIQUE_BRANCH,
    SEQUENCE_BRANCH,
    JOB_KEY_BRANCH,
    PERIODIC_BRANCH,
    QUEUE_BRANCH,
    LIMITS_BRANCH,
    WORKFLOW_BRANCH,
    OUTPUT_BRANCH,
    FAIRNESS_BRANCH,
    REFS_BRANCH,
)

#: A column each feature branch adds to ``sa_job``, to tell whether it is installed.
_BRANCH_MARKER_COLUMNS = {
    UNIQUE_BRANCH: "unique_key",
    SEQUENCE_BRANCH: "sequence_key",
    JOB_KEY_BRANCH: "job_key",
    WORKFLOW_BRANCH: "workflow_id",
    OUTPUT_BRANCH: "output",
    FAIRNESS_BRANCH: "partition_key",
}

#: A table each feature branch that adds tables (not columns of sa_job) creates, to tell
#: whether it is installed.
_BRANCH_MARKER_TABLES = {
    PERIODIC_BRANCH: "sa_job_periodic",
    QUEUE_BRANCH: "sa_job_queue",
    LIMITS_BRANCH: "sa_job_rate_window",
    WORKFLOW_BRANCH: "sa_job_workflow",
}
#: Other tables of a branch, so a "relation does not exist" names the right one.
_BRANCH_OTHER_TABLES = {"sa_job_dep": WORKFLOW_BRANCH}

#: Columns added by later revisions of a branch: a database without them has the branch,
#: but not at its head.
_LATER_COLUMNS = {"run_count": CORE_BRANCH, "revision": JOB_KEY_BRANCH}

#: NOTIFY channels: new due jobs (payload: the queue; sent by the insert trigger the core
#: migration installs, and by maintenance), and control messages (``{"cancel": id}``,
#: ``{"pause": queue}``, ``{"resume": queue}``).
INSERT_CHANNEL = "sa_jobs_insert"
CONTROL_CHANNEL = "sa_jobs_control"
#: A watched job entered a final state (payload: its id); sent by the trigger the
#: ``sa_jobs_output`` branch installs, only for jobs ``sa_jobs.wait_for`` marked watched.
DONE_CHANNEL = "sa_jobs_done"

MIGRATIONS_DIR = Path(__file__).parent.parent / "migrations"
#: The version table ``migrate()`` uses, apart from an application's ``alembic_version``.
VERSION_TABLE = "sa_jobs_alembic_version"
#: Serialises concurrent migrators (two processes deploying at once).
MIGRATION_LOCK_KEY = 0x5A_10B5_0000_0001


@contextlib.contextmanager
def quiet_alembic_import() -> Iterator[None]:
    """Import Alembic without its seven "setup plugin alembic.autogenerate…" INFO lines.

    Alembic logs one per built-in plugin the first time any of its modules is imported;
    an application logging at INFO would see them at ``import sa_jobs`` (or at its first
    ``migrate()``) and wonder what ran. Only that logger, only during the import: its
    later messages, and every other Alembic logger, are left as configured.
    """
    logger = logging.getLogger("alembic.runtime.plugins")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _alembic_command() -> ModuleType:
    # Imported here, not at the top: ``import sa_jobs`` needs no Alembic (faster, and
    # quiet), only installing the schema does.
    with quiet_alembic_import():
        from alembic import command

    return command


def alembic_config(connection: Connection, version_table: str = VERSION_TABLE) -> Config:
    """An Alembic config that runs sa_jobs' scripts on ``connection``."""
    with quiet_alembic_import():
        from alembic.config import Config

    config = Config()
    # The scripts are in script_location's own versions/ directory, Alembic's default, so
    # no version_locations: Alembic splits that option on a separator (":" with
    # path_separator=os), which broke a package installed under a path containing one.
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    config.attributes["version_table"] = version_table
    return config


def migrate(bind: Engine | Connection, target: str = "heads") -> None:
    """Upgrade the database to ``target`` (default: every branch's head).

    ``target`` may name one branch, such as ``"sa_jobs_core@head"``. Safe to run from
    several processes at once: they queue on an advisory lock and the later ones find
    nothing to do.
    """
    with _locked_connection(bind) as connection:
        _refuse_if_managed_elsewhere(connection)
        _alembic_command().upgrade(alembic_config(connection), target)


def _refuse_if_managed_elsewhere(connection: Connection) -> None:
    """sa_job exists but our version table records nothing: another Alembic environment
    (the application's) installed it, and running the scripts again would fail halfway."""
    tables = set(
        connection.scalars(
            select(text("table_name"))
            .select_from(text("information_schema.tables"))
            .where(text("table_schema = current_schema()"))
        )
    )
    if "sa_job" not in tables:
        return
    recorded = VERSION_TABLE in tables and connection.scalar(
        select(func.count()).select_from(text(VERSION_TABLE))
    )
    if not recorded:
        raise SchemaManagedElsewhereError(VERSION_TABLE)


def downgrade(bind: Engine | Connection, target: str) -> None:
    """Downgrade to ``target`` (``"base"`` removes everything sa_jobs installed).

    Raises:
        InvalidOptionsError: a bare relative target (``"-1"``) while several branches
            are installed: Alembic would pick one of them itself. Name the branch
            (``"sa_jobs_unique@-1"``). Refused before Alembic runs, so nothing changes.
    """
    with _locked_connection(bind) as connection:
        _refuse_if_managed_elsewhere(connection)
        _refuse_ambiguous_relative(connection, target)
        _alembic_command().downgrade(alembic_config(connection), target)


#: A downgrade target that counts steps without saying on which branch (``-1``, ``-2``).
_BARE_RELATIVE = re.compile(r"-\d+")


def _refuse_ambiguous_relative(connection: Connection, target: str) -> None:
    """``-1`` with several heads recorded: Alembic would choose a branch (only warning
    that this will stop working), possibly not the one meant. Checked with a plain query
    of the version table, before Alembic logs a "Running downgrade" it would not finish."""
    if not _BARE_RELATIVE.fullmatch(target.strip()):
        return
    heads = recorded_versions(connection)
    if len(heads) < 2:
        return
    raise InvalidOptionsError(
        "target",
        f"{target!r} is ambiguous with {len(heads)} sa_jobs branches installed "
        f"(Alembic would pick one); nothing was downgraded. Name the branch, e.g. "
        f"'{UNIQUE_BRANCH}@{target.strip()}', or '{CORE_BRANCH}@base' to remove sa_jobs "
        "(`sa-jobs migrate --status` lists the branches)",
    )


def recorded_versions(connection: Connection, version_table: str = VERSION_TABLE) -> list[str]:
    """The revisions ``version_table`` records (none if it does not exist), read with a
    plain query: Alembic's own reader logs two INFO lines per look."""
    name = bindparam("version_table", version_table, type_=Text)
    exists = connection.scalar(select(func.to_regclass(name).is_not(None)))
    if not exists:
        return []
    table = sql_table(version_table, column("version_num"))
    return sorted(connection.scalars(select(table.c.version_num)))


@contextlib.contextmanager
def _locked_connection(bind: Engine | Connection) -> Iterator[Connection]:
    if isinstance(bind, AsyncEngine | AsyncConnection):
        # Alembic is sync; SQLAlchemy's bridge runs it on an async connection.
        raise InvalidOptionsError(
            "bind",
            "migrate()/downgrade() take a sync Engine or Connection; with an AsyncEngine "
            "run `async with engine.begin() as connection: await "
            "connection.run_sync(sa_jobs.migrate)`, or use `sa-jobs migrate`",
        )
    # Before the advisory lock, which another database would fail on with a traceback.
    require_postgresql(bind, "bind")
    if isinstance(bind, Connection):
        bind.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
        yield bind
        return
    with bind.begin() as connection:
        connection.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
        yield connection


def installed_branches(connection: Connection) -> frozenset[str]:
    """Which of sa_jobs' branches the database has (read from the job table's columns
    and the tables beside it)."""
    columns = set(
        connection.scalars(
            select(text("column_name"))
            .select_from(text("information_schema.columns"))
            .where(text("table_schema = current_schema() AND table_name = 'sa_job'"))
        )
    )
    if not columns:
        return frozenset()
    tables = set(
        connection.scalars(
            select(text("table_name"))
            .select_from(text("information_schema.tables"))
            .where(
                text("table_schema = current_schema()"),
                column("table_name").in_(list(_BRANCH_MARKER_TABLES.values())),
            )
        )
    )
    # The refs branch adds an index (and the function it is on), no column or table.
    refs_index = connection.scalar(
        select(func.to_regclass(bindparam("index", _REFS_MARKER_INDEX, type_=Text)).is_not(None))
    )
    return frozenset(
        {CORE_BRANCH}
        | {branch for branch, marker in _BRANCH_MARKER_COLUMNS.items() if marker in columns}
        | {branch for branch, table in _BRANCH_MARKER_TABLES.items() if table in tables}
        | ({REFS_BRANCH} if refs_index else set())
    )


_REFS_MARKER_INDEX = "sa_job_refs_idx"


def has_stuck_columns(connection: Connection) -> bool:
    """The heartbeat rows carry stuck handler threads (core revision
    ``sajobs_core_0006``): a worker and the health check read and write them only then."""
    return bool(
        connection.scalar(
            select(func.count())
            .select_from(text("information_schema.columns"))
            .where(
                text(
                    "table_schema = current_schema() AND table_name = 'sa_job_worker' "
                    "AND column_name = 'stuck_threads'"
                )
            )
        )
    )


@attrs.frozen
class Features:
    """Which of sa_jobs' feature branches a database has; read once per engine
    (:meth:`of`) and handed to whatever builds statements that depend on them."""

    unique: bool = False
    sequence: bool = False
    job_key: bool = False
    limits: bool = False
    periodic: bool = False
    #: Queue controls (pause/resume): the ``sa_job_queue`` table.
    queue: bool = False
    #: Workflows and batches: ``sa_job_workflow``, ``sa_job_dep`` and the step columns.
    workflow: bool = False
    #: Recorded outputs and waiting for them: ``sa_job.output``, ``output_watched``.
    output: bool = False
    #: Partition keys (limits by key, fair queues): ``sa_job.partition_key``.
    fairness: bool = False
    #: ``jobs_for``: the ``sa_job_refs_idx`` index.
    refs: bool = False

    @classmethod
    def from_branches(cls, branches: frozenset[str]) -> Features:
        return cls(
            unique=UNIQUE_BRANCH in branches,
            sequence=SEQUENCE_BRANCH in branches,
            job_key=JOB_KEY_BRANCH in branches,
            periodic=PERIODIC_BRANCH in branches,
            queue=QUEUE_BRANCH in branches,
            limits=LIMITS_BRANCH in branches,
            workflow=WORKFLOW_BRANCH in branches,
            output=OUTPUT_BRANCH in branches,
            fairness=FAIRNESS_BRANCH in branches,
            refs=REFS_BRANCH in branches,
        )

    @classmethod
    def of(cls, connection: Connection) -> Features:
        """The features of ``connection``'s database, remembered per engine.

        A branch installed while the process runs is seen after a restart.

        Raises:
            SchemaMissingError: the core branch is not installed.
        """
        engine = connection.engine
        cached = _features.get(engine)
        if cached is None:
            branches = installed_branches(connection)
            if CORE_BRANCH not in branches:
                raise SchemaMissingError(CORE_BRANCH, "there is no sa_job table")
            cached = _features[engine] = cls.from_branches(branches)
        return cached


#: Every feature: what ``sa-jobs migrate`` installs.
ALL_FEATURES = Features(
    unique=True,
    sequence=True,
    job_key=True,
    periodic=True,
    queue=True,
    limits=True,
    workflow=True,
    output=True,
    fairness=True,
    refs=True,
)
#: The core alone.
NO_FEATURES = Features()

_features: weakref.WeakKeyDictionary[Engine, Features] = weakref.WeakKeyDictionary()


def missing_schema_error(exc: BaseException) -> SchemaMissingError | None:
    """The :class:`SchemaMissingError` a database error stands for, if it is one.

    "relation sa_job does not exist" means the core branch is missing; an unknown
    feature column (PostgreSQL names it with or without quotes and table prefix) means
    that feature's branch is.
    """
    orig = getattr(exc, "orig", exc)
    sqlstate = getattr(orig, "sqlstate", None)
    message = str(orig)
    detail = message.splitlines()[0] if message else ""
    if sqlstate == "42883" and "sa_job_refs" in message:
        return SchemaMissingError(REFS_BRANCH, detail)
    if sqlstate in ("42P01", "42704") and "sa_job" in message:
        for table, branch in [
            *((t, b) for b, t in _BRANCH_MARKER_TABLES.items()),
            *_BRANCH_OTHER_TABLES.items(),
        ]:
            if re.search(rf"(?<![\w]){table}\b", message):
                return SchemaMissingError(branch, detail)
        return SchemaMissingError(CORE_BRANCH, detail)
    if sqlstate == "42703":
        for column, branch in _LATER_COLUMNS.items():
            if re.search(rf"(?<![\w]){column}\b", message):
                return SchemaMissingError(branch, detail, outdated=True)
        for branch, marker in _BRANCH_MARKER_COLUMNS.items():
            prefix = marker.split("_")[0] + "_"
            # The marker itself (``output``) or any column sharing its prefix.
            pattern = rf"(?<![\w])(?:{re.escape(marker)}\b|{re.escape(prefix)}\w*)"
            if re.search(pattern, message):
                return SchemaMissingError(branch, detail)
    return None


@contextlib.contextmanager
def translate_missing_schema() -> Iterator[None]:
    """Turn "relation sa_job does not exist" (or a feature's missing column) into an error
    that names the branch to install and the command that installs it."""
    try:
        yield
    except ProgrammingError as exc:
        error = missing_schema_error(exc)
        if error is not None:
            raise error from exc
        raise


#: Execution option marking statements sa_jobs built, so their errors can be translated
#: even when the caller executes them (``insert_job()``).
STATEMENT_OPTION = "sa_jobs_statement"


@event.listens_for(Engine, "handle_error")
def _translate_for_callers(context: ExceptionContext) -> None:
    execution = context.execution_context
    if execution is None or not execution.execution_options.get(STATEMENT_OPTION):
        return
    error = missing_schema_error(context.original_exception)
    if error is not None:
        raise error from context.sqlalchemy_exception
