"""What the store's writers and readers share: the tables a tick writes, the rows' shapes, the
insert that ignores duplicates, the decoding of rollup columns, and how a database error becomes
``StoreUnavailableError``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, TypedDict, Unpack

from sqlalchemy import Row, Select, Table

from vgpumon.model import GpuIdentity
from vgpumon.store.schema import (
    ColumnValue,
    GpuProcessSample,
    GpuSampleRow,
    HostEventRow,
    HostSample,
    RejectedValue,
    XidEvent,
    gpu_samples_1m,
)

if TYPE_CHECKING:
    from sqlalchemy.dialects.postgresql import Insert as PostgresInsert
    from sqlalchemy.dialects.sqlite import Insert as SqliteInsert

    from vgpumon.store.codec import GpuRow
    from vgpumon.store.vllm_schema import VllmRow

#: A dict row of a table a tick writes besides ``gpu_samples`` (base units; the column types
#: encode them): column → value.
ExtraRow: TypeAlias = dict[str, ColumnValue]

#: A read row of ``ts`` and columns named at run time (``series``, ``latest``, ``summed_series``,
#: rollup series): column → value in base units.
SeriesRow: TypeAlias = dict[str, ColumnValue]

#: Aggregates of a window (``window_aggregates``): ``samples``, ``up_samples`` and
#: ``<column>_<aggregate>`` → value in base units (counts as integers).
Aggregates: TypeAlias = dict[str, ColumnValue]

#: The newest value of a column: ``(ts, value)``, ``ts`` in epoch seconds.
NewestValue: TypeAlias = tuple[float, ColumnValue]

#: A ``SELECT`` of columns chosen at run time.
DynamicSelect: TypeAlias = Select[Unpack[tuple[ColumnValue, ...]]]


class ProcessMemoryRow(TypedDict):
    """One process on one GPU at one tick (``process_memory_series``)."""

    gpu_id: int
    process_id: int
    pid: int
    start_time: float | None
    name: str | None
    ts: float
    used_gpu_memory_bytes: int | None


class GpuEventRow(TypedDict):
    """An event of a host's GPUs (``gpu_events``); ``gpu_id`` is ``None`` for a host-wide one."""

    ts: float
    kind: str
    gpu_id: int | None
    detail: str


#: The dialect's ``INSERT`` construct (both have ``ON CONFLICT``).
DialectInsert: TypeAlias = "PostgresInsert | SqliteInsert"

_SAMPLES = GpuSampleRow.__table__

#: Windows longer than this (seconds) are read with one SQLite connection per core.
PARALLEL_WINDOW_S = 6 * 3600

_ROLLUPS = gpu_samples_1m

#: Tables a tick writes besides ``gpu_samples``, in foreign-key order; ``TickRows`` maps each
#: name to its rows (dicts in base units; the column types encode them).
#: How long ``Store.gpus_of`` keeps a host's GPU list (registration by this store drops it at once).
GPUS_TTL_S = 60.0

EXTRA_TABLES = ("host_samples", "xid_events", "gpu_process_samples", "rejected_values", "host_events")

#: a tick's rows by table: ``gpu_samples`` as encoded tuples (``GpuRow``), ``vllm_samples`` as
#: encoded samples (``VllmRow``), the others as dicts (``ExtraRow``)
TickRows: TypeAlias = "dict[str, list[GpuRow] | list[ExtraRow] | list[VllmRow]]"

_PROCESS_KEYS = ("pid", "start_time", "name", "cmdline", "username", "container_id", "resolved")

_TABLES = {
    "host_samples": HostSample.__table__,
    "xid_events": XidEvent.__table__,
    "gpu_process_samples": GpuProcessSample.__table__,
    "rejected_values": RejectedValue.__table__,
    "host_events": HostEventRow.__table__,
}

def store_unavailable(exc: BaseException) -> bool:
    """Whether a write failed because the store cannot take writes now (unreachable, restarting,
    locked, disk full, read-only) rather than because of the rows (a value its column cannot
    hold, a foreign key that does not exist, a constraint).

    The first kind is retried later from the backlog; the second would fail again however long
    the agent waited, so its batch must be split and the failing row set aside (``Agent``).
    SQLAlchemy's ``OperationalError``/``InterfaceError`` (and psycopg's, which the COPY path
    raises unwrapped) are the first kind, except Postgres class 54 ("program limit exceeded":
    a row too large, too many columns), which concerns the row.
    """
    from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeoutError

    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if str(getattr(orig, "sqlstate", "") or "").startswith("54"):
        return False
    if isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, PoolTimeoutError)):
        return True
    try:
        import psycopg
    except ImportError:  # the postgres extra is not installed: no psycopg error can occur
        return False
    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))

def _insert(dialect: str, table: Table) -> DialectInsert:
    """The dialect's ``INSERT`` construct (it has ``ON CONFLICT``)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgres_insert

        return postgres_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table)

def insert_ignoring_duplicates(dialect: str, table: Table) -> DialectInsert:
    """``INSERT ... ON CONFLICT DO NOTHING``: a row written twice is stored once."""
    return _insert(dialect, table).on_conflict_do_nothing()

def inserted_id(key: Row[int] | None) -> int:
    """The id an ``INSERT`` of one row gave it (``CursorResult.inserted_primary_key``)."""
    if key is None:  # only an executemany or a statement that is not an INSERT has none
        raise TypeError("the statement inserted no single row")
    return int(key[0])

def _rollup_of_last(column: str) -> str | None:
    """The rollup column that holds a raw column's newest value for a minute: its ``last``
    (counters), ``any`` (latched flags) or ``max`` (gauges such as the link generation); ``None``
    when it has none of them."""
    from vgpumon.store.schema import ROLLUP_SPEC, rollup_column_name

    aggs = ROLLUP_SPEC.get(column, ())
    for agg in ("last", "any", "max"):
        if agg in aggs:
            return rollup_column_name(column, agg)
    return None

def decode_rollup(column: str, value: float | None) -> ColumnValue:
    """A ``gpu_samples_1m`` value read with ``raw=True`` (the stored integer) in base units."""
    if value is None:
        return None
    col_type = _ROLLUPS.c[column].type
    decode = getattr(col_type, "process_result_value", None)
    return decode(value, None) if decode is not None else value

@dataclass(frozen=True)
class StoredGpu:
    """A GPU row as reports see it."""

    id: int
    hostname: str
    identity: GpuIdentity
