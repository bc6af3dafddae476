"""vLLM fields: per server and poll (``vllm_samples``), per data-parallel engine
(``vllm_engine_samples``) and per server start (``vllm_instances``). Metric names and the versions
that carry them: FACTS §5 and ``vgpumon.sources.vllm.metrics.ALIASES``."""

from __future__ import annotations

from vgpumon.catalogue.core import (
    BOOL,
    BYTES_PER_SECOND,
    INT16,
    INT32,
    INT64,
    JOULES,
    MILLI,
    PER_SECOND,
    RATIO,
    SECONDS_US,
    Encoding,
    Field,
    text,
)
from vgpumon.model.vllm import ServerState

#: ``ServerState`` code → name (the stored SmallInteger of ``state`` and ``final_state``).
SERVER_STATES: dict[int, str] = {s.code: s.value for s in ServerState}
#: Unit of the prefix-cache counters a hit ratio was computed from (stored code).
PREFIX_CACHE_UNITS: dict[str, int] = {"tokens": 1, "blocks": 2}
#: How much of ``/metrics`` could be read (stored code): all of it, no ``vllm:`` families
#: (``--disable-log-stats``), some lines unreadable, nothing.
TELEMETRY_CODES: dict[str, int] = {"full": 1, "limited": 2, "partial": 3, "down": 4}

#: The labels that key one engine's series and its ``vllm_engine_samples`` row, with the longest
#: value each may have (the store's key column): text from outside, checked at the door like any
#: text field (``Door.text``), so that SQLite and Postgres hold the same rows. A served model
#: name (``/v1/models`` ``id``) is held to the ``model_name`` length too.
ENGINE_KEY_LENGTHS: dict[str, int] = {"model_name": 255, "engine": 32}
#: The ``(model_name, engine)`` series of one server kept per scrape (and so its rows per poll
#: and its ``/metrics`` series), and the ``engine`` and ``model_name`` label values: a real
#: server has one per data-parallel engine and served model, a few dozen at most. Any local
#: user's process that listens where its argv says is scraped, and one serving 20 000 series
#: made 20 000 engine rows every poll (docs/security.md, "Attacker trial").
ENGINE_SERIES_LIMIT = 256

_REQUESTS_MAX = 1e6  # queued or running requests of one server: far above any batch
_RATE_MAX = 1e9  # tokens or requests per second of one server
_OFFLOAD_MAX = 1e13  # bytes per second of KV offload: ten times the fastest host link of 2026
_LATENCY_MAX = 7 * 86400.0  # a latency quantile of a week is already a broken histogram
_BLOCKS_MAX = float(2**40)
_TOKENS_MAX = float(2**48)


def _poll(name: str, kind: str, unit: str, help: str, source: str, encoding: Encoding, **kw: object) -> Field:
    return Field(name=name, table="vllm_samples", kind=kind, unit=unit, help=help, source=source, cadence="poll",
                 encoding=encoding, **kw)  # type: ignore[arg-type]


_HISTOGRAMS = {
    "ttft": ("time to first token", "vllm:time_to_first_token_seconds", "vgpumon_vllm_time_to_first_token_seconds", "TTFT"),
    "itl": (
        "inter-token latency", "vllm:inter_token_latency_seconds (0.11+), vllm:time_per_output_token_seconds before",
        "vgpumon_vllm_inter_token_latency_seconds", "ITL",
    ),
    "e2e": ("end-to-end request latency", "vllm:e2e_request_latency_seconds", "vgpumon_vllm_e2e_request_latency_seconds",
            "E2E latency"),
    "queue": ("time in the queue", "vllm:request_queue_time_seconds", "vgpumon_vllm_request_queue_time_seconds",
              "queue time"),
}


def _quantiles() -> tuple[Field, ...]:
    # One gauge family per histogram, told apart by a ``percentile`` label ("50", "95", "99"),
    # not ``quantile``: Prometheus reserves ``quantile`` for summaries, and ``promtool check
    # metrics`` (2.42) refuses it on a gauge ("non-summary metrics should not have "quantile"
    # label"). These are interval estimates, not a summary's cumulative quantiles.
    out = []
    for key, (what, metric, prom, short) in _HISTOGRAMS.items():
        for q in (50, 95, 99):
            out.append(
                _poll(
                    f"{key}_p{q}_seconds", "gauge", "seconds",
                    f"{q}th percentile of the {what} over the poll interval.",
                    f"{metric} histogram: interpolated in the interval's bucket increments (le read each scrape)",
                    SECONDS_US, lo=0, hi=_LATENCY_MAX, prometheus=prom, prom_labels={"percentile": str(q)},
                    label=f"{short} p{q}",
                )
            )
    return tuple(out)


