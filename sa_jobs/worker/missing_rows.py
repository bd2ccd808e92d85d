"""Before a handler runs: are the rows its job references (``sa_jobs.Ref``) still there?

**Per fetched batch** (:func:`check_batch`, called by the worker when it hands a batch
to its handlers): one ``SELECT`` of the primary keys per referenced table for the whole
batch, not one per job. Each run then reads its job's verdict instead of querying
(``Execution.rows_verdict``). A job the batch check could not cover — its args did not
decode, or the query failed — is checked alone by :func:`check_rows` (and
:func:`check_rows_apart` etc.) before its handler, in the handler's transaction when the
handler takes a session, as the inline test runner always does. A job whose args class
holds no ``Ref`` costs one cached lookup and no query either way.

Neither check locks the row: under READ COMMITTED a row seen by the check can be deleted
before the handler's next statement, whichever transaction the check ran in. A handler
that needs the row to stay calls ``ref.load(session, for_update=True)``, which locks it
or raises :class:`~sa_jobs.errors.RowMissingError` (the attempt fails; the next attempt's
check ends the job as its field says).

A row that is gone ends the attempt as its field says (``sa_jobs.field(on_missing=...)``):
``"cancel"`` (the default) raises :class:`~sa_jobs.errors.JobCancel`, ``"discard"``
:class:`~sa_jobs.errors.JobDiscard` — both end the job at once, no retry spent, with a
reason naming the model and the key — and ``"run"`` lets the handler run (its
``ref.get(session)`` returns None). The check holds however the row went: an ORM delete,
a bulk ``DELETE``, another program.
"""

from __future__ import annotations

import functools
import logging
import typing
from collections.abc import Callable, Sequence
from typing import Any, Final

from sqlalchemy import Engine, select, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from sa_jobs._declare.args_paths import Unresolved, is_record, record_field_types
from sa_jobs._declare.refs import Ref, is_ref_type, iter_refs, mapper_of
from sa_jobs._table.models import Job
from sa_jobs.errors import JobCancel, JobDiscard

__all__ = [
    "UNCHECKED",
    "Verdict",
    "batch_checked",
    "check_batch",
    "check_rows",
    "check_rows_apart",
    "check_rows_apart_async",
    "check_rows_async",
]

log = logging.getLogger("sa_jobs.worker")

#: What the batch check found for one job: None (every row it needs is there, or it
#: references none), or the ending to raise instead of running its handler.
Verdict = JobCancel | JobDiscard | None


class _Unchecked:
    def __repr__(self) -> str:
        return "UNCHECKED"


#: A job the batch check did not cover: checked alone before its handler.
UNCHECKED: Final = _Unchecked()


@functools.cache
def may_hold_refs(args_class: type) -> bool:
    """Whether instances of ``args_class`` can hold a ``Ref`` (read from its field types,
    once per class); True when the types cannot be resolved, so the walk decides."""
    return _type_holds_refs(args_class, set())


def _type_holds_refs(tp: Any, seen: set[Any]) -> bool:
    if is_ref_type(tp):
        return True
    if is_record(tp):
        if tp in seen:
            return False
        seen.add(tp)
        try:
            fields = record_field_types(tp)
        except Unresolved:
            return True
        return any(_type_holds_refs(field_type, seen) for _name, field_type in fields)
    return any(_type_holds_refs(argument, seen) for argument in typing.get_args(tp))


def _needs_check(job: Job[Any]) -> bool:
    return may_hold_refs(job.job_kind.args_class)


def check_rows(session: Session, job: Job[Any]) -> None:
    """Raise if a row ``job`` references is gone and its field says to end the job.

    Raises:
        JobCancel: a missing row's field says ``on_missing="cancel"`` (the default).
        JobDiscard: a missing row's field says ``on_missing="discard"`` (and none says
            cancel).
    """
    if not _needs_check(job):
        return
    refs = list(iter_refs(job.args))
    if not refs:
        return
    verdict = _verdict(refs, _missing(session, _checked(refs)))
    if verdict is not None:
        raise verdict


