"""Each delivery's body format (alldata, crater), fixed when it is recorded, so every attempt
POSTs the same bytes. Deliveries recorded before were POSTed as Crater's typed body: they
keep that format (the server default), so a retry or replay of one sends what it sent.

Revision ID: 0006
Revises: 0005
Create Date: 2027-01-10 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "callback_deliveries"


def upgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.add_column(
            sa.Column("format", sa.String(16), nullable=False, server_default="crater")
        )


def downgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_column("format")
