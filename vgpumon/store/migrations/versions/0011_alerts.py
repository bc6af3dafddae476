"""Alerts: one row per episode of one rule on one subject (pending → firing → resolved).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 06:30:00
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: Union[str, None] = "0010"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("fingerprint", sa.String(length=40), nullable=False),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("active_since", sa.BigInteger(), nullable=False),
        sa.Column("fired_at", sa.BigInteger(), nullable=True),
        sa.Column("resolved_at", sa.BigInteger(), nullable=True),
        sa.Column("last_eval", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("summary", sa.String(length=255), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name=op.f("fk_alerts_host_id_hosts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("host_id", "fingerprint", "active_since", name=op.f("uq_alerts_host_id")),
    )
    op.create_index("ix_alerts_host_id_state", "alerts", ["host_id", "state"])


def downgrade() -> None:
    op.drop_index("ix_alerts_host_id_state", table_name="alerts")
    op.drop_table("alerts")