def _slo() -> tuple[Field, ...]:
    # SLO attainment over the window (vgpumon.sources.vllm.slo; docs/vllm.md, "SLO attainment")
    out = []
    for key, what, target in (("ttft", "requests whose time to first token", "vllm_slo_ttft_seconds"),
                              ("itl", "inter-token intervals whose latency", "vllm_slo_itl_seconds")):
        metric, short = _HISTOGRAMS[key][1], _HISTOGRAMS[key][3]
        out += [
            _poll(
                f"{key}_slo_attainment_ratio", "gauge", "ratio",
                f"Share of the {what} stayed within its target ({target}) over the SLO window; none without observations.",
                f"{metric} bucket increments over vllm_slo_window_seconds, intervals flagged unreliable left out; "
                "a target between bucket bounds interpolated in its bucket", RATIO, lo=0, hi=1,
                prometheus=f"vgpumon_vllm_{key}_slo_attainment_ratio", label=f"{short} SLO attainment",
            ),
            _poll(
                f"{key}_slo_observations", "gauge", "count",
                f"Observations of the {_HISTOGRAMS[key][0]} histogram the SLO attainment was computed from (its window).",
                f"{metric}_count increments over vllm_slo_window_seconds", MILLI, lo=0, hi=_TOKENS_MAX,
                prometheus=f"vgpumon_vllm_{key}_slo_observations", display="number", label=f"{short} SLO observations",
            ),
            _poll(
                f"{key}_slo_interpolated", "flag", "bool",
                f"1 when the {short} target lies between bucket bounds and the attainment is interpolated in its bucket.",
                f"{metric} bucket bounds (le)", BOOL, lo=0, hi=1,
                prometheus=f"vgpumon_vllm_{key}_slo_interpolated", label=f"{short} SLO interpolated",
            ),
        ]
    return tuple(out)


def _lmcache() -> tuple[Field, ...]:
    # LMCache's families in the same /metrics (vgpumon.sources.vllm.lmcache: pid splits summed,
    # rates the largest tensor-parallel rank's, ratios over every rank's sums; docs/vllm.md)
    rate = "the largest worker_id's (tensor-parallel ranks each count the same requests), pid splits summed"
    out = [
        _poll(
            f"lmcache_{what}_per_second", "gauge", "per_second", f"LMCache: {help_} per second over the interval.",
            f"increase of lmcache:num_{what}_total; {rate}", PER_SECOND, lo=0, hi=_RATE_MAX,
            prometheus=f"vgpumon_vllm_lmcache_{what}_per_second", label=f"LMCache {short}/s",
        )
        for what, help_, short in (
            ("retrieve_requests", "retrieve requests (KV looked for in LMCache to load into the GPU)", "retrieves"),
            ("store_requests", "store requests (KV handed from the GPU to LMCache)", "stores"),
            ("hit_tokens", "tokens whose KV was retrieved from LMCache (prefill not recomputed)", "hit tokens"),
            ("stored_tokens", "tokens whose KV was stored in LMCache", "stored tokens"),
        )
    ]
    out += [
        _poll(
            "lmcache_retrieve_hit_ratio", "gauge", "ratio",
            "LMCache: tokens retrieved over tokens requested by retrieves in the interval (none without a retrieve).",
            "increase of lmcache:num_hit_tokens_total over lmcache:num_requested_tokens_total, summed over every label set",
            RATIO, lo=0, hi=1, prometheus="vgpumon_vllm_lmcache_retrieve_hit_ratio", label="LMCache hit ratio",
        ),
        _poll(
            "lmcache_lookup_hit_ratio", "gauge", "ratio",
            "LMCache: prompt tokens its lookups found cached over tokens looked up in the interval (the scheduler's view).",
            "increase of lmcache:num_lookup_hits_total over lmcache:num_lookup_tokens_total, summed over every label set",
            RATIO, lo=0, hi=1, prometheus="vgpumon_vllm_lmcache_lookup_hit_ratio", label="LMCache lookup hit ratio",
        ),
        _poll(
            "lmcache_local_cache_usage_bytes", "gauge", "bytes",
            "LMCache: bytes its local cache (CPU memory) holds, summed over ranks and processes.",
            "lmcache:local_cache_usage, summed over every label set (pid included)", INT64, lo=0, hi=float(2**50),
            prometheus="vgpumon_vllm_lmcache_local_cache_usage_bytes", label="LMCache local cache",
        ),
    ]
    for what in ("retrieve", "store"):
        out.append(
            _poll(
                f"lmcache_{what}_mean_seconds", "gauge", "seconds",
                f"LMCache: mean time of one {what} over the interval's {what}s (none without one).",
                f"increase of lmcache:time_to_{what}_sum over lmcache:time_to_{what}_count, summed over every label set",
                SECONDS_US, lo=0, hi=_LATENCY_MAX, prometheus=f"vgpumon_vllm_lmcache_{what}_mean_seconds",
                label=f"LMCache {what} time (mean)",
            )
        )
    return tuple(out)


