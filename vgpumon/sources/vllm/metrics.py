"""Read one vLLM ``/metrics`` scrape into canonical fields, whatever the vLLM version (0.2 → 0.33).

Sample lines are parsed by prometheus-client (``prometheus_client.parser``); this module only maps
names. It works on *samples*, not families, because a fragment without ``# TYPE`` lines comes back
as one untyped family per line (vllm PR 11117's capture), and it reads the body line by line:

* **Streaming, bounded memory.** The body (bytes, up to the response limit) is never decoded or
  parsed as a whole: each line is decoded and parsed on its own and only ``vllm:`` samples are
  kept (reduced at once, see below). Parsing the whole text into families first cost 14 times the
  body (107 MiB for a 7.9 MB body of 246 LoRA adapters' series); docs/benchmarks.md has the
  figure now.
* **Partial telemetry.** A line that is not UTF-8, or that the parser refuses, is dropped and
  counted (``MetricsReading.lines_dropped``); the rest is read. Only a body of which no line can
  be read is unparseable.
* ``# TYPE`` lines are read for two things only: a ``vllm:`` family declared without samples
  still means "vLLM metrics on", and a counter declared without ``_total`` has its samples named
  with ``_total`` (what prometheus-client does for a whole text; aioprometheus builds, vllm PR
  1890). The sample syntax of OpenMetrics is the text format's, so both are read alike.

Rules (FACTS §5):

* Only ``vllm:`` samples are read, and LMCache's ``lmcache:`` ones (``vgpumon.sources.vllm.lmcache``);
  ``*_created`` samples (their own gauge families in prometheus-client ≥ 0.20 output, e.g.
  production-stack issue 617) are skipped.
* A label whose value is the Python repr ``"None"`` is unknown, not a string (vllm issue 28924).
* Series split by API-server ``pid`` (``--api-server-count`` > 1, vllm PR 28792) are reduced with
  **max** per remaining label set — never summed, never "last one wins".
* A series is identified by ``(model_name, engine)``; ``engine`` exists from 0.8 (one per
  data-parallel engine), ``model_name`` is the served name (a LoRA adapter is its own name).
* Renamed metrics are read through ``ALIASES`` (new name first). The ambiguous prefix-cache
  counters are interpreted with the server's version (``/version``).
* **Ray Serve** re-exports vLLM's metrics as ``ray_vllm_<name>`` (``vllm:`` → ``ray_vllm_``) with
  Ray's labels: they are read as the ``vllm:`` ones. ``ReplicaId`` tells the replicas apart and
  becomes part of the engine (``<ReplicaId>/<engine>``), so totals add replicas up and the KV
  maximum is the fullest replica's; Ray's other labels (``WorkerId``, ``Component``,
  ``NodeAddress``, ``SessionName``, ``Version``) are reduced with max, like ``pid``.
* A family whose ``# HELP`` says it is deprecated (or one of ``DEPRECATED_FAMILIES``, whose HELP
  does not) is read as usual, and named in ``MetricsReading.deprecated`` (logged once per process
  and metric): vLLM hides a deprecated metric one minor release later and removes it the next
  (FACTS §5).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vgpumon.sources.vllm.lmcache import PREFIX as LMCACHE_PREFIX
from vgpumon.sources.vllm.lmcache import LMCacheAccumulator, LMCacheReading

if TYPE_CHECKING:
    from prometheus_client.samples import Sample

log = logging.getLogger(__name__)

PREFIX = "vllm:"
#: Ray Serve's re-export of vLLM's metrics (``ray_vllm_num_requests_running``); FACTS §5.
RAY_PREFIX = "ray_vllm_"
#: Ray's own labels on its re-export, reduced with max like ``pid`` (one process's view each).
RAY_LABELS = frozenset({"WorkerId", "Component", "NodeAddress", "SessionName", "Version"})
REPLICA = "ReplicaId"


def canonical_name(name: str) -> str:
    """``ray_vllm_num_requests_running`` → ``vllm:num_requests_running``; others unchanged."""
    return PREFIX + name[len(RAY_PREFIX):] if name.startswith(RAY_PREFIX) else name

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
    # KV offload (OffloadingConnector): flat per-direction counters in 0.33; the deprecated
    # kv_offload_total_bytes splits the directions by transfer_type (docs/vllm.md).
    "kv_offload_load_bytes": ("vllm:kv_offload_load_bytes_total", "vllm:kv_offload_total_bytes_total{CPU_to_GPU}"),
    "kv_offload_store_bytes": ("vllm:kv_offload_store_bytes_total", "vllm:kv_offload_total_bytes_total{GPU_to_CPU}"),
    # speculative decoding (V1): draft tokens proposed and accepted
    "spec_decode_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_decode_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
    # histograms (base names)
    "ttft": ("vllm:time_to_first_token_seconds",),
    # renamed in 0.11
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
}
GAUGES = ("running", "waiting", "swapped", "kv_cache_usage", "prompt_throughput", "generation_throughput")
COUNTERS = ("prompt_tokens", "generation_tokens", "preemptions", "requests_finished", "prefix_cache_queries", "prefix_cache_hits",
            "kv_offload_load_bytes", "kv_offload_store_bytes", "spec_decode_draft_tokens", "spec_decode_accepted_tokens")
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
        lines_dropped: lines of the body that could not be read (not UTF-8, or refused by the
            parser) and were left out: more than 0 makes the telemetry partial.
        rejected: metric name → why its value was refused (NaN, ±Inf): left out, like an
            absent metric, and counted by the source.
        replicas: Ray Serve's ``ReplicaId`` values when the exposition is Ray's re-export
            (``ray_vllm_*``), sorted; empty for a vLLM server's own ``/metrics``.
        deprecated: the ``vllm:`` families whose ``# HELP`` says deprecated, sorted.
        lmcache: LMCache's families in the same exposition (``vgpumon.sources.vllm.lmcache``);
            ``None`` when the server runs no LMCache connector.
    """

    has_vllm: bool
    engines: tuple[str, ...]
    model_names: tuple[str, ...]
    series: Mapping[SeriesKey, EngineReading]
    cache: CacheConfig | None
    sources: Mapping[str, str]
    lines_dropped: int = 0
    rejected: Mapping[str, str] = field(default_factory=dict)
    replicas: tuple[str, ...] = ()
    deprecated: tuple[str, ...] = ()
    lmcache: LMCacheReading | None = None

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
    f = _float(value)
    return None if f is None else int(f)


