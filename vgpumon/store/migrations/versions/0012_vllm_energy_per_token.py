"""vLLM samples carry the server's energy per generated token (its GPUs' energy over the newest
interval between two energy reads, divided by its generation tokens), that energy, and why there
is no figure.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 21:45:00.000000
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: Union[str, None] = "0011"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("vllm_samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("energy_per_token_joules", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("energy_interval_joules", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("energy_per_token_note", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("vllm_samples", schema=None) as batch_op:
        batch_op.drop_column("energy_per_token_note")
        batch_op.drop_column("energy_interval_joules")
        batch_op.drop_column("energy_per_token_joules")