SAMPLES: tuple[Field, ...] = (
    _poll(
        "state", "enum", "code", "Server state: starting, ready, busy, idle, hung, sleeping, telemetry_down, dead, "
        "failed_to_start.", "/health, /metrics and the process table (docs/vllm.md)", INT16, lo=1,
        hi=max(SERVER_STATES), decode=SERVER_STATES, prometheus="vgpumon_vllm_server_state", display="decoded",
        label="state", note="exported as one 0/1 series per state (label state)", required=True,
    ),
    _poll(
        "health_status", "enum", "code", "HTTP status of /health (200 ready; 500/503 engine dead).", "GET /health",
        INT16, lo=100, hi=599, prometheus="vgpumon_vllm_health_status_code", display="code", label="/health status",
        note="None when the request failed (refused, timeout)",
    ),
    _poll(
        "telemetry_up", "flag", "bool", "1 when /metrics answered with readable vllm: families.", "GET /metrics",
        BOOL, lo=0, hi=1, prometheus="vgpumon_vllm_telemetry_up", label="telemetry",
    ),
    _poll(
        "running", "gauge", "count", "Requests running (summed over engines).", "vllm:num_requests_running", MILLI,
        lo=0, hi=_REQUESTS_MAX, prometheus="vgpumon_vllm_requests_running", display="number", label="running",
    ),
    _poll(
        "waiting", "gauge", "count", "Requests waiting (summed over engines; deferred ones too from 0.20).",
        "vllm:num_requests_waiting", MILLI, lo=0, hi=_REQUESTS_MAX, prometheus="vgpumon_vllm_requests_waiting",
        display="number", label="waiting",
    ),
    _poll(
        "kv_cache_usage_ratio", "gauge", "ratio", "KV-cache blocks in use (max over engines).",
        "vllm:kv_cache_usage_perc (0.9+; a ratio despite its name), vllm:gpu_cache_usage_perc before (removed 0.12)",
        RATIO, lo=0, hi=1, prometheus="vgpumon_vllm_kv_cache_usage_ratio", label="KV usage",
    ),
    _poll(
        "kv_cache_usage_mean_ratio", "gauge", "ratio", "KV-cache blocks in use (mean over engines).",
        "vllm:kv_cache_usage_perc / vllm:gpu_cache_usage_perc", RATIO, lo=0, hi=1,
        prometheus="vgpumon_vllm_kv_cache_usage_mean_ratio", label="KV usage (mean)",
    ),
    _poll(
        "prompt_tokens_per_second", "gauge", "per_second", "Prompt tokens processed per second over the interval.",
        "increase of vllm:prompt_tokens_total; vllm:avg_prompt_throughput_toks_per_s before 0.7", PER_SECOND, lo=0,
        hi=_RATE_MAX, prometheus="vgpumon_vllm_prompt_tokens_per_second", label="prompt tokens/s",
    ),
    _poll(
        "generation_tokens_per_second", "gauge", "per_second", "Tokens generated per second over the interval.",
        "increase of vllm:generation_tokens_total; vllm:avg_generation_throughput_toks_per_s before 0.7", PER_SECOND,
        lo=0, hi=_RATE_MAX, prometheus="vgpumon_vllm_generation_tokens_per_second", label="generated tokens/s",
    ),
    _poll(
        "energy_per_token_joules", "gauge", "joules",
        "Energy the server's GPUs used per generated token, over the newest interval between two energy reads "
        "(a GPU shared with other processes is split by the memory they hold).",
        "Δ nvmlDeviceGetTotalEnergyConsumption of the server's GPUs (the minute set) / Δ vllm:generation_tokens_total "
        "over the same interval (docs/vllm.md, \"Energy per token\")", Encoding("fixed", 1_000_000), lo=0, hi=1e6,
        prometheus="vgpumon_vllm_energy_per_generated_token_joules", label="energy per token",
    ),
    _poll(
        "energy_interval_joules", "gauge", "joules",
        "Energy charged to the server over the newest interval between two energy reads of its GPUs (a GPU shared "
        "with other processes split by the memory they hold), tokens generated or not.",
        "Δ nvmlDeviceGetTotalEnergyConsumption of the server's GPUs (the minute set; docs/vllm.md, \"Energy per token\")",
        JOULES, lo=0, hi=1e9, prometheus="vgpumon_vllm_energy_interval_joules", label="energy over the interval",
    ),
    _poll(
        "energy_per_token_note", "state", "text",
        "Why there is no energy-per-token figure (no tokens generated, a counter reset), or how shared GPUs were split.",
        "the energy meter (docs/vllm.md)", text(255), label="energy per token note",
    ),
    _poll(
        "preemptions_per_second", "gauge", "per_second", "Preemptions per second over the interval.",
        "increase of vllm:num_preemptions_total", PER_SECOND, lo=0, hi=_RATE_MAX,
        prometheus="vgpumon_vllm_preemptions_per_second", label="preemptions/s",
    ),
    _poll(
        "requests_finished_per_second", "gauge", "per_second", "Requests finished per second over the interval.",
        "increase of vllm:request_success_total (all finished_reason)", PER_SECOND, lo=0, hi=_RATE_MAX,
        prometheus="vgpumon_vllm_requests_finished_per_second", label="finished/s",
    ),
    _poll(
        "prefix_cache_hit_ratio", "gauge", "ratio", "Prefix-cache hits over queries in the interval.",
        "vllm:prefix_cache_{hits,queries}_total (0.9+, tokens); vllm:gpu_prefix_cache_* (blocks in V1 0.7–0.8)",
        RATIO, lo=0, hi=1, prometheus="vgpumon_vllm_prefix_cache_hit_ratio", label="prefix-cache hits",
    ),
    _poll(
        "prefix_cache_unit", "enum", "code", "What the prefix-cache counters counted: tokens or blocks.",
        "the server's version (/version) and the counter names", INT16, lo=1, hi=2,
        decode={v: k for k, v in PREFIX_CACHE_UNITS.items()}, display="decoded", label="prefix-cache unit",
    ),
    _poll(
        "kv_offload_load_bytes_per_second", "gauge", "bytes_per_second",
        "KV-cache bytes per second loaded from the offload medium (CPU memory) into the GPU over the interval: "
        "host-to-device PCIe traffic of KV offload.",
        "increase of vllm:kv_offload_load_bytes_total (0.33); deprecated vllm:kv_offload_total_bytes_total{transfer_type=\"CPU_to_GPU\"}",
        BYTES_PER_SECOND, lo=0, hi=_OFFLOAD_MAX,
        prometheus="vgpumon_vllm_kv_offload_load_bytes_per_second", label="KV offload load (H2D)",
    ),
    _poll(
        "kv_offload_store_bytes_per_second", "gauge", "bytes_per_second",
        "KV-cache bytes per second stored from the GPU to the offload medium (CPU memory) over the interval: "
        "device-to-host PCIe traffic of KV offload.",
        "increase of vllm:kv_offload_store_bytes_total (0.33); deprecated vllm:kv_offload_total_bytes_total{transfer_type=\"GPU_to_CPU\"}",
        BYTES_PER_SECOND, lo=0, hi=_OFFLOAD_MAX,
        prometheus="vgpumon_vllm_kv_offload_store_bytes_per_second", label="KV offload store (D2H)",
    ),
    _poll(
        "spec_decode_acceptance_ratio", "gauge", "ratio",
        "Speculative decoding: draft tokens accepted over draft tokens proposed in the interval.",
        "increase of vllm:spec_decode_num_accepted_tokens_total over vllm:spec_decode_num_draft_tokens_total",
        RATIO, lo=0, hi=1, prometheus="vgpumon_vllm_spec_decode_acceptance_ratio", label="spec-decode acceptance",
    ),
    *_lmcache(),
    *_quantiles(),
    *_slo(),
    _poll(
        "kv_block_size", "gauge", "tokens", "Tokens per KV-cache block.", "vllm:cache_config_info{block_size}", INT32,
        lo=1, hi=2**16, prometheus="vgpumon_vllm_kv_cache_block_size_tokens", display="number", label="block size",
    ),
    _poll(
        "kv_num_gpu_blocks", "gauge", "count", "KV-cache blocks on the GPU.", "vllm:cache_config_info{num_gpu_blocks}",
        INT64, lo=0, hi=_BLOCKS_MAX, prometheus="vgpumon_vllm_kv_cache_blocks", display="number", label="KV blocks",
    ),
    _poll(
        "kv_cache_size_tokens", "gauge", "tokens", "KV-cache capacity in tokens.",
        "vllm:cache_config_info{kv_cache_size_tokens} (0.25+)", INT64, lo=0, hi=_TOKENS_MAX,
        prometheus="vgpumon_vllm_kv_cache_size_tokens", display="number", label="KV capacity (tokens)",
    ),
    _poll(
        "kv_blocks_used", "gauge", "count", "KV-cache blocks in use: usage × (blocks − 1).",
        "vllm:kv_cache_usage_perc × (num_gpu_blocks − 1)", MILLI, lo=0, hi=_BLOCKS_MAX,
        prometheus="vgpumon_vllm_kv_cache_blocks_used", display="number", label="KV blocks used",
    ),
    _poll(
        "kv_fragmentation_ratio", "gauge", "ratio", "Estimated share of used KV slots that hold no token.",
        "R·(B−1)/2 ÷ (U·B) from running requests, block size and usage (docs/vllm.md)", RATIO, lo=0, hi=1,
        prometheus="vgpumon_vllm_kv_cache_fragmentation_ratio", label="KV fragmentation (est.)",
    ),
    _poll(
        "kv_token_occupancy_ratio", "gauge", "ratio", "Estimated tokens held over token capacity.",
        "(U·B − waste) ÷ (N·B)", RATIO, lo=0, hi=1, prometheus="vgpumon_vllm_kv_cache_token_occupancy_ratio",
        label="KV token occupancy (est.)",
    ),
    _poll(
        "kv_estimate_approximate", "flag", "bool", "1 when the KV estimate is rough (hybrid model, config missing).",
        "vllm:cache_config_info", BOOL, lo=0, hi=1, prometheus="vgpumon_vllm_kv_cache_estimate_approximate",
        label="KV estimate approximate",
    ),
    _poll(
        "gauges_stale", "flag", "bool", "1 while vLLM's gauges are frozen (an idle engine stops updating them).",
        "no change in any vllm: gauge or counter since the previous poll", BOOL, lo=0, hi=1,
        prometheus="vgpumon_vllm_gauges_stale", label="gauges stale", required=True,
    ),
    _poll(
        "sleep_state", "state", "text", "Engine sleep state (awake, or the sleep level).",
        "vllm:engine_sleep_state (0.12+) or /is_sleeping (dev mode)", text(32), label="sleep state",
    ),
    _poll(
        "server_load", "gauge", "count", "Requests the API server tracks (/load).",
        "GET /load (0.8.5+, counts with --enable-server-load-tracking)", MILLI, lo=0, hi=_REQUESTS_MAX,
        prometheus="vgpumon_vllm_server_load", display="number", label="server load",
    ),
    _poll(
        "rss_bytes", "gauge", "bytes", "Resident memory of the server's process tree.",
        "psutil memory_info().rss over the server's processes", INT64, lo=0, hi=float(2**50),
        prometheus="vgpumon_vllm_resident_memory_bytes", label="RSS",
    ),
    _poll(
        "cpu_seconds_per_second", "gauge", "cores", "CPU used by the server's process tree (cores).",
        "increase of psutil cpu_times() user + system over the interval", MILLI, lo=0, hi=65536,
        prometheus="vgpumon_vllm_cpu_seconds_per_second", display="number", label="CPU (cores)",
    ),
    _poll(
        "reason", "state", "text", "Why the server is in its state (\"engine lost (pid 812 gone)\", \"poll failed: …\").",
        "the state machine (docs/vllm.md)", text(255), label="state reason",
    ),
    _poll(
        "metrics_error", "state", "text", "Why /metrics gave no reading (\"too large\", \"HTTP 500\", a parse error).",
        "GET /metrics", text(255), label="/metrics error",
    ),
    _poll(
        "telemetry", "enum", "code", "How much of /metrics was read: full, limited (no vllm: families), partial, down.",
        "GET /metrics", INT16, lo=1, hi=4, decode={v: k for k, v in TELEMETRY_CODES.items()},
        prometheus="vgpumon_vllm_telemetry", display="decoded", label="telemetry",
        note="exported as one 0/1 series per value (label telemetry)",
    ),
    _poll(
        "metric_lines_dropped", "gauge", "count", "Lines of /metrics that could not be read (bad UTF-8, parse error).",
        "GET /metrics, line by line through prometheus-client's parser", INT32, lo=0, hi=2**31 - 1,
        prometheus="vgpumon_vllm_metric_lines_dropped", display="count", label="unreadable /metrics lines",
        note="None when no body was read",
    ),
    _poll(
        "latency_unreliable", "bitmask", "code", "Latency histograms whose quantiles cannot be true (flagged, never alerted on).",
        "_sum outside what the buckets allow, or a median above twice the mean (docs/vllm.md)", INT16, lo=0, hi=15,
        decode={1: "ttft", 2: "itl", 4: "e2e", 8: "queue"}, prometheus="vgpumon_vllm_latency_unreliable",
        display="bits", label="unreliable latency histograms", note="exported as one 0/1 series per histogram",
    ),
    _poll(
        "latency_unreliable_reason", "state", "text", "Why the flagged latency histograms cannot be true.",
        "the histogram checks (docs/vllm.md)", text(255), label="unreliable latency reason",
    ),
)

