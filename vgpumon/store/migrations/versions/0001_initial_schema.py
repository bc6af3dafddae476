"""Initial schema: hosts, GPUs, wide GPU samples, host samples, processes, XIDs, PCIe links.

The schema the store had before migrations existed (``create_all``); stores created then are
stamped at this revision. Time tables are range-partitioned on ``ts`` on Postgres (one partition
per day, created by ``vgpumon.store.partitions``).

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 01:46:18.937989
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = '0001'
down_revision: Union[str, None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('hosts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('hostname', sa.String(length=255), nullable=False),
    sa.Column('first_seen', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_hosts')),
    sa.UniqueConstraint('hostname', name=op.f('uq_hosts_hostname'))
    )
    op.create_table('gpus',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=64), nullable=False),
    sa.Column('host_id', sa.Integer(), nullable=False),
    sa.Column('index', sa.SmallInteger(), nullable=False),
    sa.Column('name', sa.String(length=96), nullable=True),
    sa.Column('serial', sa.String(length=64), nullable=True),
    sa.Column('pci_bus_id', sa.String(length=32), nullable=True),
    sa.Column('memory_total_bytes', sa.BigInteger(), nullable=True),
    sa.Column('pcie_link_gen_max', sa.SmallInteger(), nullable=True),
    sa.Column('pcie_link_width_max', sa.SmallInteger(), nullable=True),
    sa.Column('pcie_link_gen_gpu_max', sa.SmallInteger(), nullable=True),
    sa.Column('gpm_supported', sa.Boolean(), nullable=False),
    sa.Column('sm_clock_max_hertz', sa.BigInteger(), nullable=True),
    sa.Column('memory_clock_max_hertz', sa.BigInteger(), nullable=True),
    sa.Column('first_seen', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['host_id'], ['hosts.id'], name=op.f('fk_gpus_host_id_hosts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_gpus')),
    sa.UniqueConstraint('uuid', name=op.f('uq_gpus_uuid'))
    )
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_gpus_host_id'), ['host_id'], unique=False)

    op.create_table('host_samples',
    sa.Column('host_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.BigInteger(), nullable=False),
    sa.Column('cpu_ratio', sa.BigInteger(), nullable=True),
    sa.Column('memory_used_bytes', sa.BigInteger(), nullable=True),
    sa.Column('memory_total_bytes', sa.BigInteger(), nullable=True),
    sa.Column('load1', sa.BigInteger(), nullable=True),
    sa.Column('load5', sa.BigInteger(), nullable=True),
    sa.Column('load15', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['host_id'], ['hosts.id'], name=op.f('fk_host_samples_host_id_hosts')),
    sa.PrimaryKeyConstraint('host_id', 'ts', name=op.f('pk_host_samples')),
    postgresql_partition_by='RANGE (ts)',
    sqlite_with_rowid=False
    )
    op.create_table('processes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('host_id', sa.Integer(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('start_time', sa.BigInteger(), nullable=True),
    sa.Column('name', sa.String(length=255), nullable=True),
    sa.Column('cmdline', sa.Text(), nullable=True),
    sa.Column('username', sa.String(length=255), nullable=True),
    sa.Column('container_id', sa.String(length=128), nullable=True),
    sa.Column('resolved', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['host_id'], ['hosts.id'], name=op.f('fk_processes_host_id_hosts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_processes')),
    sa.UniqueConstraint('host_id', 'pid', 'start_time', name=op.f('uq_processes_host_id'))
    )
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_processes_host_id'), ['host_id'], unique=False)

    op.create_table('gpu_process_samples',
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.BigInteger(), nullable=False),
    sa.Column('process_id', sa.Integer(), nullable=False),
    sa.Column('used_gpu_memory_bytes', sa.BigInteger(), nullable=True),
    sa.Column('rss_bytes', sa.BigInteger(), nullable=True),
    sa.Column('cpu_seconds_total', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], name=op.f('fk_gpu_process_samples_gpu_id_gpus')),
    sa.ForeignKeyConstraint(['process_id'], ['processes.id'], name=op.f('fk_gpu_process_samples_process_id_processes')),
    sa.PrimaryKeyConstraint('gpu_id', 'ts', 'process_id', name=op.f('pk_gpu_process_samples')),
    postgresql_partition_by='RANGE (ts)',
    sqlite_with_rowid=False
    )
    op.create_table('gpu_samples',
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.BigInteger(), nullable=False),
    sa.Column('up', sa.Boolean(), nullable=False),
    sa.Column('activity_source', sa.SmallInteger(), nullable=True),
    sa.Column('memory_used_bytes', sa.BigInteger(), nullable=True),
    sa.Column('memory_reserved_bytes', sa.BigInteger(), nullable=True),
    sa.Column('memory_total_bytes', sa.BigInteger(), nullable=True),
    sa.Column('utilization_gpu_ratio', sa.BigInteger(), nullable=True),
    sa.Column('utilization_memory_ratio', sa.BigInteger(), nullable=True),
    sa.Column('sm_active_ratio', sa.BigInteger(), nullable=True),
    sa.Column('sm_occupancy_ratio', sa.BigInteger(), nullable=True),
    sa.Column('tensor_active_ratio', sa.BigInteger(), nullable=True),
    sa.Column('dram_active_ratio', sa.BigInteger(), nullable=True),
    sa.Column('pcie_tx_bytes_per_second', sa.BigInteger(), nullable=True),
    sa.Column('pcie_rx_bytes_per_second', sa.BigInteger(), nullable=True),
    sa.Column('pcie_link_gen_current', sa.SmallInteger(), nullable=True),
    sa.Column('pcie_link_width_current', sa.SmallInteger(), nullable=True),
    sa.Column('temperature_celsius', sa.BigInteger(), nullable=True),
    sa.Column('power_watts', sa.BigInteger(), nullable=True),
    sa.Column('sm_clock_hertz', sa.BigInteger(), nullable=True),
    sa.Column('memory_clock_hertz', sa.BigInteger(), nullable=True),
    sa.Column('clocks_event_reasons', sa.BigInteger(), nullable=True),
    sa.Column('ecc_corrected_volatile_total', sa.BigInteger(), nullable=True),
    sa.Column('ecc_uncorrected_volatile_total', sa.BigInteger(), nullable=True),
    sa.Column('ecc_corrected_aggregate_total', sa.BigInteger(), nullable=True),
    sa.Column('ecc_uncorrected_aggregate_total', sa.BigInteger(), nullable=True),
    sa.Column('energy_joules_total', sa.BigInteger(), nullable=True),
    sa.Column('performance_state', sa.SmallInteger(), nullable=True),
    sa.Column('fan_speed_ratio', sa.BigInteger(), nullable=True),
    sa.Column('ecc_corrected_volatile_dram_total', sa.BigInteger(), nullable=True),
    sa.Column('ecc_uncorrected_volatile_dram_total', sa.BigInteger(), nullable=True),
    sa.Column('ecc_corrected_volatile_sram_total', sa.BigInteger(), nullable=True),
    sa.Column('ecc_uncorrected_volatile_sram_total', sa.BigInteger(), nullable=True),
    sa.Column('bar1_used_bytes', sa.BigInteger(), nullable=True),
    sa.Column('bar1_total_bytes', sa.BigInteger(), nullable=True),
    sa.Column('pcie_replay_total', sa.BigInteger(), nullable=True),
    sa.Column('remapped_rows_correctable_total', sa.Integer(), nullable=True),
    sa.Column('remapped_rows_uncorrectable_total', sa.Integer(), nullable=True),
    sa.Column('remapped_rows_pending', sa.Boolean(), nullable=True),
    sa.Column('remapped_rows_failure', sa.Boolean(), nullable=True),
    sa.Column('retired_pages_single_bit_total', sa.Integer(), nullable=True),
    sa.Column('retired_pages_double_bit_total', sa.Integer(), nullable=True),
    sa.Column('retired_pages_pending', sa.Boolean(), nullable=True),
    sa.Column('power_limit_watts', sa.BigInteger(), nullable=True),
    sa.Column('violation_power_seconds_total', sa.BigInteger(), nullable=True),
    sa.Column('violation_thermal_seconds_total', sa.BigInteger(), nullable=True),
    sa.Column('persistence_mode', sa.Boolean(), nullable=True),
    sa.Column('compute_mode', sa.SmallInteger(), nullable=True),
    sa.Column('mig_mode', sa.SmallInteger(), nullable=True),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], name=op.f('fk_gpu_samples_gpu_id_gpus')),
    sa.PrimaryKeyConstraint('gpu_id', 'ts', name=op.f('pk_gpu_samples')),
    postgresql_partition_by='RANGE (ts)',
    sqlite_with_rowid=False
    )
    op.create_table('pcie_links',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('host_id', sa.Integer(), nullable=False),
    sa.Column('bdf', sa.String(length=32), nullable=False),
    sa.Column('parent_bdf', sa.String(length=32), nullable=True),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('gpu_id', sa.Integer(), nullable=True),
    sa.Column('link_gen_current', sa.SmallInteger(), nullable=True),
    sa.Column('link_width_current', sa.SmallInteger(), nullable=True),
    sa.Column('link_gen_max', sa.SmallInteger(), nullable=True),
    sa.Column('link_width_max', sa.SmallInteger(), nullable=True),
    sa.Column('observed_at', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], name=op.f('fk_pcie_links_gpu_id_gpus')),
    sa.ForeignKeyConstraint(['host_id'], ['hosts.id'], name=op.f('fk_pcie_links_host_id_hosts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_pcie_links')),
    sa.UniqueConstraint('host_id', 'bdf', name=op.f('uq_pcie_links_host_id'))
    )
    with op.batch_alter_table('pcie_links', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pcie_links_host_id'), ['host_id'], unique=False)

    op.create_table('xid_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.BigInteger(), nullable=False),
    sa.Column('xid', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], name=op.f('fk_xid_events_gpu_id_gpus')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_xid_events')),
    sa.UniqueConstraint('gpu_id', 'ts', 'xid', name=op.f('uq_xid_events_gpu_id'))
    )
    with op.batch_alter_table('xid_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_xid_events_gpu_id'), ['gpu_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('xid_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_xid_events_gpu_id'))

    op.drop_table('xid_events')
    with op.batch_alter_table('pcie_links', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pcie_links_host_id'))

    op.drop_table('pcie_links')
    op.drop_table('gpu_samples')
    op.drop_table('gpu_process_samples')
    with op.batch_alter_table('processes', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_processes_host_id'))

    op.drop_table('processes')
    op.drop_table('host_samples')
    with op.batch_alter_table('gpus', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gpus_host_id'))

    op.drop_table('gpus')
    op.drop_table('hosts')
