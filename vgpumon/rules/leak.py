"""Slow GPU memory leaks, per GPU and per process: a robust trend over the stored minutes.

The story this exists for: a logging middleware kept references to request objects and leaked
0.3 GB a day, an OOM after three days. What must not be taken for a leak:

* a step that plateaus — a model load, the KV-cache allocation at start, prewarm: the level jumps
  and then stays. The fit starts only after the newest **level step** (the median of
  ``leak_step_seconds`` after a point differs from the median before it by more than
  ``leak_step_bytes``), so a step is never inside a fit;
* a process restart: its memory goes back to the base (a step down), then up again — steps too;
  per process, a restart is a new process (a new series);
* an event of the NVML source (``Store.gpu_events``: re-initialised, a GPU back or new, a clock
  step): the fit starts after it;
* a sleeping vLLM server: sleeping frees its weights and KV cache and waking takes them back; the
  fit starts after the server's newest sleeping poll.

A change of memory accounting (memory info v2 ↔ v1: ``used`` gains or loses the ~0.6 GB the
driver reserves; ``memory_reserved_bytes`` appears or disappears) is no break for a GPU: its
offset is the reserved bytes v2 reports beside it, and the points before it are moved into the
newest accounting (``_carry_accounting``), so the fit runs across it.

The fit is Theil–Sen (the median of the slopes between every pair of points; robust to 29 % of
outliers) over the last ``leak_fit_seconds`` (6 h) of the unbroken segment, on medians of
3-minute buckets of the per-minute rollups (``memory_used_bytes_p50``) — at most 120 points,
7 140 pairs. A trend must be sustained: the slopes of the window's two halves must both be
positive and agree within ``leak_halves_ratio``, which a ramp that plateaus does not do. The
confidence is Mann–Kendall's one-sided test of a rising trend; the interval is Sen's 95 %
interval of the slope. Time to full extrapolates the fitted level at the evaluation time to the
GPU's memory total at the fitted slope.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from statistics import median
from typing import Iterable, Sequence

from vgpumon.config.thresholds import Thresholds
from vgpumon.model import ServerState
from vgpumon.rules.core import Finding, Rule, Runbook, Twin, by, duration, gb, gpu_labels, prom, prom_duration
from vgpumon.rules.view import HostView, ProcessMemoryRow, row_ts

DAY = 86400.0
_BUCKETS = 120
#: Event kinds of the NVML source after which a memory series is a new one.
#: Host events (``vgpumon.model.HostEvent``) after which a memory series may step for a reason that
#: is not a leak: the memory API changed (v1 counts driver-reserved memory), NVML re-initialised
#: (driver reload), the GPU came back from a reset or appeared, the wall clock stepped.
BREAK_EVENTS = frozenset(
    {"memory_api_changed", "nvml_reinitialized", "gpu_recovered", "gpu_appeared", "gpu_unwedged", "clock_step"}
)


@dataclass(frozen=True)
class Trend:
    """A fitted memory trend.

    Attributes:
        slope: bytes per second (Theil–Sen).
        low, high: Sen's 95 % interval of the slope, bytes per second.
        confidence: Mann–Kendall's one-sided confidence that the series rises (0–1).
        level: fitted memory in use at the evaluation time, bytes.
        start: time of the fit window's first point (epoch seconds).
        halves: Theil–Sen slopes of the window's first and second halves, bytes per second.
        points: bucket medians the fit used.
    """

    slope: float
    low: float
    high: float
    confidence: float
    level: float
    start: float
    halves: tuple[float, float]
    points: int

    def sustained(self, ratio: float) -> bool:
        """Both halves rise and agree within ``ratio`` (min/max): a trend, not a plateauing ramp."""
        a, b = self.halves
        return a > 0 and b > 0 and min(a, b) / max(a, b) >= ratio


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, list[float]]:
    """Theil–Sen slope of points and the sorted pairwise slopes (O(n²); n ≤ 120 here).

    One list comprehension per point rather than one generator over all pairs: the same slopes,
    twice as fast (``diagnose`` fits every GPU at six times, docs/benchmarks.md)."""
    n = len(xs)
    slopes: list[float] = []
    for i in range(n):
        xi, yi = xs[i], ys[i]
        slopes.extend([(ys[j] - yi) / (xs[j] - xi) for j in range(i + 1, n) if xs[j] != xi])
    slopes.sort()
    return (median(slopes) if slopes else 0.0), slopes


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def fit(points: Sequence[tuple[float, float]], at: float) -> Trend | None:
    """Theil–Sen trend of ``(ts, bytes)`` points (oldest first), bucketed to ≤ 120 medians.

    Returns:
        The trend, or ``None`` with fewer than 8 buckets.
    """
    if not points:
        return None
    start, end = points[0][0], points[-1][0]
    size = max((end - start) / _BUCKETS, 1e-9)
    buckets: dict[int, list[float]] = {}
    for t, y in points:
        buckets.setdefault(min(int((t - start) / size), _BUCKETS - 1), []).append(y)
    xs = [start + (k + 0.5) * size - at for k in sorted(buckets)]
    ys = [median(buckets[k]) for k in sorted(buckets)]
    n = len(xs)
    if n < 8:
        return None
    slope, slopes = theil_sen(xs, ys)
    half = n // 2
    s1, _ = theil_sen(xs[:half], ys[:half])
    s2, _ = theil_sen(xs[half:], ys[half:])
    # Mann–Kendall S and its variance (no ties correction: bucket medians of bytes rarely tie).
    # The bucket times are distinct and increasing, so a pair's slope has the sign of its rise:
    # S is the count of positive slopes less the count of negative ones.
    s = (len(slopes) - bisect.bisect_right(slopes, 0.0)) - bisect.bisect_left(slopes, 0.0)
    var = n * (n - 1) * (2 * n + 5) / 18.0
    z = (s - 1) / math.sqrt(var) if s > 0 else (s + 1) / math.sqrt(var) if s < 0 else 0.0
    c = 1.96 * math.sqrt(var)
    m = len(slopes)
    lo = slopes[max(0, min(m - 1, int((m - c) / 2)))]
    hi = slopes[max(0, min(m - 1, int(math.ceil((m + c) / 2))))]
    level = median(y - slope * x for x, y in zip(xs, ys, strict=True))  # x is relative to ``at``: level at ``at``
    return Trend(slope, lo, hi, _normal_cdf(z), level, start, (s1, s2), n)


def steps(points: Sequence[tuple[float, float]], span: float, size: float) -> list[float]:
    """Times where the level steps: the median of the ``span`` after a point differs from the
    median of the ``span`` up to it by more than ``size`` bytes (model load, KV-cache allocation,
    restart, sleep/wake). A ramp shorter than ``span`` counts as one step."""
    ts = [p[0] for p in points]
    ys = [p[1] for p in points]
    out = []
    for i, t in enumerate(ts):
        lo, hi = bisect.bisect_right(ts, t - span), bisect.bisect_right(ts, t + span)
        if lo <= i < hi - 1 and abs(_median(ys[i + 1 : hi]) - _median(ys[lo : i + 1])) > size:
            out.append(t)
    return out


def _median(values: list[float]) -> float:
    """``statistics.median`` of a short non-empty list, without its checks (``steps`` takes two
    per point of a 6 h series, six times per GPU in a ``diagnose``)."""
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def segment_start(points: Sequence[tuple[float, float]], breaks: Iterable[float], th: Thresholds) -> float:
    """Start of the newest unbroken segment: after the newest step's settling span and after the
    newest external break (semantics change, event, sleep)."""
    cut = -math.inf
    found = steps(points, th.leak_step_seconds, th.leak_step_bytes)
    if found:
        cut = found[-1] + th.leak_step_seconds
    for b in breaks:
        cut = max(cut, b)
    return cut


def assess(
    points: Sequence[tuple[float, float]], breaks: Iterable[float], at: float, th: Thresholds, active: bool
) -> tuple[str, Trend | None, str | None]:
    """Decide on one memory series.

    Args:
        points: ``(ts, bytes)``, oldest first, over at least ``leak_fit_seconds +
            leak_step_seconds`` before ``at``.
        breaks: times after which the series is a new one (semantics changes, events, sleep).
        at: evaluation time.
        active: the alert is active (hysteresis: it holds at half the slope, halves not checked).

    Returns:
        ``(state, trend, reason)``: ``firing``/``ok`` with the trend, or ``unknown`` with why.
    """
    fit_s = th.leak_fit_seconds
    cut = segment_start(points, breaks, th)
    window_start = max(cut, at - fit_s)
    seg = [(t, y) for t, y in points if t >= window_start]
    if cut > at - 0.95 * fit_s:
        if cut == -math.inf:
            since = "too short"
        elif cut > at:  # a step's settling span (or a break stamped ahead of the data) reaches past now
            since = f"a level step or a break settles for another {duration(cut - at)}"
        else:
            since = f"only {duration(at - cut)} since a level step or a break"
        history = at - points[0][0] if points else 0.0
        stored = f", and {duration(history)} of history is stored" if history < 0.9 * fit_s else ""
        return "unknown", None, f"{since}; a trend needs {duration(fit_s)} without one{stored}"
    if len(seg) < 0.5 * fit_s / 60 or not seg or seg[0][0] > at - 0.9 * fit_s:
        return "unknown", None, f"fewer than half the minutes of the last {duration(fit_s)} stored"
    trend = fit(seg, at)
    if trend is None:
        return "unknown", None, "too few points"
    per_day = trend.slope * DAY
    if active:
        on = per_day >= 0.5 * th.leak_min_slope_bytes_per_day and trend.low > 0
    else:
        on = per_day >= th.leak_min_slope_bytes_per_day and trend.low > 0 and trend.sustained(th.leak_halves_ratio)
    return ("firing" if on else "ok"), trend, None


def evidence(trend: Trend, total: float | None, at: float) -> dict[str, str | float | None]:
    """The description's values for a trend."""
    ttf = (total - trend.level) / trend.slope if total and trend.slope > 0 else None
    return {
        "slope": f"{trend.slope * DAY / 1e9:.2f} GB/day",
        "interval": f"{trend.low * DAY / 1e9:.2f}–{trend.high * DAY / 1e9:.2f} GB/day",
        "confidence": f"{trend.confidence * 100:.1f} %",
        "level": gb(trend.level),
        "total": gb(total),
        "ttf": duration(ttf) if ttf is not None else "N/A",
        "ttf_seconds": ttf,
        "window": duration(at - trend.start),
    }


