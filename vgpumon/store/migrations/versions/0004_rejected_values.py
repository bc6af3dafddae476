"""Values rejected at the door: one row per subject (GPU, host, vLLM server), field and tick.

Range-partitioned on ``ts`` on Postgres like the other time tables; pruned with the raw window.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 03:00:00
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: Union[str, None] = "0003"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "rejected_values",
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.BigInteger(), nullable=False),
        sa.Column("subject", sa.String(length=160), nullable=False),
        sa.Column("field", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.String(length=255), nullable=False),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name=op.f("fk_rejected_values_host_id_hosts")),
        sa.PrimaryKeyConstraint("host_id", "ts", "subject", "field", name=op.f("pk_rejected_values")),
        sqlite_with_rowid=False,
        postgresql_partition_by="RANGE (ts)",
    )


def downgrade() -> None:
    op.drop_table("rejected_values")
