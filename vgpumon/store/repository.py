"""Every query the agent and the reports make, in one place, on SQLite and Postgres alike."""

from __future__ import annotations

import datetime as dt
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from sqlalchemy import BigInteger, Connection, Engine, and_, bindparam, case, func, select, text, type_coerce
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.base.errors import StoreUnavailableError
from vgpumon.model import GpuIdentity, GpuSample, HostEvent, PcieHop, PcieTopology
from vgpumon.store import partitions
from vgpumon.store.codec import GPU_ROW_COLUMNS, ROLLUP_ROW_COLUMNS, TS, GpuRow, RollupRow, encode_gpu_sample
from vgpumon.store.engine import (
    ConnectionWatch,
    describe_store,
    make_engine,
    normalise_url,
    sqlite_access,
    sqlite_file,
    unavailable,
)
from vgpumon.store.rollup import percentile
from vgpumon.store.schema import (
    TIME_TABLES,
    Gpu,
    GpuProcessSample,
    GpuSampleRow,
    Host,
    HostEventRow,
    HostSample,
    PcieLink,
    Process,
    RejectedValue,
    RollupWatermark,
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


class Store:
    """The time-series store.

    Args:
        url: SQLAlchemy URL (see ``make_engine``).
        engine: an existing engine instead of ``url`` (tests).
        create: allow creating a new SQLite file; readers pass False so that a mistyped path
            reports "no store" instead of creating an empty one.
        read_only: open for reading only (``diagnose``, ``db stats``): no file is created or
            changed, SQLite is opened ``mode=ro`` or as an immutable snapshot
            (``vgpumon.store.engine``); implies ``create=False``.
        busy_timeout_ms: SQLite: how long a write waits for a lock held by another writer.
        connect_timeout_s: Postgres: give up connecting after this long; ``None`` waits.
        statement_timeout_s: Postgres: the server cancels a longer statement; ``None``: its
            setting.

    Every method raises ``StoreUnavailableError`` when the database cannot be reached or queried.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        engine: Engine | None = None,
        create: bool = True,
        read_only: bool = False,
        busy_timeout_ms: int = 5000,
        connect_timeout_s: float | None = None,
        statement_timeout_s: float | None = None,
    ) -> None:
        if engine is None:
            if url is None:
                raise ValueError("Store needs a URL or an engine")
            create = create and not read_only
            file = sqlite_file(normalise_url(url))
            if not create and file is not None and not file.is_file():
                what = "is not a file" if file.exists() else "does not exist"
                raise StoreUnavailableError(f"no store at {file}: it {what} (has an agent written there? see --db)")
            engine = make_engine(
                url,
                create_dirs=create,
                read_only=read_only,
                busy_timeout_ms=busy_timeout_ms,
                connect_timeout_s=connect_timeout_s,
                statement_timeout_s=statement_timeout_s,
            )
        self.engine = engine
        self.dialect = engine.dialect.name
        #: the pool's connections and its last movement: the agent cuts a silent store's (``ConnectionWatch``)
        self.watch = ConnectionWatch(engine)
        #: (table, day ms) partitions known to exist (Postgres).
        self._partitions: set[tuple[str, int]] = set()
        self._extra_inserts = {name: insert_ignoring_duplicates(self.dialect, t) for name, t in _TABLES.items()}
        self._process_ids: dict[tuple[int, int, float | None], int] = {}
        # statements the agent's rules run every cycle, built once with bound parameters: building
        # a SQLAlchemy statement and its cache key costs more than running it on a small window
        self._stmts: dict[tuple[Any, ...], Any] = {}
        self._schema_ok = False  # a reader found the tables at the revision this vgpumon reads
        self._gpus: dict[str, tuple[float, tuple[StoredGpu, ...]]] = {}  # gpus_of, with when it was read

    @staticmethod
    def _ids(n: int) -> list[Any]:
        """``n`` bound parameters ``id0``… for an ``IN`` list whose length is part of the
        statement's key (an expanding parameter is re-compiled at every execution)."""
        return [bindparam(f"id{i}") for i in range(n)]

    @staticmethod
    def _id_params(ids: Sequence[int]) -> dict[str, int]:
        return {f"id{i}": g for i, g in enumerate(ids)}

    def _stmt(self, key: tuple[Any, ...], build: Any) -> Any:
        """The statement ``build()`` makes, made once per ``key``."""
        stmt = self._stmts.get(key)
        if stmt is None:
            stmt = self._stmts[key] = build()
        return stmt

    @property
    def access_note(self) -> str | None:
        """Says how a reader sees a SQLite store when that is not plain read-only access: an
        immutable snapshot (no agent has it open, or it cannot be opened read-only here);
        ``None`` otherwise."""
        if sqlite_access(self.engine) != "immutable":
            return None
        file = sqlite_file(self.engine.url)
        wal = Path(f"{file}-wal") if file is not None else None
        if wal is not None and wal.exists() and wal.stat().st_size > 0:
            return f"read as an immutable snapshot (cannot open it read-only here); rows still in {wal} are not shown"
        return "read as an immutable snapshot (no agent has it open)"

    def _fail(self, exc: Exception) -> StoreUnavailableError:
        return unavailable(self.engine, exc)

    def _require_tables(self, conn: Connection) -> None:
        """Raise ``StoreUnavailableError`` when the database holds no vgpumon tables (an empty
        file, another application's database), so readers say that instead of "no such table"."""
        if not self.engine.dialect.has_table(conn, Host.__table__.name):
            raise StoreUnavailableError(f"{describe_store(self.engine)} holds no vgpumon data (no tables)")
        if self._schema_ok:
            return
        # an older schema than this vgpumon reads: say so, not "no such column" (a newer one is
        # read: its additions are left alone)
        from vgpumon.store.migrate import packaged_head, packaged_revisions

        head = packaged_head()
        current = None
        if self.engine.dialect.has_table(conn, "alembic_version"):
            current = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
        if head is not None and current != head and (current is None or current in packaged_revisions()):
            raise StoreUnavailableError(
                f"{describe_store(self.engine)} has schema revision {current or '(from before migrations)'}, older than "
                f"this vgpumon reads ({head}): run `vgpumon db upgrade --db URL` (an agent of this version upgrades it "
                "when it starts)"
            )
        self._schema_ok = True

    def init_schema(self) -> None:
        """Bring the schema to the newest revision (Alembic; under an advisory lock on Postgres).

        Raises:
            StoreUnavailableError: the database cannot be reached or a migration fails.
        """
        from vgpumon.store.migrate import at_head, upgrade

        if not at_head(self.engine):  # the common case costs one query, and no Alembic import
            upgrade(self.engine)

    def close(self) -> None:
        """Release pooled connections."""
        self.engine.dispose()

    # -- writes --------------------------------------------------------------------------------

    def register_gpus(self, hostname: str, gpus: Iterable[GpuIdentity]) -> dict[str, int]:
        """Insert or update the host and its GPUs: idempotent upserts, so agents that start
        together (on one host name, or sharing GPU UUIDs) never collide.

        A GPU's history belongs to (host, UUID): a card seen on another host (moved, a cloned VM
        image, masked captures that share UUIDs) gets a row, and a history, of its own there.

        Returns:
            GPU UUID → ``gpus.id`` of this host's GPUs.
        """
        now = dt.datetime.now(dt.timezone.utc)
        t = Gpu.__table__
        self._gpus.pop(hostname, None)
        try:
            with self.engine.begin() as conn:
                conn.execute(insert_ignoring_duplicates(self.dialect, Host.__table__).values(hostname=hostname, first_seen=now))
                host_id = conn.scalar(select(Host.id).where(Host.hostname == hostname))
                ids: dict[str, int] = {}
                for g in gpus:
                    attrs = dict(
                        index=g.index,
                        name=g.name,
                        serial=g.serial,
                        pci_bus_id=g.pci_bus_id,
                        memory_total_bytes=g.memory_total_bytes,
                        pcie_link_gen_max=g.pcie_link_gen_max,
                        pcie_link_width_max=g.pcie_link_width_max,
                        pcie_link_gen_gpu_max=g.pcie_link_gen_gpu_max,
                        gpm_supported=g.gpm_supported,
                        sm_clock_max_hertz=g.sm_clock_max_hertz,
                        memory_clock_max_hertz=g.memory_clock_max_hertz,
                        slowdown_temperature_celsius=g.slowdown_temperature_celsius,
                        last_seen=now,
                    )
                    ins = _insert(self.dialect, t).values(host_id=host_id, uuid=g.uuid, first_seen=now, **attrs)
                    ins = ins.on_conflict_do_update(
                        index_elements=[t.c.host_id, t.c.uuid], set_={k: ins.excluded[k] for k in attrs}
                    ).returning(t.c.id)
                    ids[g.uuid] = int(conn.execute(ins).scalar_one())
            return ids
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        finally:
            self._gpus.pop(hostname, None)  # a list read meanwhile (another thread) is not kept either

    @staticmethod
    def sample_row(gpu_id: int, s: GpuSample) -> GpuRow:
        """The stored ``gpu_samples`` row of one sample (see ``codec.encode_gpu_sample``)."""
        return encode_gpu_sample(gpu_id, s)

    def ensure_partitions(self, conn: Connection, table: str, days: Iterable[int]) -> None:
        """Create the day partitions ``table`` needs for ``days`` (epoch ms) on Postgres; no-op on
        SQLite. Known partitions are cached, so calling this per batch costs nothing."""
        if self.dialect != "postgresql":
            return
        missing = {d for d in days if (table, d) not in self._partitions}
        if missing:
            partitions.ensure(conn, table, missing)
            conn.commit()  # DDL out of the way of the batch: a failed batch must not undo it
            self._partitions.update((table, d) for d in missing)

    def forget_partitions(self) -> None:
        """Drop the partition cache (after retention dropped some)."""
        self._partitions.clear()

    def _copy_insert(self, conn: Connection, table: str, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> int:
        """Postgres: ``COPY`` the batch straight into ``table``; if some rows are already stored
        (a replayed spool file, a capture replayed twice) COPY fails on the primary key, and the
        batch goes again through a session-local staging table and ``INSERT ... SELECT ... ON
        CONFLICT DO NOTHING``. The common case thus runs at the driver's COPY rate
        (docs/benchmarks.md); duplicates cost one extra round."""
        import psycopg

        cols = ", ".join(f'"{c}"' for c in columns)
        raw = conn.connection.driver_connection
        if not conn.in_transaction():
            conn.begin()  # COPY runs on the driver connection: let SQLAlchemy own the commit
        try:
            with raw.cursor() as cur:  # type: ignore[union-attr]
                with cur.copy(f'COPY "{table}" ({cols}) FROM STDIN') as copy:
                    for r in rows:
                        copy.write_row(r)
            return len(rows)
        except psycopg.errors.UniqueViolation:
            conn.rollback()
            conn.begin()
        stage = f"_stage_{table}"
        conn.exec_driver_sql(
            f'CREATE TEMP TABLE IF NOT EXISTS "{stage}" (LIKE "{table}" INCLUDING DEFAULTS) ON COMMIT DELETE ROWS'
        )
        with raw.cursor() as cur:  # type: ignore[union-attr]
            with cur.copy(f'COPY "{stage}" ({cols}) FROM STDIN') as copy:
                for r in rows:
                    copy.write_row(r)
        return conn.exec_driver_sql(
            f'INSERT INTO "{table}" ({cols}) SELECT {cols} FROM "{stage}" ON CONFLICT DO NOTHING'  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
        ).rowcount

    def _insert_rows(self, table: str, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> int:
        """Insert rows, skipping those already stored; returns how many were inserted."""
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        try:
            with self.engine.connect() as conn:
                self.ensure_partitions(conn, table, {partitions.day_of(r[TS]) for r in rows})
                if self.dialect == "postgresql":
                    try:
                        inserted = self._copy_insert(conn, table, columns, rows)
                    except dbapi_error as exc:
                        # COPY runs on the driver connection, outside SQLAlchemy's error
                        # handling: a server that went away mid-COPY leaves a dead connection
                        # that must not go back to the pool (nor may one left mid-transaction
                        # by a row the server refused).
                        conn.invalidate()
                        if store_unavailable(exc):
                            raise self._fail(exc) from None
                        raise
                else:
                    marks = ", ".join("?" for _ in columns)
                    cols = ", ".join(f'"{c}"' for c in columns)
                    # sqlite3 sums the changes of an executemany: the rows inserted
                    inserted = conn.exec_driver_sql(
                        f'INSERT INTO "{table}" ({cols}) VALUES ({marks}) ON CONFLICT DO NOTHING', list(rows)  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
                    ).rowcount
                conn.commit()
                return max(inserted, 0)
        except SQLAlchemyError as exc:
            if store_unavailable(exc):
                raise self._fail(exc) from None
            raise

    def write_gpu_rows(self, rows: Sequence[GpuRow]) -> int:
        """Write stored ``gpu_samples`` rows (``codec.GPU_ROW_COLUMNS`` order) in one transaction;
        rows already stored are skipped, so a batch written twice is stored once.

        Returns:
            The rows inserted (the others were stored already: a replayed spool, a capture
            replayed twice).

        Raises:
            StoreUnavailableError: the database is unreachable, locked, full, ...; nothing of the
                batch is stored then.
            Exception: the driver's own error (SQLAlchemy ``IntegrityError``/``DataError``,
                ``OverflowError`` from sqlite3, ...) when the store refuses a row for what it
                holds (``store_unavailable`` is false for it); nothing of the batch is stored.
        """
        return self._insert_rows("gpu_samples", GPU_ROW_COLUMNS, rows) if rows else 0

    def write_rollup_rows(self, rows: Sequence[RollupRow]) -> None:
        """Write ``gpu_samples_1m`` rows (``codec.ROLLUP_ROW_COLUMNS`` order), skipping minutes
        already summarised. Raises ``StoreUnavailableError`` like ``write_gpu_rows``."""
        if rows:
            self._insert_rows("gpu_samples_1m", ROLLUP_ROW_COLUMNS, rows)

    def write_extra_rows(self, ticks: Sequence[TickRows]) -> None:
        """Write the non-GPU rows of whole ticks (``EXTRA_TABLES``: host samples, XID events, GPU
        process samples, rejected values, host events) in one transaction; rows already stored are skipped.

        ``gpu_process_samples`` rows also carry the process identity (``host_id`` and
        ``_PROCESS_KEYS``): the ``processes`` row is created on first sight and referenced by id.

        Raises:
            StoreUnavailableError: the database is unreachable; nothing of the batch is stored.
            Exception: the driver's own error when the store refuses a row for what it holds,
                as in ``write_gpu_rows``; nothing of the batch is stored.
        """
        merged: dict[str, list[dict[str, Any]]] = {t: [] for t in EXTRA_TABLES}
        for tick in ticks:
            for table, rows in tick.items():
                if table in merged:
                    merged[table].extend(rows)
        if not any(merged.values()):
            return
        try:
            with self.engine.connect() as conn:
                for table in EXTRA_TABLES:
                    if merged[table] and table in TIME_TABLES:
                        self.ensure_partitions(conn, table, {partitions.day_of(int(round(r["ts"] * 1000))) for r in merged[table]})
                if merged["gpu_process_samples"]:
                    merged["gpu_process_samples"] = [self._with_process_id(conn, r) for r in merged["gpu_process_samples"]]
                for table in EXTRA_TABLES:
                    if merged[table]:
                        conn.execute(self._extra_inserts[table], merged[table])
                conn.commit()
        except Exception as exc:
            self._process_ids.clear()  # ids inserted by a rolled-back transaction are void
            if isinstance(exc, SQLAlchemyError) and store_unavailable(exc):
                raise self._fail(exc) from None
            raise

    def _with_process_id(self, conn: Any, row: dict[str, Any]) -> dict[str, Any]:
        key = (row["host_id"], row["pid"], row["start_time"])
        pid = self._process_ids.get(key)
        if pid is None:
            t = Process.__table__
            cond = [t.c.host_id == row["host_id"], t.c.pid == row["pid"]]
            cond.append(t.c.start_time.is_(None) if row["start_time"] is None else t.c.start_time == row["start_time"])
            pid = conn.scalar(select(t.c.id).where(and_(*cond)))
            if pid is None:
                values = {k: row[k] for k in _PROCESS_KEYS}
                pid = conn.execute(t.insert().values(host_id=row["host_id"], **values)).inserted_primary_key[0]
            self._process_ids[key] = pid
        return {
            "gpu_id": row["gpu_id"],
            "ts": row["ts"],
            "process_id": pid,
            "used_gpu_memory_bytes": row["used_gpu_memory_bytes"],
            "rss_bytes": row["rss_bytes"],
            "cpu_seconds_total": row["cpu_seconds_total"],
        }

    def replace_topology(self, host_id: int, hops: Sequence[Any], gpu_ids: dict[str, int], observed_at: float) -> None:
        """Replace a host's stored PCIe tree with ``hops`` (``PcieHop``s) in one transaction."""
        t = PcieLink.__table__
        rows = [
            {
                "host_id": host_id, "bdf": h.bdf, "parent_bdf": h.parent_bdf, "kind": h.kind,
                "gpu_id": gpu_ids.get(h.uuid) if h.uuid else None,
                "link_gen_current": h.link_gen_current, "link_width_current": h.link_width_current,
                "link_gen_max": h.link_gen_max, "link_width_max": h.link_width_max, "observed_at": observed_at,
            }
            for h in hops
        ]
        try:
            with self.engine.begin() as conn:
                conn.execute(t.delete().where(t.c.host_id == host_id))
                if rows:
                    conn.execute(t.insert(), rows)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def topology(self, hostname: str) -> Any:
        """The stored PCIe tree of a host as a ``PcieTopology`` (empty when never read)."""

        t = PcieLink.__table__
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(t, Gpu.uuid).join(Host, Host.id == t.c.host_id).outerjoin(Gpu, Gpu.id == t.c.gpu_id).where(Host.hostname == hostname)
                ).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return PcieTopology(
            tuple(
                PcieHop(
                    bdf=r["bdf"], kind=r["kind"], parent_bdf=r["parent_bdf"],
                    link_gen_current=r["link_gen_current"], link_width_current=r["link_width_current"],
                    link_gen_max=r["link_gen_max"], link_width_max=r["link_width_max"], uuid=r["uuid"],
                )
                for r in rows
            )
        )

    def host_id(self, hostname: str) -> int | None:
        """``hosts.id`` of a host name, ``None`` if unknown."""
        try:
            with self.engine.connect() as conn:
                return conn.scalar(select(Host.id).where(Host.hostname == hostname))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def xid_events(self, gpu_id: int, start: float, end: float) -> list[tuple[float, int]]:
        """``(ts, xid)`` of a GPU's XID events in a window, oldest first."""
        t = XidEvent.__table__
        try:
            with self.engine.connect() as conn:
                return [
                    (r[0], r[1])
                    for r in conn.execute(
                        select(t.c.ts, t.c.xid).where(and_(t.c.gpu_id == gpu_id, t.c.ts >= start, t.c.ts <= end)).order_by(t.c.ts)
                    )
                ]
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    # -- reads ---------------------------------------------------------------------------------

    def hostnames(self) -> list[str]:
        """Every host in the store, sorted."""
        try:
            with self.engine.connect() as conn:
                self._require_tables(conn)
                return list(conn.scalars(select(Host.hostname).order_by(Host.hostname)))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def gpus_of(self, hostname: str) -> list[StoredGpu]:
        """The GPUs stored for a host, by NVML index. Kept for ``GPUS_TTL_S`` seconds (the agent's
        rules read it every cycle), and read again at once after this store registers GPUs."""
        cached = self._gpus.get(hostname)
        if cached is not None and time.monotonic() - cached[0] < GPUS_TTL_S:
            return list(cached[1])
        out = self._read_gpus_of(hostname)
        self._gpus[hostname] = (time.monotonic(), tuple(out))
        return out

    def _read_gpus_of(self, hostname: str) -> list[StoredGpu]:
        try:
            with self.engine.connect() as conn:
                if not self._schema_ok:
                    self._require_tables(conn)
                stmt = self._stmt(("gpus_of",), lambda: select(Gpu.__table__).join(Host, Host.id == Gpu.host_id)
                                  .where(Host.hostname == bindparam("hostname")).order_by(Gpu.index))
                rows = conn.execute(stmt, {"hostname": hostname}).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        out = []
        for g in rows:
            out.append(
                StoredGpu(
                    id=g["id"],
                    hostname=hostname,
                    identity=GpuIdentity(
                        index=g["index"],
                        uuid=g["uuid"],
                        name=g["name"],
                        serial=g["serial"],
                        pci_bus_id=g["pci_bus_id"],
                        memory_total_bytes=g["memory_total_bytes"],
                        pcie_link_gen_max=g["pcie_link_gen_max"],
                        pcie_link_width_max=g["pcie_link_width_max"],
                        pcie_link_gen_gpu_max=g["pcie_link_gen_gpu_max"],
                        gpm_supported=bool(g["gpm_supported"]),
                        sm_clock_max_hertz=g["sm_clock_max_hertz"],
                        memory_clock_max_hertz=g["memory_clock_max_hertz"],
                        slowdown_temperature_celsius=g["slowdown_temperature_celsius"],
                    ),
                )
            )
        return out

    def newest_ts(self, gpu_ids: Sequence[int]) -> float | None:
        """Newest sample time (epoch seconds) over these GPUs; ``None`` when they have none."""
        if not gpu_ids:
            return None
        try:
            with self.engine.connect() as conn:
                stmt = self._stmt(("newest_ts", len(gpu_ids)), lambda: select(type_coerce(func.max(_SAMPLES.c.ts), _SAMPLES.c.ts.type))
                                  .where(_SAMPLES.c.gpu_id.in_(self._ids(len(gpu_ids)))))
                return conn.scalar(stmt, self._id_params(gpu_ids))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def window_aggregates(
        self, gpu_id: int, start: float, end: float, columns: Sequence[str]
    ) -> dict[str, Any]:
        """Mean and max of columns over ``start <= ts <= end`` for one GPU.

        Returns:
            ``{"samples": n, "up_samples": n, "<col>_mean": x, "<col>_max": x, ...}`` in base
            units; ``None`` where the window has no non-NULL value.
        """
        c = _SAMPLES.c
        exprs = [func.count().label("samples"), func.sum(case((c.up, 1), else_=0)).label("up_samples")]
        for name in columns:
            col = c[name]
            exprs.append(type_coerce(func.avg(col), col.type).label(f"{name}_mean"))
            exprs.append(type_coerce(func.max(col), col.type).label(f"{name}_max"))
        try:
            with self.engine.connect() as conn:
                row = conn.execute(
                    select(*exprs).where(and_(c.gpu_id == gpu_id, c.ts >= start, c.ts <= end))
                ).mappings().one()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return dict(row)

    def window_aggregates_many(
        self,
        gpu_ids: Sequence[int],
        start: float,
        end: float,
        columns: Sequence[str],
        aggregates: Sequence[str] = ("mean", "max"),
    ) -> dict[int, dict[str, Any]]:
        """``window_aggregates`` for many GPUs in one query (``GROUP BY gpu_id``).

        On Postgres this reads each partition once (in parallel workers) instead of once per GPU:
        a tick's rows of all GPUs share heap pages, so per-GPU queries read every page 8 times on
        an 8-GPU host. On SQLite the GPUs are split over one connection per core. Figures for
        72 h of 8 GPUs are in docs/benchmarks.md.

        Args:
            aggregates: which of ``min``, ``mean``, ``max`` and ``count`` (non-NULL values) to
                take of every column; the rules read minima and counts too.

        Returns:
            ``gpu_id`` → ``{"samples": n, "up_samples": n, "<col>_<aggregate>": x, ...}`` in base
            units (counts as integers); GPUs without rows in the window get ``samples == 0`` and
            ``None`` aggregates.
        """
        c = _SAMPLES.c

        def build(n: int) -> Any:
            exprs = [c.gpu_id, func.count().label("samples"), func.sum(case((c.up, 1), else_=0)).label("up_samples")]
            sql = {"min": func.min, "mean": func.avg, "max": func.max}
            for name in columns:
                col = c[name]
                for agg in aggregates:
                    if agg == "count":
                        exprs.append(func.count(col).label(f"{name}_count"))
                    else:
                        exprs.append(type_coerce(sql[agg](col), col.type).label(f"{name}_{agg}"))
            where = and_(c.gpu_id.in_(self._ids(n)), c.ts >= bindparam("start"), c.ts <= bindparam("end"))
            return select(*exprs).where(where).group_by(c.gpu_id)

        def query(ids: Sequence[int]) -> list[Any]:
            stmt = self._stmt(("window_many", tuple(columns), tuple(aggregates), len(ids)), lambda: build(len(ids)))
            with self.engine.connect() as conn:
                return list(conn.execute(stmt, {**self._id_params(ids), "start": start, "end": end}).mappings().all())

        try:
            # (cpu_count reads sysfs each call: asked only when a split is possible at all)
            long_sqlite = self.dialect == "sqlite" and len(gpu_ids) > 1 and end - start > PARALLEL_WINDOW_S
            workers = min(len(gpu_ids), os.cpu_count() or 1) if long_sqlite else 1
            if workers > 1:
                # SQLite runs a query on one core; its module releases the GIL while it steps,
                # and WAL lets readers run side by side: one connection per core halves the
                # time on 2 cores over long windows (docs/benchmarks.md). A short window (the
                # agent's rules, every few seconds) costs less than starting the threads.
                chunks = [list(gpu_ids)[i::workers] for i in range(workers)]
                with ThreadPoolExecutor(workers, thread_name_prefix="vgpumon-read") as pool:
                    rows = [r for part in pool.map(query, chunks) for r in part]
            else:
                rows = query(gpu_ids)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        empty = {"samples": 0, "up_samples": None, **{f"{n}_{k}": None for n in columns for k in aggregates}}
        out: dict[int, dict[str, Any]] = {g: dict(empty) for g in gpu_ids}
        for r in rows:
            d = dict(r)
            out[d.pop("gpu_id")] = d
        return out

    def events(self, hostname: str, start: float, end: float, kinds: Sequence[str] | None = None) -> list[HostEvent]:
        """Host events of one host over ``start <= ts <= end``, oldest first (``kinds``: only
        these)."""
        c = HostEventRow.__table__.c
        kinds = tuple(kinds or ())

        def build() -> Any:
            query = (
                select(c.ts, c.kind, c.subject, c.detail)
                .join(Host.__table__, Host.id == c.host_id)
                .where(and_(Host.hostname == bindparam("hostname"), c.ts >= bindparam("start"), c.ts <= bindparam("end")))
                .order_by(c.ts, c.id)
            )
            return query.where(c.kind.in_(kinds)) if kinds else query

        query = self._stmt(("events", kinds), build)
        try:
            with self.engine.connect() as conn:
                params = {"hostname": hostname, "start": start, "end": end}
                return [HostEvent(ts=r[0], kind=r[1], subject=r[2], detail=r[3]) for r in conn.execute(query, params)]
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def summed_series(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> list[dict[str, Any]]:
        """Per tick, the sum of columns over several GPUs (``GROUP BY ts``), oldest first: the
        traffic a shared PCIe switch or root port carries, tick by tick (the agent stamps every
        GPU of a tick with the tick's time).

        Returns:
            ``{"ts": seconds, "gpus": GPUs with a row at that tick, <col>: sum in base units or
            None}`` per tick.
        """
        c = _SAMPLES.c
        sums = [type_coerce(func.sum(c[n]), c[n].type).label(n) for n in columns]
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(c.ts, func.count().label("gpus"), *sums)
                    .where(and_(c.gpu_id.in_(list(gpu_ids)), c.ts >= start, c.ts <= end))
                    .group_by(c.ts)
                    .order_by(c.ts)
                ).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [dict(r) for r in rows]

    def host_xid_events(self, hostname: str, start: float, end: float) -> list[tuple[float, int, int]]:
        """``(ts, gpu_id, xid)`` of every XID event of a host's GPUs in a window, oldest first."""
        t = XidEvent.__table__
        try:
            with self.engine.connect() as conn:
                stmt = self._stmt(("host_xids",), lambda: select(t.c.ts, t.c.gpu_id, t.c.xid)
                                  .join(Gpu, Gpu.id == t.c.gpu_id)
                                  .join(Host, Host.id == Gpu.host_id)
                                  .where(and_(Host.hostname == bindparam("hostname"), t.c.ts >= bindparam("start"), t.c.ts <= bindparam("end")))
                                  .order_by(t.c.ts))
                rows = conn.execute(stmt, {"hostname": hostname, "start": start, "end": end}).all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [(r[0], r[1], r[2]) for r in rows]

    def process_memory_series(self, gpu_ids: Sequence[int], start: float, end: float) -> list[dict[str, Any]]:
        """GPU memory of each process on these GPUs over a window, oldest first: ``gpu_id``,
        ``process_id`` (one process start: a restarted server is a new id), ``pid``,
        ``start_time``, ``name``, ``ts`` and ``used_gpu_memory_bytes`` (``None`` where the driver
        withheld it)."""
        s = GpuProcessSample.__table__.c
        p = Process.__table__.c
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(s.gpu_id, s.process_id, p.pid, p.start_time, p.name, s.ts, s.used_gpu_memory_bytes)
                    .join(Process.__table__, p.id == s.process_id)
                    .where(and_(s.gpu_id.in_(list(gpu_ids)), s.ts >= start, s.ts <= end))
                    .order_by(s.ts)
                ).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [dict(r) for r in rows]

    def newest_host_sample(self, hostname: str) -> float | None:
        """Time (epoch seconds) of the host's newest ``host_samples`` row; ``None`` when it has
        none (replays of another host's capture take none)."""
        c = HostSample.__table__.c
        try:
            with self.engine.connect() as conn:
                stmt = self._stmt(("newest_host_sample",), lambda: select(type_coerce(func.max(c.ts), c.ts.type))
                                  .join(Host, Host.id == c.host_id).where(Host.hostname == bindparam("hostname")))
                return conn.scalar(stmt, {"hostname": hostname})
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def gpu_events(self, hostname: str, start: float, end: float, gpus: Sequence[StoredGpu] | None = None) -> list[dict[str, Any]]:
        """Events of a host's GPUs in a window, oldest first (``host_events`` whose subject is a
        GPU: appeared, disappeared, down, recovered, wedged, memory-API change, collector fault),
        each as ``{"ts": seconds, "kind": str, "gpu_id": int | None, "detail": str}``; host-wide
        events (clock steps, re-initialisations) come with ``gpu_id`` ``None``. ``gpus``: the
        host's GPUs where the caller has them (``gpus_of``), else they are read."""
        ids = {f"gpu:{g.identity.uuid}": g.id for g in (self.gpus_of(hostname) if gpus is None else gpus)}
        return [
            {"ts": e.ts, "kind": e.kind, "gpu_id": ids.get(e.subject), "detail": e.detail}
            for e in self.events(hostname, start, end)
        ]

    def rejections(self, hostname: str, start: float, end: float) -> dict[str, dict[str, tuple[int, str]]]:
        """Values rejected at the door over ``start <= ts <= end`` for one host.

        Returns:
            subject (``gpu:<uuid>``, ``host``, ``vllm:<url>``) → field → (ticks with a rejected
            value, the newest reason).
        """
        t = RejectedValue.__table__
        c = t.c
        out: dict[str, dict[str, tuple[int, str]]] = {}
        try:
            with self.engine.connect() as conn:
                host_id = conn.scalar(select(Host.id).where(Host.hostname == hostname))
                if host_id is None:
                    return out
                where = and_(c.host_id == host_id, c.ts >= start, c.ts <= end)
                counts = conn.execute(
                    select(c.subject, c.field, func.count(), type_coerce(func.max(c.ts), c.ts.type))
                    .where(where)
                    .group_by(c.subject, c.field)
                ).all()
                for subject, field, n, newest in counts:
                    reason = conn.scalar(
                        select(c.reason).where(and_(where, c.subject == subject, c.field == field, c.ts == newest))
                    )
                    out.setdefault(subject, {})[field] = (int(n), reason)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return out

    #: How far back raw rows are read for a newest value (``last_values``): the slow set reads
    #: every 10 ticks; an older value is taken from the rollups (which trail by minutes: a value
    #: read only in that gap is found in the rollups once they catch up).
    LAST_RAW_SECONDS = 120.0
    #: How far back the rollups are searched beyond that: a counter last read more than a week
    #: before the report's end is not "the current count"; searching further would scan months of
    #: a column the GPU never reports (SQLite cannot stop early on ``IS NOT NULL``).
    LAST_ROLLUP_SECONDS = 7 * 86400.0

    def last_values(self, gpu_id: int, end: float, columns: Sequence[str]) -> dict[str, tuple[float, Any] | None]:
        """Newest non-NULL value of each column at or before ``end`` for one GPU
        (``last_values_many`` for one GPU)."""
        return self.last_values_many([gpu_id], end, columns)[gpu_id]

    def last_values_many(self, gpu_ids: Sequence[int], end: float, columns: Sequence[str]) -> dict[int, dict[str, tuple[float, Any] | None]]:
        """Newest non-NULL value of each column at or before ``end``, per GPU.

        One query over the raw rows of the last ``LAST_RAW_SECONDS`` for all GPUs
        (``newest_values``); a column without a value there is looked up in the 1-minute rollups
        of the ``LAST_ROLLUP_SECONDS`` before (its ``last``, ``any`` or ``max`` aggregate, the
        minute's start as its time) with one scan per GPU. Per-column seeks on raw rows used to
        scan the whole history of a column a GPU never reports: 2.2 s of a 2.5 s report on 72 h of
        8 GPUs (docs/benchmarks.md).

        Returns:
            ``gpu_id`` → column → ``(ts, value)`` in base units, or ``None`` when not found.
        """
        out: dict[int, dict[str, tuple[float, Any] | None]] = {g: {n: None for n in columns} for g in gpu_ids}
        if not gpu_ids or not columns:
            return out
        for gid, found in self.newest_values(gpu_ids, end - self.LAST_RAW_SECONDS, end, columns).items():
            out[gid].update(found)
        rc = _ROLLUPS.c
        try:
            with self.engine.connect() as conn:
                for gid in gpu_ids:
                    missing = {n: _rollup_of_last(n) for n, v in out[gid].items() if v is None}
                    missing = {n: col for n, col in missing.items() if col is not None}
                    if not missing:
                        continue
                    key = tuple(missing.items())
                    newest_stmt = self._stmt(("last_rollup_ts", key), lambda: select(
                        *(type_coerce(func.max(case((rc[col].is_not(None), rc.ts))), rc.ts.type).label(n) for n, col in key)  # noqa: B023  the statement factory runs at once, inside this iteration (_stmt)
                    ).where(and_(rc.gpu_id == bindparam("gid"), rc.ts >= bindparam("start"), rc.ts <= bindparam("end"))))
                    newest = conn.execute(
                        newest_stmt,
                        {"gid": gid, "start": end - self.LAST_RAW_SECONDS - self.LAST_ROLLUP_SECONDS, "end": end},
                    ).one()
                    for n, col in missing.items():
                        ts = getattr(newest, n)
                        if ts is not None:
                            value_stmt = self._stmt(("last_rollup_value", col), lambda col=col: select(rc[col]).where(
                                and_(rc.gpu_id == bindparam("gid"), rc.ts == bindparam("ts"))))
                            out[gid][n] = (ts, conn.scalar(value_stmt, {"gid": gid, "ts": ts}))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return out

    def newest_values(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> dict[int, dict[str, tuple[float, Any]]]:
        """Newest non-NULL value of each column among the raw rows of ``start <= ts <= end``, per
        GPU: one query for all GPUs (raw rows only; ``last_values_many`` looks further back).

        Returns:
            ``gpu_id`` → column → ``(ts, value)`` in base units; columns without a value in the
            window, and GPUs without one at all, are absent.
        """
        c = _SAMPLES.c
        out: dict[int, dict[str, tuple[float, Any]]] = {}
        if not gpu_ids or not columns:
            return out
        # built once per column set, with bound parameters (the rules ask every 15 s)
        cols = tuple(columns)
        raw = self._stmt(("last_raw", cols), lambda: select(c.gpu_id, c.ts, *(c[n] for n in cols))
                         .where(and_(c.gpu_id.in_(bindparam("gids", expanding=True)), c.ts >= bindparam("start"),
                                     c.ts <= bindparam("end")))
                         .order_by(c.gpu_id, c.ts.desc()))
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(raw, {"gids": list(gpu_ids), "start": start, "end": end}).all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        for r in rows:  # newest first per GPU: the first non-NULL value of a column is its newest
            found = out.setdefault(r[0], {})
            if len(found) == len(cols):
                continue
            for i, n in enumerate(cols):
                v = r[2 + i]
                if v is not None and n not in found:
                    found[n] = (r[1], v)
        return out

    def series(self, gpu_id: int, start: float, end: float, columns: Sequence[str], present: bool = False) -> list[dict[str, Any]]:
        """Rows of ``ts`` and the columns over a window, oldest first (base units).

        Args:
            present: only the rows where every column has a value (a counter read each minute,
                such as the PCIe replay counter, has one row in 60 with it).
        """
        c = _SAMPLES.c
        cols = tuple(columns)

        def build() -> Any:
            where = [c.gpu_id == bindparam("gid"), c.ts >= bindparam("start"), c.ts <= bindparam("end")]
            if present:
                where += [c[n].is_not(None) for n in cols]
            return select(c.ts, *(c[n] for n in cols)).where(and_(*where)).order_by(c.ts)

        try:
            with self.engine.connect() as conn:
                rows = conn.execute(self._stmt(("series", cols, present), build), {"gid": gpu_id, "start": start, "end": end}).all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        names = ("ts", *cols)
        return [dict(zip(names, r)) for r in rows]  # plain tuples zipped: half the time of RowMapping copies


    def latest(self, gpu_ids: Sequence[int], columns: Sequence[str], until: float | None = None) -> dict[int, dict[str, Any]]:
        """The newest row of each GPU, at or before ``until`` when given (one PK seek per GPU on
        both engines).

        Returns:
            ``gpu_id`` → ``{"ts": seconds, <column>: value in base units or None}``; GPUs without
            rows are absent.
        """
        c = _SAMPLES.c
        out: dict[int, dict[str, Any]] = {}
        try:
            with self.engine.connect() as conn:
                bounded = until is not None
                stmt = self._stmt(
                    ("latest", tuple(columns), bounded),
                    lambda: select(c.ts, *(c[n] for n in columns))
                    .where(and_(c.gpu_id == bindparam("gid"), c.ts <= bindparam("until")) if bounded else c.gpu_id == bindparam("gid"))
                    .order_by(c.ts.desc()).limit(1),
                )
                for gid in gpu_ids:
                    params = {"gid": gid, "until": until} if bounded else {"gid": gid}
                    row = conn.execute(stmt, params).mappings().first()
                    if row is not None:
                        out[gid] = dict(row)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return out

    def down_since(self, newest: Mapping[int, tuple[float, Any]], at: float) -> dict[int, float]:
        """For each GPU whose newest row at or before ``at`` is unreadable (``up`` false), the
        time of the first unreadable row since its newest readable one: how long it has been
        down now. GPUs readable at ``at``, or without rows, are absent.

        Args:
            newest: each GPU's newest ``(ts, up)`` at or before ``at``, as ``latest(ids, ("up",),
                until=at)`` reads it (``HostView`` reads it once for every rule); GPUs absent
                from it have no row.

        Two primary-key seeks per GPU that is down (newest readable row, then the row after it);
        none while every GPU is readable.

        Returns:
            ``gpu_id`` → epoch seconds.
        """
        c = _SAMPLES.c
        out: dict[int, float] = {}
        down = [gid for gid, (_, up) in newest.items() if not up]
        if not down:
            return out
        try:
            with self.engine.connect() as conn:
                for gid in down:
                    last_up = conn.scalar(
                        select(c.ts).where(and_(c.gpu_id == gid, c.ts <= at, c.up)).order_by(c.ts.desc()).limit(1)
                    )
                    first = select(c.ts).where(c.gpu_id == gid).order_by(c.ts).limit(1)
                    if last_up is not None:
                        first = first.where(c.ts > last_up)
                    out[gid] = conn.scalar(first)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return out

    def window_percentiles(
        self, gpu_id: int, start: float, end: float, columns: Sequence[str], quantiles: Sequence[float] = (0.5, 0.95, 0.99)
    ) -> dict[str, dict[float, float | None]]:
        """Percentiles of raw values over ``start <= ts <= end`` for one GPU.

        Linear interpolation between closest ranks (Postgres ``percentile_cont``; on SQLite, which
        has no percentile aggregate, the same definition in Python over the sorted column), NULLs
        ignored.

        Returns:
            column → {quantile → value in base units, or ``None`` when the window has no value}.
        """
        c = _SAMPLES.c
        where = and_(c.gpu_id == gpu_id, c.ts >= start, c.ts <= end)
        out: dict[str, dict[float, float | None]] = {}
        try:
            with self.engine.connect() as conn:
                for name in columns:
                    col = c[name]
                    if self.dialect == "postgresql":
                        exprs = [
                            type_coerce(func.percentile_cont(q).within_group(col), col.type).label(f"q{i}")
                            for i, q in enumerate(quantiles)
                        ]
                        row = conn.execute(select(*exprs).where(where)).one()
                        out[name] = {q: row[i] for i, q in enumerate(quantiles)}
                    else:
                        values = conn.execute(
                            select(type_coerce(col, _SAMPLES.c.gpu_id.type)).where(and_(where, col.is_not(None))).order_by(col)
                        ).scalars().all()
                        decode = col.type.process_result_value if hasattr(col.type, "process_result_value") else None
                        res: dict[float, float | None] = {}
                        for q in quantiles:
                            if not values:
                                res[q] = None
                                continue
                            v = percentile(values, q)
                            res[q] = decode(v, self.engine.dialect) if decode else v
                        out[name] = res
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return out

    def rollup_series(self, gpu_id: int, start: float, end: float, columns: Sequence[str]) -> list[dict[str, Any]]:
        """1-minute rollup rows over ``start <= minute start <= end``, oldest first: the series for
        a trend over days (memory leak slope, PCIe p95 for capacity).

        Args:
            columns: rollup columns, e.g. ``("memory_used_bytes_max", "pcie_rx_bytes_per_second_p95")``;
                ``ts`` (minute start, seconds), ``samples`` and ``folded_samples`` always come along.
        """
        c = _ROLLUPS.c
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(c.ts, c.samples, c.folded_samples, *(c[n] for n in columns))
                    .where(and_(c.gpu_id == gpu_id, c.ts >= start, c.ts <= end))
                    .order_by(c.ts)
                ).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [dict(r) for r in rows]

    def series_many(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> dict[int, list[dict[str, Any]]]:
        """``series`` for many GPUs in one query (the report's trends).

        Returns:
            ``gpu_id`` → rows of ``ts`` and the columns, oldest first (base units); every GPU of
            ``gpu_ids`` is a key, with ``[]`` when it has no rows.
        """
        c = _SAMPLES.c
        out: dict[int, list[dict[str, Any]]] = {g: [] for g in gpu_ids}
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(c.gpu_id, c.ts, *(c[n] for n in columns))
                    .where(and_(c.gpu_id.in_(list(gpu_ids)), c.ts >= start, c.ts <= end))
                    .order_by(c.gpu_id, c.ts)
                ).all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        names = ("ts", *columns)
        for r in rows:  # plain tuples zipped into dicts: half the time of RowMapping copies
            out[r[0]].append(dict(zip(names, r[1:])))
        return out

    def rollup_series_many(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> dict[int, list[dict[str, Any]]]:
        """``rollup_series`` for many GPUs in one query (trends over days).

        Returns:
            ``gpu_id`` → rows of ``ts``, ``samples`` and the columns, oldest first (base units);
            every GPU of ``gpu_ids`` is a key.
        """
        c = _ROLLUPS.c
        out: dict[int, list[dict[str, Any]]] = {g: [] for g in gpu_ids}
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(c.gpu_id, c.ts, c.samples, *(c[n] for n in columns))
                    .where(and_(c.gpu_id.in_(list(gpu_ids)), c.ts >= start, c.ts <= end)).order_by(c.gpu_id, c.ts)
                ).all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        names = ["ts", "samples", *columns]
        for r in rows:
            out[r[0]].append(dict(zip(names, r[1:])))
        return out

    def rollup_columns(
        self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str], *, summed: bool = False
    ) -> dict[Any, dict[str, tuple[Any, ...]]]:
        """1-minute rollups as stored integers, by column (``vgpumon capacity``: 16 hosts × 72 h
        are 550 000 rows, and decoding every value, or making a dict of every row, costs more
        than the query; decode the figures kept with ``decode_rollup``).

        Args:
            columns: rollup columns.
            summed: one series for all ``gpu_ids``: per minute, each column summed over the GPUs
                that have a row (SQL ``GROUP BY ts``; a shared PCIe port's load).

        Returns:
            ``gpu_id`` (or ``"sum"`` when ``summed``) → column → the minute values oldest first,
            ``ts`` among them in epoch ms; ``None`` where NULL (a sum is NULL only when every GPU's
            value is). Every GPU of ``gpu_ids`` is a key when not ``summed``.
        """
        c = _ROLLUPS.c
        ts = type_coerce(c.ts, BigInteger)
        lo, hi = int(start * 1000), int(end * 1000)
        where = and_(c.gpu_id.in_(list(gpu_ids)), ts >= lo, ts <= hi)
        names = ["ts", *columns]
        try:
            with self.engine.connect() as conn:
                if summed:
                    sums = [type_coerce(func.sum(type_coerce(c[n], BigInteger)), BigInteger) for n in columns]
                    rows = conn.execute(select(ts, *sums).where(where).group_by(c.ts).order_by(c.ts)).cursor.fetchall()
                    return {"sum": dict(zip(names, zip(*rows))) if rows else {n: () for n in names}}
                # the driver's own tuples: every column is a plain integer, nothing to convert, and
                # SQLAlchemy's rows would cost as much as the query (docs/benchmarks.md)
                rows = conn.execute(
                    select(c.gpu_id, ts, *(type_coerce(c[n], BigInteger) for n in columns)).where(where).order_by(c.gpu_id, c.ts)
                ).cursor.fetchall()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        by_gpu: dict[Any, list[Any]] = {g: [] for g in gpu_ids}
        for r in rows:
            by_gpu[r[0]].append(r[1:])
        return {g: (dict(zip(names, zip(*rs))) if rs else {n: () for n in names}) for g, rs in by_gpu.items()}

    def process_holdings(self, gpu_ids: Sequence[int], start: float, end: float) -> list[dict[str, Any]]:
        """The processes holding memory on these GPUs at the newest process sample in
        ``[start, end]`` (the host source records them every few ticks), with their owner.

        Returns:
            One dict per (GPU, process): ``gpu_id``, ``ts``, ``pid``, ``start_time``, ``name``,
            ``cmdline``, ``username``, ``container_id``, ``resolved``, ``used_gpu_memory_bytes``
            (``None`` where the driver withheld it), ``rss_bytes``; largest memory first.
        """
        s = GpuProcessSample.__table__.c
        p = Process.__table__.c
        where = and_(s.gpu_id.in_(list(gpu_ids)), s.ts >= start, s.ts <= end)
        try:
            with self.engine.connect() as conn:
                newest = conn.scalar(select(type_coerce(func.max(s.ts), BigInteger)).where(where))  # raw epoch ms
                if newest is None:
                    return []
                rows = conn.execute(
                    select(s.gpu_id, s.ts, p.pid, p.start_time, p.name, p.cmdline, p.username, p.container_id, p.resolved,
                           s.used_gpu_memory_bytes, s.rss_bytes)
                    .join(Process.__table__, p.id == s.process_id)
                    .where(and_(s.gpu_id.in_(list(gpu_ids)), s.ts == type_coerce(newest, BigInteger)))
                ).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return sorted((dict(r) for r in rows), key=lambda r: -(r["used_gpu_memory_bytes"] or 0))

    def newest_rollup_ts(self, gpu_ids: Sequence[int]) -> float | None:
        """Start (epoch seconds) of the newest 1-minute rollup of these GPUs; ``None`` without one."""
        if not gpu_ids:
            return None
        c = _ROLLUPS.c
        try:
            with self.engine.connect() as conn:
                return conn.scalar(select(type_coerce(func.max(c.ts), c.ts.type)).where(c.gpu_id.in_(list(gpu_ids))))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def rollup_watermark(self, gpu_ids: Sequence[int]) -> float | None:
        """The oldest ``rolled_until`` of these GPUs (epoch seconds): every minute before it is in
        ``gpu_samples_1m``; ``None`` when none of them was rolled up yet."""
        if not gpu_ids:
            return None
        c = RollupWatermark.__table__.c
        try:
            with self.engine.connect() as conn:
                return conn.scalar(select(type_coerce(func.min(c.rolled_until), c.rolled_until.type)).where(c.gpu_id.in_(list(gpu_ids))))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def table_stats(self) -> list[dict[str, Any]]:
        """Rows, bytes on disk, oldest and newest ``ts`` of each time table (``vgpumon db stats``).

        Returns:
            One dict per table: ``table``, ``rows``, ``bytes`` (table and its indexes; all
            partitions on Postgres; ``None`` where the engine cannot tell), ``oldest``/``newest``
            (epoch seconds, ``None`` when empty), ``partitions`` (Postgres, else ``None``) and, for
            ``gpu_samples_1m``, ``folded_samples`` (raw ticks kept only as rollups).
        """
        out: list[dict[str, Any]] = []
        try:
            with self.engine.connect() as conn:
                self._require_tables(conn)
                sizes: dict[str, int] = {}
                if self.dialect == "sqlite":
                    try:
                        for tbl, size in conn.exec_driver_sql(
                            "SELECT m.tbl_name, sum(d.pgsize) FROM dbstat d JOIN sqlite_master m ON m.name = d.name GROUP BY m.tbl_name"
                        ):
                            sizes[tbl] = int(size)
                    except SQLAlchemyError:  # SQLite built without SQLITE_ENABLE_DBSTAT_VTAB
                        sizes = {}
                for table in TIME_TABLES:
                    rows, oldest, newest = conn.execute(text(f'SELECT count(*), min(ts), max(ts) FROM "{table}"')).one()  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
                    item: dict[str, Any] = {
                        "table": table,
                        "rows": int(rows),
                        "bytes": sizes.get(table),
                        "oldest": None if oldest is None else oldest / 1000.0,
                        "newest": None if newest is None else newest / 1000.0,
                        "partitions": None,
                    }
                    if self.dialect == "postgresql":
                        parts = partitions.list_partitions(conn, table)
                        item["partitions"] = len(parts)
                        item["bytes"] = int(
                            conn.scalar(
                                text("SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree(CAST(:t AS regclass))"),
                                {"t": table},
                            )
                        )
                    if table == "gpu_samples_1m":
                        item["folded_samples"] = int(conn.scalar(text("SELECT coalesce(sum(folded_samples), 0) FROM gpu_samples_1m")))
                    out.append(item)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return out

def open_store(url: str, **kw: Any) -> Store:
    """Open (create if needed) the store at ``url`` and bring its schema to the newest revision;
    ``kw`` go to ``Store``. Raises ``StoreUnavailableError``."""
    store = Store(url, **kw)
    store.init_schema()
    return store