# -- per GPU --------------------------------------------------------------------------------------


def _sleep_breaks(view: HostView, uuid: str, lookback: float) -> list[float]:
    out = []
    for inst in view.vllm_instances:
        if inst["last_seen"] < view.at - lookback or uuid not in {m["gpu_uuid"] for m in view.vllm_gpu_map(inst["id"])}:
            continue
        sleeping = [s["ts"] for s in view.vllm_samples(inst["id"], lookback) if s["state"] is ServerState.SLEEPING]
        if sleeping:
            out.append(max(sleeping))
    return out


def _semantics_breaks(rows: Sequence[dict]) -> list[float]:
    """Minutes where ``memory_reserved_bytes`` appears or disappears: memory info v2 ↔ v1."""
    out, prev = [], None
    for r in rows:
        has = r["memory_reserved_bytes_mean"] is not None
        if prev is not None and has != prev:
            out.append(r["ts"])
        prev = has
    return out


#: Rollup minutes each side of an accounting change whose reserved bytes measure its offset.
_CARRY_MINUTES = 10


def _carry_accounting(rows: Sequence[dict], points: list[tuple[float, float]], changes: Sequence[float]) -> list[tuple[float, float]]:
    """The series in the newest accounting across each change of ``changes`` (memory info v1 ↔
    v2): v1's "used" includes the memory the driver reserves, which v2 reports apart, so the
    points before a change move by the reserved bytes v2 reported next to it (the median of up
    to ``_CARRY_MINUTES`` minutes on v2's side), and one fit runs across it instead of none for
    the next six hours."""
    out = list(points)
    for c in changes:
        before = [r for r in rows if r["ts"] < c][-_CARRY_MINUTES:]
        after = [r for r in rows if r["ts"] >= c][:_CARRY_MINUTES]
        v2_after = bool(after) and after[0]["memory_reserved_bytes_mean"] is not None
        side = after if v2_after else before
        reserved = [r["memory_reserved_bytes_mean"] for r in side if r["memory_reserved_bytes_mean"] is not None]
        if not reserved:
            continue
        shift = -median(reserved) if v2_after else median(reserved)  # v1 → v2 drops it from "used"; v2 → v1 adds it
        out = [(t, y + shift) if t < c else (t, y) for t, y in out]
    return out


