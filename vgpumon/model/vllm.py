"""vLLM servers as data: one start's identity, its state, and what one poll saw. Produced by
``vgpumon.sources.vllm``, stored by ``vgpumon.store.vllm_repository``."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping


class ServerState(str, enum.Enum):
    """States of one vLLM server; ``code`` is the stored SmallInteger."""

    STARTING = "starting"
    READY = "ready"
    BUSY = "busy"
    IDLE = "idle"
    HUNG = "hung"
    SLEEPING = "sleeping"
    TELEMETRY_DOWN = "telemetry_down"
    DEAD = "dead"
    FAILED_TO_START = "failed_to_start"

    @property
    def code(self) -> int:
        return _CODES[self]

    @classmethod
    def from_code(cls, code: int) -> "ServerState":
        return _BY_CODE[code]

    @property
    def terminal(self) -> bool:
        return self in (ServerState.DEAD, ServerState.FAILED_TO_START)


_CODES = {s: i for i, s in enumerate(ServerState, start=1)}
_BY_CODE = {i: s for s, i in _CODES.items()}


@dataclass(frozen=True, slots=True)
class InstanceIdentity:
    """One start of one server: host, port, pid and process start time (static targets: no pid;
    ``first_seen`` distinguishes their starts).

    Attributes:
        host: the host the agent runs on is the server's host; this is the address scraped.
        port: HTTP port.
        url: base URL (``http://127.0.0.1:8000``).
        origin: ``"discovered"`` (process table) or ``"static"`` (configured URL).
        pid: API server pid; ``None`` for static targets.
        process_start: process start time (epoch seconds); ``None`` for static targets.
        first_seen: when the agent first saw this start (epoch seconds, injected clock).
    """

    host: str
    port: int
    url: str
    origin: str
    pid: int | None
    process_start: float | None
    first_seen: float


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One ``(model_name, engine)`` series of one poll (data-parallel engines are kept apart)."""

    model_name: str | None
    engine: str | None
    running: float | None
    waiting: float | None
    kv_cache_usage_ratio: float | None


@dataclass(frozen=True)
class ServerSample:
    """What one poll saw of one server, in base units; ``None`` = unknown.

    Identity and start (the same for every sample of one start):
        instance, version (``/version``), model_names (``/v1/models``, else ``model_name``
        labels), first_connect_ts, ready_ts, prewarm_seconds (process start → first
        ``/health`` 200), prewarm_gpu_active_ratio (mean SM activity of the server's GPUs over
        the prewarm window; ``utilization.gpu`` where the GPU has no GPM, see
        ``prewarm_gpu_activity_source``), ended (the process is gone; last sample of the start).

    Per poll:
        ts (epoch seconds), state, reason, health_status, metrics_error, telemetry
        (``"full"``, ``"limited"`` without ``vllm:`` metrics, ``"down"``), running, waiting
        (sums over engines), kv_cache_usage_ratio (max over engines), kv_cache_usage_mean_ratio,
        *_per_second rates from counters (kv_offload_load/store_bytes_per_second: KV offload
        traffic to / from the GPU), prefix_cache_hit_ratio (+ unit of the counters),
        spec_decode_acceptance_ratio, lmcache_* (LMCache's families when the server runs its
        connector: ``vgpumon.sources.vllm.lmcache``), latency quantiles in seconds, ttft_slo_* and itl_slo_* (SLO
        attainment over the window: ``vgpumon.sources.vllm.slo``), kv_* (``vgpumon.sources.vllm.kv``), gauges_stale,
        sleep_state, server_load (``/load``), rss_bytes and cpu_seconds_per_second of the
        server's process tree, gpu_uuids (GPUs holding one of its processes), engines,
        scrape_seconds (wall time of this server's requests), generation_tokens_total (the
        cumulative counter, summed over engines), engine_labels (every ``engine`` label of the
        scrape), reading (the parsed scrape itself, not stored),
        energy_per_token_joules and energy_interval_joules (the newest interval between two energy
        reads of its GPUs, held until the next) and energy_per_token_note (why there is no figure, or
        how shared GPUs were split).

    Trust:
        telemetry ``"partial"``: ``/metrics`` parsed, but ``metric_lines_dropped`` lines of it
        could not be (invalid UTF-8, a line the parser refuses); ``metric_lines_dropped`` is
        ``None`` when no body was parsed. ``metrics_error`` says why there is no reading
        (``"too large"``, ``"HTTP 500"``, ...). ``latency_unreliable``: histogram (``"ttft"``,
        ``"itl"``, ``"e2e"``, ``"queue"``) → why its quantiles cannot be true
        (``vgpumon.sources.vllm.derive.implausible``); they are kept, and no latency alert may
        use them: read latencies for alerting through ``latency_for_alerts``.
    """

    instance: InstanceIdentity
    ts: float
    state: ServerState
    reason: str
    version: str | None = None
    model_names: tuple[str, ...] = ()
    first_connect_ts: float | None = None
    ready_ts: float | None = None
    prewarm_seconds: float | None = None
    prewarm_gpu_active_ratio: float | None = None
    prewarm_gpu_activity_source: str | None = None
    ended: bool = False
    health_status: int | None = None
    metrics_error: str | None = None
    telemetry: str | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage_ratio: float | None = None
    kv_cache_usage_mean_ratio: float | None = None
    prompt_tokens_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    energy_per_token_joules: float | None = None
    energy_interval_joules: float | None = None
    energy_per_token_note: str | None = None
    preemptions_per_second: float | None = None
    requests_finished_per_second: float | None = None
    prefix_cache_hit_ratio: float | None = None
    prefix_cache_unit: str | None = None
    kv_offload_load_bytes_per_second: float | None = None
    kv_offload_store_bytes_per_second: float | None = None
    spec_decode_acceptance_ratio: float | None = None
    lmcache_retrieve_requests_per_second: float | None = None
    lmcache_store_requests_per_second: float | None = None
    lmcache_hit_tokens_per_second: float | None = None
    lmcache_stored_tokens_per_second: float | None = None
    lmcache_retrieve_hit_ratio: float | None = None
    lmcache_lookup_hit_ratio: float | None = None
    lmcache_local_cache_usage_bytes: float | None = None
    lmcache_retrieve_mean_seconds: float | None = None
    lmcache_store_mean_seconds: float | None = None
    ttft_p50_seconds: float | None = None
    ttft_p95_seconds: float | None = None
    ttft_p99_seconds: float | None = None
    itl_p50_seconds: float | None = None
    itl_p95_seconds: float | None = None
    itl_p99_seconds: float | None = None
    e2e_p50_seconds: float | None = None
    e2e_p95_seconds: float | None = None
    e2e_p99_seconds: float | None = None
    ttft_slo_attainment_ratio: float | None = None
    ttft_slo_observations: float | None = None
    ttft_slo_interpolated: bool | None = None
    itl_slo_attainment_ratio: float | None = None
    itl_slo_observations: float | None = None
    itl_slo_interpolated: bool | None = None
    queue_p50_seconds: float | None = None
    queue_p95_seconds: float | None = None
    queue_p99_seconds: float | None = None
    kv_block_size: int | None = None
    kv_num_gpu_blocks: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_blocks_used: float | None = None
    kv_fragmentation_ratio: float | None = None
    kv_token_occupancy_ratio: float | None = None
    kv_estimate_approximate: bool | None = None
    gauges_stale: bool = False
    sleep_state: str | None = None
    server_load: float | None = None
    rss_bytes: int | None = None
    cpu_seconds_per_second: float | None = None
    gpu_uuids: tuple[str, ...] = ()
    engines: tuple[EngineSample, ...] = ()
    scrape_seconds: float | None = None
    generation_tokens_total: float | None = None
    engine_labels: tuple[str, ...] = ()
    metric_lines_dropped: int | None = None
    latency_unreliable: Mapping[str, str] = field(default_factory=dict)
    #: the parsed scrape (``vgpumon.sources.vllm.metrics.MetricsReading``); not stored
    reading: Any = field(default=None, compare=False, repr=False)
    #: field (or ``vllm:`` metric) → why its value was refused at the door (NaN, ±Inf, out of
    #: range: a running count of 1e16, a KV usage of 1.7); the field is ``None``
    rejected: Mapping[str, str] = field(default_factory=dict)


#: Histograms whose quantiles a sample carries, and their bit in the stored
#: ``vllm_samples.latency_unreliable`` mask.
LATENCY_HISTOGRAMS = {"ttft": 1, "itl": 2, "e2e": 4, "queue": 8}


def latency_for_alerts(sample: ServerSample | Mapping[str, Any], histogram: str, percentile: int) -> float | None:
    """A latency quantile that a rule may alert on: ``None`` when unknown, and also when its
    histogram was flagged unreliable for that poll (the quantile cannot be true).

    Args:
        sample: a ``ServerSample``, or a stored row as ``VllmRepository.samples`` returns it
            (``latency_unreliable`` there is the set of flagged histogram names).
        histogram: ``"ttft"``, ``"itl"``, ``"e2e"`` or ``"queue"``.
        percentile: 50, 95 or 99.

    Returns:
        Seconds, or ``None``.
    """
    if isinstance(sample, ServerSample):
        flagged, value = sample.latency_unreliable, getattr(sample, f"{histogram}_p{percentile}_seconds")
    else:
        flagged, value = sample.get("latency_unreliable") or {}, sample.get(f"{histogram}_p{percentile}_seconds")
    return None if histogram in flagged else value


@dataclass(frozen=True, slots=True)
class ServerProcess:
    """A vLLM server found in the process table, as a tick saw it: the PIDs ``diagnose --stacks``
    may dump (the API server's and its engines'), and no others."""

    pid: int
    engine_pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class VllmServers:
    """The vLLM source's view at one tick, carried by the ``Snapshot`` so that the exporter and the
    API read ticks only, never a source's live state.

    Attributes:
        samples: the newest sample of each server tracked, in the source's order (a server polled
            but never answered has none).
        interval: seconds between polls; a sample older than three of them is not served.
        read_at: the source's clock (epoch seconds) when the view was taken: the ages above are
            measured from it.
        processes: base URL → the process of each server found in the process table and
            listening where it says (static targets, whose processes the agent cannot see, are
            left out).
    """

    samples: tuple[ServerSample, ...] = ()
    interval: float = 2.0
    read_at: float = 0.0
    processes: Mapping[str, ServerProcess] = field(default_factory=dict)

    def recent(self) -> tuple[ServerSample, ...]:
        """The samples young enough to serve: at most three poll intervals old."""
        too_old = 3 * self.interval
        return tuple(s for s in self.samples if self.read_at - s.ts <= too_old)
