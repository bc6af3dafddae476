"""What the agent's rule windows hold, how they are fed as batches are stored, trimmed to the
rules' windows and restored from the store (``vgpumon.alerts.windows``, which reads them)."""

from __future__ import annotations

import bisect
import logging
import threading
from array import array
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import Column, Engine

from vgpumon.store import Store, StoredGpu
from vgpumon.store.codec import GPU_ID, GPU_ROW_COLUMNS, ROLLUP_ROW_COLUMNS, TS, UP, GpuRow, RollupRow
from vgpumon.store.rollup import MINUTE_MS, aggregate, minute_of
from vgpumon.store.schema import ROLLUP_SPEC, ColumnValue, GpuSampleRow, gpu_samples_1m, rollup_column_name
from vgpumon.store.tables import NewestValue, SeriesRow, _rollup_of_last

if TYPE_CHECKING:
    from vgpumon.model.topology import PcieTopology
    from vgpumon.store.tables import GpuEventRow, ProcessMemoryRow

log = logging.getLogger(__name__)

#: A NULL among the stored integers of a column window.
_NULL = -(2**63)
_POS = {c: i for i, c in enumerate(GPU_ROW_COLUMNS)}
_RPOS = {c: i for i, c in enumerate(ROLLUP_ROW_COLUMNS)}
#: rollup column → (position of its raw column in a row, aggregate)
_RSOURCE = {rollup_column_name(c, a): (_POS[c], a) for c, aggs in ROLLUP_SPEC.items() for a in aggs}
_Decode = Callable[[ColumnValue], ColumnValue]


#: Columns whose stored integers are what a read returns (plain integer types: no decoding).
_PLAIN = frozenset(c.name for c in GpuSampleRow.__table__.columns if type(c.type).__name__ in ("Integer", "BigInteger", "SmallInteger"))


def _ms(seconds: float) -> int:
    """Epoch seconds as the store compares them (``EpochMillis``)."""
    return int(round(seconds * 1000))


def _processor(col: Column[ColumnValue], store: Store) -> _Decode:
    """The function the store's driver result goes through for ``col``: the column type's own."""
    dialect = store.engine.dialect
    proc = col.type.dialect_impl(dialect).result_processor(dialect, None)
    return proc if proc is not None else (lambda v: v)


@dataclass
class Needs:
    """What the rules read, learned from their reads: seconds of each window."""

    ticks: float = 0.0
    columns: dict[str, float] = field(default_factory=dict)
    rollup: float = 0.0
    rollup_columns: set[str] = field(default_factory=set)
    last: set[str] = field(default_factory=set)


class _Gpu:
    """One GPU's windows."""

    def __init__(self) -> None:
        self.full: deque[GpuRow] = deque()  # the last FULL_SECONDS of rows, whole
        self.ts = array("q")  # tick times (ms), oldest first
        self.up = bytearray()  # aligned with ts: 0, 1, 2 for NULL
        self.cols: dict[str, array[int]] = {}  # tail-aligned with ts; _NULL for NULL
        self.minute: list[GpuRow] = []  # rows of the minute not yet complete
        self.rollups: deque[RollupRow] = deque()  # whole rollup rows, oldest first
        self.rolled_ts: array[int] = array("q")  # their minutes (ms), for bisecting
        self.minute_last: dict[str, tuple[int, ColumnValue]] = {}  # column → (minute ms, decoded aggregate)
        self.last: GpuRow | None = None  # the newest row fed
        self.newest: dict[str, tuple[int, int]] = {}  # column → (ms, stored value) of its newest non-NULL value
        self.restored: SeriesRow | None = None  # the newest row the store had at the restore (decoded)

    def column(self, name: str) -> tuple[array[int], int]:
        """A column window and the index in ``ts`` of its first value."""
        arr = self.cols[name]
        return arr, len(self.ts) - len(arr)


