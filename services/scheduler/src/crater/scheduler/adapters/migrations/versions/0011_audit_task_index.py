"""The audit log's task index: the tasks each record is about, so that explain reads a
task's records rather than the whole log (crater.scheduler.audit.task_ids). Not part of the
hash chain. Records written before this migration are not indexed here (their
`tasks_indexed` stays NULL): explain scans them until `crater audit index` fills it in, in
small transactions, online (docs/audit.md).

Revision ID: 0011
Revises: 0010
Create Date: 2027-03-16 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UNINDEXED = sa.text("tasks_indexed IS NULL")


def upgrade() -> None:
    # NULL for every record already there: no rewrite of the log, and no backfill holding
    # the table while a running (older) leader waits to commit.
    op.add_column("scheduler_audit_log", sa.Column("tasks_indexed", sa.Boolean(), nullable=True))
    op.create_index(
        "ix_scheduler_audit_log_unindexed",
        "scheduler_audit_log",
        ["seq"],
        postgresql_where=UNINDEXED,
        sqlite_where=UNINDEXED,
    )
    op.create_table(
        "scheduler_audit_tasks",
        sa.Column("task_id", sa.String(256), primary_key=True),
        sa.Column("seq", SEQ, primary_key=True, autoincrement=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_audit_tasks")
    op.drop_index("ix_scheduler_audit_log_unindexed", "scheduler_audit_log")
    with op.batch_alter_table("scheduler_audit_log") as batch:
        batch.drop_column("tasks_indexed")
