"""The ``sa_jobs_workflow`` branch's tables: workflows and the edges between their steps.

A step is an ``sa_job`` row with ``workflow_id`` set (columns on :class:`~sa_jobs.Job`);
these tables hold what belongs to the workflow as a whole and to each dependency.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Identity,
    Index,
    Integer,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from sa_jobs._table.models import Base

__all__ = ["CALLBACK_KEY", "JobDep", "WorkflowRow", "dep_table", "workflow_table"]

#: ``metadata`` key of a workflow's callback job: ``{"workflow_id": id, "on": role}``
#: (callbacks are not steps: the workflow row names them, and this names the workflow).
CALLBACK_KEY = "workflow_callback"


class WorkflowRow(Base):
    """One workflow (or batch): its counters and its callback jobs.

    ``unfinished`` and ``failed`` are kept by the transactions that finish steps (and by
    retries that revive them), never recounted: the row is the serialisation point of a
    workflow, and the transaction that brings ``unfinished`` to 0 fires the callbacks.
    """

    __tablename__ = "sa_job_workflow"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    #: The default of the workflow's steps: ``cancel`` or ``run``.
    on_dependency_failure: Mapped[str] = mapped_column(Text)
    #: Steps in the workflow (callbacks not counted).
    total: Mapped[int] = mapped_column(Integer)
    #: Steps not in a final state.
    unfinished: Mapped[int] = mapped_column(Integer)
    #: Steps cancelled or discarded.
    failed: Mapped[int] = mapped_column(Integer)
    on_success_job_id: Mapped[int | None] = mapped_column(BigInteger)
    on_complete_job_id: Mapped[int | None] = mapped_column(BigInteger)
    on_failure_job_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    #: When ``unfinished`` first reached 0.
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        CheckConstraint("on_dependency_failure IN ('cancel', 'run')", name="on_dependency_failure"),
        CheckConstraint("unfinished >= 0 AND failed >= 0 AND unfinished <= total", name="counters"),
    )


class JobDep(Base):
    """An edge: ``job_id`` waits for ``depends_on_id``.

    ``resolved`` once the dependency completed (or failed, for a step that runs anyway);
    a step's ``workflow_deps`` is the number of its unresolved edges.
    """

    __tablename__ = "sa_job_dep"

    depends_on_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    workflow_id: Mapped[int] = mapped_column(BigInteger)
    resolved: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    #: The dependent's ``on_dependency_failure="run"``: a failed dependency resolves the
    #: edge instead of cancelling the dependent.
    run_on_failure: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))

    __table_args__ = (Index("sa_job_dep_job_id_idx", "job_id", "depends_on_id"),)


workflow_table: Table = WorkflowRow.__table__  # type: ignore[assignment]
dep_table: Table = JobDep.__table__  # type: ignore[assignment]
