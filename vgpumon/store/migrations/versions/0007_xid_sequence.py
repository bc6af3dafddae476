"""XID events keep their per-GPU sequence number: three XID 31 on one GPU in one millisecond are
three rows (unique on GPU, time, code and sequence), and a replayed spool still stores each once.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 06:00:00
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: Union[str, None] = "0006"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("xid_events") as batch:
        batch.add_column(sa.Column("seq", sa.Integer(), server_default="0", nullable=False))
        batch.drop_constraint("uq_xid_events_gpu_id", type_="unique")
        batch.create_unique_constraint("uq_xid_events_gpu_id", ["gpu_id", "ts", "xid", "seq"])


def downgrade() -> None:
    with op.batch_alter_table("xid_events") as batch:
        batch.drop_constraint("uq_xid_events_gpu_id", type_="unique")
        batch.create_unique_constraint("uq_xid_events_gpu_id", ["gpu_id", "ts", "xid"])
        batch.drop_column("seq")
