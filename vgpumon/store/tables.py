"""What the store's writers and readers share: the tables a tick writes, the rows' shapes, the
insert that ignores duplicates, the decoding of rollup columns, and how a database error becomes
``StoreUnavailableError``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vgpumon.model import GpuIdentity
from vgpumon.store.schema import (
    GpuProcessSample,
    GpuSampleRow,
    HostEventRow,
    HostSample,
    RejectedValue,
    XidEvent,
    gpu_samples_1m,
)

_SAMPLES = GpuSampleRow.__table__

#: Windows longer than this (seconds) are read with one SQLite connection per core.
PARALLEL_WINDOW_S = 6 * 3600

_ROLLUPS = gpu_samples_1m

#: Tables a tick writes besides ``gpu_samples``, in foreign-key order; ``TickRows`` maps each
#: name to its rows (dicts in base units; the column types encode them).
#: How long ``Store.gpus_of`` keeps a host's GPU list (registration by this store drops it at once).
GPUS_TTL_S = 60.0

EXTRA_TABLES = ("host_samples", "xid_events", "gpu_process_samples", "rejected_values", "host_events")

#: a tick's rows by table: ``gpu_samples`` as encoded tuples (``GpuRow``), the others as dicts
TickRows = dict[str, list[Any]]

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

def _insert(dialect: str, table: Any) -> Any:
    """The dialect's ``INSERT`` construct (it has ``ON CONFLICT``)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table)

def insert_ignoring_duplicates(dialect: str, table: Any) -> Any:
    """``INSERT ... ON CONFLICT DO NOTHING``: a row written twice is stored once."""
    return _insert(dialect, table).on_conflict_do_nothing()

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

def decode_rollup(column: str, value: Any) -> Any:
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
