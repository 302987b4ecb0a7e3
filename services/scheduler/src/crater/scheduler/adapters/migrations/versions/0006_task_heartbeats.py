"""A launcher's heartbeat grace per allocation: set when the launcher confirmed it with its
reservation token, so a restarted scheduler still fails the task when its heartbeats stop.

Revision ID: 0006
Revises: 0005
Create Date: 2027-01-20 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_allocations") as batch:
        # null: no launcher confirmed it with the token (not held to heartbeats)
        batch.add_column(sa.Column("heartbeat_grace_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_allocations") as batch:
        batch.drop_column("heartbeat_grace_seconds")
