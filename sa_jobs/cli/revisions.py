"""Which of sa_jobs' Alembic revisions a database has, per branch, and which are pending.

Read from ``sa_jobs_alembic_version`` (the table ``sa-jobs migrate`` keeps) and the
scripts shipped in the package. Alembic records only the newest revision of each branch
it installed, so "installed" is everything those revisions stand on: their
``down_revision`` chain and their ``depends_on`` (each feature branch depends on the
core's first revision).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
from alembic.script import Script, ScriptDirectory
from sqlalchemy import Connection

from sa_jobs._table.schema import BRANCHES, MIGRATIONS_DIR, VERSION_TABLE, recorded_versions

__all__ = [
    "BranchStatus",
    "applied_between",
    "branch_status",
    "describe",
    "recorded_heads",
    "scripts",
]


def scripts() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS_DIR))


def recorded_heads(connection: Connection, version_table: str = VERSION_TABLE) -> tuple[str, ...]:
    """The revisions ``version_table`` holds (none if the table is missing)."""
    return tuple(recorded_versions(connection, version_table))


def _installed(script: ScriptDirectory, heads: Iterable[str]) -> set[str]:
    """Every revision the recorded ``heads`` stand on, the heads included."""
    seen: set[str] = set()
    todo = list(heads)
    while todo:
        revision = script.get_revision(todo.pop())
        if revision is None or revision.revision in seen:
            continue
        seen.add(revision.revision)
        todo.extend(_below(revision))
    return seen


def _below(revision: Script) -> list[str]:
    below: list[str] = []
    for field in (revision.down_revision, revision.dependencies):
        if isinstance(field, str):
            below.append(field)
        elif field:
            below.extend(field)
    return below


def _in_order(script: ScriptDirectory) -> list[Script]:
    """Every revision, each after everything it stands on (the order Alembic applies)."""
    return [r for r in reversed(list(script.walk_revisions())) if r is not None]


@attrs.frozen
class BranchStatus:
    """One branch: its newest installed revision (``None``: not installed) and the
    revisions ``sa-jobs migrate`` would still apply, oldest first."""

    branch: str
    installed: str | None
    pending: tuple[str, ...]


def branch_status(script: ScriptDirectory, heads: Sequence[str]) -> list[BranchStatus]:
    """Each of sa_jobs' branches, in :data:`sa_jobs._table.schema.BRANCHES` order."""
    installed = _installed(script, heads)
    statuses = []
    for branch in BRANCHES:
        revisions = [r.revision for r in _in_order(script) if branch in r.branch_labels]
        have = [r for r in revisions if r in installed]
        statuses.append(
            BranchStatus(
                branch,
                have[-1] if have else None,
                tuple(r for r in revisions if r not in installed),
            )
        )
    return statuses


def applied_between(
    script: ScriptDirectory, before: Sequence[str], after: Sequence[str]
) -> list[Script]:
    """The revisions installed at ``after`` but not at ``before``, oldest first (for a
    downgrade, swap the arguments: what was removed)."""
    gained = _installed(script, after) - _installed(script, before)
    revisions = [r for r in _in_order(script) if r.revision in gained]
    # Listed branch by branch (core first) for reading; within a branch, in order.
    return sorted(revisions, key=lambda r: _branch_rank(r.branch_labels))


def _branch_rank(labels: Iterable[str]) -> int:
    return min((BRANCHES.index(label) for label in labels if label in BRANCHES), default=0)


def describe(revision: Script) -> str:
    """``sajobs_core_0001 - sa_jobs core: the job table, ...``: the id and its summary."""
    summary = (revision.doc or "").strip().splitlines()
    return f"{revision.revision} - {summary[0]}" if summary else revision.revision
