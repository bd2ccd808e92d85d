"""sa_jobs core: the job table, its state type, indexes, and the insert notification.

Revision ID: sajobs_core_0001
Revises:
Create Date: 2026-11-22

The root of the ``sa_jobs_core`` branch. The feature branches (unique, sequence,
job_key) are roots of their own that depend on this revision.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "sajobs_core_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sa_jobs_core",)
depends_on: str | Sequence[str] | None = None

STATES = (
    "available",
    "scheduled",
    "pending",
    "running",
    "retryable",
    "completed",
    "cancelled",
    "discarded",
)

# One notification per queue per statement, only for jobs that are due now; PostgreSQL
# folds identical notifications inside one transaction, so workers hear each queue once
# per transaction. A statement-level trigger covers every insert path, raw SQL included.
NOTIFY_FUNCTION = """
CREATE FUNCTION sa_job_notify_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sa_jobs_insert', queues.queue)
    FROM (SELECT DISTINCT queue FROM sa_job_new_rows WHERE state = 'available') AS queues;
    RETURN NULL;
END;
$$
"""

NOTIFY_TRIGGER = """
CREATE TRIGGER sa_job_notify_insert
AFTER INSERT ON sa_job
REFERENCING NEW TABLE AS sa_job_new_rows
FOR EACH STATEMENT EXECUTE FUNCTION sa_job_notify_insert()
"""


# Every name is wrapped in op.f() ("final"): Alembic applies the naming convention of the
# env's target_metadata to the names given here, and sa_jobs.metadata's convention would
# turn name="sa_job_priority_check" into "sa_job_sa_job_priority_check_check" (an app's
# own convention would make yet another name). op.f() keeps the names the models expect,
# whichever env runs this script.


def upgrade() -> None:
    state_type = postgresql.ENUM(*STATES, name="sa_job_state", create_type=False)
    state_type.create(op.get_bind())
    op.create_table(
        "sa_job",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column(
            "args", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False
        ),
        sa.Column(
            "state", state_type, server_default=sa.text("'available'::sa_job_state"), nullable=False
        ),
        sa.Column("queue", sa.Text(), server_default=sa.text("'default'::text"), nullable=False),
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column("attempt", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.SmallInteger(), server_default=sa.text("25"), nullable=False),
        sa.Column(
            "errors", postgresql.JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False
        ),
        sa.Column(
            "metadata", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False
        ),
        sa.Column(
            "tags",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{}'::text[]"),
            nullable=False,
        ),
        sa.Column(
            "scheduled_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("attempted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempted_by", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("finalized_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("sa_job_pkey")),
        sa.CheckConstraint("priority BETWEEN 1 AND 4", name=op.f("sa_job_priority_check")),
        sa.CheckConstraint("max_attempts > 0", name=op.f("sa_job_max_attempts_check")),
        sa.CheckConstraint("attempt >= 0", name=op.f("sa_job_attempt_check")),
        sa.CheckConstraint(
            "char_length(kind) BETWEEN 1 AND 128", name=op.f("sa_job_kind_length_check")
        ),
        sa.CheckConstraint(
            "char_length(queue) BETWEEN 1 AND 128", name=op.f("sa_job_queue_length_check")
        ),
        sa.CheckConstraint("cardinality(tags) <= 64", name=op.f("sa_job_tags_count_check")),
        sa.CheckConstraint(
            "jsonb_typeof(args) IN ('object', 'array')", name=op.f("sa_job_args_type_check")
        ),
        sa.CheckConstraint(
            "jsonb_typeof(metadata) = 'object'", name=op.f("sa_job_metadata_type_check")
        ),
        sa.CheckConstraint("jsonb_typeof(errors) = 'array'", name=op.f("sa_job_errors_type_check")),
        sa.CheckConstraint(
            "(state IN ('cancelled', 'completed', 'discarded')) = (finalized_at IS NOT NULL)",
            name=op.f("sa_job_finalized_iff_final_check"),
        ),
    )
    op.create_index(
        op.f("sa_job_fetch_idx"),
        "sa_job",
        ["queue", "priority", "scheduled_at", "id"],
        postgresql_where=sa.text("state IN ('available')"),
    )
    op.create_index(
        op.f("sa_job_due_idx"),
        "sa_job",
        ["scheduled_at"],
        postgresql_where=sa.text("state IN ('scheduled', 'retryable')"),
    )
    op.create_index(
        op.f("sa_job_running_idx"),
        "sa_job",
        ["attempted_at"],
        postgresql_where=sa.text("state IN ('running')"),
    )
    op.create_index(
        op.f("sa_job_finalized_idx"),
        "sa_job",
        ["state", "finalized_at"],
        postgresql_where=sa.text("finalized_at IS NOT NULL"),
    )
    op.execute(NOTIFY_FUNCTION)
    op.execute(NOTIFY_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER sa_job_notify_insert ON sa_job")
    op.execute("DROP FUNCTION sa_job_notify_insert()")
    op.drop_table("sa_job")
    postgresql.ENUM(name="sa_job_state").drop(op.get_bind())
