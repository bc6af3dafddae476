"""Reads of the 1-minute rollups for ``capacity`` and the store's upkeep (watermarks, what each
table holds for ``db stats``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypeAlias, TypedDict

from sqlalchemy import BigInteger, and_, case, func, select, text, type_coerce
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.store import partitions
from vgpumon.store.core import StoreBase
from vgpumon.store.schema import (
    TIME_TABLES,
    ColumnValue,
    GpuProcessSample,
    Process,
    RollupWatermark,
)
from vgpumon.store.tables import (
    _ROLLUPS,
)

#: Rollup columns as ``rollup_columns`` returns them: column → the stored integers of each
#: minute, oldest first (``None`` where NULL).
RollupColumns: TypeAlias = dict[str, tuple[int | None, ...]]


class ProcessHolding(TypedDict):
    """A process holding memory on a GPU at one process sample (``process_holdings``)."""

    gpu_id: int
    ts: float
    pid: int
    start_time: float | None
    name: str | None
    cmdline: str | None
    username: str | None
    container_id: str | None
    resolved: bool
    used_gpu_memory_bytes: int | None
    rss_bytes: int | None


class TableStats(TypedDict):
    """What one time table holds (``table_stats``, ``vgpumon db stats``)."""

    table: str
    rows: int
    bytes: int | None
    oldest: float | None
    newest: float | None
    partitions: int | None
    folded_samples: NotRequired[int]


def _decoded(kind: object, stored: float) -> float | None:
    """A mean of stored integers in base units: the column type's own (linear) decoding."""
    decode = getattr(kind, "process_result_value", None)
    return stored if decode is None else decode(stored, None)


class RollupReads(StoreBase):
    """The rollups' reads and the store's own statistics (a part of ``Store``)."""

    def rollup_columns(
        self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str], *, summed: bool = False
    ) -> dict[int | str, RollupColumns]:
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
        by_gpu: dict[int, list[tuple[int | None, ...]]] = {g: [] for g in gpu_ids}
        for r in rows:
            by_gpu[r[0]].append(r[1:])
        return {g: (dict(zip(names, zip(*rs))) if rs else {n: () for n in names}) for g, rs in by_gpu.items()}

    def process_holdings(self, gpu_ids: Sequence[int], start: float, end: float) -> list[ProcessHolding]:
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
                ).all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        holdings = (
            ProcessHolding(gpu_id=gpu_id, ts=ts, pid=pid, start_time=start_time, name=name, cmdline=cmdline, username=username,
                           container_id=container_id, resolved=resolved, used_gpu_memory_bytes=used, rss_bytes=rss)
            for gpu_id, ts, pid, start_time, name, cmdline, username, container_id, resolved, used, rss in rows
        )
        return sorted(holdings, key=lambda r: -(r["used_gpu_memory_bytes"] or 0))

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

    def rollup_window_aggregates(
        self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]
    ) -> dict[int, dict[str, ColumnValue]]:
        """``window_aggregates_many``'s figures over whole rolled-up minutes, in one ``GROUP BY``
        inside the database (a long ``diagnose`` window: 4 320 rows a GPU for 72 h, not 259 200).

        Covers the minutes that start in ``start <= ts < end``. Per GPU: ``samples``,
        ``up_samples`` and, per column, ``<col>_max`` (the largest minute maximum), ``<col>_mean``
        (the minutes' means weighted by their answered samples) and ``<col>_weight`` (that weight,
        so that a caller can merge raw rows at the edges). GPUs without minutes are left out.
        """
        c = _ROLLUPS.c
        if not gpu_ids:
            return {}
        exprs = [c.gpu_id, func.sum(c.samples).label("samples"), func.sum(c.up_samples).label("up_samples")]
        for name in columns:
            mean, top = c[f"{name}_mean"], c[f"{name}_max"]
            # weighted sums as REAL: SQLite's integer SUM raises on overflow (bytes × samples × minutes)
            exprs.append(func.sum(type_coerce(mean, BigInteger) * 1.0 * c.up_samples).label(f"{name}_wsum"))
            exprs.append(func.sum(case((mean.is_not(None), c.up_samples), else_=0)).label(f"{name}_weight"))
            exprs.append(type_coerce(func.max(top), top.type).label(f"{name}_max"))
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(*exprs).where(and_(c.gpu_id.in_(list(gpu_ids)), c.ts >= start, c.ts < end)).group_by(c.gpu_id)
                ).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        out: dict[int, dict[str, ColumnValue]] = {}
        for r in rows:
            agg: dict[str, ColumnValue] = {"samples": int(r["samples"] or 0), "up_samples": int(r["up_samples"] or 0)}
            for name in columns:
                weight, wsum = int(r[f"{name}_weight"] or 0), r[f"{name}_wsum"]
                agg[f"{name}_mean"] = _decoded(c[f"{name}_mean"].type, float(wsum) / weight) if weight and wsum is not None else None
                agg[f"{name}_weight"] = weight
                agg[f"{name}_max"] = r[f"{name}_max"]
            out[r["gpu_id"]] = agg
        return out

    def table_stats(self) -> list[TableStats]:
        """Rows, bytes on disk, oldest and newest ``ts`` of each time table (``vgpumon db stats``).

        Returns:
            One dict per table: ``table``, ``rows``, ``bytes`` (table and its indexes; all
            partitions on Postgres; ``None`` where the engine cannot tell), ``oldest``/``newest``
            (epoch seconds, ``None`` when empty), ``partitions`` (Postgres, else ``None``) and, for
            ``gpu_samples_1m``, ``folded_samples`` (raw ticks kept only as rollups).
        """
        out: list[TableStats] = []
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
                    item: TableStats = {
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
