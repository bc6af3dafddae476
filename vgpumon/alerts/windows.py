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
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar, cast

from vgpumon.alerts.window_store import _NULL, _PLAIN, _POS, _RPOS, TS, WindowStore, _Gpu, _ms, _rollup_of_last
from vgpumon.store.rollup import percentile
from vgpumon.store.schema import ColumnValue
from vgpumon.store.tables import Aggregates, NewestValue, SeriesRow

_T = TypeVar("_T")

class RuleWindows(WindowStore):
    """The agent's own GPUs' windows in memory, read as ``HostView`` reads the store
    (``rules.view.StoreReads``).

    Args:
        store: the agent's store (restores, the reads memory does not cover, the small tables).
        hostname: the agent's host.
    """

    # -- what is covered -------------------------------------------------------------------------

    def _cover_ticks(self, start: float, seconds: float) -> bool:
        if seconds > self.needs.ticks:
            self.needs.ticks, self.grown = seconds, True
        return self._ticks_from is not None and _ms(start) >= self._ticks_from

    def _from_memory(self, start: float, end: float, columns: Sequence[str], build: Callable[[], _T],
                     store: Callable[[], _T]) -> _T:
        """``build()`` under the lock where memory covers ``columns`` over [start, end], else the
        store's answer (``store()``, outside the lock), the miss counted."""
        with self._lock:
            if self._cover_columns(start, end - start, columns):
                return build()
            self._miss()
        return store()

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
        return self._from_memory(
            start, end, columns,
            lambda: {gid: self._aggregates(self._gpus.get(gid), start, end, columns, aggregates) for gid in gpu_ids},
            lambda: self.store.window_aggregates_many(gpu_ids, start, end, columns, aggregates))

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
        def build() -> dict[str, dict[float, float | None]]:
            g = self._gpus.get(gpu_id)
            out: dict[str, dict[float, float | None]] = {}
            for name in columns:
                values: list[int] = []
                if g is not None:
                    lo, hi = self._span(g, start, end)
                    values = sorted(self._present(g, name, lo, hi))
                decode = self._decode[name]
                out[name] = {q: (decode(percentile(values, q)) if values else None) for q in quantiles}
            return out

        return self._from_memory(start, end, columns, build,
                                 lambda: self.store.window_percentiles(gpu_id, start, end, columns, quantiles))

    def series(self, gpu_id: int, start: float, end: float, columns: Sequence[str], present: bool = False) -> list[SeriesRow]:
        def build() -> list[SeriesRow]:
            g = self._gpus.get(gpu_id)
            return [] if g is None else self._rows(g, start, end, columns, present)

        return self._from_memory(start, end, columns, build, lambda: self.store.series(gpu_id, start, end, columns, present))

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
        return self._from_memory(start, end, columns, lambda: self._summed(gpu_ids, start, end, columns),
                                 lambda: self.store.summed_series(gpu_ids, start, end, columns))

    def _summed(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> list[SeriesRow]:
        ticks: dict[int, list[int | None]] = {}
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
