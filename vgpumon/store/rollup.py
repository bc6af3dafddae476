"""1-minute rollups of raw GPU rows, computed in Python on stored (fixed-point) values.

One function serves the three places that summarise raw ticks: the store's rollup job (raw rows
read back from ``gpu_samples``), the agent's spool and its in-memory buffer when a bound is reached
while the store is away (raw ticks folded before they are ever stored). Computing in Python gives
the same figures on SQLite and Postgres (SQLite has no percentile aggregate) and costs little:
a minute of 8 GPUs is 480 rows.

Aggregates (``schema.ROLLUP_SPEC``) are taken over the non-NULL values of the minute; an all-NULL
column gives NULL. Means and percentiles are rounded to the column's fixed-point unit.
Percentiles interpolate linearly between closest ranks, as Postgres ``percentile_cont`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vgpumon.store.codec import GPU_ID, GPU_ROW_COLUMNS, ROLLUP_ROW_COLUMNS, TS, UP, GpuRow, RollupRow, StoredValue
from vgpumon.store.schema import ROLLUP_SPEC, rollup_column_name

MINUTE_MS = 60_000
_QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
_POS = {name: i for i, name in enumerate(GPU_ROW_COLUMNS)}
#: (source position, aggregate) per rollup value column, in ``ROLLUP_ROW_COLUMNS`` order after
#: the five key/count columns.
_PLAN: list[tuple[int, str]] = []
_by_name = {rollup_column_name(c, a): (_POS[c], a) for c, aggs in ROLLUP_SPEC.items() for a in aggs}
for _name in ROLLUP_ROW_COLUMNS[5:]:
    _PLAN.append(_by_name[_name])
del _name, _by_name
assert ROLLUP_ROW_COLUMNS[:5] == ("gpu_id", "ts", "samples", "up_samples", "folded_samples")


def minute_of(ts_ms: int) -> int:
    """Start (epoch ms) of the minute holding ``ts_ms``."""
    return ts_ms - ts_ms % MINUTE_MS


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of ascending values (``percentile_cont``); q in 0–1."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def aggregate(values: list[StoredValue], agg: str) -> StoredValue:
    """One rollup aggregate (``schema.ROLLUP_SPEC``'s names) of a minute's stored values, in time
    order, as ``rollup_rows`` takes it (the agent's rule windows roll up only the columns the
    rules read, with this)."""
    return _aggregate(values, agg)


def _aggregate(values: list[StoredValue], agg: str) -> StoredValue:
    present = [v for v in values if v is not None]
    if not present:
        return None
    if agg == "min":
        return min(present)
    if agg == "max":
        return max(present)
    if agg == "mean":
        return int(round(sum(present) / len(present)))
    if agg == "last":
        return present[-1]
    if agg == "any":
        return any(present)
    if agg == "or":
        out = 0
        for v in present:
            out |= int(v)
        return out
    present.sort()
    return int(round(percentile(present, _QUANTILES[agg])))


def rollup_rows(rows: Iterable[GpuRow], *, folded: bool = False) -> list[RollupRow]:
    """Summarise raw rows into one ``gpu_samples_1m`` row per GPU and minute.

    Args:
        rows: stored ``gpu_samples`` rows (``codec.GPU_ROW_COLUMNS`` order), any order; rows of a
            minute that are missing are simply not counted.
        folded: the rows will never be stored raw (resolution lost); counted in
            ``folded_samples``.

    Returns:
        Rollup rows in ``codec.ROLLUP_ROW_COLUMNS`` order, sorted by (minute, GPU).
    """
    groups: dict[tuple[int, int], list[GpuRow]] = {}
    for r in rows:
        groups.setdefault((minute_of(r[TS]), r[GPU_ID]), []).append(r)
    out: list[RollupRow] = []
    for (minute, gpu_id), members in sorted(groups.items()):
        members.sort(key=lambda r: r[TS])
        n = len(members)
        up = sum(1 for r in members if r[UP])
        values: list[StoredValue] = [gpu_id, minute, n, up, n if folded else 0]
        columns: dict[int, list[StoredValue]] = {}
        for pos, agg in _PLAN:
            col = columns.get(pos)
            if col is None:
                col = columns[pos] = [r[pos] for r in members]
            values.append(_aggregate(col, agg))
        out.append(tuple(values))
    return out


def split_whole_minutes(rows: Sequence[GpuRow], *, keep_last_minute: bool) -> tuple[list[GpuRow], list[GpuRow]]:
    """Split time-ordered rows into (rows of whole minutes, rows of the newest minute).

    Folding must not summarise part of a minute whose other part is folded later (two rollup rows
    for one minute would collide): the newest minute is held back while more rows of it may come.

    Args:
        rows: rows ordered by ``ts``.
        keep_last_minute: hold back the newest minute's rows (more may follow).
    """
    if not rows or not keep_last_minute:
        return list(rows), []
    last = minute_of(max(r[TS] for r in rows))
    return [r for r in rows if r[TS] < last], [r for r in rows if r[TS] >= last]