ENGINES: tuple[Field, ...] = (
    Field(
        "running", "vllm_engine_samples", "gauge", "count", "Requests running on one engine.",
        "vllm:num_requests_running{engine}", "poll", MILLI, lo=0, hi=_REQUESTS_MAX,
        prometheus="vgpumon_vllm_engine_requests_running", display="number", label="running",
    ),
    Field(
        "waiting", "vllm_engine_samples", "gauge", "count", "Requests waiting on one engine.",
        "vllm:num_requests_waiting{engine}", "poll", MILLI, lo=0, hi=_REQUESTS_MAX,
        prometheus="vgpumon_vllm_engine_requests_waiting", display="number", label="waiting",
    ),
    Field(
        "kv_cache_usage_ratio", "vllm_engine_samples", "gauge", "ratio", "KV-cache blocks in use on one engine.",
        "vllm:kv_cache_usage_perc{engine}", "poll", RATIO, lo=0, hi=1,
        prometheus="vgpumon_vllm_engine_kv_cache_usage_ratio", label="KV usage",
    ),
)

INSTANCES: tuple[Field, ...] = (
    Field(
        "version", "vllm_instances", "info", "text", "vLLM version the server reports.", "GET /version", "start",
        text(64), prom_label="version", label="version",
    ),
    Field(
        "model", "vllm_instances", "info", "text", "Served model names.", "GET /v1/models, else model_name labels",
        "start", text(1024), prom_label="model_name", label="model",
    ),
    Field(
        "prewarm_seconds", "vllm_instances", "gauge", "seconds",
        "Process start to the first /health 200: weights, KV-cache sizing, CUDA-graph capture.",
        "process create time (psutil) and the first GET /health 200", "start", SECONDS_US, lo=0, hi=30 * 86400.0,
        prometheus="vgpumon_vllm_prewarm_seconds", label="prewarm",
    ),
    Field(
        "prewarm_gpu_active_ratio", "vllm_instances", "gauge", "ratio",
        "Mean SM activity of the server's GPUs during its prewarm.",
        "GPM SM_UTIL of the GPUs holding the server's processes (utilization.gpu without GPM)", "start", RATIO,
        lo=0, hi=1, prometheus="vgpumon_vllm_prewarm_gpu_active_ratio", label="GPU activity during prewarm",
    ),
    Field(
        "prewarm_gpu_activity_source", "vllm_instances", "state", "text",
        "Where prewarm_gpu_active_ratio comes from: gpm or utilization.", "the GPUs' activity_source", "start",
        text(16), label="prewarm activity source",
    ),
    Field(
        "final_state", "vllm_instances", "enum", "code", "How the start ended (dead, failed_to_start).",
        "the state machine when the process is gone", "start", INT16, lo=1, hi=max(SERVER_STATES),
        decode=SERVER_STATES, display="decoded", label="final state",
    ),
)
