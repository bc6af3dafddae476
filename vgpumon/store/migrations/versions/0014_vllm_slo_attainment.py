"""vLLM samples carry the server's SLO attainment over the window: per histogram (TTFT, inter-token
latency) the share within its target, the observations it was computed from, and whether the
target lay between bucket bounds (interpolated).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 15:30:00.000000
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: Union[str, None] = "0013"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_COLUMNS = ("attainment_ratio", "observations", "interpolated")


def upgrade() -> None:
    with op.batch_alter_table("vllm_samples", schema=None) as batch_op:
        for key in ("ttft", "itl"):
            batch_op.add_column(sa.Column(f"{key}_slo_attainment_ratio", sa.BigInteger(), nullable=True))
            batch_op.add_column(sa.Column(f"{key}_slo_observations", sa.BigInteger(), nullable=True))
            batch_op.add_column(sa.Column(f"{key}_slo_interpolated", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("vllm_samples", schema=None) as batch_op:
        for key in ("itl", "ttft"):
            for col in reversed(_COLUMNS):
                batch_op.drop_column(f"{key}_slo_{col}")
