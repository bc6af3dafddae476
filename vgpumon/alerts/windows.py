"""The agent's rules read their GPU windows from memory, not from the store.

Every 15 s the agent's rules read back, from the store, the raw rows and rollups of the agent's
own GPUs that the agent itself wrote a few seconds before: on a shared Postgres each agent reads
its own data back, and on any store that is most of the rules step's CPU. ``RuleWindows`` keeps
what the rules read of the ``gpu_samples`` family in bounded windows fed from the ticks as they
are stored (the encoded rows the store got, fed by the agent's writer after each batch, so a value
decodes to the float the store returns, and memory is never a tick ahead of the small tables a
view still reads from the store) and answers the reads of ``HostView`` that concern them with the store's own semantics:

* **full rows** of the last ``FULL_SECONDS`` (every column): the newest row of each GPU, the
  raw half of ``last_values_many`` and the minute being rolled up;
* **tick times and readability** (``up``) for the longest window any read asks of them (the
  XID rules count samples over 24 h: 9 bytes a tick);
* **column windows**: each column the rules read as a series, an aggregate or a percentile, kept
  as stored integers (8 bytes a value) for the longest window asked of that column;
* **1-minute rollups** of the columns asked of them (the leak fit's 3-minute medians are taken
  of its minutes' medians, so the 6 h window holds 370 minutes, not 22 000 ticks), built with the
  store's own ``rollup_rows`` from the ticks as each minute completes;
* per column, the newest completed minute's aggregate, the rollup half of ``last_values_many``.

Sizes are the rules' own: a read learns its column and window (``Thresholds``' seconds as the
rule asks them). A read that memory does not cover yet is answered by the store, as before, and
grows the windows; the next cycle restores what is needed from the store once (``prepare``), and
then evaluations read nothing of ``gpu_samples`` or ``gpu_samples_1m`` (the other, small tables
— events, XIDs, process samples, vLLM polls, the host sample — are still read from the store).
A restarted agent therefore restores its windows from the store at its first cycles, and
``diagnose`` and ``capacity``, which are not the agent, keep reading the store. docs/rules.md,
"Where the agent's rules read from", says why.

Thread-safety: ticks are fed by the store's thread and read by the rules thread, under one lock.
"""

from __future__ import annotations

import bisect
import logging
import threading
from array import array
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from sqlalchemy import Column, Engine

from vgpumon.store import Store, StoredGpu
from vgpumon.store.codec import GPU_ID, GPU_ROW_COLUMNS, ROLLUP_ROW_COLUMNS, TS, UP, GpuRow, RollupRow
from vgpumon.store.rollup import MINUTE_MS, aggregate, minute_of, percentile
from vgpumon.store.schema import ROLLUP_SPEC, ColumnValue, GpuSampleRow, gpu_samples_1m, rollup_column_name
from vgpumon.store.tables import Aggregates, NewestValue, SeriesRow, _rollup_of_last

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


