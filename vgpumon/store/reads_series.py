"""Reads of values and series: the newest values, raw and rollup series, percentiles over a
window, since when a GPU is down."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import cast

from sqlalchemy import BigInteger, and_, bindparam, case, func, literal_column, select, type_coerce
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.store.core import StoreBase
from vgpumon.store.rollup import percentile
from vgpumon.store.tables import (
    _ROLLUPS,
    _SAMPLES,
    DynamicSelect,
    NewestValue,
    SeriesRow,
    _rollup_of_last,
)


def _rollup_value(column: str) -> DynamicSelect:
    """A rollup column's value of one GPU's minute (``last_values_many``)."""
    rc = _ROLLUPS.c
    return select(rc[column]).where(and_(rc.gpu_id == bindparam("gid"), rc.ts == bindparam("ts")))


class SeriesReads(StoreBase):
    """Values and series of GPUs (a part of ``Store``)."""

    def last_values(self, gpu_id: int, end: float, columns: Sequence[str]) -> dict[str, NewestValue | None]:
        """Newest non-NULL value of each column at or before ``end`` for one GPU
        (``last_values_many`` for one GPU)."""
        return self.last_values_many([gpu_id], end, columns)[gpu_id]

    def last_values_many(
        self, gpu_ids: Sequence[int], end: float, columns: Sequence[str]
    ) -> dict[int, dict[str, NewestValue | None]]:
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
        out: dict[int, dict[str, NewestValue | None]] = {g: {n: None for n in columns} for g in gpu_ids}
        if not gpu_ids or not columns:
            return out
        for gid, found in self.newest_values(gpu_ids, end - self.LAST_RAW_SECONDS, end, columns).items():
            out[gid].update(found)
        rc = _ROLLUPS.c
        try:
            with self.engine.connect() as conn:
                for gid in gpu_ids:
                    rollup_of = {n: _rollup_of_last(n) for n, v in out[gid].items() if v is None}
                    missing = {n: col for n, col in rollup_of.items() if col is not None}
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
                            value_stmt = self._stmt(("last_rollup_value", col), partial(_rollup_value, col))
                            out[gid][n] = (ts, conn.scalar(value_stmt, {"gid": gid, "ts": ts}))
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return out

    def newest_values(
        self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]
    ) -> dict[int, dict[str, NewestValue]]:
        """Newest non-NULL value of each column among the raw rows of ``start <= ts <= end``, per
        GPU: one query for all GPUs (raw rows only; ``last_values_many`` looks further back).

        Returns:
            ``gpu_id`` → column → ``(ts, value)`` in base units; columns without a value in the
            window, and GPUs without one at all, are absent.
        """
        c = _SAMPLES.c
        out: dict[int, dict[str, NewestValue]] = {}
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

    def series(self, gpu_id: int, start: float, end: float, columns: Sequence[str], present: bool = False) -> list[SeriesRow]:
        """Rows of ``ts`` and the columns over a window, oldest first (base units).

        Args:
            present: only the rows where every column has a value (a counter read each minute,
                such as the PCIe replay counter, has one row in 60 with it).
        """
        c = _SAMPLES.c
        cols = tuple(columns)

        def build() -> DynamicSelect:
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

    def latest(self, gpu_ids: Sequence[int], columns: Sequence[str], until: float | None = None) -> dict[int, SeriesRow]:
        """The newest row of each GPU, at or before ``until`` when given (one PK seek per GPU on
        both engines).

        Returns:
            ``gpu_id`` → ``{"ts": seconds, <column>: value in base units or None}``; GPUs without
            rows are absent.
        """
        c = _SAMPLES.c
        out: dict[int, SeriesRow] = {}
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

    def down_since(self, newest: Mapping[int, tuple[float, bool]], at: float) -> dict[int, float]:
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
                    # its newest row is down, so a row follows its newest readable one
                    out[gid] = cast(float, conn.scalar(first))
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

    def rollup_series(self, gpu_id: int, start: float, end: float, columns: Sequence[str]) -> list[SeriesRow]:
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

    def series_many(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> dict[int, list[SeriesRow]]:
        """``series`` for many GPUs in one query (the report's trends).

        Returns:
            ``gpu_id`` → rows of ``ts`` and the columns, oldest first (base units); every GPU of
            ``gpu_ids`` is a key, with ``[]`` when it has no rows.
        """
        c = _SAMPLES.c
        out: dict[int, list[SeriesRow]] = {g: [] for g in gpu_ids}
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

    def rollup_series_many(
        self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]
    ) -> dict[int, list[SeriesRow]]:
        """``rollup_series`` for many GPUs in one query (trends over days).

        Returns:
            ``gpu_id`` → rows of ``ts``, ``samples`` and the columns, oldest first (base units);
            every GPU of ``gpu_ids`` is a key.
        """
        c = _ROLLUPS.c
        out: dict[int, list[SeriesRow]] = {g: [] for g in gpu_ids}
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

    def rollup_bucket_maxima(
        self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str], points: int
    ) -> tuple[float, float, dict[int, list[dict[str, float | None]]]]:
        """The largest minute value of each of ``columns`` in ``points`` equal buckets per GPU,
        taken inside the database (``diagnose``'s trends over days: 8 × ``points`` rows, not one
        row per GPU and minute).

        The buckets span from the first minute of any of the GPUs in ``start <= ts <= end`` to
        ``end``; a minute belongs to the bucket its start falls in (the last bucket takes ``end``).

        Returns:
            ``(t0, width, by_gpu)``: the first bucket's start and the buckets' width (seconds),
            and ``gpu_id`` → ``points`` dicts of column → maximum (``None`` for an empty bucket);
            every GPU of ``gpu_ids`` is a key. Without any minute, ``t0`` is ``start``.
        """
        c = _ROLLUPS.c
        ids = list(gpu_ids)
        where = and_(c.gpu_id.in_(ids), c.ts >= start, c.ts <= end)
        try:
            with self.engine.connect() as conn:
                first_ms = conn.scalar(select(func.min(type_coerce(c.ts, BigInteger))).where(where)) if ids else None
                t0_ms = int(first_ms) if first_ms is not None else int(round(start * 1000))
                width_ms = max(1, -(-(int(round(end * 1000)) - t0_ms) // points))  # whole ms, rounded up
                # whole-number literals (ours, not input): one expression for SELECT and GROUP BY on Postgres
                bucket = (type_coerce(c.ts, BigInteger) - literal_column(str(int(t0_ms)), BigInteger)) // literal_column(str(int(width_ms)), BigInteger)
                rows = conn.execute(
                    select(c.gpu_id, bucket.label("b"), *(type_coerce(func.max(c[n]), c[n].type).label(n) for n in columns))
                    .where(where).group_by(c.gpu_id, bucket)
                ).all() if first_ms is not None else []
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        out: dict[int, list[dict[str, float | None]]] = {g: [dict.fromkeys(columns) for _ in range(points)] for g in ids}
        for r in rows:
            slot = out[r[0]][min(int(r[1]), points - 1)]
            for n, v in zip(columns, r[2:]):
                if v is not None and (slot[n] is None or v > slot[n]):
                    slot[n] = v
        return t0_ms / 1000, width_ms / 1000, out

    def stored_rows(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> list[tuple[int, ...]]:
        """Raw rows of ``start <= ts <= end`` as stored: ``(gpu_id, ts in epoch ms, *columns)`` of
        the stored integers (fixed-point, codes, flags as 0/1; ``None`` where NULL), ordered by
        GPU and time. What the agent's in-memory rule windows restore at start
        (``vgpumon.alerts.windows``): they keep the values the store got, not decoded floats.
        """
        c = _SAMPLES.c
        if not gpu_ids:
            return []
        cols = tuple(columns)
        stmt = self._stmt(("stored_rows", cols), lambda: select(
            c.gpu_id, type_coerce(c.ts, BigInteger), *(type_coerce(c[n], BigInteger) for n in cols)
        ).where(and_(c.gpu_id.in_(bindparam("gids", expanding=True)), c.ts >= bindparam("start"), c.ts <= bindparam("end")))
         .order_by(c.gpu_id, c.ts))
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(stmt, {"gids": list(gpu_ids), "start": start, "end": end}).all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [tuple(r) for r in rows]
