"""Database schema (SQLAlchemy 2.0 Core tables).

Sample tables are wide (one row per GPU per tick, a column per metric) and store fixed-point
integers: SQLite stores an integer in 0–8 bytes by magnitude but a REAL always in 8, so a ratio in
units of 1e-4 or a power in milliwatts keeps history about 3× smaller (FACTS §6: 2.8 vs 9.7 bytes
per value on replayed H200 data). Python code never sees the encoding: the column types below
convert to and from base units (ratio 0–1, watts, hertz, ...).

Sample timestamps are integer milliseconds since the Unix epoch (UTC) in the database and float
seconds in Python; identity tables use timezone-aware ``DateTime``.

Time tables (``TIME_TABLES``) are partitioned by day on Postgres (the migrations create them
``PARTITION BY RANGE (ts)``, ``vgpumon.store.partitions`` adds the days) so that retention drops
whole partitions; on SQLite they are ``WITHOUT ROWID`` tables clustered on their primary key.
The tables here leave the Postgres-only option to the migrations: declaring it makes SQLAlchemy
import its Postgres dialect (2 MB of an agent's memory) even for a SQLite store.

The tables themselves are created by the Alembic migrations in ``vgpumon/store/migrations``; these
definitions must match the newest revision (``tests/store/test_store.py`` checks it on both engines).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Sequence, TypeAlias

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
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import SchemaItem

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

    def process_bind_param(self, value: float | None, dialect: Dialect) -> int | None:
        if value is None:
            return None
        return int(round(value / self.scale if self.coarse else value * self.scale))

    def process_result_value(self, value: float | None, dialect: Dialect | None) -> float | None:
        if value is None:
            return None
        return float(value) * self.scale if self.coarse else float(value) / self.scale


class EpochMillis(TypeDecorator[float]):
    """Seconds since the epoch (float) stored as integer milliseconds."""

    impl = BigInteger
    cache_ok = True

    def process_bind_param(self, value: float | None, dialect: Dialect) -> int | None:
        return None if value is None else int(round(value * 1000))

    def process_result_value(self, value: float | None, dialect: Dialect | None) -> float | None:
        return None if value is None else float(value) / 1000.0


#: A value read from a column named at run time, in base units: its Python type is that
#: column's (``float`` for fixed-point and epoch columns, ``int``, ``bool``, ``str``) or ``None``
#: for NULL. No checker can tell which from a name held in a string, so this stays ``Any``:
#: callers narrow it by the column they asked for (a union would force a cast at every sum).
ColumnValue: TypeAlias = Any

#: A column of the tables: their Python types differ column by column (``float`` for fixed-point
#: and epoch columns, ``int``, ``bool``, ``str``, ``datetime``), so a list of them is of ``Column[Any]``.
Col: TypeAlias = "Column[Any]"


def column_type(enc: Encoding) -> FixedPoint | SmallInteger | Integer | BigInteger | Boolean | String:
    """The SQLAlchemy type of a catalogue encoding (``vgpumon.catalogue.Encoding``)."""
    if enc.kind == "fixed":
        return FixedPoint(enc.scale, enc.coarse)
    if enc.kind in ("int", "code"):
        return {16: SmallInteger, 32: Integer, 64: BigInteger}[enc.bits]()
    if enc.kind == "bool":
        return Boolean()
    return String(enc.length)


def catalogue_columns(table: str) -> list[Col]:
    """The value columns of ``table`` as the field catalogue defines them, in its order."""
    return [
        Column(f.name, column_type(f.encoding), nullable=not f.required) for f in catalogue.fields_of(table)
    ]


HERTZ = column_type(catalogue.core.HERTZ)  # the gpus table's max clocks
CELSIUS = column_type(catalogue.core.CELSIUS)  # the gpus table's slowdown threshold


#: Every table, with a naming convention so migrations get stable constraint names.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class TableColumns:
    """A Core ``Table`` whose columns read as attributes (``Host.hostname`` is
    ``hosts.c.hostname``); usable wherever SQLAlchemy takes a table (``select``, ``insert``,
    ``join``) through ``__clause_element__``.

    Core tables rather than ORM models: the store never loads objects, and importing and
    configuring the ORM costs the agent about 8 MB of resident memory (docs/benchmarks.md)."""

    __slots__ = ("__table__",)

    def __init__(self, table: Table) -> None:
        self.__table__ = table

    def __clause_element__(self) -> Table:
        return self.__table__

    def __getattr__(self, name: str) -> Col:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self.__table__.c[name]
        except KeyError:
            raise AttributeError(f"table {self.__table__.name} has no column {name!r}") from None


def table(name: str, *items: SchemaItem, sqlite_with_rowid: bool = True) -> TableColumns:
    """``Table(name, metadata, *items)`` as ``TableColumns``; ``sqlite_with_rowid=False`` makes it a
    ``WITHOUT ROWID`` table on SQLite (the option is left out otherwise, as SQLAlchemy's default)."""
    if sqlite_with_rowid:
        return TableColumns(Table(name, metadata, *items))
    return TableColumns(Table(name, metadata, *items, sqlite_with_rowid=False))


def time_table(name: str, owner: str, target: str, *keys: Col, values: Sequence[Col] | None = None) -> TableColumns:
    """A time table: ``(owner, ts, *keys)`` as its primary key (``owner`` a foreign key to
    ``target``, ``ts`` epoch milliseconds), then ``values`` (default: the catalogue's columns of
    ``name``); clustered on that key (``WITHOUT ROWID``) on SQLite."""
    return table(
        name,
        Column(owner, ForeignKey(target), primary_key=True),
        Column("ts", EpochMillis, primary_key=True),
        *keys,
        *(catalogue_columns(name) if values is None else values),
        sqlite_with_rowid=False,
    )


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


#: A host an agent samples (by host name).
Host = table(
    "hosts",
    Column("id", Integer, primary_key=True),
    Column("hostname", String(255), unique=True, nullable=False),
    Column("first_seen", DateTime(timezone=True), default=_utcnow, nullable=False),
)


#: A physical GPU on a host, identified by (host, UUID); index and PCI bus id are attributes
#: that change. UUIDs alone are not unique across hosts (masked captures, cloned VM images, a
#: card moved to another host): each host keeps its own history of a card (revision 0006).
Gpu = table(
    "gpus",
    Column("id", Integer, primary_key=True),
    Column("uuid", String(64), nullable=False),
    Column("host_id", ForeignKey("hosts.id"), nullable=False),
    Column("index", SmallInteger, nullable=False),
    Column("name", String(96)),
    Column("serial", String(64)),
    Column("pci_bus_id", String(32)),
    Column("memory_total_bytes", BigInteger),
    Column("pcie_link_gen_max", SmallInteger),
    Column("pcie_link_width_max", SmallInteger),
    Column("pcie_link_gen_gpu_max", SmallInteger),
    Column("gpm_supported", Boolean, default=False, nullable=False),
    Column("sm_clock_max_hertz", HERTZ),
    Column("memory_clock_max_hertz", HERTZ),
    Column("slowdown_temperature_celsius", CELSIUS),
    Column("first_seen", DateTime(timezone=True), default=_utcnow, nullable=False),
    Column("last_seen", DateTime(timezone=True), default=_utcnow, nullable=False),
    UniqueConstraint("host_id", "uuid"),
)


#: One GPU, one tick (wide row): a column per ``gpu_samples`` field of the catalogue, whose
#: entries give each column's meaning, unit and encoding (docs/metrics.md).
#:
#: ``up`` is false for a tick where the device could not be read; ``activity_source`` is 1 for
#: GPM, 2 for the utilization proxy. Slow-set columns are NULL on ticks that did not read them.
GpuSampleRow = time_table("gpu_samples", "gpu_id", "gpus.id")


#: One host, one tick (psutil): the catalogue's ``host_samples`` fields.
HostSample = time_table("host_samples", "host_id", "hosts.id")


#: A process that held a GPU, identified by (host, pid, start time) since PIDs are reused.
#:
#: ``resolved`` is false when the PID could not be looked up (another PID namespace, or gone
#: before the first look): owner fields are then NULL.
Process = table(
    "processes",
    Column("id", Integer, primary_key=True),
    Column("host_id", ForeignKey("hosts.id"), index=True, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("start_time", EpochMillis),
    Column("name", String(255)),
    Column("cmdline", Text),
    Column("username", String(255)),
    Column("container_id", String(128)),
    Column("resolved", Boolean, default=True, nullable=False),
    UniqueConstraint("host_id", "pid", "start_time"),
)


#: One process on one GPU at one tick: its GPU memory, and its host RSS and CPU time (a
#: leak that keeps request objects alive grows both); the catalogue's ``gpu_process_samples``
#: fields.
GpuProcessSample = time_table(
    "gpu_process_samples", "gpu_id", "gpus.id", Column("process_id", ForeignKey("processes.id"), primary_key=True)
)


#: One XID event (``nvmlEventSetWait``): every event is kept, never only the last one.
XidEvent = table(
    "xid_events",
    Column("id", Integer, primary_key=True),
    Column("gpu_id", ForeignKey("gpus.id"), index=True, nullable=False),
    Column("ts", EpochMillis, nullable=False),
    Column("xid", Integer, nullable=False),
    #: the event's number among its GPU's events since the agent started (``XidEvent.seq``)
    Column("seq", Integer, server_default="0", nullable=False),
    UniqueConstraint("gpu_id", "ts", "xid", "seq"),
)


#: A value refused at the door (``vgpumon.catalogue.Door``) or that could not be stored: one
#: row per subject, field and tick, so that reports can say "reported impossible values N
#: times" instead of "not reported". ``subject`` is ``gpu:<uuid>``, ``host`` or
#: ``vllm:<url>``; ``reason`` names what was wrong (``rejected: blank sentinel …``).
RejectedValue = time_table(
    "rejected_values", "host_id", "hosts.id",
    Column("subject", String(160), primary_key=True),
    Column("field", String(64), primary_key=True),
    values=[Column("reason", String(255), nullable=False)],
)


#: Something that happened to a host or one of its GPUs (``vgpumon.model.HostEvent``): a GPU
#: appearing, going or coming back, NVML re-initialised, the memory API changing, the wall clock
#: stepping. Rare, kept with the rollup window: they explain steps and gaps in long trends.
#: Written twice (a replayed spool), stored once.
HostEventRow = table(
    "host_events",
    Column("id", Integer, primary_key=True),
    Column("host_id", ForeignKey("hosts.id"), index=True, nullable=False),
    Column("ts", EpochMillis, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("subject", String(160), nullable=False),
    Column("detail", String(255), nullable=False),
    UniqueConstraint("host_id", "ts", "kind", "subject"),
)


#: One hop of a host's PCIe tree as last observed (sysfs): a GPU, a switch port or a root
#: port, with its parent. The capacity review sums GPU traffic over shared upstream hops.
PcieLink = table(
    "pcie_links",
    Column("id", Integer, primary_key=True),
    Column("host_id", ForeignKey("hosts.id"), index=True, nullable=False),
    Column("bdf", String(32), nullable=False),
    Column("parent_bdf", String(32)),
    Column("kind", String(16), nullable=False),  # gpu | bridge | root
    Column("gpu_id", ForeignKey("gpus.id")),
    Column("link_gen_current", SmallInteger),
    Column("link_width_current", SmallInteger),
    Column("link_gen_max", SmallInteger),
    Column("link_width_max", SmallInteger),
    Column("observed_at", EpochMillis, nullable=False),
    UniqueConstraint("host_id", "bdf"),
)


#: One alert episode of one rule on one subject (``vgpumon.model.Alert``): created when the
#: condition is first found (pending), updated when it fires and when it resolves. ``labels``
#: is the subject's identity as JSON; ``fingerprint`` hashes name and labels, so one condition
#: on one subject has at most one open episode (deduplication). A pending episode that never
#: fired is deleted when its condition stops. Low volume: not partitioned.
AlertRow = table(
    "alerts",
    Column("id", Integer, primary_key=True),
    Column("host_id", ForeignKey("hosts.id"), nullable=False),
    Column("name", String(64), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("fingerprint", String(40), nullable=False),
    Column("labels", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("active_since", EpochMillis, nullable=False),
    Column("fired_at", EpochMillis),
    Column("resolved_at", EpochMillis),
    Column("last_eval", EpochMillis, nullable=False),
    Column("value", Float),
    Column("summary", String(255), nullable=False),
    Column("description", Text, nullable=False),
    UniqueConstraint("host_id", "fingerprint", "active_since"),
    Index("ix_alerts_host_id_state", "host_id", "state"),
)


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


def _rollup_columns() -> list[Col]:
    src = GpuSampleRow.__table__.c
    cols: list[Col] = []
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
gpu_samples_1m = time_table(
    "gpu_samples_1m", "gpu_id", "gpus.id",
    values=[
        Column("samples", Integer, nullable=False),
        Column("up_samples", Integer, nullable=False),
        Column("folded_samples", Integer, nullable=False),
        *_rollup_columns(),
    ],
).__table__


#: How far raw ``gpu_samples`` of one GPU have been rolled up: every raw row with
#: ``ts < rolled_until`` is summarised in ``gpu_samples_1m``; retention never deletes raw rows at
#: or after it.
RollupWatermark = table(
    "rollup_watermarks",
    Column("gpu_id", ForeignKey("gpus.id"), primary_key=True),
    Column("rolled_until", EpochMillis, nullable=False),
)


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
