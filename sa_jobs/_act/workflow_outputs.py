"""``job.output_of(name)``: a step's output, read by the step's name in the job's workflow.

Read lazily, on each call, with one query through the unique ``(workflow_id,
workflow_step)`` index: prefetching outputs after each fetch would cost every fetched
batch a query, workflow or not, and most handlers read one or two outputs. A callback
finds its workflow in ``metadata.workflow_callback`` (callbacks are not steps).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import BigInteger, Connection, Text, and_, bindparam, func, select

from sa_jobs._act.workflow_callbacks import CALLBACK_KEY
from sa_jobs._base.states import JobState
from sa_jobs._declare.args import default_registry
from sa_jobs._declare.output import decode_output
from sa_jobs._table.models import job_table
from sa_jobs.errors import JobStateError, UnknownStepError

__all__ = ["read_step_output"]


@functools.cache
def _read_statement() -> Any:
    me = job_table.alias("reader")
    callback_of = me.c["metadata"][CALLBACK_KEY]["workflow_id"].astext.cast(BigInteger)
    workflow = (
        select(func.coalesce(me.c.workflow_id, callback_of).label("wf"))
        .where(me.c.id == bindparam(_READER, type_=BigInteger))
        .cte("reader_workflow")
    )
    step = job_table.alias("step")
    found = and_(
        step.c.workflow_id == workflow.c.wf,
        step.c.workflow_step == bindparam(_STEP, type_=Text),
    )
    return select(
        workflow.c.wf, step.c.id, step.c.kind, step.c.state, step.c["output"]
    ).select_from(workflow.outerjoin(step, found))


_READER = "sa_jobs_reader_id"
_STEP = "sa_jobs_step_name"


def read_step_output(connection: Connection, job_id: int, step: str) -> Any:
    """The output of step ``step`` of job ``job_id``'s workflow, decoded.

    Raises:
        UnknownStepError: no such step (or the job is in no workflow).
        JobStateError: the step has not completed.
    """
    row = connection.execute(_read_statement(), {_READER: job_id, _STEP: step}).one_or_none()
    if row is None or row.id is None:
        raise UnknownStepError(job_id, step, row.wf if row is not None else None)
    state = JobState(row.state)
    if state is not JobState.COMPLETED:
        raise JobStateError(
            row.id, state.value, f"read the output of step {step!r}, job", ["completed"]
        )
    kind = default_registry.get(row.kind) if row.kind in default_registry else None
    return decode_output(kind, row.output)
