"""Reads of a host's window, for the rules and ``diagnose``: aggregates, events, XIDs, processes,
rejected values, the topology."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, cast

from sqlalchemy import ColumnElement, RowMapping, and_, bindparam, case, func, select, type_coerce
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.model import HostEvent, PcieHop, PcieTopology
from vgpumon.store.core import StoreBase
from vgpumon.store.schema import (
    Col,
    Gpu,
    GpuProcessSample,
    Host,
    HostEventRow,
    HostSample,
    PcieLink,
    Process,
    RejectedValue,
    XidEvent,
)
from vgpumon.store.tables import (
    _SAMPLES,
    PARALLEL_WINDOW_S,
    Aggregates,
    ColumnValue,
    DynamicSelect,
    GpuEventRow,
    ProcessMemoryRow,
    SeriesRow,
    StoredGpu,
)


class WindowReads(StoreBase):
    """What the rules and ``diagnose`` read of a window (a part of ``Store``)."""

    if TYPE_CHECKING:  # another part of ``Store`` (``Registration``) defines it

        def gpus_of(self, hostname: str) -> list[StoredGpu]: ...

    def topology(self, hostname: str) -> PcieTopology:
        """The stored PCIe tree of a host as a ``PcieTopology`` (empty when never read)."""

        t = PcieLink.__table__
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(t, Gpu.uuid).join(Host.__table__, Host.id == t.c.host_id).outerjoin(Gpu.__table__, Gpu.id == t.c.gpu_id).where(Host.hostname == hostname)
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
    ) -> Aggregates:
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
    ) -> dict[int, Aggregates]:
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

        def build(n: int) -> DynamicSelect:
            exprs: list[ColumnElement[ColumnValue]] = [
                c.gpu_id, func.count().label("samples"), func.sum(case((c.up, 1), else_=0)).label("up_samples")
            ]
            sql: dict[str, Callable[[Col], ColumnElement[ColumnValue]]] = {"min": func.min, "mean": func.avg, "max": func.max}
            for name in columns:
                col = c[name]
                for agg in aggregates:
                    if agg == "count":
                        exprs.append(func.count(col).label(f"{name}_count"))
                    else:
                        exprs.append(type_coerce(sql[agg](col), col.type).label(f"{name}_{agg}"))
            where = and_(c.gpu_id.in_(self._ids(n)), c.ts >= bindparam("start"), c.ts <= bindparam("end"))
            return select(*exprs).where(where).group_by(c.gpu_id)

        def query(ids: Sequence[int]) -> list[RowMapping]:
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
        out: dict[int, Aggregates] = {g: dict(empty) for g in gpu_ids}
        for r in rows:
            d = dict(r)
            out[d.pop("gpu_id")] = d
        return out

    def events(self, hostname: str, start: float, end: float, kinds: Sequence[str] | None = None) -> list[HostEvent]:
        """Host events of one host over ``start <= ts <= end``, oldest first (``kinds``: only
        these)."""
        c = HostEventRow.__table__.c
        kinds = tuple(kinds or ())

        def build() -> DynamicSelect:
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

    def summed_series(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> list[SeriesRow]:
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
                                  .join(Gpu.__table__, Gpu.id == t.c.gpu_id)
                                  .join(Host.__table__, Host.id == Gpu.host_id)
                                  .where(and_(Host.hostname == bindparam("hostname"), t.c.ts >= bindparam("start"), t.c.ts <= bindparam("end")))
                                  .order_by(t.c.ts))
                rows = conn.execute(stmt, {"hostname": hostname, "start": start, "end": end}).all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [(r[0], r[1], r[2]) for r in rows]

    def process_memory_series(self, gpu_ids: Sequence[int], start: float, end: float) -> list[ProcessMemoryRow]:
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
                ).all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [
            ProcessMemoryRow(gpu_id=gpu_id, process_id=process_id, pid=pid, start_time=start_time, name=name, ts=ts,
                             used_gpu_memory_bytes=used)
            for gpu_id, process_id, pid, start_time, name, ts, used in rows
        ]

    def newest_host_sample(self, hostname: str) -> float | None:
        """Time (epoch seconds) of the host's newest ``host_samples`` row; ``None`` when it has
        none (replays of another host's capture take none)."""
        c = HostSample.__table__.c
        try:
            with self.engine.connect() as conn:
                stmt = self._stmt(("newest_host_sample",), lambda: select(type_coerce(func.max(c.ts), c.ts.type))
                                  .join(Host.__table__, Host.id == c.host_id).where(Host.hostname == bindparam("hostname")))
                return conn.scalar(stmt, {"hostname": hostname})
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None

    def gpu_events(
        self, hostname: str, start: float, end: float, gpus: Sequence[StoredGpu] | None = None
    ) -> list[GpuEventRow]:
        """Events of a host's GPUs in a window, oldest first (``host_events`` whose subject is a
        GPU: appeared, disappeared, down, recovered, wedged, memory-API change, collector fault),
        each as ``{"ts": seconds, "kind": str, "gpu_id": int | None, "detail": str}``; host-wide
        events (clock steps, re-initialisations) come with ``gpu_id`` ``None``. ``gpus``: the
        host's GPUs where the caller has them (``gpus_of``), else they are read."""
        ids = {f"gpu:{g.identity.uuid}": g.id for g in (self.gpus_of(hostname) if gpus is None else gpus)}
        return [
            GpuEventRow(ts=e.ts, kind=e.kind, gpu_id=ids.get(e.subject), detail=e.detail)
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
                    # the row the newest time came from: it exists, and ``reason`` is NOT NULL
                    reason = cast(str, conn.scalar(
                        select(c.reason).where(and_(where, c.subject == subject, c.field == field, c.ts == newest))
                    ))
                    out.setdefault(subject, {})[field] = (int(n), reason)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return out
