"""Each GPU's own slowdown temperature (``gpus.slowdown_temperature_celsius``), read once at start.

The thermal rule compares the GPU's temperature with this threshold instead of a fixed 85 °C,
which pages daily on SKUs that run hot (FACTS §7).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 06:00:00
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: Union[str, None] = "0009"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    # Plain ADD COLUMN: nullable, so no table rebuild on SQLite.
    op.add_column("gpus", sa.Column("slowdown_temperature_celsius", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpus") as batch:
        batch.drop_column("slowdown_temperature_celsius")
