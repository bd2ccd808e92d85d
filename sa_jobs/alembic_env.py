"""Hooks for an application's own Alembic ``env.py`` that includes sa_jobs' scripts.

With ``sa_jobs:migrations/versions`` in ``version_locations`` an application's script
directory has several heads: its own, and one per sa_jobs branch. Alembic then refuses
``alembic revision`` ("Multiple heads are present") and, worse, runs ``alembic downgrade
-1`` on whichever head it happens to pick — possibly one of sa_jobs'. These two hooks,
passed to ``context.configure()``, make the first land on the application's own branch
and refuse the second before anything is changed; :func:`check_downgrade`, called just
before ``context.run_migrations()``, refuses it before Alembic even announces the step::

    from sa_jobs import alembic_env

    context.configure(
        connection=connection,
        target_metadata=[Base.metadata, sa_jobs.metadata],
        process_revision_directives=alembic_env.process_revision_directives,
        on_version_apply=alembic_env.on_version_apply,
    )
    with context.begin_transaction():
        alembic_env.check_downgrade(context)
        context.run_migrations()

sa_jobs' revisions are told apart by their branch labels, which Alembic carries to every
revision of a branch, so revisions added by a later sa_jobs release are recognised too.
``alembic upgrade head`` cannot be rescued from ``env.py`` (Alembic resolves the target
itself); ``alembic upgrade heads`` is the command (see ``docs/migrations.md``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from pathlib import Path

from alembic.operations.ops import MigrationScript
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext, MigrationInfo
from alembic.script import ScriptDirectory
from alembic.util import CommandError, coerce_resource_to_filename

from sa_jobs._table.schema import BRANCHES, CORE_BRANCH

__all__ = [
    "application_heads",
    "check_downgrade",
    "on_version_apply",
    "process_revision_directives",
]

#: A downgrade target that counts steps without saying from which head (``-1``, ``-2``).
_BARE_RELATIVE = re.compile(r"-\d+")


def _sa_jobs_branch(script: ScriptDirectory, revision: str) -> str | None:
    """The sa_jobs branch ``revision`` belongs to, or None if it is not sa_jobs'."""
    labels = script.get_revision(revision).branch_labels
    return next((label for label in BRANCHES if label in labels), None)


def application_heads(script: ScriptDirectory) -> list[str]:
    """The heads of ``script`` that are not on an sa_jobs branch: the application's own."""
    return [head for head in script.get_heads() if _sa_jobs_branch(script, head) is None]


def _application_version_path(script: ScriptDirectory) -> str | None:
    """The one version location holding no sa_jobs script, if there is exactly one."""
    sa_jobs_dirs = {
        Path(revision.path).parent.absolute()
        for revision in script.walk_revisions()
        if _sa_jobs_branch(script, revision.revision) is not None
    }
    own = [
        path
        for path in (
            coerce_resource_to_filename(str(loc)).absolute() for loc in script.version_locations
        )
        if path not in sa_jobs_dirs
    ]
    return str(own[0]) if len(own) == 1 else None


def process_revision_directives(
    context: MigrationContext, revision: object, directives: list[MigrationScript]
) -> None:
    """Base a plain ``alembic revision`` on the application's own head.

    Only a revision asked for without ``--head`` (Alembic's default ``head``) is moved,
    and only when the application has exactly one head of its own: an explicit
    ``--head`` always wins, and two application heads stay an error for the user to
    resolve. The application's very first revision is based on ``base`` and written to
    its own version location.
    """
    script = context.script
    if script is None or len(script.get_heads()) < 2:
        return
    for directive in directives:
        # None is what Alembic's command line passes without --head; it means "head".
        if directive.head not in (None, "head"):
            continue
        own = application_heads(script)
        if len(own) == 1:
            # Alembic writes the file beside the revision it is based on: the app's.
            directive.head = own[0]
        elif not own:
            directive.head = "base"
            if directive.version_path is None:
                directive.version_path = _application_version_path(script)


def _ambiguous_downgrade(destination: str, chosen: str) -> CommandError:
    return CommandError(
        f"'alembic downgrade {destination}' is ambiguous with several heads (Alembic "
        f"would choose {chosen}); nothing was downgraded. Name the branch: "
        f"'alembic downgrade <your_branch_label>@{destination}' for your own revisions, "
        f"'alembic downgrade {CORE_BRANCH}@base' to remove sa_jobs."
    )


def check_downgrade(context: EnvironmentContext) -> None:
    """Refuse ``alembic downgrade -N`` with several heads installed, before Alembic runs
    (or logs) any step. Call it right before ``context.run_migrations()``.

    It reads the command's target and the database's current heads; an upgrade, a
    ``<branch>@-N`` target, offline (``--sql``) mode, and ``-N`` from a single installed
    head pass through. :func:`on_version_apply` stays the safety net for an ``env.py``
    that does not call this.
    """
    if context.is_offline_mode():
        return
    migration = context.get_context()
    # The target as typed (get_revision_argument() resolves "myapp@-1" to "-1"); absent
    # for commands without one (`alembic revision`, `check`).
    destination = migration.opts.get("destination_rev")
    if not isinstance(destination, str) or not _BARE_RELATIVE.fullmatch(destination):
        return
    heads = migration.get_current_heads()
    if len(heads) < 2:
        return
    script = context.script
    chosen = "one of " + ", ".join(
        f"{head} ({_sa_jobs_branch(script, head) or 'yours'})" for head in sorted(heads)
    )
    raise _ambiguous_downgrade(destination, chosen)


def on_version_apply(
    ctx: MigrationContext,
    step: MigrationInfo,
    heads: Collection[object],
    run_args: Mapping[str, object],
) -> None:
    """Refuse ``alembic downgrade -N`` when the database has several heads.

    Alembic resolves a bare relative downgrade against one head of its own choosing (and
    only warns that it will stop doing so); with sa_jobs' branches installed that may be
    an sa_jobs branch, dropping a column or an index the application relies on. Raising
    here, at the first step and inside the migration transaction, undoes that step: on
    PostgreSQL nothing is changed. ``<branch>@-N`` is never refused, nor ``-N`` from a
    single installed head (an app that has not installed sa_jobs yet).
    """
    destination = ctx.opts.get("destination_rev")
    if step.is_upgrade or not step.is_migration:
        return
    if not isinstance(destination, str) or not _BARE_RELATIVE.fullmatch(destination):
        return
    # `heads` is after this step: put back what it removed, take away what it exposed.
    before = (set(heads) | set(step.up_revision_ids)) - set(step.down_revision_ids)
    script = ctx.script
    if script is None or len(before) < 2:
        return
    chosen = ", ".join(
        f"{revision} ({_sa_jobs_branch(script, revision) or 'yours'})"
        for revision in step.up_revision_ids
    )
    raise _ambiguous_downgrade(destination, chosen)
