"""The leader's fence: one row holding the epoch of the scheduler allowed to commit; a
deposed leader's transactions find a higher epoch there and are refused.

Revision ID: 0007
Revises: 0006
Create Date: 2027-02-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scheduler_leadership",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_leadership")