class WindowStore:
    """The agent's own GPUs' windows in memory: fed, trimmed, restored (``RuleWindows`` reads them).

    Args:
        store: the agent's store (restores, the reads memory does not cover, the small tables).
        hostname: the agent's host.
    """

    #: Seconds of whole rows kept (``Store.LAST_RAW_SECONDS`` and a minute more for catch-up).
    FULL_SECONDS = 180.0

    def __init__(self, store: Store, hostname: str) -> None:
        self.store = store
        self.hostname = hostname
        self.LAST_RAW_SECONDS = store.LAST_RAW_SECONDS
        self.LAST_ROLLUP_SECONDS = store.LAST_ROLLUP_SECONDS
        self.needs = Needs()
        self.grown = False  # a read asked for more than memory holds: restore at the next ``prepare``
        self.misses = 0  # reads the store answered because memory did not cover them
        self.restores = 0
        self._lock = threading.Lock()
        self._gpus: dict[int, _Gpu] = {}
        self._known: list[StoredGpu] | None = None
        self._unknown_gpu = False
        # the oldest time (ms) from which memory holds every row of a tier (None: not restored)
        self._ticks_from: int | None = None
        self._cols_from: dict[str, int] = {}
        self._rollups_from: int | None = None
        self._rollup_cols: tuple[str, ...] = ()
        self._last_ready = False
        self._newest: int | None = None  # newest tick fed or restored (ms)
        self._fed = 0
        self._last_pos: tuple[tuple[str, int], ...] = ()  # the columns whose newest value is asked
        self._decode = {c.name: _processor(c, store) for c in GpuSampleRow.__table__.columns}
        self._rdecode = {c.name: _processor(c, store) for c in gpu_samples_1m.columns}

    # -- feeding --------------------------------------------------------------------------------

    #: Ticks fed between two trims of the windows (each rules cycle trims too).
    TRIM_EVERY = 32

    def feed(self, rows: Sequence[GpuRow]) -> None:
        """Take stored ``gpu_samples`` rows in (encoded, ``codec.GPU_ROW_COLUMNS`` order, time
        order): a few appends per row."""
        with self._lock:
            for row in rows:
                self._append(row)
            self._fed += 1
            if self._fed % self.TRIM_EVERY == 0:
                self._trim()

    def _append(self, row: GpuRow) -> None:
        gid, ts = row[GPU_ID], row[TS]
        g = self._gpus.get(gid)
        if g is None:
            g = self._gpus[gid] = _Gpu()
            g.cols = {c: array("q") for c in self._cols_from}
            if self._known is not None and all(k.id != gid for k in self._known):
                self._unknown_gpu = True
        if g.ts and ts <= g.ts[-1]:
            # time went back (a clock step) or a duplicate: the store keeps the first row of a
            # (GPU, time) and orders by time; memory does the same, the slow way (rare)
            if ts in g.ts:
                return
            self._insert(g, row)
            return
        g.full.append(row)
        g.last = row
        for name, pos in self._last_pos:
            v = row[pos]
            if v is not None:
                g.newest[name] = (ts, v)
        g.ts.append(ts)
        up = row[UP]
        g.up.append(2 if up is None else int(bool(up)))
        for name, arr in g.cols.items():
            v = row[_POS[name]]
            arr.append(_NULL if v is None else int(v))
        self._roll(g, row)
        if self._newest is None or ts > self._newest:
            self._newest = ts

    def _insert(self, g: _Gpu, row: GpuRow) -> None:
        ts = row[TS]
        i = bisect.bisect_left(g.ts, ts)
        g.ts.insert(i, ts)
        up = row[UP]
        g.up.insert(i, 2 if up is None else int(bool(up)))
        for name, arr in g.cols.items():
            j = i - (len(g.ts) - 1 - len(arr))
            if j >= 0:
                v = row[_POS[name]]
                arr.insert(j, _NULL if v is None else int(v))
            else:  # before the column's window: the window still ends where it did
                pass
        full = list(g.full)
        bisect.insort(full, row, key=lambda r: r[TS])
        g.full = deque(full)
        # a minute already rolled up is not rolled again (the store would not either: its
        # watermark has passed it); the current minute takes the row
        if g.minute and minute_of(ts) == minute_of(g.minute[0][TS]):
            g.minute.append(row)

    def _roll(self, g: _Gpu, row: GpuRow) -> None:
        """The store's rollup step, as the ticks pass: a minute is complete at a row after it."""
        m = minute_of(row[TS])
        if g.minute and minute_of(g.minute[0][TS]) != m:
            self._close_minute(g)
        g.minute.append(row)

    def _close_minute(self, g: _Gpu) -> None:
        """The minute's rollup row, as ``rollup_rows`` makes it, of the rollup columns the rules
        read (the others stay ``None``: nothing reads them here)."""
        rows = g.minute
        rows.sort(key=lambda r: r[TS])
        out: list[ColumnValue] = [None] * len(ROLLUP_ROW_COLUMNS)
        out[0], out[1], out[2] = rows[0][GPU_ID], minute_of(rows[0][TS]), len(rows)
        out[3], out[4] = sum(1 for r in rows if r[UP]), 0
        for name in self._rollup_cols:
            pos, agg = _RSOURCE[name]
            out[_RPOS[name]] = aggregate([r[pos] for r in rows], agg)
        self._take_rollup(g, tuple(out))
        g.minute = []

    def _take_rollup(self, g: _Gpu, r: RollupRow) -> None:
        if g.rolled_ts and r[1] <= g.rolled_ts[-1]:
            return  # a minute held already
        g.rollups.append(r)
        g.rolled_ts.append(r[1])
        for name in self.needs.last:
            col = _rollup_of_last(name)
            if col is not None and (v := r[_RPOS[col]]) is not None:
                g.minute_last[name] = (r[1], self._rdecode[col](v))

    def _trim(self) -> None:
        if self._newest is None:
            return
        newest = self._newest
        need = self.needs
        full_cut = newest - _ms(self.FULL_SECONDS)
        tick_seconds = max([need.ticks, *need.columns.values()], default=0.0)
        tick_cut = newest - _ms(tick_seconds) - MINUTE_MS  # a minute of slack: catch-up times are older
        rollup_cut = newest - _ms(need.rollup) - 2 * MINUTE_MS
        for g in self._gpus.values():
            while g.full and g.full[0][TS] < full_cut:
                g.full.popleft()
            k = bisect.bisect_left(g.ts, tick_cut)
            if k > 256 or (k and len(g.ts) < 4096):  # amortised: a memmove of the arrays now and then
                del g.ts[:k]
                del g.up[:k]
            for name, arr in g.cols.items():
                cut = newest - _ms(need.columns.get(name, 0.0)) - MINUTE_MS
                first = len(g.ts) - len(arr)
                j = bisect.bisect_left(g.ts, cut, first) - first
                if j > 256 or (j and len(arr) < 4096):
                    del arr[:j]
                if len(arr) > len(g.ts):
                    del arr[: len(arr) - len(g.ts)]
            while g.rollups and g.rollups[0][1] < rollup_cut:
                g.rollups.popleft()
            if len(g.rolled_ts) > len(g.rollups):
                del g.rolled_ts[: len(g.rolled_ts) - len(g.rollups)]
        if self._ticks_from is not None:
            self._ticks_from = max(self._ticks_from, tick_cut)
        for name in self._cols_from:
            self._cols_from[name] = max(self._cols_from[name], newest - _ms(need.columns.get(name, 0.0)) - MINUTE_MS)
        if self._rollups_from is not None:
            self._rollups_from = max(self._rollups_from, rollup_cut)

    def size(self) -> dict[str, int]:
        """What memory holds, by tier (entries over all GPUs): for tests and the benchmark."""
        with self._lock:
            gs = self._gpus.values()
            return {"full": sum(len(g.full) for g in gs), "ticks": sum(len(g.ts) for g in gs),
                    "values": sum(len(a) for g in gs for a in g.cols.values()), "rollups": sum(len(g.rollups) for g in gs)}

    # -- restoring --------------------------------------------------------------------------------

    def prepare(self) -> None:
        """At the start of a rules cycle, on the rules thread: restore from the store what the
        reads of the previous cycle found missing (at the first cycles of an agent: all of it).

        Raises:
            StoreUnavailableError: the store cannot be read (memory is left as it was).
        """
        with self._lock:
            self._trim()
        if self._known is None or self._unknown_gpu:
            self._known = self.store.gpus_of(self.hostname)
            self._unknown_gpu = False
        if self.grown:
            self._restore()
            self.grown = False

    def _restore(self) -> None:
        store, need = self.store, self.needs
        ids = [g.id for g in self.gpus]
        end_s = store.newest_ts(ids)
        if end_s is None:
            with self._lock:
                self._restored_empty()
            return
        end = _ms(end_s)
        cols = tuple(sorted(need.columns))
        tick_seconds = max([need.ticks, *need.columns.values()], default=0.0) + 60.0
        col_seconds = max(need.columns.values(), default=0.0) + 60.0
        ticks = store.stored_rows(ids, end_s - tick_seconds, end_s, ("up",))
        values = store.stored_rows(ids, end_s - col_seconds, end_s, cols) if cols else []
        full = store.stored_rows(ids, end_s - max(self.FULL_SECONDS, 120.0), end_s, GPU_ROW_COLUMNS[2:])
        rollup_cols = tuple(sorted(need.rollup_columns | {c for n in need.last if (c := _rollup_of_last(n)) is not None}))
        # the store's rollups up to its watermark (never past the minute of ``end``: what memory
        # holds is the store as of ``end``); the raw rows after it are rolled up here, as the
        # store's next steps will
        wm = store.rollup_watermark(ids)
        upto = min(wm, minute_of(end) / 1000.0) if wm else None
        rolled = store.rollup_columns(ids, end_s - need.rollup - 120.0, upto - 0.001, rollup_cols) if upto else {}
        pending = store.stored_rows(ids, upto if upto else end_s - need.rollup - 120.0, end_s, GPU_ROW_COLUMNS[2:])
        newest = store.latest(ids, GPU_ROW_COLUMNS[2:], until=end_s)
        last = store.last_values_many(ids, end_s, sorted(need.last)) if need.last else {}
        with self._lock:
            self._rebuild(ids, end, cols, ticks, values, full, rollup_cols, rolled, pending, last)
            for gid, row in newest.items():
                self._gpus[gid].restored = row
        self.restores += 1
        log.debug("rule windows restored from the store: %s", self.size())

    def _restored_empty(self) -> None:
        self._ticks_from = 0
        self._cols_from = {c: 0 for c in self.needs.columns}
        self._rollups_from = 0
        self._last_ready = True
        for g in self._gpus.values():
            for c in self.needs.columns:
                g.cols.setdefault(c, array("q", [_NULL] * len(g.ts)))

    def _rebuild(self, ids: list[int], end: int, cols: tuple[str, ...], ticks: list[tuple[int, ...]], values: list[tuple[int, ...]],
                 full: list[tuple[int, ...]], rollup_cols: tuple[str, ...], rolled: Mapping[int | str, Mapping[str, tuple[int | None, ...]]],
                 pending: list[tuple[int, ...]], last: Mapping[int, Mapping[str, NewestValue | None]]) -> None:
        fed = {gid: [r for r in g.full if r[TS] > end] for gid, g in self._gpus.items()}
        fed_last = {gid: g.last for gid, g in self._gpus.items()}
        minute_last = {gid: dict(g.minute_last) for gid, g in self._gpus.items()}
        self._gpus = {gid: _Gpu() for gid in ids}
        for gid, ts, up in ticks:
            g = self._gpus.setdefault(gid, _Gpu())
            g.ts.append(ts)
            g.up.append(2 if up is None else int(bool(up)))
        by_gpu: dict[int, list[tuple[int, ...]]] = {}
        for r in values:
            by_gpu.setdefault(r[0], []).append(r)
        for gid, g in self._gpus.items():
            rows = by_gpu.get(gid, [])
            # the values read are the newest rows of the ticks read: the same rows, tail-aligned
            for k, name in enumerate(cols):
                g.cols[name] = array("q", (_NULL if r[2 + k] is None else int(r[2 + k]) for r in rows))
        self._last_pos = tuple((n, _POS[n]) for n in sorted(self.needs.last))
        for r in full:
            g = self._gpus[r[0]]
            g.full.append((r[0], *r[1:]))
            for name, pos in self._last_pos:
                if (v := r[pos]) is not None:
                    g.newest[name] = (r[TS], v)
        for gid, g in self._gpus.items():
            got = rolled.get(gid)
            if got:
                names = ("ts", *rollup_cols)
                for minute in zip(*(got[n] for n in names)):
                    rrow: list[ColumnValue] = [None] * len(ROLLUP_ROW_COLUMNS)
                    rrow[0], rrow[1] = gid, minute[0]
                    for n, v in zip(rollup_cols, minute[1:]):
                        rrow[_RPOS[n]] = v
                    self._take_rollup(g, tuple(rrow))  # (and its minute's newest values, as memory's own)
        self._rollup_cols = rollup_cols
        for gid, g in self._gpus.items():
            for n, found in last.get(gid, {}).items():
                older = n not in g.minute_last or g.minute_last[n][0] < _ms(found[0]) if found is not None else False
                if found is not None and older and _ms(found[0]) < end - _ms(self.LAST_RAW_SECONDS):
                    g.minute_last[n] = (_ms(found[0]), found[1])  # an answer of the rollups: its minute
            for n, held in minute_last.get(gid, {}).items():
                if n not in g.minute_last or g.minute_last[n][0] < held[0]:
                    g.minute_last[n] = held
        for r in pending:
            g = self._gpus[r[0]]
            row = (r[0], *r[1:])
            if minute_of(row[TS]) >= minute_of(end):
                g.minute.append(row)
            else:
                self._roll(g, row)
        for g in self._gpus.values():  # the minutes before the newest one are complete
            if g.minute and minute_of(g.minute[0][TS]) < minute_of(end):
                self._close_minute(g)
        span = max([self.needs.ticks, *self.needs.columns.values()], default=0.0) + 60.0
        self._ticks_from = end - _ms(span)
        self._cols_from = {c: end - _ms(max(self.needs.columns.values(), default=0.0) + 60.0) for c in cols}
        self._rollups_from = end - _ms(self.needs.rollup + 120.0)
        self._last_ready = True
        self._newest = end
        for gid, g in self._gpus.items():
            newest_fed = fed_last.get(gid)
            g.last = g.full[-1] if g.full else (newest_fed if newest_fed is not None and newest_fed[TS] <= end else None)
        for rows in fed.values():  # ticks taken in since the store's newest: not stored yet
            for row in rows:
                self._append(row)
        self._trim()

    @property
    def gpus(self) -> list[StoredGpu]:
        """The host's GPUs, read from the store at the first cycle (and when a row names another)."""
        if self._known is None:
            self._known = self.store.gpus_of(self.hostname)
        return list(self._known)

    def gpus_of(self, hostname: str) -> list[StoredGpu]:
        return self.gpus if hostname == self.hostname else self.store.gpus_of(hostname)

    # -- the small tables: read from the store, as before ----------------------------------------

    @property
    def engine(self) -> Engine:
        """The store's engine (the vLLM repository's reads)."""
        return self.store.engine

    def host_xid_events(self, hostname: str, start: float, end: float) -> list[tuple[float, int, int]]:
        return self.store.host_xid_events(hostname, start, end)

    def gpu_events(self, hostname: str, start: float, end: float, gpus: Sequence[StoredGpu] | None = None) -> list[GpuEventRow]:
        return self.store.gpu_events(hostname, start, end, gpus)

    def process_memory_series(self, gpu_ids: Sequence[int], start: float, end: float) -> list[ProcessMemoryRow]:
        return self.store.process_memory_series(gpu_ids, start, end)

    def rejections(self, hostname: str, start: float, end: float) -> dict[str, dict[str, tuple[int, str]]]:
        return self.store.rejections(hostname, start, end)

    def topology(self, hostname: str) -> PcieTopology:
        return self.store.topology(hostname)

    def newest_host_sample(self, hostname: str) -> float | None:
        return self.store.newest_host_sample(hostname)
