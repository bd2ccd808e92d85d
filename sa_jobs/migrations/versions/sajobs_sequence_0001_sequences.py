"""sa_jobs sequence: sequence key and slot columns, the slot index, the pending index.

Revision ID: sajobs_sequence_0001
Revises:
Depends on: sajobs_core_0001
Create Date: 2026-11-22

The root of the ``sa_jobs_sequence`` branch. A sequence's one slot is held by its
active job (or by the cancelled/discarded job that halted it); the unique index admits
one holder per key, and the CHECK makes every active sequence job a holder, so at most
one job of a sequence is ever active.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_sequence_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sa_jobs_sequence",)
depends_on: str | Sequence[str] | None = "sajobs_core_0001"


def upgrade() -> None:
    op.add_column("sa_job", sa.Column("sequence_key", sa.LargeBinary(), nullable=True))
    for name in (
        "sequence_slot",
        "sequence_continue_on_cancelled",
        "sequence_continue_on_discarded",
    ):
        op.add_column(
            "sa_job",
            sa.Column(name, sa.Boolean(), server_default=sa.text("false"), nullable=False),
        )
    op.create_check_constraint(
        op.f("sa_job_sequence_active_holds_slot_check"),
        "sa_job",
        "sequence_key IS NULL OR sequence_slot OR state NOT IN "
        "('available', 'running', 'retryable', 'scheduled')",
    )
    op.create_index(
        op.f("sa_job_sequence_slot_idx"),
        "sa_job",
        ["sequence_key"],
        unique=True,
        postgresql_where=sa.text("sequence_key IS NOT NULL AND sequence_slot"),
    )
    op.create_index(
        op.f("sa_job_sequence_pending_idx"),
        "sa_job",
        ["sequence_key", "id"],
        postgresql_where=sa.text("sequence_key IS NOT NULL AND state = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index(op.f("sa_job_sequence_pending_idx"), table_name="sa_job")
    op.drop_index(op.f("sa_job_sequence_slot_idx"), table_name="sa_job")
    op.drop_constraint(op.f("sa_job_sequence_active_holds_slot_check"), "sa_job", type_="check")
    for name in (
        "sequence_continue_on_discarded",
        "sequence_continue_on_cancelled",
        "sequence_slot",
    ):
        op.drop_column("sa_job", name)
    op.drop_column("sa_job", "sequence_key")
