"""Interval figures from two consecutive scrapes: counter rates and histogram quantiles.

Both follow Prometheus semantics so that a value here matches what ``rate()`` and
``histogram_quantile()`` would show over the same interval:

* a counter that goes down was reset (the server restarted its engine): the increase over the
  interval is the new value (counted from 0), not a negative number;
* a histogram's interval distribution is the per-bucket difference of cumulative counts; the
  bucket bounds (``le``) are read from each scrape, and a scrape whose bounds differ from the
  previous one, or whose counts went down, is a reset (its own counts are the interval's);
* a quantile is interpolated linearly inside its bucket; one that falls in the ``+Inf`` bucket is
  the highest finite bound (a lower bound of the truth).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from vgpumon.sources.vllm.metrics import Histogram, MetricsReading

QUANTILES = (0.5, 0.95, 0.99)


def counter_increase(prev: float | None, cur: float | None) -> float | None:
    """Increase of a cumulative counter between two scrapes; a drop is a reset (increase =
    ``cur``). ``None`` when either value is unknown."""
    if prev is None or cur is None:
        return None
    return cur if cur < prev else cur - prev


def counter_rate(prev: float | None, cur: float | None, seconds: float | None) -> float | None:
    """Per-second rate of a counter over ``seconds`` (> 0); ``None`` when unknown."""
    inc = counter_increase(prev, cur)
    if inc is None or not seconds or seconds <= 0:
        return None
    return inc / seconds


def histogram_delta(prev: Histogram | None, cur: Histogram) -> tuple[tuple[float, float], ...]:
    """Cumulative bucket counts of the interval between ``prev`` and ``cur``.

    Returns:
        ``(le, cumulative count)`` pairs; ``cur``'s own counts when there is no previous scrape
        of this series... callers skip that case (no interval yet); on a reset (bounds changed,
        or a count went down) also ``cur``'s counts.
    """
    if prev is None:
        return cur.buckets
    pb = dict(prev.buckets)
    if set(pb) != {le for le, _ in cur.buckets}:
        return cur.buckets  # bounds changed: the server restarted with other buckets
    out = []
    for le, c in cur.buckets:
        d = c - pb[le]
        if d < 0:
            return cur.buckets
        out.append((le, d))
    return tuple(out)


def merge_cumulative(parts: Sequence[Sequence[tuple[float, float]]]) -> tuple[tuple[float, float], ...]:
    """Sum several cumulative bucket lists that share bounds (engines of one server); lists whose
    bounds differ from the first are left out."""
    if not parts:
        return ()
    bounds = [le for le, _ in parts[0]]
    acc = [0.0] * len(bounds)
    for p in parts:
        if [le for le, _ in p] != bounds:
            continue
        for i, (_, c) in enumerate(p):
            acc[i] += c
    return tuple(zip(bounds, acc))


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """``histogram_quantile(q, ...)`` over cumulative ``(le, count)`` pairs sorted by ``le``.

    Returns:
        The estimated quantile in the histogram's unit; ``None`` when the interval holds no
        observation (an interval without requests has no latency, not a latency of 0) or there
        are no buckets.
    """
    if not buckets:
        return None
    total = buckets[-1][1] if math.isinf(buckets[-1][0]) else max(c for _, c in buckets)
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le  # highest finite bound: all we know
            if c == prev_c:
                return le
            lower = prev_le if prev_le < le else 0.0
            return lower + (le - lower) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


class IntervalDeriver:
    """Turns consecutive readings of one server (one process lifetime) into interval figures.

    Not shared between servers: a restarted server gets a new deriver, so its counters start
    over instead of reading as a reset of the old one.
    """

    def __init__(self) -> None:
        self._prev: MetricsReading | None = None
        self._prev_ts: float | None = None

    def step(self, ts: float, reading: MetricsReading) -> dict[str, float | None]:
        """Figures for the interval that ends with ``reading`` at ``ts`` (epoch seconds).

        Returns:
            ``prompt_tokens_per_second``, ``generation_tokens_per_second``,
            ``preemptions_per_second``, ``requests_finished_per_second`` (counter rates summed
            over series; for V0 servers without token counters the ``avg_*_throughput`` gauges),
            ``prefix_cache_hit_ratio`` (interval hits / queries), ``tokens_advanced`` (prompt +
            generation token increase; ``None`` without counters), and ``<hist>_p50_seconds`` /
            ``_p95_`` / ``_p99_`` for ``ttft``, ``itl``, ``e2e``, ``queue``. ``None`` for the first
            scrape (no interval yet), for absent metrics, and for quantiles of an interval
            without observations.
        """
        prev, prev_ts = self._prev, self._prev_ts
        self._prev, self._prev_ts = reading, ts
        out: dict[str, float | None] = {}
        dt = None if prev_ts is None else ts - prev_ts

        def series_increase(canon: str) -> float | None:
            """Sum over series of the counter's increase since the last scrape (resets handled)."""
            if prev is None:
                return None
            incs = []
            for key, s in reading.series.items():
                if canon not in s.counters:
                    continue
                p = prev.series.get(key)
                incs.append(counter_increase(p.counters.get(canon, 0.0) if p else 0.0, s.counters[canon]))
            vals = [i for i in incs if i is not None]
            return sum(vals) if vals else None

        def series_rate(canon: str) -> float | None:
            if not dt or dt <= 0:
                return None
            inc = series_increase(canon)
            return None if inc is None else inc / dt

        out["prompt_tokens_per_second"] = series_rate("prompt_tokens")
        out["generation_tokens_per_second"] = series_rate("generation_tokens")
        if out["prompt_tokens_per_second"] is None:
            out["prompt_tokens_per_second"] = reading.gauge_total("prompt_throughput")
        if out["generation_tokens_per_second"] is None:
            out["generation_tokens_per_second"] = reading.gauge_total("generation_throughput")
        out["preemptions_per_second"] = series_rate("preemptions")
        out["requests_finished_per_second"] = series_rate("requests_finished")
        hits, queries = series_increase("prefix_cache_hits"), series_increase("prefix_cache_queries")
        out["prefix_cache_hit_ratio"] = hits / queries if hits is not None and queries else None
        p_inc, g_inc = series_increase("prompt_tokens"), series_increase("generation_tokens")
        out["tokens_advanced"] = None if p_inc is None and g_inc is None else (p_inc or 0.0) + (g_inc or 0.0)
        for hist in ("ttft", "itl", "e2e", "queue"):
            parts = []
            if prev is not None:
                for key, s in reading.series.items():
                    h = s.histograms.get(hist)
                    if h is None or not h.buckets:
                        continue
                    p = prev.series.get(key)
                    parts.append(histogram_delta(p.histograms.get(hist) if p else None, h))
            merged = merge_cumulative(parts)
            for q in QUANTILES:
                out[f"{hist}_p{int(q * 100)}_seconds"] = quantile(q, merged)
        return out


def gauge_fingerprint(reading: MetricsReading) -> Mapping[object, object]:
    """The gauge values of a scrape, comparable between scrapes (frozen-gauge detection)."""
    return {key: tuple(sorted(s.gauges.items())) for key, s in reading.series.items()}
