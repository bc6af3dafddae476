"""The per-GPU figures of a long ``diagnose`` window: whole minutes from the 1-minute rollups,
raw rows only at the edges.

A 72-h window of 8 GPUs is 2 073 600 raw rows; the minutes the store has rolled up (every minute
before its ``rollup_watermark``) hold the same means and maxima in 34 560. The merge is exact for
``samples``, ``up_samples`` and maxima; a mean is the minutes' means weighted by their answered
samples, which equals the raw mean unless a column was missing for part of a minute while the GPU
answered (docs/diagnose.md, "Long windows").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from vgpumon.store import Store

#: A window longer than this reads its whole minutes from the rollups (the agent's own windows,
#: and the default 15 minutes, stay on raw rows: exact, and cheap at that length).
LONG_WINDOW_S = 3 * 3600.0
_MINUTE_S = 60.0


def window_aggregates(
    store: Store, ids: Sequence[int], start: float, end: float, columns: Sequence[str], *, long_window_s: float = LONG_WINDOW_S,
) -> dict[int, dict[str, Any]]:
    """``Store.window_aggregates_many(ids, start, end, columns)`` (means and maxima), from the
    rollups over the minutes they cover when the window is longer than ``long_window_s``."""
    ids = list(ids)
    if end - start <= long_window_s or not ids:
        return store.window_aggregates_many(ids, start, end, columns)
    first = math.ceil(start / _MINUTE_S) * _MINUTE_S  # the first whole minute in the window
    # every minute before a GPU's watermark is rolled up; a GPU without one has no rollups yet
    marks = [store.rollup_watermark([g]) for g in ids]
    if any(m is None for m in marks):
        return store.window_aggregates_many(ids, start, end, columns)
    last = min(min(m for m in marks if m is not None), math.floor(end / _MINUTE_S) * _MINUTE_S)  # rolled: [first, last)
    if last - first < _MINUTE_S:
        return store.window_aggregates_many(ids, start, end, columns)
    middle = store.rollup_window_aggregates(ids, first, last, columns)
    parts = [middle, store.window_aggregates_many(ids, start, first - 0.001, columns, ("mean", "max", "count")),
             store.window_aggregates_many(ids, last, end, columns, ("mean", "max", "count"))]
    return {g: _merged([p.get(g) for p in parts], columns) for g in ids}


def _merged(parts: list[dict[str, Any] | None], columns: Sequence[str]) -> dict[str, Any]:
    present = [p for p in parts if p and p.get("samples")]
    out: dict[str, Any] = {"samples": sum(int(p["samples"]) for p in present),
                           "up_samples": sum(int(p.get("up_samples") or 0) for p in present) if present else None}
    for c in columns:
        # (float: Postgres averages an integer column as a Decimal)
        weighted = [(float(p[f"{c}_mean"]), int(p.get(f"{c}_weight", p.get(f"{c}_count")) or 0)) for p in present
                    if p.get(f"{c}_mean") is not None]
        weight = sum(n for _, n in weighted)
        out[f"{c}_mean"] = sum(v * n for v, n in weighted) / weight if weight else None
        maxima = [p[f"{c}_max"] for p in present if p.get(f"{c}_max") is not None]
        out[f"{c}_max"] = max(maxima) if maxima else None
    return out
