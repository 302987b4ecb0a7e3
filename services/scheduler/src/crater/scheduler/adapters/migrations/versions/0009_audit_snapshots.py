"""Snapshots of the scheduling core's state for the audit log: a replay starts from the one
at or before --from instead of the log's beginning (crater.scheduler.audit_state). Their
digests are in chained audit records; the bytes live here.

Revision ID: 0009
Revises: 0008
Create Date: 2027-03-09 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "scheduler_audit_snapshots",
        sa.Column("seq", SEQ, primary_key=True, autoincrement=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_audit_snapshots")
