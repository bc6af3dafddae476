"""Every query the agent and the reports make, in one place, on SQLite and Postgres alike."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from sqlalchemy import Engine, and_, case, func, select, type_coerce
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.errors import StoreUnavailableError
from vgpumon.model import GpuIdentity, GpuSample
from vgpumon.store.engine import make_engine
from vgpumon.store.schema import (
    ACTIVITY_SOURCES,
    SAMPLE_VALUE_COLUMNS,
    Base,
    Gpu,
    GpuProcessSample,
    GpuSampleRow,
    Host,
    HostSample,
    PcieLink,
    Process,
    XidEvent,
)

_SAMPLES = GpuSampleRow.__table__
#: Tables a tick writes to, in foreign-key order. ``TickRows`` maps each name to its rows.
TICK_TABLES = ("gpu_samples", "host_samples", "xid_events", "gpu_process_samples")
TickRows = dict[str, list[dict[str, Any]]]
_PROCESS_KEYS = ("pid", "start_time", "name", "cmdline", "username", "container_id", "resolved")


@dataclass(frozen=True)
class StoredGpu:
    """A GPU row as reports see it."""

    id: int
    hostname: str
    identity: GpuIdentity


def _insert_ignoring_duplicates(engine: Engine, table: Any) -> Any:
    """``INSERT ... ON CONFLICT DO NOTHING``: a tick written twice (a retried batch, a replay run
    again) is stored once."""
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table).on_conflict_do_nothing()


class Store:
    """The time-series store.

    Args:
        url: SQLAlchemy URL (see ``make_engine``).
        engine: an existing engine instead of ``url`` (tests).
        create: allow creating a new SQLite file; readers pass False so that a mistyped path
            reports "no store" instead of creating an empty one.

    Every method raises ``StoreUnavailableError`` when the database cannot be reached or queried.
    """

    def __init__(self, url: str | None = None, *, engine: Engine | None = None, create: bool = True) -> None:
        if engine is None:
            if url is None:
                raise ValueError("Store needs a URL or an engine")
            engine = make_engine(url, create_dirs=create)
            db = engine.url.database
            if not create and engine.dialect.name == "sqlite" and db and db != ":memory:" and not Path(db).expanduser().exists():
                raise StoreUnavailableError(f"no store at {db} (has an agent written there? see --db)")
        self.engine = engine
        self._insert = _insert_ignoring_duplicates(engine, _SAMPLES)
        self._inserts = {
            "gpu_samples": self._insert,
            "host_samples": _insert_ignoring_duplicates(engine, HostSample.__table__),
            "xid_events": _insert_ignoring_duplicates(engine, XidEvent.__table__),
            "gpu_process_samples": _insert_ignoring_duplicates(engine, GpuProcessSample.__table__),
        }
        self._process_ids: dict[tuple[int, int, float | None], int] = {}

    def _fail(self, exc: Exception) -> StoreUnavailableError:
        url = self.engine.url.render_as_string(hide_password=True)
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return StoreUnavailableError(f"store {url} unavailable: {detail}")

    def init_schema(self) -> None:
        """Create missing tables (idempotent)."""
        try:
            Base.metadata.create_all(self.engine)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def close(self) -> None:
        """Release pooled connections."""
        self.engine.dispose()

    # -- writes --------------------------------------------------------------------------------

    def register_gpus(self, hostname: str, gpus: Iterable[GpuIdentity]) -> dict[str, int]:
        """Insert or update the host and its GPUs.

        Returns:
            GPU UUID → ``gpus.id``.
        """
        now = dt.datetime.now(dt.timezone.utc)
        try:
            with self.engine.begin() as conn:
                host_id = conn.scalar(select(Host.id).where(Host.hostname == hostname))
                if host_id is None:
                    host_id = conn.execute(Host.__table__.insert().values(hostname=hostname, first_seen=now)).inserted_primary_key[0]
                ids: dict[str, int] = {}
                for g in gpus:
                    attrs = dict(
                        host_id=host_id,
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
                        last_seen=now,
                    )
                    gpu_id = conn.scalar(select(Gpu.id).where(Gpu.uuid == g.uuid))
                    if gpu_id is None:
                        gpu_id = conn.execute(
                            Gpu.__table__.insert().values(uuid=g.uuid, first_seen=now, **attrs)
                        ).inserted_primary_key[0]
                    else:
                        conn.execute(Gpu.__table__.update().where(Gpu.id == gpu_id).values(**attrs))
                    ids[g.uuid] = int(gpu_id)
                return ids
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    @staticmethod
    def sample_row(gpu_id: int, s: GpuSample) -> dict[str, Any]:
        """The ``gpu_samples`` row of one sample (base units; the column types encode)."""
        row = {name: getattr(s, name) for name in SAMPLE_VALUE_COLUMNS}
        row["gpu_id"] = gpu_id
        row["ts"] = s.ts
        row["up"] = s.up
        row["activity_source"] = ACTIVITY_SOURCES.get(s.activity_source) if s.activity_source else None
        return row

    def write_gpu_rows(self, rows: Sequence[dict[str, Any]]) -> None:
        """Write sample rows in one transaction; rows already stored are skipped."""
        self.write_ticks([{"gpu_samples": list(rows)}])

    def write_ticks(self, ticks: Sequence[TickRows]) -> None:
        """Write the rows of whole ticks in one transaction; rows already stored are skipped.

        Args:
            ticks: per tick, table name (``TICK_TABLES``) → rows. ``gpu_process_samples`` rows
                also carry the process identity (``host_id`` and ``_PROCESS_KEYS``); the
                ``processes`` row is created on first sight and referenced by id.
        """
        merged: dict[str, list[dict[str, Any]]] = {t: [] for t in TICK_TABLES}
        for tick in ticks:
            for table, rows in tick.items():
                merged[table].extend(rows)
        if not any(merged.values()):
            return
        try:
            with self.engine.begin() as conn:
                if merged["gpu_process_samples"]:
                    merged["gpu_process_samples"] = [self._with_process_id(conn, r) for r in merged["gpu_process_samples"]]
                for table in TICK_TABLES:
                    if merged[table]:
                        conn.execute(self._inserts[table], merged[table])
        except SQLAlchemyError as exc:
            self._process_ids.clear()  # ids inserted by a rolled-back transaction are void
            raise self._fail(exc) from None

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
        from vgpumon.sources.pcie_topology import PcieHop, PcieTopology

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
                if not self.engine.dialect.has_table(conn, Host.__tablename__):
                    raise StoreUnavailableError(
                        f"{self.engine.url.render_as_string(hide_password=True)} holds no vgpumon data (no tables)"
                    )
                return list(conn.scalars(select(Host.hostname).order_by(Host.hostname)))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def gpus_of(self, hostname: str) -> list[StoredGpu]:
        """The GPUs stored for a host, by NVML index."""
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(Gpu.__table__).join(Host, Host.id == Gpu.host_id).where(Host.hostname == hostname).order_by(Gpu.index)
                ).mappings().all()
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
                return conn.scalar(
                    select(type_coerce(func.max(_SAMPLES.c.ts), _SAMPLES.c.ts.type)).where(_SAMPLES.c.gpu_id.in_(gpu_ids))
                )
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

    def last_values(self, gpu_id: int, end: float, columns: Sequence[str]) -> dict[str, tuple[float, Any] | None]:
        """Newest non-NULL value of each column at or before ``end`` for one GPU.

        Returns:
            column → ``(ts, value)``, or ``None`` when the column was never stored.
        """
        c = _SAMPLES.c
        out: dict[str, tuple[float, Any] | None] = {}
        try:
            with self.engine.connect() as conn:
                for name in columns:
                    row = conn.execute(
                        select(c.ts, c[name])
                        .where(and_(c.gpu_id == gpu_id, c.ts <= end, c[name].is_not(None)))
                        .order_by(c.ts.desc())
                        .limit(1)
                    ).first()
                    out[name] = (row[0], row[1]) if row else None
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return out

    def series(self, gpu_id: int, start: float, end: float, columns: Sequence[str]) -> list[dict[str, Any]]:
        """Rows of ``ts`` and the columns over a window, oldest first (base units)."""
        c = _SAMPLES.c
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(c.ts, *(c[n] for n in columns))
                    .where(and_(c.gpu_id == gpu_id, c.ts >= start, c.ts <= end))
                    .order_by(c.ts)
                ).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [dict(r) for r in rows]


def open_store(url: str) -> Store:
    """Open (and create if needed) the store at ``url``; raises ``StoreUnavailableError``."""
    store = Store(url)
    store.init_schema()
    return store
