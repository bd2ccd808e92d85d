"""sa_jobs refs: find the jobs that reference a row (``sa_jobs.jobs_for``) through an index.

Revision ID: sajobs_refs_0001
Revises:
Depends on: sajobs_core_0001
Create Date: 2026-11-28

The root of the ``sa_jobs_refs`` branch. ``sa_job_refs(args)`` lists the references a
job's args hold (every JSON object with a string ``table`` and an array ``pk``, at any
depth) as ``table:pk`` texts, the pk in jsonb's canonical text. A GIN index on it,
partial so that jobs without references add no index entry and cost no call of the
function, answers "which jobs reference invoice 7" without scanning the job table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "sajobs_refs_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("sa_jobs_refs",)
depends_on: str | Sequence[str] | None = "sajobs_core_0001"

FUNCTION = """
CREATE FUNCTION sa_job_refs(args jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT coalesce(array_agg(DISTINCT (item ->> 'table') || ':' || (item -> 'pk')::text), '{}')
  FROM jsonb_path_query(args, 'strict $.**') AS item
  WHERE jsonb_typeof(item) = 'object'
    AND jsonb_typeof(item -> 'table') = 'string'
    AND jsonb_typeof(item -> 'pk') = 'array'
$$
"""


def upgrade() -> None:
    op.execute(FUNCTION)
    op.create_index(
        "sa_job_refs_idx",
        "sa_job",
        [sa.text("sa_job_refs(args)")],
        postgresql_using="gin",
        # Not "sa_job_refs(args) <> '{}'": that runs the function on every insert (it
        # doubled a plain insert's cost); a substring test of jsonb's text does not.
        postgresql_where=sa.text("""strpos(args::text, '"pk": [') > 0"""),
    )


def downgrade() -> None:
    op.drop_index("sa_job_refs_idx", table_name="sa_job")
    op.execute("DROP FUNCTION sa_job_refs(jsonb)")
