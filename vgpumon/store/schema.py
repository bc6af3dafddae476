"""Database schema (SQLAlchemy 2.0, typed declarative models).

Sample tables are wide (one row per GPU per tick, a column per metric) and store fixed-point
integers: SQLite stores an integer in 0–8 bytes by magnitude but a REAL always in 8, so a ratio in
units of 1e-4 or a power in milliwatts keeps history about 3× smaller (FACTS §6: 2.8 vs 9.7 bytes
per value on replayed H200 data). Python code never sees the encoding: the column types below
convert to and from base units (ratio 0–1, watts, hertz, ...).

Sample timestamps are integer milliseconds since the Unix epoch (UTC) in the database and float
seconds in Python; identity tables use timezone-aware ``DateTime``.

Time tables (``gpu_samples``, ``host_samples``, ``gpu_process_samples``, ``gpu_samples_1m``) carry
``postgresql_partition_by="RANGE (ts)"``: on Postgres they are partitioned by day (partitions are
created by ``vgpumon.store.partitions``) so that retention drops whole partitions; SQLite ignores
the option and keeps them as ``WITHOUT ROWID`` tables clustered on their primary key.

The tables themselves are created by the Alembic migrations in ``vgpumon/store/migrations``; these
models must match the newest revision (``tests/test_migrations.py`` checks it on both engines).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from vgpumon import catalogue
from vgpumon.catalogue import Encoding


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


def column_type(enc: Encoding) -> Any:
    """The SQLAlchemy type of a catalogue encoding (``vgpumon.catalogue.Encoding``)."""
    if enc.kind == "fixed":
        return FixedPoint(enc.scale, enc.coarse)
    if enc.kind in ("int", "code"):
        return {16: SmallInteger, 32: Integer, 64: BigInteger}[enc.bits]()
    if enc.kind == "bool":
        return Boolean()
    return String(enc.length)


def catalogue_columns(table: str) -> list[Column[Any]]:
    """The value columns of ``table`` as the field catalogue defines them, in its order."""
    return [
        Column(f.name, column_type(f.encoding), nullable=not f.required) for f in catalogue.fields_of(table)
    ]


HERTZ = column_type(catalogue.core.HERTZ)  # the gpus table's max clocks
CELSIUS = column_type(catalogue.core.CELSIUS)  # the gpus table's slowdown threshold


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
    """A physical GPU on a host, identified by (host, UUID); index and PCI bus id are attributes
    that change. UUIDs alone are not unique across hosts (masked captures, cloned VM images, a
    card moved to another host): each host keeps its own history of a card (revision 0006)."""

    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("host_id", "uuid"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(64))
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    index: Mapped[int] = mapped_column(SmallInteger)
    name: Mapped[str | None] = mapped_column(String(96))
    serial: Mapped[str | None] = mapped_column(String(64))
    pci_bus_id: Mapped[str | None] = mapped_column(String(32))
    memory_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    pcie_link_gen_max: Mapped[int | None] = mapped_column(SmallInteger)
    pcie_link_width_max: Mapped[int | None] = mapped_column(SmallInteger)
    pcie_link_gen_gpu_max: Mapped[int | None] = mapped_column(SmallInteger)
    gpm_supported: Mapped[bool] = mapped_column(Boolean, default=False)
    sm_clock_max_hertz: Mapped[float | None] = mapped_column(HERTZ)
    memory_clock_max_hertz: Mapped[float | None] = mapped_column(HERTZ)
    slowdown_temperature_celsius: Mapped[float | None] = mapped_column(CELSIUS)
    first_seen: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)
    last_seen: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


class GpuSampleRow(Base):
    """One GPU, one tick (wide row): a column per ``gpu_samples`` field of the catalogue, whose
    entries give each column's meaning, unit and encoding (docs/metrics.md).

    ``up`` is false for a tick where the device could not be read; ``activity_source`` is 1 for
    GPM, 2 for the utilization proxy. Slow-set columns are NULL on ticks that did not read them.
    """

    __table__ = Table(
        "gpu_samples",
        Base.metadata,
        Column("gpu_id", ForeignKey("gpus.id"), primary_key=True),
        Column("ts", EpochMillis, primary_key=True),
        *catalogue_columns("gpu_samples"),
        sqlite_with_rowid=False,
        postgresql_partition_by="RANGE (ts)",
    )


class HostSample(Base):
    """One host, one tick (psutil): the catalogue's ``host_samples`` fields."""

    __table__ = Table(
        "host_samples",
        Base.metadata,
        Column("host_id", ForeignKey("hosts.id"), primary_key=True),
        Column("ts", EpochMillis, primary_key=True),
        *catalogue_columns("host_samples"),
        sqlite_with_rowid=False,
        postgresql_partition_by="RANGE (ts)",
    )


