"""``jobs_for(session, row)``: the jobs whose args reference a row (``sa_jobs.Ref``).

Answered through the ``sa_jobs_refs`` branch's GIN index on ``sa_job_refs(args)`` (see
:data:`sa_jobs._table.models.REFS_FUNCTION`), so the cost follows the number of jobs that
reference the row, not the size of the job table.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, Select, Text, bindparam, cast, func, literal, select, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, array
from sqlalchemy.orm import Session

from sa_jobs._base.sessions import either_session
from sa_jobs._base.states import JobState
from sa_jobs._declare.convert import default_converter
from sa_jobs._declare.refs import Ref
from sa_jobs._table.models import REFS_PREDICATE, Job
from sa_jobs._table.schema import REFS_BRANCH, Features
from sa_jobs.errors import InvalidOptionsError, SchemaMissingError

__all__ = ["jobs_for", "jobs_for_statement", "ref_key", "references_row", "refs_in"]


def ref_key(target: object) -> tuple[str, list[Any]]:
    """The table and the JSON primary key of a row, a ``Ref`` or a mapped instance.

    Raises:
        InvalidJobArgsError: not a mapped instance (or one with no primary key yet).
    """
    ref = target if isinstance(target, Ref) else Ref.to(target)
    data = default_converter.cattrs.unstructure(ref, unstructure_as=Ref)
    return data["table"], data["pk"]


def jobs_for_statement(
    table: str, pk: list[Any], states: Iterable[JobState | str] | None = None
) -> Select[Job[Any]]:
    """The jobs referencing ``table`` row ``pk``, oldest first."""
    statement = (
        select(Job).where(*references_row(Job.args_json, table, pk, "sa_job")).order_by(Job.id)
    )
    if states is not None:
        chosen = [JobState(state).value for state in states]
        if not chosen:
            raise InvalidOptionsError("states", "give at least one state, or None for all")
        statement = statement.where(Job.state.in_(chosen))
    return statement


def references_row(
    args: Any, table: str, pk: list[Any], qualifier: str | None
) -> list[ColumnElement[bool]]:
    """Conditions on a job's ``args`` column: it references ``table`` row ``pk``.

    ``qualifier`` is how the statement names the job table: the partial index's
    predicate is stated in those words, so the planner can use the index (None: not
    stated, for a filter over rows already chosen otherwise).
    """
    refs = func.sa_job_refs(args, type_=ARRAY(Text))
    key = literal(table, Text) + ":" + cast(bindparam("ref_pk", pk, type_=JSONB), Text)
    found: list[ColumnElement[bool]] = []
    if qualifier is not None:
        predicate = REFS_PREDICATE.format(args=f"{qualifier}.args")
        found.append(text(predicate))  # type: ignore[arg-type]
    found.append(refs.contains(array([key], type_=Text)))
    return found


def refs_in(args: Any) -> list[tuple[str, list[Any]]]:
    """The references anywhere in stored args JSON, as ``sa_job_refs`` finds them: every
    object with a string ``table`` and a list ``pk``; in order, without repeats."""
    found: list[tuple[str, list[Any]]] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            shaped = isinstance(value.get("table"), str) and isinstance(value.get("pk"), list)
            if shaped and (value["table"], value["pk"]) not in found:
                found.append((value["table"], value["pk"]))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(args)
    return found


@either_session
def jobs_for(
    session: Session, target: object, *, states: Iterable[JobState | str] | None = None
) -> list[Job[Any]]:
    """The jobs whose args reference ``target`` (a mapped instance or a ``sa_jobs.Ref``),
    oldest first; ``states`` keeps only jobs in those states.

    Raises:
        InvalidJobArgsError: ``target`` is neither a mapped instance with a primary key
            nor a ``Ref``.
        SchemaMissingError: the ``sa_jobs_refs`` branch is not installed.
    """
    table, pk = ref_key(target)
    if not Features.of(session.connection()).refs:
        raise SchemaMissingError(
            REFS_BRANCH, "jobs_for() finds jobs through the sa_job_refs_idx index"
        )
    return list(session.scalars(jobs_for_statement(table, pk, states)))
