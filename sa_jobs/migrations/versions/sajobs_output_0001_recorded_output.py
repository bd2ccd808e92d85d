"""sa_jobs output: recorded job outputs, and the notification that wakes a waiter.

Revision ID: sajobs_output_0001
Revises:
Depends on: sajobs_core_0001
Create Date: 2026-11-28

The root of the ``sa_jobs_output`` branch. ``output`` holds what a handler returned (or
recorded with ``job.record_output``), kept in the job's row so the cleaner removes it
with its job. ``output_watched`` is set by ``sa_jobs.wait_for``: only a watched job that
enters a final state sends a notification on ``sa_jobs_done`` (payload: its id), so
completions nobody waits for send nothing. The trigger's WHEN clause is evaluated with
the row in hand, so an unwatched completion never calls the function.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "sajobs_output_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sa_jobs_output",)
depends_on: str | Sequence[str] | None = "sajobs_core_0001"

NOTIFY_FUNCTION = """
CREATE FUNCTION sa_job_notify_done() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sa_jobs_done', NEW.id::text);
    RETURN NULL;
END
$$
"""

NOTIFY_TRIGGER = """
CREATE TRIGGER sa_job_notify_done
AFTER UPDATE OF state ON sa_job
FOR EACH ROW
WHEN (NEW.output_watched
      AND NEW.state IN ('completed', 'cancelled', 'discarded')
      AND OLD.state IS DISTINCT FROM NEW.state)
EXECUTE FUNCTION sa_job_notify_done()
"""


def upgrade() -> None:
    op.add_column("sa_job", sa.Column("output", postgresql.JSONB(), nullable=True))
    op.add_column(
        "sa_job",
        sa.Column("output_watched", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.execute(NOTIFY_FUNCTION)
    op.execute(NOTIFY_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER sa_job_notify_done ON sa_job")
    op.execute("DROP FUNCTION sa_job_notify_done()")
    op.drop_column("sa_job", "output_watched")
    op.drop_column("sa_job", "output")
