"""Job ids are bigint: every statement that takes ids from Python must take them as such.

Past 2**31 - 1, an ``int[]`` parameter fails with "integer out of range": sequenced jobs
then could not pass their slot on, be rescued, or be repaired.
"""

from __future__ import annotations

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState, SequenceOpts
from sa_jobs._act.complete import finish_in
from sa_jobs._base.records import Outcome
from sa_jobs.worker.maintenance.sequence_repair import SequenceRepair
from sa_jobs.worker.producer import fetch_jobs
from tests.factories import job_row

BEYOND_INT4 = 3_000_000_000


@sa_jobs.job_args(kind="large_ids_step", sequence=SequenceOpts())
class Step:
    n: int


def test_sequences_pass_on_past_the_range_of_a_32_bit_id(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text(f"ALTER SEQUENCE sa_job_id_seq RESTART WITH {BEYOND_INT4}"))
    with Session(engine) as session, session.begin():
        first, second = (r.job.id for r in sa_jobs.insert_many(session, [Step(1), Step(2)]))
    assert first >= BEYOND_INT4
    (job,) = fetch_jobs(engine, "default", 10, "large-ids")
    assert job.id == first
    with engine.begin() as connection:
        assert finish_in(connection, [Outcome.completed(job)]) == [(first, JobState.COMPLETED)]
    assert job_row(engine, second).state is JobState.AVAILABLE
    # The repair pass reads and locks by id too.
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE sa_job SET state = 'pending', sequence_slot = false WHERE id = :id"),
            {"id": second},
        )
        assert SequenceRepair().run_once(connection) == 1
    assert job_row(engine, second).state is JobState.AVAILABLE
