"""vLLM samples carry the KV-offload traffic by direction (bytes per second loaded into and stored
from the GPU) and the speculative-decoding acceptance ratio.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 15:30:00.000000
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: Union[str, None] = "0012"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table("vllm_samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kv_offload_load_bytes_per_second", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("kv_offload_store_bytes_per_second", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("spec_decode_acceptance_ratio", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("vllm_samples", schema=None) as batch_op:
        batch_op.drop_column("spec_decode_acceptance_ratio")
        batch_op.drop_column("kv_offload_store_bytes_per_second")
        batch_op.drop_column("kv_offload_load_bytes_per_second")