def _float(value: str | None) -> float | None:
    """A label's number, finite ("inf", "nan", "1e400" are no value: not a size or a ratio)."""
    v = _label(value)
    if v is None:
        return None
    try:
        f = float(v)
    except ValueError:
        return None
    return f if math.isfinite(f) else None


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


class _Lines:
    """The sample lines of a body, decoded one by one (``str`` bodies are taken as they are).

    Comment lines are not handed on: ``# TYPE``/``# HELP`` of a ``vllm:`` family set ``has_vllm``
    and counters declared without ``_total`` are noted (``counters``). A line that is not UTF-8
    is counted in ``dropped``; so is the line the parser refuses (``refused``: the last line
    handed on). ``given`` counts the lines handed on and read.
    """

    def __init__(self, body: bytes | bytearray | str) -> None:
        self.body = body
        self.dropped = 0
        self.given = 0
        self.has_vllm = False
        self.counters: set[str] = set()
        self.deprecated: set[str] = set()

    def _raw(self) -> Iterator[str | bytes | bytearray]:
        buf, start, n = self.body, 0, len(self.body)
        newline = "\n" if isinstance(buf, str) else b"\n"
        while start < n:  # slices of one line at a time: no second copy of the whole body
            end = buf.find(newline, start)  # type: ignore[arg-type]
            if end < 0:
                end = n
            yield buf[start:end]
            start = end + 1

    def __iter__(self) -> Iterator[str]:
        for raw in self._raw():
            if isinstance(raw, str):
                line = raw.strip()
            else:
                try:
                    line = bytes(raw).decode("utf-8").strip()
                except UnicodeDecodeError:
                    self.dropped += 1
                    continue
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("TYPE", "HELP") and canonical_name(parts[2]).startswith(PREFIX):
                    self.has_vllm = True  # a family without samples (vllm PR 1890) still says "on"
                    if parts[1] == "TYPE" and len(parts) == 4 and parts[3].strip() == "counter" and not parts[2].endswith("_total"):
                        self.counters.add(parts[2])
                    elif parts[1] == "HELP" and len(parts) == 4 and "deprecated" in parts[3].lower():
                        self.deprecated.add(canonical_name(parts[2]).removesuffix("_created").removesuffix("_total"))
                continue
            self.given += 1
            yield line

    def refused(self) -> None:
        self.dropped += 1
        self.given -= 1  # handed on, but not read


def _samples(lines: _Lines) -> Iterator[Sample]:
    """Every sample of the body, parsed line by line by prometheus-client: comment lines are
    withheld, so each sample comes back at once as its own family and nothing accumulates. After
    a line the parser refuses, parsing resumes with the next line."""
    # imported on the first scrape: a host without a vLLM server never loads it
    from prometheus_client.parser import text_fd_to_metric_families

    feed = iter(lines)
    while True:
        try:
            for fam in text_fd_to_metric_families(feed):  # type: ignore[arg-type]
                yield from fam.samples
            return
        except Exception:  # noqa: BLE001 - the parser raises ValueError, KeyError, IndexError, TypeError...
            lines.refused()


