"""The audit log: every input the core decided on and every decision, hash-chained, and its
signed checkpoints (crater.scheduler.audit).

Revision ID: 0008
Revises: 0007
Create Date: 2027-03-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "scheduler_audit_log",
        sa.Column("seq", SEQ, primary_key=True, autoincrement=False),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("decided_at", sa.String(40), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(63), nullable=False),
        sa.Column("input", sa.Text(), nullable=False),
        sa.Column("decisions", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.create_index(
        "ix_scheduler_audit_log_decided_at", "scheduler_audit_log", ["decided_at"]
    )
    op.create_table(
        "scheduler_audit_checkpoints",
        sa.Column("seq", SEQ, primary_key=True, autoincrement=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("signed_at", sa.String(40), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("signature", sa.String(128), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_audit_checkpoints")
    op.drop_index("ix_scheduler_audit_log_decided_at", "scheduler_audit_log")
    op.drop_table("scheduler_audit_log")
