"""A simulated GPU memory series for the leak rule (issue 11's acceptance series), and its stored form.

The story: a 141 GB GPU, 40 GB in use at start, load noise with a standard deviation of 0.1 GB
(every second), a +20 GB model-load step at hour 2, a process restart at hour 30 (memory back to
the base for a minute, then the model-load step again), and a leak of 0.3 GB/day from hour 12 in
the serving process — so the restart frees what leaked and the leak starts over. The same series
without the leak must raise nothing.

``series`` yields it second by second; ``rollup_rows`` folds it into ``gpu_samples_1m`` rows as the
store's rollup job would (min/mean/max/p50/p95/p99 of each minute), so a 72 h history is written
in 4 320 rows instead of 259 200 raw ticks; ``scrape`` takes every 15th second, as Prometheus
scraping an exporter every 15 s would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator, Sequence

from vgpumon.store.codec import ROLLUP_ROW_COLUMNS, RollupRow
from vgpumon.store.rollup import percentile

HOUR = 3600.0
DAY = 86400.0


@dataclass(frozen=True)
class MemoryStory:
    """The parameters of the simulated series (bytes and seconds; defaults: issue 11's)."""

    hours: float = 72.0
    total: float = 141e9
    base: float = 40e9
    noise_sd: float = 0.1e9
    step: float = 20e9
    step_at: float = 2 * HOUR
    restart_at: float = 30 * HOUR
    restart_down: float = 60.0  # seconds at the base before the model is loaded again
    leak_per_day: float = 0.3e9  # 0 for the silent case
    leak_from: float = 12 * HOUR
    seed: int = 20261201

    def level(self, t: float) -> float:
        """Memory in use at ``t`` seconds without noise."""
        down = self.restart_at <= t < self.restart_at + self.restart_down  # the process is gone
        loaded = t >= self.step_at and not down
        # the leak lives in the serving process: a restart frees what it leaked, then it starts over
        process_start = self.restart_at + self.restart_down if t >= self.restart_at + self.restart_down else 0.0
        leaking_since = max(self.leak_from, process_start)
        leak = 0.0 if down or not self.leak_per_day or t < leaking_since else self.leak_per_day * (t - leaking_since) / DAY
        return self.base + (self.step if loaded else 0.0) + leak

    def time_to_full(self, t: float) -> float | None:
        """True time until the GPU is full at ``t`` (seconds), ``None`` without a leak."""
        if not self.leak_per_day or t < self.leak_from:
            return None
        return (self.total - self.level(t)) / (self.leak_per_day / DAY)


def series(story: MemoryStory) -> Iterator[tuple[int, float]]:
    """``(second, bytes)`` for every second of the story (noise from a fixed seed)."""
    rng = random.Random(story.seed)  # noqa: S311  test data, seeded for repeatability
    for t in range(int(story.hours * HOUR)):
        yield t, story.level(t) + rng.gauss(0.0, story.noise_sd)


def rollup_rows(story: MemoryStory, gpu_id: int, start: float) -> list[RollupRow]:
    """One ``gpu_samples_1m`` row per minute of the story, starting at epoch ``start`` (a whole
    minute): memory used's aggregates as the rollup job computes them (``vgpumon.store.rollup``),
    memory total, every other column NULL."""
    cols = {c: i for i, c in enumerate(ROLLUP_ROW_COLUMNS)}
    rows = []
    minute: list[float] = []
    for t, v in series(story):
        minute.append(v)
        if len(minute) < 60:
            continue
        minute.sort()
        row: list = [None] * len(ROLLUP_ROW_COLUMNS)
        row[cols["gpu_id"]], row[cols["ts"]] = gpu_id, int((start + t - 59) * 1000)
        row[cols["samples"]] = row[cols["up_samples"]] = 60
        row[cols["folded_samples"]] = 0
        agg = {"min": minute[0], "max": minute[-1], "mean": sum(minute) / 60,
               "p50": percentile(minute, 0.5), "p95": percentile(minute, 0.95), "p99": percentile(minute, 0.99)}
        for k, v2 in agg.items():
            row[cols[f"memory_used_bytes_{k}"]] = int(round(v2))
        row[cols["memory_total_bytes_last"]] = int(story.total)
        rows.append(tuple(row))
        minute = []
    return rows


def scrape(story: MemoryStory, every: int = 15) -> list[float]:
    """The series as a Prometheus scrape every ``every`` seconds would see it (from second 0)."""
    return [v for t, v in series(story) if t % every == 0]


def promql_avg(values: Sequence[float]) -> float:
    """``avg_over_time`` as Prometheus 2.42 computes it (an incremental mean), so a test can
    predict an alert's value to the four digits its annotation prints (``humanize``)."""
    mean = count = 0.0
    for v in values:
        count += 1
        mean += v / count - mean / count
    return mean


def humanize(v: float) -> str:
    """Prometheus' ``humanize`` template function for values ≥ 1: ``%.4g`` with an SI prefix."""
    prefix = ""
    for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
        if abs(v) < 1000:
            break
        prefix, v = p, v / 1000
    return f"{v:.4g}{prefix}"