class RuleWindows:
    """The agent's own GPUs' windows in memory, read as ``HostView`` reads the store.

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

    # -- what is covered -------------------------------------------------------------------------

    def _cover_ticks(self, start: float, seconds: float) -> bool:
        if seconds > self.needs.ticks:
            self.needs.ticks, self.grown = seconds, True
        return self._ticks_from is not None and _ms(start) >= self._ticks_from

    def _cover_columns(self, start: float, seconds: float, columns: Sequence[str]) -> bool:
        ok = self._cover_ticks(start, seconds)
        for c in columns:
            if c in ("ts", "up"):
                continue
            if seconds > self.needs.columns.get(c, 0.0):
                self.needs.columns[c], self.grown = seconds, True
            have = self._cols_from.get(c)
            ok = ok and have is not None and _ms(start) >= have
        return ok

    def _miss(self) -> None:
        """A read the store answers: memory does not cover it. A read that asked for more than
        the windows held (a new column, a longer window) has grown them (``grown``: restored
        at the next cycle); one at a catch-up time older than the windows' slack has not."""
        self.misses += 1

    # -- the reads of HostView --------------------------------------------------------------------

    @property
    def gpus(self) -> list[StoredGpu]:
        if self._known is None:
            self._known = self.store.gpus_of(self.hostname)
        return list(self._known)

    def gpus_of(self, hostname: str) -> list[StoredGpu]:
        return self.gpus if hostname == self.hostname else self.store.gpus_of(hostname)

    def forget(self) -> None:
        """Rows were stored that memory was not fed (a spool replayed after an outage): restore
        from the store at the next cycle."""
        with self._lock:
            self.grown = True

    def newest_ts(self, gpu_ids: Sequence[int]) -> float | None:
        """The newest tick fed (or restored) of these GPUs: the agent feeds what it stored."""
        with self._lock:
            times = [g.ts[-1] for gid in gpu_ids if (g := self._gpus.get(gid)) is not None and g.ts]
            times += [g.full[-1][TS] for gid in gpu_ids if (g := self._gpus.get(gid)) is not None and g.full]
        if times:
            return max(times) / 1000.0
        return self.store.newest_ts(gpu_ids) if self._ticks_from is None else None

    def _span(self, g: _Gpu, start: float, end: float) -> tuple[int, int]:
        return bisect.bisect_left(g.ts, _ms(start)), bisect.bisect_right(g.ts, _ms(end))

    def _values(self, g: _Gpu, name: str, lo: int, hi: int) -> list[int | None]:
        if name == "ts":
            return list(g.ts[lo:hi])
        if name == "up":
            return [None if u == 2 else u for u in g.up[lo:hi]]
        arr, first = g.column(name)
        pad: list[int | None] = [None] * max(0, min(first, hi) - lo)  # before the column's window (never, once covered)
        values = arr[max(lo - first, 0):max(hi - first, 0)]
        return pad + ([None if v == _NULL else v for v in values] if _NULL in values else list(values))

    def _slice(self, g: _Gpu, name: str, lo: int, hi: int) -> Sequence[int]:
        """A column's stored values over ``ts[lo:hi]``, ``_NULL`` where NULL (C-speed slices)."""
        if name == "ts":
            return g.ts[lo:hi]
        if name == "up":
            return [_NULL if u == 2 else u for u in g.up[lo:hi]]
        arr, first = g.column(name)
        return arr[max(lo - first, 0):max(hi - first, 0)]

    def _present(self, g: _Gpu, name: str, lo: int, hi: int) -> Sequence[int]:
        """The non-NULL stored values of a column over ``ts[lo:hi]`` (an array slice: C speed)."""
        if name == "ts":
            return g.ts[lo:hi]
        if name == "up":
            return [u for u in g.up[lo:hi] if u != 2]
        arr, first = g.column(name)
        values = arr[max(lo - first, 0):max(hi - first, 0)]
        return [v for v in values if v != _NULL] if _NULL in values else values

    def _count(self, g: _Gpu, name: str, lo: int, hi: int) -> int:
        if name == "ts":
            return hi - lo
        if name == "up":
            return hi - lo - g.up.count(2, lo, hi)
        arr, first = g.column(name)
        values = arr[max(lo - first, 0):max(hi - first, 0)]
        return len(values) - values.count(_NULL)

    def window_aggregates_many(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str],
                               aggregates: Sequence[str] = ("mean", "max")) -> dict[int, Aggregates]:
        with self._lock:
            if not self._cover_columns(start, end - start, columns):
                self._miss()
                covered = False
            else:
                covered = True
                out: dict[int, Aggregates] = {}
                for gid in gpu_ids:
                    out[gid] = self._aggregates(self._gpus.get(gid), start, end, columns, aggregates)
        if not covered:
            return self.store.window_aggregates_many(gpu_ids, start, end, columns, aggregates)
        return out

    def _aggregates(self, g: _Gpu | None, start: float, end: float, columns: Sequence[str], aggregates: Sequence[str]) -> Aggregates:
        lo, hi = self._span(g, start, end) if g is not None else (0, 0)
        if g is None or hi <= lo:
            return {"samples": 0, "up_samples": None, **{f"{n}_{k}": None for n in columns for k in aggregates}}
        ups = g.up[lo:hi]
        out: Aggregates = {"samples": hi - lo, "up_samples": ups.count(1)}
        for name in columns:
            if tuple(aggregates) == ("count",):  # how many values: no list of them
                out[f"{name}_count"] = self._count(g, name, lo, hi)
                continue
            values = self._slice(g, name, lo, hi)
            nulls = values.count(_NULL)
            n = len(values) - nulls
            decode = self._decode[name]
            for agg in aggregates:
                if agg == "count":
                    out[f"{name}_count"] = n
                elif not n:
                    out[f"{name}_{agg}"] = None
                elif agg == "min":  # NULL is the least integer: left out of the minimum only
                    out[f"{name}_min"] = decode(min(v for v in values if v != _NULL) if nulls else min(values))
                elif agg == "max":
                    out[f"{name}_max"] = decode(max(values))
                else:  # SQLite's avg of integers: their exact sum over the count, as doubles
                    out[f"{name}_mean"] = decode(float(sum(values) - nulls * _NULL) / float(n))
        return out

    def latest(self, gpu_ids: Sequence[int], columns: Sequence[str], until: float | None = None) -> dict[int, SeriesRow]:
        with self._lock:
            out: dict[int, SeriesRow] = {}
            covered = self._ticks_from is not None
            for gid in gpu_ids if covered else ():
                g = self._gpus.get(gid)
                if g is None:
                    continue
                row = None
                if g.full:
                    k = len(g.full) if until is None else bisect.bisect_right(g.full, _ms(until), key=lambda r: r[TS])
                    row = g.full[k - 1] if k else None
                if row is None and g.last is not None and (until is None or g.last[TS] <= _ms(until)):
                    row = g.last
                if row is not None:
                    out[gid] = {"ts": row[TS] / 1000.0, **{c: self._decode_raw(c, row[_POS[c]]) for c in columns}}
                elif g.restored is not None and self._restored_is_newest(g, until):
                    out[gid] = {"ts": g.restored["ts"], **{c: g.restored[c] for c in columns}}
                elif g.full or g.last is not None:
                    covered = False  # a time before every row held: the store looks
                    break
            if not covered:
                self._miss()
        if not covered:
            return self.store.latest(gpu_ids, columns, until)
        return out

    @staticmethod
    def _restored_is_newest(g: _Gpu, until: float | None) -> bool:
        """The row restored as the GPU's newest is its newest at or before ``until``: no tick
        held comes after it by then."""
        assert g.restored is not None
        ts = _ms(cast(float, g.restored["ts"]))
        if until is not None and ts > _ms(until):
            return False
        k = bisect.bisect_right(g.ts, _ms(until)) if until is not None else len(g.ts)
        return k == 0 or g.ts[k - 1] <= ts

    def _decode_raw(self, name: str, v: ColumnValue) -> ColumnValue:
        return None if v is None else self._decode[name](v)

    def last_values_many(self, gpu_ids: Sequence[int], end: float, columns: Sequence[str]) -> dict[int, dict[str, NewestValue | None]]:
        with self._lock:
            new = [c for c in columns if c not in self.needs.last]
            if new:
                self.needs.last.update(new)
                self.grown = True
            out: dict[int, dict[str, NewestValue | None]] = {gid: {c: None for c in columns} for gid in gpu_ids}
            covered = self._last_ready and not new
            lo_ms, end_ms = _ms(end - self.LAST_RAW_SECONDS), _ms(end)
            back = _ms(end - self.LAST_RAW_SECONDS - self.LAST_ROLLUP_SECONDS)
            for gid in gpu_ids if covered else ():
                g = self._gpus.get(gid)
                if g is None:
                    continue
                want = dict.fromkeys(columns)
                if g.last is not None and g.last[TS] <= end_ms:
                    # the usual case, at the newest tick: each column's newest value, kept as fed
                    for c in columns:
                        found = g.newest.get(c)
                        if found is not None and found[0] >= lo_ms:
                            out[gid][c] = (found[0] / 1000.0, self._decode[c](found[1]))
                            del want[c]
                else:  # a catch-up time: the whole rows before it
                    if not g.full or (g.full[0][TS] > lo_ms and g.ts and g.ts[0] < g.full[0][TS]):
                        covered = False  # older than the whole rows held: the store looks
                        break
                    rows = [r for r in g.full if lo_ms <= r[TS] <= end_ms]
                    for r in reversed(rows):
                        for c in list(want):
                            v = r[_POS[c]]
                            if v is not None:
                                out[gid][c] = (r[TS] / 1000.0, self._decode[c](v))
                                del want[c]
                        if not want:
                            break
                for c in want:
                    if _rollup_of_last(c) is None:
                        continue
                    found = g.minute_last.get(c)
                    if found is None:
                        continue
                    if found[0] > end_ms:
                        covered = False  # a catch-up time before the newest minute: the store knows
                        break
                    if found[0] >= back:
                        out[gid][c] = (found[0] / 1000.0, found[1])
            if not covered:
                self._miss()
        if not covered:
            return self.store.last_values_many(gpu_ids, end, columns)
        return out

    def newest_values(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> dict[int, dict[str, NewestValue]]:
        return self.store.newest_values(gpu_ids, start, end, columns)  # ``CarriedValues`` only, which memory replaces

    def down_since(self, newest: Mapping[int, tuple[float, bool]], at: float) -> dict[int, float]:
        down = [gid for gid, (_, up) in newest.items() if not up]
        out: dict[int, float] = {}
        with self._lock:
            covered = self._ticks_from is not None
            for gid in down if covered else ():
                g = self._gpus.get(gid)
                if g is None:
                    covered = False
                    break
                hi = bisect.bisect_right(g.ts, _ms(at))
                k = g.up.rfind(1, 0, hi)
                if k < 0 or k + 1 >= len(g.ts):
                    covered = False  # readable before the window: the store looks further back
                    break
                out[gid] = g.ts[k + 1] / 1000.0
            if not covered:
                self._miss()
        if not covered:
            return self.store.down_since(newest, at)
        return out

    def window_percentiles(self, gpu_id: int, start: float, end: float, columns: Sequence[str],
                           quantiles: Sequence[float] = (0.5, 0.95, 0.99)) -> dict[str, dict[float, float | None]]:
        with self._lock:
            covered = self._cover_columns(start, end - start, columns)
            out: dict[str, dict[float, float | None]] = {}
            if covered:
                g = self._gpus.get(gpu_id)
                for name in columns:
                    values: list[int] = []
                    if g is not None:
                        lo, hi = self._span(g, start, end)
                        values = sorted(self._present(g, name, lo, hi))
                    decode = self._decode[name]
                    out[name] = {q: (decode(percentile(values, q)) if values else None) for q in quantiles}
            else:
                self._miss()
        if not covered:
            return self.store.window_percentiles(gpu_id, start, end, columns, quantiles)
        return out

    def series(self, gpu_id: int, start: float, end: float, columns: Sequence[str], present: bool = False) -> list[SeriesRow]:
        with self._lock:
            covered = self._cover_columns(start, end - start, columns)
            rows: list[SeriesRow] = []
            if covered:
                g = self._gpus.get(gpu_id)
                if g is not None:
                    rows = self._rows(g, start, end, columns, present)
            else:
                self._miss()
        if not covered:
            return self.store.series(gpu_id, start, end, columns, present)
        return rows

    def _rows(self, g: _Gpu, start: float, end: float, columns: Sequence[str], present: bool = False) -> list[SeriesRow]:
        lo, hi = self._span(g, start, end)
        raw = [self._values(g, name, lo, hi) for name in columns]
        times: Sequence[int] = g.ts[lo:hi]
        if present:  # only the ticks where every column has a value, before anything is decoded
            keep = [k for k, vals in enumerate(zip(*raw)) if None not in vals]
            times = [times[k] for k in keep]
            raw = [[vals[k] for k in keep] for vals in raw]
        cols = []
        for name, vals in zip(columns, raw):
            decode = self._decode[name]
            cols.append(vals if name in _PLAIN else [None if v is None else decode(v) for v in vals])
        names = ("ts", *columns)
        return [dict(zip(names, r)) for r in zip([t / 1000.0 for t in times], *cols)]

    def summed_series(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> list[SeriesRow]:
        with self._lock:
            covered = self._cover_columns(start, end - start, columns)
            ticks: dict[int, list[int | None]] = {}
            if covered:
                for gid in gpu_ids:
                    g = self._gpus.get(gid)
                    if g is None:
                        continue
                    lo, hi = self._span(g, start, end)
                    per = [self._values(g, c, lo, hi) for c in columns]
                    for k, t in enumerate(g.ts[lo:hi]):
                        have = ticks.get(t)
                        if have is None:
                            have = ticks[t] = [0, *([None] * len(columns))]
                        have[0] = (have[0] or 0) + 1
                        for i, vals in enumerate(per):
                            v = vals[k]
                            if v is not None:
                                s = have[1 + i]
                                have[1 + i] = v if s is None else s + v
            else:
                self._miss()
        if not covered:
            return self.store.summed_series(gpu_ids, start, end, columns)
        out: list[SeriesRow] = []
        for t in sorted(ticks):
            have = ticks[t]
            row: SeriesRow = {"ts": t / 1000.0, "gpus": have[0]}
            for i, c in enumerate(columns):
                s = have[1 + i]
                row[c] = None if s is None else self._decode[c](s)
            out.append(row)
        return out

    def rollup_series_many(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> dict[int, list[SeriesRow]]:
        with self._lock:
            new = [c for c in columns if c not in self.needs.rollup_columns]
            if new or end - start > self.needs.rollup:
                self.needs.rollup = max(self.needs.rollup, end - start)
                self.needs.rollup_columns.update(new)
                self.grown = True
            covered = (self._rollups_from is not None and _ms(start) >= self._rollups_from and not new
                       and all(c in self._rollup_cols for c in columns))
            out: dict[int, list[SeriesRow]] = {gid: [] for gid in gpu_ids}
            if covered:
                names = ("ts", "samples", *columns)
                lo_ms, hi_ms = _ms(start), _ms(end)
                for gid in gpu_ids:
                    g = self._gpus.get(gid)
                    if g is None:
                        continue
                    lo, hi = bisect.bisect_left(g.rolled_ts, lo_ms), bisect.bisect_right(g.rolled_ts, hi_ms)
                    rows = list(g.rollups)[lo:hi] if lo or hi < len(g.rollups) else list(g.rollups)
                    decs = [self._rdecode[n] for n in names]
                    idx = [_RPOS[n] for n in names]
                    out[gid] = [dict(zip(names, (None if r[i] is None else d(r[i]) for i, d in zip(idx, decs)))) for r in rows]
            else:
                self._miss()
        if not covered:
            return self.store.rollup_series_many(gpu_ids, start, end, columns)
        return out

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
