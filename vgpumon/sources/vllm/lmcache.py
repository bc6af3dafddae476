"""LMCache's ``lmcache:*`` families, served in a vLLM server's own ``/metrics`` when the server runs
LMCache's connector (docs/vllm.md, "LMCache").

Names, types and labels are LMCache's (``lmcache/observability.py``, ``PrometheusLogger``): counters
``lmcache:num_<what>`` exposed by prometheus-client as ``lmcache:num_<what>_total``, the gauge
``lmcache:local_cache_usage`` (bytes) and the histograms ``lmcache:time_to_retrieve`` /
``lmcache:time_to_store`` (seconds), every series labelled ``model_name``, ``worker_id``, ``role``
and ``served_model_name``.

How label sets add up to one server's figure:

* **``pid``** (prometheus-client's multiprocess collector keeps a gauge per process in its
  ``all`` mode): each pid's value is that process's own (its own counters, its own cache), so pid
  splits are **summed** — unlike vLLM's API-server split, where every pid re-reports the same
  engine and the reader takes the max (``vgpumon.sources.vllm.metrics``).
* **``worker_id``** (one LMCache engine per tensor-parallel rank): every rank retrieves and stores
  its shard of the same requests' KV, so request and token *rates* are the largest rank's (a sum
  would count each request once per rank); the cache's bytes are **summed** (each rank's cache
  holds memory of its own); ratios and mean durations are taken over the sums of every rank
  (the ranks' shares weigh alike).
* ``role`` (``scheduler`` for lookups, ``worker`` for retrieves and stores) and the model labels
  are summed within a rank: each family counts on one side only.

Pure: fed one scrape's ``lmcache:`` samples (``LMCacheAccumulator.add``), then two consecutive
readings (``interval_figures``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

PREFIX = "lmcache:"

#: canonical name → the sample name LMCache's prometheus-client exposition carries.
COUNTERS: dict[str, str] = {
    "retrieve_requests": "lmcache:num_retrieve_requests_total",
    "store_requests": "lmcache:num_store_requests_total",
    "requested_tokens": "lmcache:num_requested_tokens_total",
    "hit_tokens": "lmcache:num_hit_tokens_total",
    "stored_tokens": "lmcache:num_stored_tokens_total",
    "lookup_tokens": "lmcache:num_lookup_tokens_total",
    "lookup_hits": "lmcache:num_lookup_hits_total",
    "time_to_retrieve_sum": "lmcache:time_to_retrieve_sum",
    "time_to_retrieve_count": "lmcache:time_to_retrieve_count",
    "time_to_store_sum": "lmcache:time_to_store_sum",
    "time_to_store_count": "lmcache:time_to_store_count",
}
GAUGES: dict[str, str] = {"local_cache_usage": "lmcache:local_cache_usage"}
_CANON = {v: k for k, v in {**COUNTERS, **GAUGES}.items()}

#: field (``vllm_samples``) → the counter whose interval rate it is (the largest rank's).
RATES: dict[str, str] = {
    "lmcache_retrieve_requests_per_second": "retrieve_requests",
    "lmcache_store_requests_per_second": "store_requests",
    "lmcache_hit_tokens_per_second": "hit_tokens",
    "lmcache_stored_tokens_per_second": "stored_tokens",
}
#: field → (numerator, denominator) counters whose interval increases it divides (every rank's sum).
QUOTIENTS: dict[str, tuple[str, str]] = {
    "lmcache_retrieve_hit_ratio": ("hit_tokens", "requested_tokens"),
    "lmcache_lookup_hit_ratio": ("lookup_hits", "lookup_tokens"),
    "lmcache_retrieve_mean_seconds": ("time_to_retrieve_sum", "time_to_retrieve_count"),
    "lmcache_store_mean_seconds": ("time_to_store_sum", "time_to_store_count"),
}
FIELDS = (*RATES, *QUOTIENTS, "lmcache_local_cache_usage_bytes")


@dataclass(frozen=True, slots=True)
class LMCacheReading:
    """One scrape's LMCache families: canonical name → ``worker_id`` (``None``: unlabelled) →
    value summed over every other label (``pid``, ``role``, model names)."""

    values: Mapping[str, Mapping[str | None, float]] = field(default_factory=dict)

    def total(self, canon: str) -> float | None:
        """The sum over ranks; ``None`` when the scrape has no such family."""
        per = self.values.get(canon)
        return float(sum(per.values())) if per else None


class LMCacheAccumulator:
    """Collects one scrape's ``lmcache:`` samples (already finite: NaN and ±Inf are refused by the
    caller, each costing only its own family)."""

    def __init__(self) -> None:
        self._values: dict[str, dict[str | None, float]] = {}

    def add(self, name: str, labels: Mapping[str, str | None], value: float) -> None:
        canon = _CANON.get(name)
        if canon is None:
            return  # a family vgpumon does not read (docs/vllm.md lists those it reads)
        per = self._values.setdefault(canon, {})
        rank = labels.get("worker_id") or None
        per[rank] = per.get(rank, 0.0) + value

    def reading(self) -> LMCacheReading | None:
        return LMCacheReading(self._values) if self._values else None


def _increases(prev: LMCacheReading | None, cur: LMCacheReading, canon: str) -> dict[str | None, float]:
    """Each rank's increase since the previous scrape; a counter that went down was reset (its
    increase is its new value, as Prometheus' ``increase()``)."""
    if prev is None:
        return {}
    before = prev.values.get(canon, {})
    out: dict[str | None, float] = {}
    for rank, v in cur.values.get(canon, {}).items():
        p = before.get(rank, 0.0)
        out[rank] = v if v < p else v - p
    return out


def interval_figures(prev: LMCacheReading | None, cur: LMCacheReading | None, seconds: float | None) -> dict[str, float | None]:
    """The LMCache fields of the interval that ends with ``cur`` (``FIELDS``; ``None`` where the
    families are absent, for the first scrape, and for a quotient whose denominator did not grow:
    no retrieve in the interval has no hit ratio, not one of 0)."""
    out: dict[str, float | None] = dict.fromkeys(FIELDS)
    if cur is None:
        return out
    out["lmcache_local_cache_usage_bytes"] = cur.total("local_cache_usage")
    if prev is None or not seconds or seconds <= 0:
        return out
    for name, canon in RATES.items():
        incs = _increases(prev, cur, canon)
        out[name] = max(incs.values()) / seconds if incs else None
    for name, (num, den) in QUOTIENTS.items():
        n, d = _increases(prev, cur, num), _increases(prev, cur, den)
        out[name] = sum(n.values()) / sum(d.values()) if n and d and sum(d.values()) > 0 else None
    return out
