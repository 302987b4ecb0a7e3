"""Time limits: an allocation told to stop because it held its grant for its time limit
(max_run_seconds), so that a restarted scheduler releases it as `time-limit`, not as a
preemption, and does not count it among recent victims.

Revision ID: 0012
Revises: 0011
Create Date: 2027-03-30 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_allocations") as batch:
        # null or false: not told to stop for its time limit (yield_by, if set, is a preemption)
        batch.add_column(sa.Column("time_limited", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_allocations") as batch:
        batch.drop_column("time_limited")