class Process(Base):
    """A process that held a GPU, identified by (host, pid, start time) since PIDs are reused.

    ``resolved`` is false when the PID could not be looked up (another PID namespace, or gone
    before the first look): owner fields are then NULL.
    """

    __tablename__ = "processes"
    __table_args__ = (UniqueConstraint("host_id", "pid", "start_time"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), index=True)
    pid: Mapped[int] = mapped_column(Integer)
    start_time: Mapped[float | None] = mapped_column(EpochMillis)
    name: Mapped[str | None] = mapped_column(String(255))
    cmdline: Mapped[str | None] = mapped_column(Text)
    username: Mapped[str | None] = mapped_column(String(255))
    container_id: Mapped[str | None] = mapped_column(String(128))
    resolved: Mapped[bool] = mapped_column(Boolean, default=True)


class GpuProcessSample(Base):
    """One process on one GPU at one tick: its GPU memory, and its host RSS and CPU time (a
    leak that keeps request objects alive grows both); the catalogue's ``gpu_process_samples``
    fields."""

    __table__ = Table(
        "gpu_process_samples",
        Base.metadata,
        Column("gpu_id", ForeignKey("gpus.id"), primary_key=True),
        Column("ts", EpochMillis, primary_key=True),
        Column("process_id", ForeignKey("processes.id"), primary_key=True),
        *catalogue_columns("gpu_process_samples"),
        sqlite_with_rowid=False,
        postgresql_partition_by="RANGE (ts)",
    )


class XidEvent(Base):
    """One XID event (``nvmlEventSetWait``): every event is kept, never only the last one."""

    __tablename__ = "xid_events"
    __table_args__ = (UniqueConstraint("gpu_id", "ts", "xid", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id"), index=True)
    ts: Mapped[float] = mapped_column(EpochMillis)
    xid: Mapped[int] = mapped_column(Integer)
    #: the event's number among its GPU's events since the agent started (``XidEvent.seq``)
    seq: Mapped[int] = mapped_column(Integer, server_default="0")


class RejectedValue(Base):
    """A value refused at the door (``vgpumon.catalogue.Door``) or that could not be stored: one
    row per subject, field and tick, so that reports can say "reported impossible values N
    times" instead of "not reported". ``subject`` is ``gpu:<uuid>``, ``host`` or
    ``vllm:<url>``; ``reason`` names what was wrong (``rejected: blank sentinel …``)."""

    __tablename__ = "rejected_values"
    __table_args__ = {"sqlite_with_rowid": False, "postgresql_partition_by": "RANGE (ts)"}

    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), primary_key=True)
    ts: Mapped[float] = mapped_column(EpochMillis, primary_key=True)
    subject: Mapped[str] = mapped_column(String(160), primary_key=True)
    field: Mapped[str] = mapped_column(String(64), primary_key=True)
    reason: Mapped[str] = mapped_column(String(255))


class HostEventRow(Base):
    """Something that happened to a host or one of its GPUs (``vgpumon.model.HostEvent``): a GPU
    appearing, going or coming back, NVML re-initialised, the memory API changing, the wall clock
    stepping. Rare, kept with the rollup window: they explain steps and gaps in long trends.
    Written twice (a replayed spool), stored once."""

    __tablename__ = "host_events"
    __table_args__ = (UniqueConstraint("host_id", "ts", "kind", "subject"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), index=True)
    ts: Mapped[float] = mapped_column(EpochMillis)
    kind: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(String(160))
    detail: Mapped[str] = mapped_column(String(255))


class PcieLink(Base):
    """One hop of a host's PCIe tree as last observed (sysfs): a GPU, a switch port or a root
    port, with its parent. The capacity review sums GPU traffic over shared upstream hops."""

    __tablename__ = "pcie_links"
    __table_args__ = (UniqueConstraint("host_id", "bdf"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), index=True)
    bdf: Mapped[str] = mapped_column(String(32))
    parent_bdf: Mapped[str | None] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(16))  # gpu | bridge | root
    gpu_id: Mapped[int | None] = mapped_column(ForeignKey("gpus.id"))
    link_gen_current: Mapped[int | None] = mapped_column(SmallInteger)
    link_width_current: Mapped[int | None] = mapped_column(SmallInteger)
    link_gen_max: Mapped[int | None] = mapped_column(SmallInteger)
    link_width_max: Mapped[int | None] = mapped_column(SmallInteger)
    observed_at: Mapped[float] = mapped_column(EpochMillis)


