"""1-minute rollups of GPU samples and the rollup watermark per GPU.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 01:46:18.937989
"""

from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: Union[str, None] = '0001'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('gpu_samples_1m',
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.BigInteger(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('up_samples', sa.Integer(), nullable=False),
    sa.Column('folded_samples', sa.Integer(), nullable=False),
    sa.Column('memory_used_bytes_min', sa.BigInteger(), nullable=True),
    sa.Column('memory_used_bytes_mean', sa.BigInteger(), nullable=True),
    sa.Column('memory_used_bytes_max', sa.BigInteger(), nullable=True),
    sa.Column('memory_used_bytes_p50', sa.BigInteger(), nullable=True),
    sa.Column('memory_used_bytes_p95', sa.BigInteger(), nullable=True),
    sa.Column('memory_used_bytes_p99', sa.BigInteger(), nullable=True),
    sa.Column('memory_reserved_bytes_min', sa.BigInteger(), nullable=True),
    sa.Column('memory_reserved_bytes_mean', sa.BigInteger(), nullable=True),
    sa.Column('memory_reserved_bytes_max', sa.BigInteger(), nullable=True),
    sa.Column('memory_total_bytes_last', sa.BigInteger(), nullable=True),
    sa.Column('utilization_gpu_ratio_min', sa.BigInteger(), nullable=True),
    sa.Column('utilization_gpu_ratio_mean', sa.BigInteger(), nullable=True),
    sa.Column('utilization_gpu_ratio_max', sa.BigInteger(), nullable=True),
    sa.Column('utilization_gpu_ratio_p50', sa.BigInteger(), nullable=True),
    sa.Column('utilization_gpu_ratio_p95', sa.BigInteger(), nullable=True),
    sa.Column('utilization_gpu_ratio_p99', sa.BigInteger(), nullable=True),
    sa.Column('utilization_memory_ratio_min', sa.BigInteger(), nullable=True),
    sa.Column('utilization_memory_ratio_mean', sa.BigInteger(), nullable=True),
    sa.Column('utilization_memory_ratio_max', sa.BigInteger(), nullable=True),
    sa.Column('sm_active_ratio_min', sa.BigInteger(), nullable=True),
    sa.Column('sm_active_ratio_mean', sa.BigInteger(), nullable=True),
    sa.Column('sm_active_ratio_max', sa.BigInteger(), nullable=True),
    sa.Column('sm_active_ratio_p50', sa.BigInteger(), nullable=True),
    sa.Column('sm_active_ratio_p95', sa.BigInteger(), nullable=True),
    sa.Column('sm_active_ratio_p99', sa.BigInteger(), nullable=True),
    sa.Column('sm_occupancy_ratio_min', sa.BigInteger(), nullable=True),
    sa.Column('sm_occupancy_ratio_mean', sa.BigInteger(), nullable=True),
    sa.Column('sm_occupancy_ratio_max', sa.BigInteger(), nullable=True),
    sa.Column('tensor_active_ratio_min', sa.BigInteger(), nullable=True),
    sa.Column('tensor_active_ratio_mean', sa.BigInteger(), nullable=True),
    sa.Column('tensor_active_ratio_max', sa.BigInteger(), nullable=True),
    sa.Column('dram_active_ratio_min', sa.BigInteger(), nullable=True),
    sa.Column('dram_active_ratio_mean', sa.BigInteger(), nullable=True),
    sa.Column('dram_active_ratio_max', sa.BigInteger(), nullable=True),
    sa.Column('dram_active_ratio_p50', sa.BigInteger(), nullable=True),
    sa.Column('dram_active_ratio_p95', sa.BigInteger(), nullable=True),
    sa.Column('dram_active_ratio_p99', sa.BigInteger(), nullable=True),
    sa.Column('pcie_tx_bytes_per_second_min', sa.BigInteger(), nullable=True),
    sa.Column('pcie_tx_bytes_per_second_mean', sa.BigInteger(), nullable=True),
    sa.Column('pcie_tx_bytes_per_second_max', sa.BigInteger(), nullable=True),
    sa.Column('pcie_tx_bytes_per_second_p50', sa.BigInteger(), nullable=True),
    sa.Column('pcie_tx_bytes_per_second_p95', sa.BigInteger(), nullable=True),
    sa.Column('pcie_tx_bytes_per_second_p99', sa.BigInteger(), nullable=True),
    sa.Column('pcie_rx_bytes_per_second_min', sa.BigInteger(), nullable=True),
    sa.Column('pcie_rx_bytes_per_second_mean', sa.BigInteger(), nullable=True),
    sa.Column('pcie_rx_bytes_per_second_max', sa.BigInteger(), nullable=True),
    sa.Column('pcie_rx_bytes_per_second_p50', sa.BigInteger(), nullable=True),
    sa.Column('pcie_rx_bytes_per_second_p95', sa.BigInteger(), nullable=True),
    sa.Column('pcie_rx_bytes_per_second_p99', sa.BigInteger(), nullable=True),
    sa.Column('pcie_link_gen_current_min', sa.SmallInteger(), nullable=True),
    sa.Column('pcie_link_gen_current_mean', sa.SmallInteger(), nullable=True),
    sa.Column('pcie_link_gen_current_max', sa.SmallInteger(), nullable=True),
    sa.Column('pcie_link_width_current_min', sa.SmallInteger(), nullable=True),
    sa.Column('pcie_link_width_current_mean', sa.SmallInteger(), nullable=True),
    sa.Column('pcie_link_width_current_max', sa.SmallInteger(), nullable=True),
    sa.Column('temperature_celsius_min', sa.BigInteger(), nullable=True),
    sa.Column('temperature_celsius_mean', sa.BigInteger(), nullable=True),
    sa.Column('temperature_celsius_max', sa.BigInteger(), nullable=True),
    sa.Column('temperature_celsius_p50', sa.BigInteger(), nullable=True),
    sa.Column('temperature_celsius_p95', sa.BigInteger(), nullable=True),
    sa.Column('temperature_celsius_p99', sa.BigInteger(), nullable=True),
    sa.Column('power_watts_min', sa.BigInteger(), nullable=True),
    sa.Column('power_watts_mean', sa.BigInteger(), nullable=True),
    sa.Column('power_watts_max', sa.BigInteger(), nullable=True),
    sa.Column('power_watts_p50', sa.BigInteger(), nullable=True),
    sa.Column('power_watts_p95', sa.BigInteger(), nullable=True),
    sa.Column('power_watts_p99', sa.BigInteger(), nullable=True),
    sa.Column('sm_clock_hertz_min', sa.BigInteger(), nullable=True),
    sa.Column('sm_clock_hertz_mean', sa.BigInteger(), nullable=True),
    sa.Column('sm_clock_hertz_max', sa.BigInteger(), nullable=True),
    sa.Column('memory_clock_hertz_min', sa.BigInteger(), nullable=True),
    sa.Column('memory_clock_hertz_mean', sa.BigInteger(), nullable=True),
    sa.Column('memory_clock_hertz_max', sa.BigInteger(), nullable=True),
    sa.Column('clocks_event_reasons_or', sa.BigInteger(), nullable=True),
    sa.Column('ecc_corrected_volatile_total_last', sa.BigInteger(), nullable=True),
    sa.Column('ecc_uncorrected_volatile_total_last', sa.BigInteger(), nullable=True),
    sa.Column('ecc_corrected_aggregate_total_last', sa.BigInteger(), nullable=True),
    sa.Column('ecc_uncorrected_aggregate_total_last', sa.BigInteger(), nullable=True),
    sa.Column('energy_joules_total_last', sa.BigInteger(), nullable=True),
    sa.Column('performance_state_last', sa.SmallInteger(), nullable=True),
    sa.Column('fan_speed_ratio_min', sa.BigInteger(), nullable=True),
    sa.Column('fan_speed_ratio_mean', sa.BigInteger(), nullable=True),
    sa.Column('fan_speed_ratio_max', sa.BigInteger(), nullable=True),
    sa.Column('ecc_corrected_volatile_dram_total_last', sa.BigInteger(), nullable=True),
    sa.Column('ecc_uncorrected_volatile_dram_total_last', sa.BigInteger(), nullable=True),
    sa.Column('ecc_corrected_volatile_sram_total_last', sa.BigInteger(), nullable=True),
    sa.Column('ecc_uncorrected_volatile_sram_total_last', sa.BigInteger(), nullable=True),
    sa.Column('bar1_used_bytes_min', sa.BigInteger(), nullable=True),
    sa.Column('bar1_used_bytes_mean', sa.BigInteger(), nullable=True),
    sa.Column('bar1_used_bytes_max', sa.BigInteger(), nullable=True),
    sa.Column('bar1_total_bytes_last', sa.BigInteger(), nullable=True),
    sa.Column('pcie_replay_total_last', sa.BigInteger(), nullable=True),
    sa.Column('remapped_rows_correctable_total_last', sa.Integer(), nullable=True),
    sa.Column('remapped_rows_uncorrectable_total_last', sa.Integer(), nullable=True),
    sa.Column('remapped_rows_pending_any', sa.Boolean(), nullable=True),
    sa.Column('remapped_rows_failure_any', sa.Boolean(), nullable=True),
    sa.Column('retired_pages_single_bit_total_last', sa.Integer(), nullable=True),
    sa.Column('retired_pages_double_bit_total_last', sa.Integer(), nullable=True),
    sa.Column('retired_pages_pending_any', sa.Boolean(), nullable=True),
    sa.Column('power_limit_watts_last', sa.BigInteger(), nullable=True),
    sa.Column('violation_power_seconds_total_last', sa.BigInteger(), nullable=True),
    sa.Column('violation_thermal_seconds_total_last', sa.BigInteger(), nullable=True),
    sa.Column('persistence_mode_last', sa.Boolean(), nullable=True),
    sa.Column('compute_mode_last', sa.SmallInteger(), nullable=True),
    sa.Column('mig_mode_last', sa.SmallInteger(), nullable=True),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], name=op.f('fk_gpu_samples_1m_gpu_id_gpus')),
    sa.PrimaryKeyConstraint('gpu_id', 'ts', name=op.f('pk_gpu_samples_1m')),
    postgresql_partition_by='RANGE (ts)',
    sqlite_with_rowid=False
    )
    op.create_table('rollup_watermarks',
    sa.Column('gpu_id', sa.Integer(), nullable=False),
    sa.Column('rolled_until', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['gpu_id'], ['gpus.id'], name=op.f('fk_rollup_watermarks_gpu_id_gpus')),
    sa.PrimaryKeyConstraint('gpu_id', name=op.f('pk_rollup_watermarks'))
    )


def downgrade() -> None:
    op.drop_table('rollup_watermarks')
    op.drop_table('gpu_samples_1m')