def parse_metrics(body: bytes | bytearray | str, *, openmetrics: bool = False) -> MetricsReading:
    """Read a ``/metrics`` body into canonical fields.

    Args:
        body: the body as received (bytes; a ``str`` is read as already decoded), Prometheus
            text format 0.0.4 or OpenMetrics 1.0 (same sample syntax).
        openmetrics: the server answered ``application/openmetrics-text`` (read alike).

    Returns:
        The reading; absent metrics are ``None``/missing keys, never 0. Lines that could not
        be read are left out and counted (``lines_dropped``).

    Raises:
        MetricsParseError: not a single line of the body could be read (garbage, HTML, ...).
    """
    del openmetrics  # one sample syntax for both formats (module docstring)
    # name → reduced label set (sorted (label, value) pairs, pid left out) → max value. Pairs are
    # shared (one tuple per distinct pair) and keys are tuples, not frozensets: what a reading
    # keeps of a large body is most of what reading it costs (docs/benchmarks.md).
    samples: dict[str, dict[tuple[tuple[str, str | None], ...], float]] = {}
    pairs: dict[tuple[str, str | None], tuple[str, str | None]] = {}
    engines: set[str] = set()
    models: set[str] = set()
    rejected: dict[str, str] = {}
    lines = _Lines(body)
    replicas: set[str] = set()
    lmcache = LMCacheAccumulator()
    for s in _samples(lines):
        name: str = s.name
        if name in lines.counters:
            name += "_total"
        name = canonical_name(name)
        lmc = name.startswith(LMCACHE_PREFIX)
        if not (lmc or name.startswith(PREFIX)) or name.endswith("_created"):
            continue
        try:
            value = float(s.value)
        except OverflowError:  # an integer token of hundreds of digits (the parser keeps ints)
            rejected[name] = "rejected: a number too large for a float"
            continue
        if not math.isfinite(value):
            # NaN or ±Inf never reach a field (a kv_cache_usage_perc of +Inf once stopped every
            # vLLM write); the sample is left out and named, so the refusal is counted.
            rejected[name] = f"rejected: {'NaN' if math.isnan(value) else f'infinite: {value!r}'}"
            continue
        if lmc:  # LMCache's own label sets: pid splits summed, not reduced with max
            lmcache.add(name, s.labels, value)
            continue
        labels = {k: _label(v) for k, v in s.labels.items() if k != "pid" and k not in RAY_LABELS}
        replica = labels.pop(REPLICA, None)
        if replica is not None:  # Ray Serve: each replica's engines are engines of their own
            replicas.add(replica)
            labels["engine"] = f"{replica}/{labels.get('engine') or '0'}"
        if labels.get("engine") is not None:
            engines.add(labels["engine"])  # type: ignore[arg-type]
        if labels.get("model_name") is not None:
            models.add(labels["model_name"])  # type: ignore[arg-type]
        key = tuple(pairs.setdefault(kv, kv) for kv in sorted(labels.items()))
        by_labels = samples.setdefault(name, {})
        prev = by_labels.get(key)
        by_labels[key] = value if prev is None else max(prev, value)
    if lines.dropped and not lines.given:
        raise MetricsParseError(f"unparseable /metrics: none of its {lines.dropped} lines could be read")
    has_vllm = lines.has_vllm or bool(samples)

    gauges: dict[SeriesKey, dict[str, float]] = {}
    counters: dict[SeriesKey, dict[str, float]] = {}
    hists: dict[SeriesKey, dict[str, Histogram]] = {}
    sleep: dict[SeriesKey, str] = {}
    sources: dict[str, str] = {}

    def series_of(labels: Mapping[str, str | None]) -> SeriesKey:
        return (labels.get("model_name"), labels.get("engine"))

    for canon in GAUGES + COUNTERS:
        target = gauges if canon in GAUGES else counters
        for alias in ALIASES[canon]:
            # "name{value}": only the samples whose transfer_type is value
            metric, _, wanted = alias.partition("{")
            chosen = {k: v for k, v in samples.get(metric, {}).items()
                      if not wanted or dict(k).get("transfer_type") == wanted[:-1]}
            if not chosen:
                continue
            sources.setdefault(canon, metric)
            for key, value in chosen.items():
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
                sleep[sk] = labels["sleep_state"]
        else:  # an unlabelled gauge: 0 awake, N = sleep level N
            sleep[sk] = "awake" if value == 0 else f"level_{int(value)}" if math.isfinite(value) else "unknown"
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
        lines_dropped=lines.dropped,
        rejected=rejected,
        replicas=tuple(sorted(replicas)),
        deprecated=_said_deprecated(lines.deprecated | {m.removesuffix("_total") for m in samples if m in DEPRECATED_FAMILIES}),
        lmcache=lmcache.reading(),
    )


#: Families vLLM has deprecated whose ``# HELP`` does not say so: read as usual (the alias table
#: falls back to them), named deprecated and logged once all the same. 0.33 replaced
#: ``kv_offload_total_bytes{transfer_type}`` with the flat ``kv_offload_load_bytes`` /
#: ``kv_offload_store_bytes`` (tests/data/vllm-0.33-kv-offload/PROVENANCE.md).
DEPRECATED_FAMILIES = frozenset({"vllm:kv_offload_total_bytes_total"})
_DEPRECATED_SAID: set[str] = set()


def _said_deprecated(names: set[str]) -> tuple[str, ...]:
    """The deprecated families, sorted; each logged the first time this process sees it."""
    for name in sorted(names - _DEPRECATED_SAID):
        _DEPRECATED_SAID.add(name)
        log.info("vLLM serves %s, which vLLM marks deprecated (its HELP, or docs/vllm.md): read as usual until vLLM "
                 "removes it (deprecated in X.Y, hidden in X.Y+1, removed in X.Y+2)", name)
    return tuple(sorted(names))


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
