"""sa_jobs workflow: workflows (DAGs of jobs) and batches with callbacks.

Revision ID: sajobs_workflow_0001
Revises:
Depends on: sajobs_core_0001
Create Date: 2026-11-28

The root of the ``sa_jobs_workflow`` branch. A step is a job row with a
``workflow_id``; ``workflow_deps`` counts its unresolved dependencies (the completion
that brings it to 0 releases the step). ``sa_job_dep`` holds the edges, indexed both
ways; ``sa_job_workflow`` holds each workflow's counters (``unfinished`` reaching 0 is
when callbacks fire) and its callback jobs. The three ``sa_job`` columns are nullable
without a default, so adding them rewrites nothing, and plain jobs keep them NULL. No
foreign keys: one on ``sa_job.workflow_id`` would queue a trigger event per inserted job,
workflow or not, and one on the edges a check per deleted job (the cleaner's deletes).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_workflow_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sa_jobs_workflow",)
depends_on: str | Sequence[str] | None = "sajobs_core_0001"


def upgrade() -> None:
    op.add_column("sa_job", sa.Column("workflow_id", sa.BigInteger(), nullable=True))
    op.add_column("sa_job", sa.Column("workflow_step", sa.Text(), nullable=True))
    op.add_column("sa_job", sa.Column("workflow_deps", sa.Integer(), nullable=True))
    # One step per name in a workflow; also how output_of() and workflow_status() find
    # a workflow's steps. Partial: plain jobs are not in it.
    op.create_index(
        op.f("sa_job_workflow_id_idx"),
        "sa_job",
        ["workflow_id", "workflow_step"],
        unique=True,
        postgresql_where=sa.text("workflow_id IS NOT NULL"),
    )
    op.create_table(
        "sa_job_workflow",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("on_dependency_failure", sa.Text(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("unfinished", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("on_success_job_id", sa.BigInteger(), nullable=True),
        sa.Column("on_complete_job_id", sa.BigInteger(), nullable=True),
        sa.Column("on_failure_job_id", sa.BigInteger(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "on_dependency_failure IN ('cancel', 'run')",
            name=op.f("sa_job_workflow_on_dependency_failure_check"),
        ),
        sa.CheckConstraint(
            "unfinished >= 0 AND failed >= 0 AND unfinished <= total",
            name=op.f("sa_job_workflow_counters_check"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("sa_job_workflow_pkey")),
    )
    op.create_table(
        "sa_job_dep",
        sa.Column("depends_on_id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("workflow_id", sa.BigInteger(), nullable=False),
        sa.Column("resolved", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("run_on_failure", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("depends_on_id", "job_id", name=op.f("sa_job_dep_pkey")),
    )
    op.create_index(op.f("sa_job_dep_job_id_idx"), "sa_job_dep", ["job_id", "depends_on_id"])


def downgrade() -> None:
    op.drop_index(op.f("sa_job_dep_job_id_idx"), table_name="sa_job_dep")
    op.drop_table("sa_job_dep")
    op.drop_table("sa_job_workflow")
    op.drop_index(op.f("sa_job_workflow_id_idx"), table_name="sa_job")
    op.drop_column("sa_job", "workflow_deps")
    op.drop_column("sa_job", "workflow_step")
    op.drop_column("sa_job", "workflow_id")
