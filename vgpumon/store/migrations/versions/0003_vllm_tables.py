"""vLLM servers: instances (one row per start), per-poll samples, per-engine samples, GPU map.

The two sample tables are range-partitioned on ``ts`` on Postgres, like the other time tables.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 02:09:46.481174
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: Union[str, None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('vllm_instances',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('host_id', sa.Integer(), nullable=False),
    sa.Column('address', sa.String(length=255), nullable=False),
    sa.Column('port', sa.Integer(), nullable=False),
    sa.Column('url', sa.String(length=512), nullable=False),
    sa.Column('origin', sa.String(length=16), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('process_start', sa.BigInteger(), nullable=True),
    sa.Column('first_seen', sa.BigInteger(), nullable=False),
    sa.Column('last_seen', sa.BigInteger(), nullable=False),
    sa.Column('version', sa.String(length=64), nullable=True),
    sa.Column('model', sa.String(length=1024), nullable=True),
    sa.Column('first_connect', sa.BigInteger(), nullable=True),
    sa.Column('ready', sa.BigInteger(), nullable=True),
    sa.Column('prewarm_seconds', sa.BigInteger(), nullable=True),
    sa.Column('prewarm_gpu_active_ratio', sa.BigInteger(), nullable=True),
    sa.Column('prewarm_gpu_activity_source', sa.String(length=16), nullable=True),
    sa.Column('ended', sa.BigInteger(), nullable=True),
    sa.Column('final_state', sa.SmallInteger(), nullable=True),
    sa.ForeignKeyConstraint(['host_id'], ['hosts.id'], name=op.f('fk_vllm_instances_host_id_hosts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_vllm_instances')),
    sa.UniqueConstraint('host_id', 'port', 'pid', 'process_start', 'first_seen', name='identity')
    )
    with op.batch_alter_table('vllm_instances', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_vllm_instances_host_id'), ['host_id'], unique=False)

    op.create_table('vllm_engine_samples',
    sa.Column('instance_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.BigInteger(), nullable=False),
    sa.Column('model_name', sa.String(length=255), nullable=False),
    sa.Column('engine', sa.String(length=32), nullable=False),
    sa.Column('running', sa.BigInteger(), nullable=True),
    sa.Column('waiting', sa.BigInteger(), nullable=True),
    sa.Column('kv_cache_usage_ratio', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['instance_id'], ['vllm_instances.id'], name=op.f('fk_vllm_engine_samples_instance_id_vllm_instances')),
    sa.PrimaryKeyConstraint('instance_id', 'ts', 'model_name', 'engine', name=op.f('pk_vllm_engine_samples')),
    postgresql_partition_by='RANGE (ts)',
    sqlite_with_rowid=False
    )
    op.create_table('vllm_gpu_map',
    sa.Column('instance_id', sa.Integer(), nullable=False),
    sa.Column('gpu_uuid', sa.String(length=64), nullable=False),
    sa.Column('first_seen', sa.BigInteger(), nullable=False),
    sa.Column('last_seen', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['instance_id'], ['vllm_instances.id'], name=op.f('fk_vllm_gpu_map_instance_id_vllm_instances')),
    sa.PrimaryKeyConstraint('instance_id', 'gpu_uuid', name=op.f('pk_vllm_gpu_map'))
    )
    op.create_table('vllm_samples',
    sa.Column('instance_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.SmallInteger(), nullable=False),
    sa.Column('health_status', sa.SmallInteger(), nullable=True),
    sa.Column('telemetry_up', sa.Boolean(), nullable=True),
    sa.Column('running', sa.BigInteger(), nullable=True),
    sa.Column('waiting', sa.BigInteger(), nullable=True),
    sa.Column('kv_cache_usage_ratio', sa.BigInteger(), nullable=True),
    sa.Column('kv_cache_usage_mean_ratio', sa.BigInteger(), nullable=True),
    sa.Column('prompt_tokens_per_second', sa.BigInteger(), nullable=True),
    sa.Column('generation_tokens_per_second', sa.BigInteger(), nullable=True),
    sa.Column('preemptions_per_second', sa.BigInteger(), nullable=True),
    sa.Column('requests_finished_per_second', sa.BigInteger(), nullable=True),
    sa.Column('prefix_cache_hit_ratio', sa.BigInteger(), nullable=True),
    sa.Column('prefix_cache_unit', sa.SmallInteger(), nullable=True),
    sa.Column('ttft_p50_seconds', sa.BigInteger(), nullable=True),
    sa.Column('ttft_p95_seconds', sa.BigInteger(), nullable=True),
    sa.Column('ttft_p99_seconds', sa.BigInteger(), nullable=True),
    sa.Column('itl_p50_seconds', sa.BigInteger(), nullable=True),
    sa.Column('itl_p95_seconds', sa.BigInteger(), nullable=True),
    sa.Column('itl_p99_seconds', sa.BigInteger(), nullable=True),
    sa.Column('e2e_p50_seconds', sa.BigInteger(), nullable=True),
    sa.Column('e2e_p95_seconds', sa.BigInteger(), nullable=True),
    sa.Column('e2e_p99_seconds', sa.BigInteger(), nullable=True),
    sa.Column('queue_p50_seconds', sa.BigInteger(), nullable=True),
    sa.Column('queue_p95_seconds', sa.BigInteger(), nullable=True),
    sa.Column('queue_p99_seconds', sa.BigInteger(), nullable=True),
    sa.Column('kv_block_size', sa.Integer(), nullable=True),
    sa.Column('kv_num_gpu_blocks', sa.BigInteger(), nullable=True),
    sa.Column('kv_cache_size_tokens', sa.BigInteger(), nullable=True),
    sa.Column('kv_blocks_used', sa.BigInteger(), nullable=True),
    sa.Column('kv_fragmentation_ratio', sa.BigInteger(), nullable=True),
    sa.Column('kv_token_occupancy_ratio', sa.BigInteger(), nullable=True),
    sa.Column('kv_estimate_approximate', sa.Boolean(), nullable=True),
    sa.Column('gauges_stale', sa.Boolean(), nullable=False),
    sa.Column('sleep_state', sa.String(length=32), nullable=True),
    sa.Column('server_load', sa.BigInteger(), nullable=True),
    sa.Column('rss_bytes', sa.BigInteger(), nullable=True),
    sa.Column('cpu_seconds_per_second', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['instance_id'], ['vllm_instances.id'], name=op.f('fk_vllm_samples_instance_id_vllm_instances')),
    sa.PrimaryKeyConstraint('instance_id', 'ts', name=op.f('pk_vllm_samples')),
    postgresql_partition_by='RANGE (ts)',
    sqlite_with_rowid=False
    )


def downgrade() -> None:
    op.drop_table('vllm_samples')
    op.drop_table('vllm_gpu_map')
    op.drop_table('vllm_engine_samples')
    with op.batch_alter_table('vllm_instances', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_vllm_instances_host_id'))

    op.drop_table('vllm_instances')