def _gpu_leak(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    lookback = th.leak_fit_seconds + th.leak_step_seconds
    # a change of the memory API is carried across (its offset measured), not a break
    events = [e for e in view.events(lookback) if e["kind"] in BREAK_EVENTS - {"memory_api_changed"}]
    for g in view.gpus:
        labels = gpu_labels(view.hostname, g.identity.index, g.identity.uuid)
        rows = view.rollups(g.id, lookback, ("memory_used_bytes_p50", "memory_reserved_bytes_mean", "memory_total_bytes_last"))
        points = [(row_ts(r), used) for r in rows if (used := r["memory_used_bytes_p50"]) is not None]
        if not points:
            raw = view.window(th.leak_fit_seconds, ("ts",)).get(g.id)
            yield Finding(rule.name, labels, "unknown", reason=(
                f"its raw samples are not rolled up yet: it reads 1-minute rollups, {duration(th.leak_fit_seconds)} of them "
                "(the agent writes them each minute; `vgpumon db prune` rolls up a replay)" if raw and raw["samples"]
                else f"no 1-minute rollups of memory used in the last {duration(th.leak_fit_seconds)}"))
            continue
        points = _carry_accounting(rows, points, _semantics_breaks(rows))
        breaks = _sleep_breaks(view, g.identity.uuid, lookback)
        breaks += [e["ts"] for e in events if e["gpu_id"] in (None, g.id)]
        state, trend, reason = assess(points, breaks, view.at, th, view.is_active(rule.name, labels))
        if trend is None:
            yield Finding(rule.name, labels, "unknown", reason=reason)
            continue
        totals = [r["memory_total_bytes_last"] for r in rows if r["memory_total_bytes_last"]]
        total = totals[-1] if totals else g.identity.memory_total_bytes
        yield Finding(rule.name, labels, state, trend.slope * DAY, evidence(trend, total, view.at))


# -- per process ------------------------------------------------------------------------------------


def _process_leak(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    lookback = th.leak_fit_seconds + th.leak_step_seconds
    by_gpu = {g.id: g for g in view.gpus}
    series: dict[tuple[int, int], list[ProcessMemoryRow]] = {}
    for r in view.process_memory(lookback):
        if r["used_gpu_memory_bytes"] is not None:
            series.setdefault((r["gpu_id"], r["process_id"]), []).append(r)
    for (gpu_id, _), rows in sorted(series.items()):
        if view.at - rows[-1]["ts"] > th.missing_after_seconds:
            continue  # the process is gone: its memory went with it
        g = by_gpu[gpu_id]
        labels = {**gpu_labels(view.hostname, g.identity.index, g.identity.uuid), "pid": str(rows[-1]["pid"])}
        minutes: dict[float, list[float]] = {}
        for r in rows:  # host samples come every few ticks: one median per minute, as the GPU's rollups
            if (used := r["used_gpu_memory_bytes"]) is not None:  # always: ``series`` holds only rows with a value
                minutes.setdefault(r["ts"] - r["ts"] % 60, []).append(used)
        points = [(t, median(v)) for t, v in sorted(minutes.items())]
        state, trend, reason = assess(points, _sleep_breaks(view, g.identity.uuid, lookback), view.at, th,
                                      view.is_active(rule.name, labels))
        name = rows[-1]["name"] or "unresolved"
        if trend is None:
            yield Finding(rule.name, labels, "unknown", reason=reason, evidence={"process": name})
            continue
        ev = evidence(trend, g.identity.memory_total_bytes, view.at)
        yield Finding(rule.name, labels, state, trend.slope * DAY, {**ev, "process": name, "pid": rows[-1]["pid"]})


# -- twins ----------------------------------------------------------------------------------------


def _trend_twin(metric: str, subject: str, th: Thresholds, what: str) -> list[Twin]:
    """PromQL for a sustained trend that a one-off step cannot pass: three consecutive window
    means A (oldest), B, C of ``leak_fit_seconds / 2`` each; slope (C − A) over their centres'
    distance; both rises B − A and C − B positive and within ``leak_halves_ratio`` of each other.
    A step lands in one rise only, a restart makes one rise negative. (A naive
    ``predict_linear(mem[30m], …)`` fires on a model load, FACTS §7; ``deriv`` over 30 minutes of
    15 s scrapes is dominated by noise: with 0.1 GB of noise its error is ~1.5 GB/day.)"""
    part = th.leak_fit_seconds / 2
    w = prom_duration(part)
    b = by(subject)

    def mean(offset: float) -> str:
        off = f" offset {prom_duration(offset)}" if offset else ""
        return f"max {b} (avg_over_time({metric}[{w}]{off}))"

    a, bm, c = mean(2 * part), mean(part), mean(0)
    r = th.leak_halves_ratio
    per_day = DAY / (2 * part)
    expr = (
        f"({c} - {a}) * {per_day:g} >= {th.leak_min_slope_bytes_per_day:g}\n"
        f"and ({c} - {bm}) > {r} * ({bm} - {a})\n"
        f"and ({bm} - {a}) > {r} * ({c} - {bm})\n"
        f"and max {b} ({metric})"  # reporting now: a process that exited took its memory along
    )
    desc = (what + " grows by {{ $value | humanize }}B/day, sustained over the last "
            + prom_duration(3 * part) + " (three " + w + " means rising alike).")
    return [Twin(expr, desc)]


def _gpu_leak_twin(th: Thresholds) -> list[Twin]:
    return _trend_twin(prom("gpu_samples", "memory_used_bytes"), "gpu", th,
                       "Memory used on GPU {{ $labels.gpu }} of {{ $labels.hostname }}")


def _process_leak_twin(th: Thresholds) -> list[Twin]:
    return _trend_twin(prom("gpu_process_samples", "used_gpu_memory_bytes"), "gpu_process", th,
                       "GPU memory of process {{ $labels.pid }} on GPU {{ $labels.gpu }} of {{ $labels.hostname }}")


_LEAK_RUNBOOK = Runbook(
    "Memory in use has risen steadily for hours with no step explaining it: at this slope the GPU runs out of memory "
    "in the time given, and the process holding it will fail with out-of-memory (our story: a logging middleware "
    "kept request objects, 0.3 GB a day, an OOM after three days). Model loads, KV-cache allocation, restarts, "
    "and sleeping vLLM servers are steps, not trends, and are left out of the fit; a change of memory accounting "
    "(driver memory API v1 ↔ v2) is carried across by its measured offset.",
    "`vgpumon diagnose <host>` and the memory panel of the GPU over a day; "
    "`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv` twice an hour apart shows which "
    "process grows; the process's own host RSS often grows alongside.",
    "Find the growing process and its owners; restart it before the time to full (a restart resets the leak); "
    "then find the leak (references kept across requests, caches without a bound).",
)

RULES: tuple[Rule, ...] = (
    Rule(
        "GpuMemoryLeak", "warning", "gpu",
        "GPU memory in use rises steadily: a slow leak.",
        "Memory used rises {slope} (95 % interval {interval}, confidence {confidence}) over the last {window} without a "
        "step; at {level} of {total} the GPU is full in {ttf}.",
        ("gpu_samples_1m.memory_used_bytes_p50", "gpu_samples_1m.memory_reserved_bytes_mean", "gpu_events", "vllm_samples.state"),
        _gpu_leak,
        _gpu_leak_twin,
        _LEAK_RUNBOOK,
        for_seconds=3600.0,
        keep_firing_seconds=1800.0,
        every_seconds=300.0,
    ),
    Rule(
        "GpuProcessMemoryLeak", "warning", "gpu_process",
        "A process's GPU memory rises steadily: a slow leak.",
        "{process} (pid {pid}) uses {slope} more GPU memory a day (95 % interval {interval}, confidence {confidence}) over "
        "the last {window}; at {level} the GPU's {total} are reached in {ttf}.",
        ("gpu_process_samples.used_gpu_memory_bytes", "vllm_samples.state"),
        _process_leak,
        _process_leak_twin,
        _LEAK_RUNBOOK,
        for_seconds=3600.0,
        keep_firing_seconds=1800.0,
        every_seconds=300.0,
    ),
)
