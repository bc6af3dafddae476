"""Host events: GPUs appearing, going and coming back, NVML re-initialisations, memory-API
changes, wall-clock steps.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 05:00:00
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: Union[str, None] = "0005"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "host_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("subject", sa.String(length=160), nullable=False),
        sa.Column("detail", sa.String(length=255), nullable=False),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name=op.f("fk_host_events_host_id_hosts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_host_events")),
        sa.UniqueConstraint("host_id", "ts", "kind", "subject", name=op.f("uq_host_events_host_id")),
    )
    with op.batch_alter_table("host_events") as batch:
        batch.create_index(batch.f("ix_host_events_host_id"), ["host_id"], unique=False)


def downgrade() -> None:
    op.drop_table("host_events")