def check_batch(engine: Engine, jobs: Sequence[Job[Any]]) -> dict[int, Verdict]:
    """The verdict of each job of a fetched batch, by job id: one ``SELECT`` per
    referenced table for all of them, in a short transaction of its own.

    A job left out was not covered (its args did not decode: its run fails on that
    again, as the attempt's error); if the query fails, none is (each run's own check
    then meets the error where it is the attempt's, not the producer's).
    """
    refs_of: dict[int, list[tuple[Ref[Any], str]]] = {}
    for job in jobs:
        try:
            refs_of[job.id] = list(iter_refs(job.args)) if _needs_check(job) else []
        except Exception:  # any decoding failure is reported by the run itself
            continue
    wanted = [ref for refs in refs_of.values() for ref in _checked(refs)]
    missing: set[Ref[Any]] = set()
    if wanted:
        try:
            with Session(engine) as session, session.begin():
                missing = _missing(session, wanted)
        except Exception as exc:  # the runs' own checks meet it, as attempt errors
            log.debug("checking the referenced rows of a batch failed: %s", exc)
            return {}
    return {job_id: _verdict(refs, missing) for job_id, refs in refs_of.items()}


def batch_checked(verdict: Verdict | object) -> bool:
    """Whether the batch check covered a job (``verdict``: its ``rows_verdict``); raises
    the verdict (``JobCancel``/``JobDiscard``) when a row is gone."""
    if verdict is UNCHECKED:
        return False
    if isinstance(verdict, BaseException):
        raise verdict
    return True


def _checked(refs: list[tuple[Ref[Any], str]]) -> list[Ref[Any]]:
    """The references whose rows are looked for (``on_missing="run"`` ones are not)."""
    return [ref for ref, policy in refs if policy != "run"]


def _verdict(refs: list[tuple[Ref[Any], str]], missing: set[Ref[Any]]) -> Verdict:
    gone = [(ref, policy) for ref, policy in refs if policy != "run" and ref in missing]
    if not gone:
        return None
    reason = "; ".join(
        f"{ref.model.__qualname__} {_shown(ref)} (table {ref.table!r}) no longer exists "
        f"(on_missing={policy!r})"
        for ref, policy in _unique(gone)
    )
    if any(policy == "cancel" for _ref, policy in gone):
        return JobCancel(reason)
    return JobDiscard(reason)


def _missing(session: Session, refs: list[Ref[Any]]) -> set[Ref[Any]]:
    """The references among ``refs`` whose rows do not exist: one query per table."""
    by_table: dict[Any, list[Ref[Any]]] = {}
    for ref in refs:
        by_table.setdefault(mapper_of(ref.model).local_table, []).append(ref)
    missing: set[Ref[Any]] = set()
    for table, table_refs in by_table.items():
        mapper = mapper_of(table_refs[0].model)
        columns = [table.c[column.key] for column in mapper.primary_key]
        keys = {ref.pk for ref in table_refs}
        if len(columns) == 1:
            clause = columns[0].in_([key[0] for key in keys])
        else:
            clause = tuple_(*columns).in_(list(keys))
        found = {tuple(row) for row in session.execute(select(*columns).where(clause))}
        missing.update(ref for ref in table_refs if ref.pk not in found)
    return missing


def _unique(pairs: list[tuple[Ref[Any], str]]) -> list[tuple[Ref[Any], str]]:
    seen: set[Ref[Any]] = set()
    kept = []
    for ref, policy in pairs:
        if ref not in seen:
            seen.add(ref)
            kept.append((ref, policy))
    return kept


def _shown(ref: Ref[Any]) -> str:
    return repr(ref.pk[0]) if len(ref.pk) == 1 else repr(ref.pk)


def check_rows_apart(engine: Engine, job: Job[Any]) -> None:
    """:func:`check_rows` for a handler that takes no session: in a transaction of its own."""
    if not _needs_check(job):
        return
    with Session(engine) as session, session.begin():
        check_rows(session, job)


async def check_rows_async(session: AsyncSession, job: Job[Any]) -> None:
    """:func:`check_rows` in an async handler's session."""
    if not _needs_check(job):
        return
    await session.run_sync(check_rows, job)


async def check_rows_apart_async(async_engine: Callable[[], AsyncEngine], job: Job[Any]) -> None:
    """:func:`check_rows` for an async handler that takes no session."""
    if not _needs_check(job):
        return
    async with AsyncSession(async_engine()) as session, session.begin():
        await session.run_sync(check_rows, job)