class AlertRow(Base):
    """One alert episode of one rule on one subject (``vgpumon.model.Alert``): created when the
    condition is first found (pending), updated when it fires and when it resolves. ``labels``
    is the subject's identity as JSON; ``fingerprint`` hashes name and labels, so one condition
    on one subject has at most one open episode (deduplication). A pending episode that never
    fired is deleted when its condition stops. Low volume: not partitioned."""

    __tablename__ = "alerts"
    __table_args__ = (
        UniqueConstraint("host_id", "fingerprint", "active_since"),
        Index("ix_alerts_host_id_state", "host_id", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    name: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    fingerprint: Mapped[str] = mapped_column(String(40))
    labels: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    active_since: Mapped[float] = mapped_column(EpochMillis)
    fired_at: Mapped[float | None] = mapped_column(EpochMillis)
    resolved_at: Mapped[float | None] = mapped_column(EpochMillis)
    last_eval: Mapped[float] = mapped_column(EpochMillis)
    value: Mapped[float | None] = mapped_column(Float)
    summary: Mapped[str] = mapped_column(String(255))
    description: Mapped[str] = mapped_column(Text)


ACTIVITY_SOURCES = catalogue.gpu.ACTIVITY_SOURCES
ACTIVITY_SOURCE_NAMES = {v: k for k, v in ACTIVITY_SOURCES.items()}

#: Columns of ``gpu_samples`` copied straight from ``GpuSample`` attributes of the same name.
SAMPLE_VALUE_COLUMNS: tuple[str, ...] = tuple(
    c.name for c in GpuSampleRow.__table__.columns if c.name not in {"gpu_id", "ts", "up", "activity_source"}
)


# -- 1-minute rollups --------------------------------------------------------------------------

#: Aggregates kept per ``gpu_samples`` column in ``gpu_samples_1m``, from each field's catalogue
#: entry (``Field.rollup``): gauges keep min/mean/max, the ones reports rank or size capacity by
#: also p50/p95/p99; counters and states keep the minute's last value; flags keep "any" and the
#: clocks-event bitmask keeps the OR of the minute's bits.
ROLLUP_SPEC: dict[str, tuple[str, ...]] = {
    f.name: tuple(f.rollup) for f in catalogue.fields_of("gpu_samples") if f.rollup
}


def rollup_column_name(column: str, aggregate: str) -> str:
    """``gpu_samples_1m`` column holding ``aggregate`` of ``gpu_samples.column``."""
    return f"{column}_{aggregate}"


def _rollup_columns() -> list[Column[Any]]:
    src = GpuSampleRow.__table__.c
    cols: list[Column[Any]] = []
    for name, aggregates in ROLLUP_SPEC.items():
        for agg in aggregates:
            # the source column's type: the same fixed-point encoding, the same base units
            cols.append(Column(rollup_column_name(name, agg), src[name].type, nullable=True))
    return cols


#: One GPU, one minute: ``ts`` is the minute's start (epoch ms). ``samples`` counts the raw ticks
#: the minute held, ``up_samples`` those where the device answered, ``folded_samples`` those that
#: were folded into this row without ever being stored as raw rows (the store was unreachable and
#: the agent's spool or buffer reached its bound): that is resolution lost, and ``vgpumon db
#: stats`` reports it. Columns are generated from ``ROLLUP_SPEC``; the migration that created the
#: table lists them explicitly.
gpu_samples_1m = Table(
    "gpu_samples_1m",
    Base.metadata,
    Column("gpu_id", ForeignKey("gpus.id"), primary_key=True),
    Column("ts", EpochMillis, primary_key=True),
    Column("samples", Integer, nullable=False),
    Column("up_samples", Integer, nullable=False),
    Column("folded_samples", Integer, nullable=False),
    *_rollup_columns(),
    sqlite_with_rowid=False,
    postgresql_partition_by="RANGE (ts)",
)


class RollupWatermark(Base):
    """How far raw ``gpu_samples`` of one GPU have been rolled up: every raw row with
    ``ts < rolled_until`` is summarised in ``gpu_samples_1m``; retention never deletes raw rows at
    or after it."""

    __tablename__ = "rollup_watermarks"

    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id"), primary_key=True)
    rolled_until: Mapped[float] = mapped_column(EpochMillis)


#: Time tables → the column of their owner (a foreign key, first in the primary key, then ``ts``).
#: Partitioned by day on Postgres; pruned by ``vgpumon.store.retention`` (``gpu_samples`` only
#: once rolled up, ``gpu_samples_1m`` by the rollup window, the others by the raw window).
TIME_TABLES: dict[str, str] = {
    "gpu_samples": "gpu_id",
    "host_samples": "host_id",
    "gpu_process_samples": "gpu_id",
    "gpu_samples_1m": "gpu_id",
    "vllm_samples": "instance_id",
    "vllm_engine_samples": "instance_id",
    "rejected_values": "host_id",
}
