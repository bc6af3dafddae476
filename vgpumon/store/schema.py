"""Database schema (SQLAlchemy 2.0, typed declarative models).

Sample tables are wide (one row per GPU per tick, a column per metric) and store fixed-point
integers: SQLite stores an integer in 0–8 bytes by magnitude but a REAL always in 8, so a ratio in
units of 1e-4 or a power in milliwatts keeps history about 3× smaller (FACTS §6: 2.8 vs 9.7 bytes
per value on replayed H200 data). Python code never sees the encoding: the column types below
convert to and from base units (ratio 0–1, watts, hertz, ...).

Sample timestamps are integer milliseconds since the Unix epoch (UTC) in the database and float
seconds in Python; identity tables use timezone-aware ``DateTime``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Integer,
    MetaData,
    SmallInteger,
    String,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class FixedPoint(TypeDecorator[float]):
    """A float stored as ``round(value * scale)`` in an integer column.

    Args:
        scale: stored units per base unit, e.g. 10_000 for a ratio stored in 1e-4, 1000 for watts
            stored in mW.
        coarse: when true, ``scale`` base units make one stored unit instead (hertz stored in
            MHz: ``FixedPoint(1_000_000, coarse=True)``), which keeps the arithmetic exact.
    """

    impl = BigInteger
    cache_ok = True

    def __init__(self, scale: int, coarse: bool = False) -> None:
        super().__init__()
        self.scale = scale
        self.coarse = coarse

    def process_bind_param(self, value: Any, dialect: Any) -> int | None:
        if value is None:
            return None
        return int(round(value / self.scale if self.coarse else value * self.scale))

    def process_result_value(self, value: Any, dialect: Any) -> float | None:
        if value is None:
            return None
        return float(value) * self.scale if self.coarse else float(value) / self.scale


class EpochMillis(TypeDecorator[float]):
    """Seconds since the epoch (float) stored as integer milliseconds."""

    impl = BigInteger
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> int | None:
        return None if value is None else int(round(value * 1000))

    def process_result_value(self, value: Any, dialect: Any) -> float | None:
        return None if value is None else float(value) / 1000.0


RATIO = FixedPoint(10_000)  # 1e-4 resolution, as DCGM reports profiling ratios
WATTS = FixedPoint(1_000)  # NVML reports milliwatts
JOULES = FixedPoint(1_000)  # NVML reports millijoules
HERTZ = FixedPoint(1_000_000, coarse=True)  # NVML reports whole MHz
CELSIUS = FixedPoint(10)  # 0.1 °C; NVML's legacy call gives whole degrees
BYTES_PER_SECOND = FixedPoint(1)


class Base(DeclarativeBase):
    """Declarative base with a naming convention, so migrations get stable constraint names."""

    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Host(Base):
    """A host an agent samples (by host name)."""

    __tablename__ = "hosts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255), unique=True)
    first_seen: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


class Gpu(Base):
    """A physical GPU, identified by its UUID; index and PCI bus id are attributes that change."""

    __tablename__ = "gpus"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(64), unique=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), index=True)
    index: Mapped[int] = mapped_column(SmallInteger)
    name: Mapped[str | None] = mapped_column(String(96))
    serial: Mapped[str | None] = mapped_column(String(64))
    pci_bus_id: Mapped[str | None] = mapped_column(String(32))
    memory_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    pcie_link_gen_max: Mapped[int | None] = mapped_column(SmallInteger)
    pcie_link_width_max: Mapped[int | None] = mapped_column(SmallInteger)
    pcie_link_gen_gpu_max: Mapped[int | None] = mapped_column(SmallInteger)
    gpm_supported: Mapped[bool] = mapped_column(Boolean, default=False)
    first_seen: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)
    last_seen: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


class GpuSampleRow(Base):
    """One GPU, one tick (wide row). Column meanings: ``vgpumon.model.GpuSample``.

    ``up`` is false for a tick where the device could not be read; ``activity_source`` is 1 for
    GPM, 2 for the utilization proxy. Slow-set columns are NULL on ticks that did not read them.
    """

    __tablename__ = "gpu_samples"
    __table_args__ = {"sqlite_with_rowid": False}

    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id"), primary_key=True)
    ts: Mapped[float] = mapped_column(EpochMillis, primary_key=True)
    up: Mapped[bool] = mapped_column(Boolean)
    activity_source: Mapped[int | None] = mapped_column(SmallInteger)
    memory_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    utilization_gpu_ratio: Mapped[float | None] = mapped_column(RATIO)
    utilization_memory_ratio: Mapped[float | None] = mapped_column(RATIO)
    sm_active_ratio: Mapped[float | None] = mapped_column(RATIO)
    sm_occupancy_ratio: Mapped[float | None] = mapped_column(RATIO)
    tensor_active_ratio: Mapped[float | None] = mapped_column(RATIO)
    dram_active_ratio: Mapped[float | None] = mapped_column(RATIO)
    pcie_tx_bytes_per_second: Mapped[float | None] = mapped_column(BYTES_PER_SECOND)
    pcie_rx_bytes_per_second: Mapped[float | None] = mapped_column(BYTES_PER_SECOND)
    pcie_link_gen_current: Mapped[int | None] = mapped_column(SmallInteger)
    pcie_link_width_current: Mapped[int | None] = mapped_column(SmallInteger)
    temperature_celsius: Mapped[float | None] = mapped_column(CELSIUS)
    power_watts: Mapped[float | None] = mapped_column(WATTS)
    sm_clock_hertz: Mapped[float | None] = mapped_column(HERTZ)
    memory_clock_hertz: Mapped[float | None] = mapped_column(HERTZ)
    clocks_event_reasons: Mapped[int | None] = mapped_column(BigInteger)
    ecc_corrected_volatile_total: Mapped[int | None] = mapped_column(BigInteger)
    ecc_uncorrected_volatile_total: Mapped[int | None] = mapped_column(BigInteger)
    ecc_corrected_aggregate_total: Mapped[int | None] = mapped_column(BigInteger)
    ecc_uncorrected_aggregate_total: Mapped[int | None] = mapped_column(BigInteger)
    energy_joules_total: Mapped[float | None] = mapped_column(JOULES)


ACTIVITY_SOURCES = {"gpm": 1, "utilization": 2}
ACTIVITY_SOURCE_NAMES = {v: k for k, v in ACTIVITY_SOURCES.items()}

#: Columns of ``gpu_samples`` copied straight from ``GpuSample`` attributes of the same name.
SAMPLE_VALUE_COLUMNS: tuple[str, ...] = tuple(
    c.name for c in GpuSampleRow.__table__.columns if c.name not in {"gpu_id", "ts", "up", "activity_source"}
)
