"""HBM memory temperature (``memory_temperature_celsius``): a column per tick and its minute rollups.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 04:00:00
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: Union[str, None] = "0004"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_ROLLUPS = ("min", "mean", "max")


def upgrade() -> None:
    # Plain ADD COLUMN: a nullable column needs no table rebuild on SQLite, and on Postgres it
    # reaches every day partition through the partitioned parent.
    op.add_column("gpu_samples", sa.Column("memory_temperature_celsius", sa.BigInteger(), nullable=True))
    for agg in _ROLLUPS:
        op.add_column("gpu_samples_1m", sa.Column(f"memory_temperature_celsius_{agg}", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpu_samples_1m") as batch:
        for agg in _ROLLUPS:
            batch.drop_column(f"memory_temperature_celsius_{agg}")
    with op.batch_alter_table("gpu_samples") as batch:
        batch.drop_column("memory_temperature_celsius")
