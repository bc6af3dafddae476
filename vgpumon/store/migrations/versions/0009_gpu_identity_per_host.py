"""A GPU's identity is (host, UUID), not its UUID alone.

Two hosts whose GPUs report the same UUID (masked captures, cloned VM images, a card moved to
another host) used to share one ``gpus`` row and so exchange history. Each host now keeps its
own row per card. The unique ``(host_id, uuid)`` constraint also serves lookups by host, so the
separate ``host_id`` index goes. Existing rows already satisfy the new constraint (UUIDs were
unique).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 02:14:13.515966
"""

from __future__ import annotations

from typing import Sequence, Union

from alembic import op

revision: str = "0009"
down_revision: Union[str, None] = "0008"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gpus_host_id'))
        batch_op.drop_constraint(batch_op.f('uq_gpus_uuid'), type_='unique')
        batch_op.create_unique_constraint(batch_op.f('uq_gpus_host_id'), ['host_id', 'uuid'])


def downgrade() -> None:
    # Fails where two hosts hold the same UUID: their histories cannot share one row again.
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('uq_gpus_host_id'), type_='unique')
        batch_op.create_unique_constraint(batch_op.f('uq_gpus_uuid'), ['uuid'])
        batch_op.create_index(batch_op.f('ix_gpus_host_id'), ['host_id'], unique=False)
