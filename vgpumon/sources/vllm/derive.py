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

Quantiles that cannot be true are kept but flagged (``implausible``): a histogram whose ``_sum``
contradicts its buckets, or whose interpolated quantiles exceed what its mean allows. vLLM builds
with broken timing produce exactly that (vllm issue 8115: 8060 TTFTs all in the first bucket,
``le="0.1"``, with a ``_sum`` of 0.587 s, a mean of 73 µs, read as p50/p95/p99 of
0.05/0.095/0.099 s; vllm issue 6337: every TTFT in the 1 ms bucket, "always 0 seconds").
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from vgpumon.sources.vllm.lmcache import interval_figures as lmcache_figures
from vgpumon.sources.vllm.metrics import Histogram, MetricsReading
from vgpumon.sources.vllm.slo import SLO_HISTOGRAMS, SloTargets, SloWindow, share_within

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


def histogram_reset(prev: Histogram | None, cur: Histogram) -> bool:
    """Whether ``cur`` starts over rather than continuing ``prev``: no previous scrape of the
    series, other bucket bounds (the server restarted with other buckets), or a count that went
    down."""
    if prev is None:
        return True
    pb = dict(prev.buckets)
    if set(pb) != {le for le, _ in cur.buckets}:
        return True
    return any(c < pb[le] for le, c in cur.buckets)


def histogram_delta(prev: Histogram | None, cur: Histogram) -> tuple[tuple[float, float], ...]:
    """Cumulative bucket counts of the interval between ``prev`` and ``cur``.

    Returns:
        ``(le, cumulative count)`` pairs; ``cur``'s own counts when ``histogram_reset`` (callers
        skip the case without a previous scrape: no interval yet).
    """
    if prev is None or histogram_reset(prev, cur):
        return cur.buckets
    pb = dict(prev.buckets)
    return tuple((le, c - pb[le]) for le, c in cur.buckets)


def interval_sum(prev: Histogram | None, cur: Histogram) -> float | None:
    """``_sum`` of the interval (the histogram's unit); ``None`` when a scrape has no ``_sum``."""
    if cur.total is None:
        return None
    if prev is None or histogram_reset(prev, cur):
        return cur.total
    if prev.total is None:
        return None
    return cur.total - prev.total


