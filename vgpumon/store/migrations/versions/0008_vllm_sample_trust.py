"""vLLM samples say how far they can be trusted: the state's reason, why /metrics failed, partial
telemetry (lines dropped) and latency histograms whose quantiles cannot be true.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 03:10:00.000000
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: Union[str, None] = "0007"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('vllm_samples', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reason', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('metrics_error', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('telemetry', sa.SmallInteger(), nullable=True))
        batch_op.add_column(sa.Column('metric_lines_dropped', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('latency_unreliable', sa.SmallInteger(), nullable=True))
        batch_op.add_column(sa.Column('latency_unreliable_reason', sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('vllm_samples', schema=None) as batch_op:
        batch_op.drop_column('latency_unreliable_reason')
        batch_op.drop_column('latency_unreliable')
        batch_op.drop_column('metric_lines_dropped')
        batch_op.drop_column('telemetry')
        batch_op.drop_column('metrics_error')
        batch_op.drop_column('reason')
