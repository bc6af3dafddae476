"""Read one vLLM ``/metrics`` scrape into canonical fields, whatever the vLLM version (0.2 → 0.33).

Parsing is prometheus-client's (``prometheus_client.parser`` for the classic text format,
``prometheus_client.openmetrics.parser`` when the server answers OpenMetrics); this module only
maps names. It works on *samples*, not families, because a fragment without ``# TYPE`` lines
comes back as one untyped family per line (vllm PR 11117's capture).

Rules (FACTS §5):

* Only ``vllm:`` samples are read; ``*_created`` samples (their own gauge families in
  prometheus-client ≥ 0.20 output, e.g. production-stack issue 617) are skipped.
* A label whose value is the Python repr ``"None"`` is unknown, not a string (vllm issue 28924).
* Series split by API-server ``pid`` (``--api-server-count`` > 1, vllm PR 28792) are reduced with
  **max** per remaining label set — never summed, never "last one wins".
* A series is identified by ``(model_name, engine)``; ``engine`` exists from 0.8 (one per
  data-parallel engine), ``model_name`` is the served name (a LoRA adapter is its own name).
* Renamed metrics are read through ``ALIASES`` (new name first). The ambiguous prefix-cache
  counters are interpreted with the server's version (``/version``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from prometheus_client.openmetrics.parser import text_string_to_metric_families as _openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as _text_families

PREFIX = "vllm:"

#: Canonical field → metric names that carry it, newest first. Sample names as exposed (counters
#: with ``_total``). Versions from FACTS §5 and vLLM's docs/design/metrics.md.
ALIASES: dict[str, tuple[str, ...]] = {
    # gauges
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),  # counts deferred requests too from 0.20
    "swapped": ("vllm:num_requests_swapped",),  # V0 only
    # kv_cache_usage_perc from 0.9 (a ratio despite its name); gpu_cache_usage_perc before,
    # removed in 0.12.
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    # V0 gauges, removed in 0.7: derive from the token counters when absent.
    "prompt_throughput": ("vllm:avg_prompt_throughput_toks_per_s",),
    "generation_throughput": ("vllm:avg_generation_throughput_toks_per_s",),
    # counters
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "preemptions": ("vllm:num_preemptions_total",),
    "requests_finished": ("vllm:request_success_total",),  # summed over finished_reason
    # prefix_cache_* from 0.9 (tokens). gpu_prefix_cache_* counted *blocks* in V1 0.7–0.8 and
    # tokens from 0.9 (deprecated then): see ``prefix_cache_unit``.
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    # histograms (base names)
    "ttft": ("vllm:time_to_first_token_seconds",),
    # renamed in 0.11
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
}
GAUGES = ("running", "waiting", "swapped", "kv_cache_usage", "prompt_throughput", "generation_throughput")
COUNTERS = ("prompt_tokens", "generation_tokens", "preemptions", "requests_finished", "prefix_cache_queries", "prefix_cache_hits")
HISTOGRAMS = ("ttft", "itl", "e2e", "queue")
SLEEP_STATE = "vllm:engine_sleep_state"  # from 0.12: one series per sleep_state, value 1 = current
CACHE_CONFIG = "vllm:cache_config_info"

# A series' identity after the pid reduction: (model_name, engine); None = label absent/unknown.
SeriesKey = tuple["str | None", "str | None"]


class MetricsParseError(ValueError):
    """The body is not Prometheus text or OpenMetrics (garbage, truncated, wrong endpoint)."""


@dataclass(frozen=True, slots=True)
class Histogram:
    """One histogram series of one scrape.

    Attributes:
        buckets: ``(le, cumulative count)`` sorted by ``le`` (``math.inf`` last when present),
            read from this scrape (vLLM's buckets differ between versions and can be user-set).
        count: ``_count``; ``None`` when the scrape has no ``_count`` sample (fragments).
        total: ``_sum`` in the histogram's unit (seconds for latencies); ``None`` when absent.
    """

    buckets: tuple[tuple[float, float], ...]
    count: float | None
    total: float | None


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """``vllm:cache_config_info`` labels of one engine (values are Python reprs; "None" → None).

    Attributes:
        block_size: tokens per KV block.
        num_gpu_blocks: KV blocks on the device (``None`` before profiling finished).
        kv_cache_size_tokens: token capacity of the KV cache (from 0.25; exact also for hybrid
            models, where blocks of several KV groups share memory).
        hybrid: True when the config shows more than one kind of KV state (Mamba/SSM state or a
            sliding window), which makes block-based estimates approximate; False when it shows
            none; ``None`` when the labels do not say.
        enable_prefix_caching: the flag; ``None`` when absent.
        gpu_memory_utilization: the configured share of device memory (ratio).
    """

    block_size: int | None = None
    num_gpu_blocks: int | None = None
    kv_cache_size_tokens: int | None = None
    hybrid: bool | None = None
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float | None = None


@dataclass(frozen=True, slots=True)
class EngineReading:
    """Canonical values of one ``(model_name, engine)`` series in one scrape; ``None`` = absent.

    ``gauges`` and ``counters`` are keyed by the canonical names in ``GAUGES`` and ``COUNTERS``
    (counters are cumulative values, not rates); ``histograms`` by ``HISTOGRAMS``.
    """

    model_name: str | None
    engine: str | None
    gauges: Mapping[str, float] = field(default_factory=dict)
    counters: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Histogram] = field(default_factory=dict)
    sleep_state: str | None = None


@dataclass(frozen=True, slots=True)
class MetricsReading:
    """Everything one ``/metrics`` scrape says, reduced to canonical fields.

    Attributes:
        has_vllm: the scrape had at least one ``vllm:`` family, with or without samples
            (``--disable-log-stats`` and some old builds have none: the server is then "ready with
            limited telemetry").
        engines: distinct ``engine`` label values, sorted.
        model_names: distinct ``model_name`` label values, sorted.
        series: per ``(model_name, engine)`` readings.
        cache: ``cache_config_info`` of the first engine that has one; ``None`` when absent.
        sources: canonical field → the metric name it was read from (for the alias audit).
        running / waiting: totals over series (sum); ``None`` when no series has the gauge.
        kv_cache_usage_ratio: max over series (the fullest engine decides when requests queue).
        kv_cache_usage_mean_ratio: mean over series.
        sleep_state: ``"awake"`` when every series reports awake, else the first other state
            (``"weights_offloaded"``, ``"discard_all"``, or ``"level_N"`` for unlabelled values);
            ``None`` before 0.12 (no such metric).
    """

    has_vllm: bool
    engines: tuple[str, ...]
    model_names: tuple[str, ...]
    series: Mapping[SeriesKey, EngineReading]
    cache: CacheConfig | None
    sources: Mapping[str, str]

    def gauge_total(self, name: str) -> float | None:
        """Sum of a canonical gauge over series; ``None`` when no series has it."""
        vals = [s.gauges[name] for s in self.series.values() if name in s.gauges]
        return float(sum(vals)) if vals else None

    def counter_total(self, name: str) -> float | None:
        """Sum of a canonical counter over series (cumulative); ``None`` when absent."""
        vals = [s.counters[name] for s in self.series.values() if name in s.counters]
        return float(sum(vals)) if vals else None

    @property
    def running(self) -> float | None:
        return self.gauge_total("running")

    @property
    def waiting(self) -> float | None:
        return self.gauge_total("waiting")

    @property
    def kv_cache_usage_ratio(self) -> float | None:
        vals = [s.gauges["kv_cache_usage"] for s in self.series.values() if "kv_cache_usage" in s.gauges]
        return max(vals) if vals else None

    @property
    def kv_cache_usage_mean_ratio(self) -> float | None:
        vals = [s.gauges["kv_cache_usage"] for s in self.series.values() if "kv_cache_usage" in s.gauges]
        return sum(vals) / len(vals) if vals else None

    @property
    def sleep_state(self) -> str | None:
        states = [s.sleep_state for s in self.series.values() if s.sleep_state is not None]
        if not states:
            return None
        return next((st for st in states if st != "awake"), "awake")

    def histogram_counts_by_model(self, name: str) -> dict[str, float]:
        """``_count`` of a canonical histogram summed per model name (series without a
        ``_count`` sample are left out)."""
        out: dict[str, float] = {}
        for s in self.series.values():
            h = s.histograms.get(name)
            if h is not None and h.count is not None and s.model_name is not None:
                out[s.model_name] = out.get(s.model_name, 0.0) + h.count
        return out


def _label(value: str | None) -> str | None:
    """A label value, with Python's ``"None"`` repr (and empty) read as unknown."""
    return None if value in (None, "", "None") else value


def _int(value: str | None) -> int | None:
    v = _label(value)
    if v is None:
        return None
    try:
        return int(float(v))
    except ValueError:
        return None


def _float(value: str | None) -> float | None:
    v = _label(value)
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _bool(value: str | None) -> bool | None:
    v = _label(value)
    return None if v is None else v.lower() == "true"


def _cache_config(labels: Mapping[str, str | None]) -> CacheConfig:
    hybrid_signs = [labels.get(k) for k in ("mamba_block_size", "mamba_page_size_padded", "sliding_window")]
    known = [k for k in ("mamba_block_size", "mamba_page_size_padded", "sliding_window") if k in labels]
    hybrid: bool | None = any(v is not None for v in hybrid_signs) if known else None
    return CacheConfig(
        block_size=_int(labels.get("block_size")),
        num_gpu_blocks=_int(labels.get("num_gpu_blocks")),
        kv_cache_size_tokens=_int(labels.get("kv_cache_size_tokens")),
        hybrid=hybrid,
        enable_prefix_caching=_bool(labels.get("enable_prefix_caching")),
        gpu_memory_utilization=_float(labels.get("gpu_memory_utilization")),
    )


def families(text: str, *, openmetrics: bool = False) -> Iterable[object]:
    """Parse with prometheus-client; raises ``MetricsParseError`` on malformed input."""
    parse = _openmetrics_families if openmetrics else _text_families
    try:
        return list(parse(text))
    except Exception as exc:  # noqa: BLE001 - the parser raises ValueError, KeyError, IndexError, TypeError...
        raise MetricsParseError(f"unparseable /metrics: {type(exc).__name__}: {str(exc)[:200]}") from None


def parse_metrics(text: str, *, openmetrics: bool = False) -> MetricsReading:
    """Read a ``/metrics`` body into canonical fields.

    Args:
        text: the body (Prometheus text format 0.0.4, or OpenMetrics 1.0 with ``openmetrics``).
        openmetrics: parse as OpenMetrics (the server answered ``application/openmetrics-text``).

    Returns:
        The reading; absent metrics are ``None``/missing keys, never 0.

    Raises:
        MetricsParseError: the body is not valid exposition text.
    """
    # name → reduced label set (frozenset without pid) → max value
    samples: dict[str, dict[frozenset[tuple[str, str | None]], float]] = {}
    engines: set[str] = set()
    models: set[str] = set()
    has_vllm = False
    for fam in families(text, openmetrics=openmetrics):
        if fam.name.startswith(PREFIX):  # type: ignore[attr-defined]
            has_vllm = True  # a family without samples (vllm PR 1890) still says "vLLM metrics on"
        for s in fam.samples:  # type: ignore[attr-defined]
            name: str = s.name
            if not name.startswith(PREFIX):
                continue
            if name.endswith("_created"):
                continue
            value = float(s.value)
            if math.isnan(value):
                continue
            labels = {k: _label(v) for k, v in s.labels.items() if k != "pid"}
            if labels.get("engine") is not None:
                engines.add(labels["engine"])  # type: ignore[arg-type]
            if labels.get("model_name") is not None:
                models.add(labels["model_name"])  # type: ignore[arg-type]
            key = frozenset(labels.items())
            by_labels = samples.setdefault(name, {})
            prev = by_labels.get(key)
            by_labels[key] = value if prev is None else max(prev, value)

    gauges: dict[SeriesKey, dict[str, float]] = {}
    counters: dict[SeriesKey, dict[str, float]] = {}
    hists: dict[SeriesKey, dict[str, Histogram]] = {}
    sleep: dict[SeriesKey, str] = {}
    sources: dict[str, str] = {}

    def series_of(labels: Mapping[str, str | None]) -> SeriesKey:
        return (labels.get("model_name"), labels.get("engine"))

    for canon in GAUGES + COUNTERS:
        target = gauges if canon in GAUGES else counters
        for metric in ALIASES[canon]:
            if metric not in samples:
                continue
            sources.setdefault(canon, metric)
            for key, value in samples[metric].items():
                sk = series_of(dict(key))
                per = target.setdefault(sk, {})
                if canon in GAUGES:
                    # several series per (model, engine) only for label splits we do not read
                    # (e.g. waiting_by_reason is another metric): keep the max.
                    per[canon] = max(per.get(canon, value), value)
                else:
                    per[canon] = per.get(canon, 0.0) + value  # e.g. request_success by finished_reason
            break  # first alias present wins for the whole scrape
    for canon in HISTOGRAMS:
        for base in ALIASES[canon]:
            if f"{base}_bucket" not in samples and f"{base}_count" not in samples:
                continue
            sources[canon] = base
            buckets: dict[SeriesKey, dict[float, float]] = {}
            for key, value in samples.get(f"{base}_bucket", {}).items():
                labels = dict(key)
                le = _float(labels.pop("le", None))
                if le is None:
                    continue
                per_le = buckets.setdefault(series_of(labels), {})
                per_le[le] = per_le.get(le, 0.0) + value
            counts = {series_of(dict(k)): v for k, v in samples.get(f"{base}_count", {}).items()}
            sums = {series_of(dict(k)): v for k, v in samples.get(f"{base}_sum", {}).items()}
            for sk in set(buckets) | set(counts):
                hists.setdefault(sk, {})[canon] = Histogram(
                    buckets=tuple(sorted(buckets.get(sk, {}).items())), count=counts.get(sk), total=sums.get(sk)
                )
            break
    for key, value in samples.get(SLEEP_STATE, {}).items():
        labels = dict(key)
        sk = series_of(labels)
        if "sleep_state" in labels:
            if value >= 1.0 and labels["sleep_state"] is not None:
                sleep[sk] = labels["sleep_state"]  # type: ignore[assignment]
        else:  # an unlabelled gauge: 0 awake, N = sleep level N
            sleep[sk] = "awake" if value == 0 else f"level_{int(value)}"
    cache: CacheConfig | None = None
    for key in sorted(samples.get(CACHE_CONFIG, {}), key=lambda k: str(dict(k).get("engine"))):
        cache = _cache_config(dict(key))
        break

    keys = set(gauges) | set(counters) | set(hists) | set(sleep)
    series = {
        sk: EngineReading(
            model_name=sk[0], engine=sk[1], gauges=gauges.get(sk, {}), counters=counters.get(sk, {}),
            histograms=hists.get(sk, {}), sleep_state=sleep.get(sk),
        )
        for sk in keys
    }
    return MetricsReading(
        has_vllm=has_vllm,
        engines=tuple(sorted(engines)),
        model_names=tuple(sorted(models)),
        series=series,
        cache=cache,
        sources=sources,
    )


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"0.10.1.dev3+g1234"`` → ``(0, 10, 1)``; ``None`` when unreadable."""
    if not text:
        return None
    parts: list[int] = []
    for piece in text.strip().lstrip("v").split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts) if parts else None


def prefix_cache_unit(reading: MetricsReading, version: tuple[int, ...] | None) -> str | None:
    """What the prefix-cache counters of this scrape count: ``"tokens"``, ``"blocks"`` or
    ``None`` (unknown).

    ``vllm:prefix_cache_*`` (from 0.9) count tokens. The older ``vllm:gpu_prefix_cache_*`` counted
    **blocks** in V1 0.7–0.8 and tokens from 0.9, so they need the server's ``/version``.
    """
    src = reading.sources.get("prefix_cache_queries")
    if src is None:
        return None
    if src == "vllm:prefix_cache_queries_total":
        return "tokens"
    if version is None:
        return None
    return "tokens" if version >= (0, 9) else "blocks"