def implausible(buckets: Sequence[tuple[float, float]], total: float | None, quantiles: Mapping[float, float | None]) -> str | None:
    """Why an interval's latency quantiles cannot be true, or ``None`` when nothing says so.

    Two checks, both exact for a quantity that is never negative (a latency):

    * every observation lies in its bucket ``(lower, le]`` (the first bucket's lower bound is 0),
      so ``_sum`` lies between Σ count × lower and Σ count × le (no upper bound when some fall in
      ``+Inf``). Outside that, the buckets and the sum cannot both be true (negative durations from
      mixed clocks, a sum reset apart from its buckets);
    * Markov's inequality: at most a share 1 − q of the observations reach mean / (1 − q), so the
      q-quantile is at most that (the median at most twice the mean). An interpolated quantile
      above it is an artefact of interpolation, not a measurement: what vLLM's broken timing
      gives (everything in the lowest bucket, a sum far too small for the count).

    Args:
        buckets: the interval's cumulative ``(le, count)`` pairs, sorted by ``le``.
        total: the interval's ``_sum``; ``None`` (no ``_sum`` sample): only the case below.
        quantiles: q → the quantile computed from ``buckets``.

    Without ``_sum``, an interval whose every observation lies in the lowest bucket (all its
    buckets count the same) is flagged too: its quantiles are then nothing but interpolation
    across ``[0, le]`` (the median is always le / 2), and nothing can check them.
    """
    if not buckets:
        return None
    n = buckets[-1][1] if math.isinf(buckets[-1][0]) else max(c for _, c in buckets)
    if n <= 0:
        return None
    if total is None:
        first = buckets[0]
        if first[1] >= n and any(v is not None for v in quantiles.values()):
            return f"all {n:g} in the lowest bucket (≤ {first[0]:g} s) and no _sum to check them by: the quantiles only interpolate inside it"
        return None
    lo = hi = 0.0
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        k = c - prev_c
        if k > 0:
            lo += k * max(prev_le, 0.0)
            hi += k * le  # +Inf once an observation lies beyond the last finite bound
        prev_le, prev_c = le, c
    tol = 1e-9 + 1e-6 * max(abs(lo), abs(total), 0.0 if math.isinf(hi) else abs(hi))
    if total < lo - tol or total > hi + tol:
        upper = "∞" if math.isinf(hi) else f"{hi:.3g}"
        return f"_sum {total:.3g} s outside what its buckets allow ({lo:.3g}…{upper} s for {n:g} observations)"
    mean = total / n
    for q, v in sorted(quantiles.items()):
        if v is not None and v > mean / (1.0 - q) + tol:
            first = buckets[0]
            where = f"; all {n:g} in the lowest bucket (≤ {first[0]:g} s)" if first[1] >= n else ""
            return f"p{q * 100:g} {v:.3g} s above what the mean {mean:.3g} s allows ({mean / (1.0 - q):.3g} s){where}"
    return None


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
        self._slo: dict[str, SloWindow] = {}

    def step(self, ts: float, reading: MetricsReading, slo: SloTargets | None = None) -> dict[str, Any]:
        """Figures for the interval that ends with ``reading`` at ``ts`` (epoch seconds).

        Returns:
            ``prompt_tokens_per_second``, ``generation_tokens_per_second``,
            ``preemptions_per_second``, ``requests_finished_per_second`` (counter rates summed
            over series; for V0 servers without token counters the ``avg_*_throughput`` gauges),
            ``prefix_cache_hit_ratio`` (interval hits / queries), ``kv_offload_load_bytes_per_second``
            (offload medium → GPU) and ``kv_offload_store_bytes_per_second`` (GPU → offload
            medium), ``spec_decode_acceptance_ratio`` (interval accepted / draft tokens; ``None``
            without drafts), the ``lmcache_*`` fields of LMCache's families
            (``vgpumon.sources.vllm.lmcache.FIELDS``), ``tokens_advanced`` (prompt +
            generation token increase; ``None`` without counters), and ``<hist>_p50_seconds`` /
            ``_p95_`` / ``_p99_`` for ``ttft``, ``itl``, ``e2e``, ``queue``. ``None`` for the first
            scrape (no interval yet), for absent metrics, and for quantiles of an interval
            without observations. ``latency_unreliable``: histogram name → why its quantiles
            cannot be true (``implausible``), for the histograms that say so (empty otherwise).
            ``ttft_slo_*`` / ``itl_slo_*``: attainment over ``slo``'s window (``vgpumon.sources.vllm.slo``),
            fed only by intervals not flagged unreliable.
        """
        prev, prev_ts = self._prev, self._prev_ts
        self._prev, self._prev_ts = reading, ts
        out: dict[str, Any] = {}
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
        out["kv_offload_load_bytes_per_second"] = series_rate("kv_offload_load_bytes")
        out["kv_offload_store_bytes_per_second"] = series_rate("kv_offload_store_bytes")
        accepted, drafted = series_increase("spec_decode_accepted_tokens"), series_increase("spec_decode_draft_tokens")
        out["spec_decode_acceptance_ratio"] = accepted / drafted if accepted is not None and drafted else None
        out.update(lmcache_figures(prev.lmcache if prev is not None else None, reading.lmcache, dt))
        p_inc, g_inc = series_increase("prompt_tokens"), series_increase("generation_tokens")
        out["tokens_advanced"] = None if p_inc is None and g_inc is None else (p_inc or 0.0) + (g_inc or 0.0)
        unreliable: dict[str, str] = {}
        for hist in ("ttft", "itl", "e2e", "queue"):
            parts = []
            sums: list[float | None] = []
            if prev is not None:
                for key, s in reading.series.items():
                    h = s.histograms.get(hist)
                    if h is None or not h.buckets:
                        continue
                    p = prev.series.get(key)
                    ph = p.histograms.get(hist) if p else None
                    parts.append(histogram_delta(ph, h))
                    sums.append(interval_sum(ph, h))
            merged = merge_cumulative(parts)
            qs = {q: quantile(q, merged) for q in QUANTILES}
            for q, v in qs.items():
                out[f"{hist}_p{int(q * 100)}_seconds"] = v
            # the sums of the series merge_cumulative kept (same bounds as the first)
            kept = [t for part, t in zip(parts, sums) if parts and [le for le, _ in part] == [le for le, _ in parts[0]]]
            total = None if not kept or any(t is None for t in kept) else float(sum(kept))  # type: ignore[arg-type]
            why = implausible(merged, total, qs) if any(v is not None for v in qs.values()) else None
            if why is not None:
                unreliable[hist] = why
            if hist in SLO_HISTOGRAMS:
                targets = slo or SloTargets()
                win = self._slo.setdefault(hist, SloWindow(targets.window_seconds))
                win.add(ts, None if why is not None or prev is None else share_within(merged, targets.target(hist)))
                ratio, n, interpolated = win.figure()
                out[f"{hist}_slo_attainment_ratio"] = ratio
                # a server that serves no such histogram observed nothing: unknown, not 0
                out[f"{hist}_slo_observations"] = n if prev is not None and parts else None
                out[f"{hist}_slo_interpolated"] = interpolated if ratio is not None else None
        out["latency_unreliable"] = unreliable
        return out


def gauge_fingerprint(reading: MetricsReading) -> Mapping[object, object]:
    """The gauge values of a scrape, comparable between scrapes (frozen-gauge detection)."""
    return {key: tuple(sorted(s.gauges.items())) for key, s in reading.series.items()}
