"""vLLM samples carry LMCache's figures when the server runs LMCache's connector: retrieve and
store requests and tokens per second, the retrieve and lookup hit ratios, the local cache's bytes
and the mean retrieve and store times.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08 00:40:00.000000
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: Union[str, None] = "0014"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_COLUMNS = (
    "lmcache_retrieve_requests_per_second",
    "lmcache_store_requests_per_second",
    "lmcache_hit_tokens_per_second",
    "lmcache_stored_tokens_per_second",
    "lmcache_retrieve_hit_ratio",
    "lmcache_lookup_hit_ratio",
    "lmcache_local_cache_usage_bytes",
    "lmcache_retrieve_mean_seconds",
    "lmcache_store_mean_seconds",
)


def upgrade() -> None:
    with op.batch_alter_table("vllm_samples", schema=None) as batch_op:
        for col in _COLUMNS:
            batch_op.add_column(sa.Column(col, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("vllm_samples", schema=None) as batch_op:
        for col in reversed(_COLUMNS):
            batch_op.drop_column(col)
