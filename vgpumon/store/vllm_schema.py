"""vLLM tables: one row per server start, wide sample rows per server per poll, per-engine rows,
and the server → GPU mapping. Same conventions as ``schema.py``: fixed-point integer columns that
convert to base units, epoch-millisecond sample times.

Ratios are stored in 1e-4, latencies in microseconds, rates in milli-units per second, CPU in
milli-cores (CPU seconds per second × 1000).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, ForeignKey, Integer, SmallInteger, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from vgpumon.store.schema import Base, EpochMillis, FixedPoint

RATIO = FixedPoint(10_000)
SECONDS_US = FixedPoint(1_000_000)  # latency quantiles: microseconds
PER_SECOND = FixedPoint(1_000)  # token / request / preemption rates: 0.001 per second
COUNT = FixedPoint(1_000)  # gauges vLLM exposes as floats (running, waiting, blocks used)
CPU = FixedPoint(1_000)  # CPU seconds per second (cores), in milli-cores


class VllmInstance(Base):
    """One start of one vLLM server: identity (host, port, pid, process start) and prewarm.

    ``pid`` and ``process_start`` are NULL for static targets (configured URLs), whose starts are
    told apart by ``first_seen``. ``prewarm_seconds`` is process start → first ``/health`` 200;
    NULL when the agent did not watch the start. ``prewarm_gpu_active_ratio`` is the mean SM
    activity of the server's GPUs over that window (``prewarm_gpu_activity_source``: ``gpm``, or
    ``utilization`` without GPM). ``final_state`` and ``ended`` are set when the process is gone.
    """

    __tablename__ = "vllm_instances"
    __table_args__ = (UniqueConstraint("host_id", "port", "pid", "process_start", "first_seen", name="identity"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"), index=True)
    address: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    url: Mapped[str] = mapped_column(String(512))
    origin: Mapped[str] = mapped_column(String(16))
    pid: Mapped[int | None] = mapped_column(Integer)
    process_start: Mapped[float | None] = mapped_column(EpochMillis)
    first_seen: Mapped[float] = mapped_column(EpochMillis)
    last_seen: Mapped[float] = mapped_column(EpochMillis)
    version: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(1024))
    first_connect: Mapped[float | None] = mapped_column(EpochMillis)
    ready: Mapped[float | None] = mapped_column(EpochMillis)
    prewarm_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    prewarm_gpu_active_ratio: Mapped[float | None] = mapped_column(RATIO)
    prewarm_gpu_activity_source: Mapped[str | None] = mapped_column(String(16))
    ended: Mapped[float | None] = mapped_column(EpochMillis)
    final_state: Mapped[int | None] = mapped_column(SmallInteger)


class VllmSampleRow(Base):
    """One server, one poll (wide row). Meanings: ``vgpumon.sources.vllm.ServerSample``.

    ``state`` is ``ServerState.code``; ``prefix_cache_unit`` 1 = tokens, 2 = blocks.

    From revision 0007: ``reason`` (why the state, e.g. "engine lost (pid 812 gone)", "poll
    failed: …"), ``metrics_error`` (why ``/metrics`` gave no reading: "too large", "HTTP 500",
    …), ``telemetry`` (``TELEMETRY_CODES``: full, limited, partial, down), ``metric_lines_dropped``
    (lines of ``/metrics`` that could not be read; NULL when no body was read) and
    ``latency_unreliable`` (bit per histogram whose quantiles cannot be true,
    ``vgpumon.model.vllm.LATENCY_HISTOGRAMS``; 0 when none) with its ``latency_unreliable_reason``.
    """

    __tablename__ = "vllm_samples"
    __table_args__ = {"sqlite_with_rowid": False, "postgresql_partition_by": "RANGE (ts)"}

    instance_id: Mapped[int] = mapped_column(ForeignKey("vllm_instances.id"), primary_key=True)
    ts: Mapped[float] = mapped_column(EpochMillis, primary_key=True)
    state: Mapped[int] = mapped_column(SmallInteger)
    health_status: Mapped[int | None] = mapped_column(SmallInteger)
    telemetry_up: Mapped[bool | None] = mapped_column(Boolean)
    running: Mapped[float | None] = mapped_column(COUNT)
    waiting: Mapped[float | None] = mapped_column(COUNT)
    kv_cache_usage_ratio: Mapped[float | None] = mapped_column(RATIO)
    kv_cache_usage_mean_ratio: Mapped[float | None] = mapped_column(RATIO)
    prompt_tokens_per_second: Mapped[float | None] = mapped_column(PER_SECOND)
    generation_tokens_per_second: Mapped[float | None] = mapped_column(PER_SECOND)
    preemptions_per_second: Mapped[float | None] = mapped_column(PER_SECOND)
    requests_finished_per_second: Mapped[float | None] = mapped_column(PER_SECOND)
    prefix_cache_hit_ratio: Mapped[float | None] = mapped_column(RATIO)
    prefix_cache_unit: Mapped[int | None] = mapped_column(SmallInteger)
    ttft_p50_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    ttft_p95_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    ttft_p99_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    itl_p50_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    itl_p95_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    itl_p99_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    e2e_p50_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    e2e_p95_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    e2e_p99_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    queue_p50_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    queue_p95_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    queue_p99_seconds: Mapped[float | None] = mapped_column(SECONDS_US)
    kv_block_size: Mapped[int | None] = mapped_column(Integer)
    kv_num_gpu_blocks: Mapped[int | None] = mapped_column(BigInteger)
    kv_cache_size_tokens: Mapped[int | None] = mapped_column(BigInteger)
    kv_blocks_used: Mapped[float | None] = mapped_column(COUNT)
    kv_fragmentation_ratio: Mapped[float | None] = mapped_column(RATIO)
    kv_token_occupancy_ratio: Mapped[float | None] = mapped_column(RATIO)
    kv_estimate_approximate: Mapped[bool | None] = mapped_column(Boolean)
    gauges_stale: Mapped[bool] = mapped_column(Boolean)
    sleep_state: Mapped[str | None] = mapped_column(String(32))
    server_load: Mapped[float | None] = mapped_column(COUNT)
    rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    cpu_seconds_per_second: Mapped[float | None] = mapped_column(CPU)
    reason: Mapped[str | None] = mapped_column(String(255))
    metrics_error: Mapped[str | None] = mapped_column(String(255))
    telemetry: Mapped[int | None] = mapped_column(SmallInteger)
    metric_lines_dropped: Mapped[int | None] = mapped_column(Integer)
    latency_unreliable: Mapped[int | None] = mapped_column(SmallInteger)
    latency_unreliable_reason: Mapped[str | None] = mapped_column(String(255))


class VllmEngineSampleRow(Base):
    """One data-parallel engine (and served model name) of one server, one poll."""

    __tablename__ = "vllm_engine_samples"
    __table_args__ = {"sqlite_with_rowid": False, "postgresql_partition_by": "RANGE (ts)"}

    instance_id: Mapped[int] = mapped_column(ForeignKey("vllm_instances.id"), primary_key=True)
    ts: Mapped[float] = mapped_column(EpochMillis, primary_key=True)
    model_name: Mapped[str] = mapped_column(String(255), primary_key=True)  # "" when unlabelled
    engine: Mapped[str] = mapped_column(String(32), primary_key=True)  # "" when unlabelled (before 0.8)
    running: Mapped[float | None] = mapped_column(COUNT)
    waiting: Mapped[float | None] = mapped_column(COUNT)
    kv_cache_usage_ratio: Mapped[float | None] = mapped_column(RATIO)


class VllmGpuMapRow(Base):
    """Which GPUs a server start used: a GPU whose NVML compute-process list held one of the
    server's processes (API server, engine cores, workers), first and last seen."""

    __tablename__ = "vllm_gpu_map"

    instance_id: Mapped[int] = mapped_column(ForeignKey("vllm_instances.id"), primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(64), primary_key=True)
    first_seen: Mapped[float] = mapped_column(EpochMillis)
    last_seen: Mapped[float] = mapped_column(EpochMillis)


PREFIX_CACHE_UNITS = {"tokens": 1, "blocks": 2}
PREFIX_CACHE_UNIT_NAMES = {v: k for k, v in PREFIX_CACHE_UNITS.items()}
TELEMETRY_CODES = {"full": 1, "limited": 2, "partial": 3, "down": 4}
TELEMETRY_NAMES = {v: k for k, v in TELEMETRY_CODES.items()}
