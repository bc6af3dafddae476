"""vLLM tables: one row per server start, wide sample rows per server per poll, per-engine rows,
and the server → GPU mapping. Same conventions as ``schema.py``: fixed-point integer columns that
convert to base units, epoch-millisecond sample times.

Ratios are stored in 1e-4, latencies in microseconds, rates in milli-units per second, CPU in
milli-cores (CPU seconds per second × 1000).
"""

from __future__ import annotations

from sqlalchemy import Column, ForeignKey, Integer, SmallInteger, String, Table, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from vgpumon.catalogue import core
from vgpumon.catalogue.vllm import PREFIX_CACHE_UNITS, TELEMETRY_CODES
from vgpumon.store.schema import Base, EpochMillis, catalogue_columns, column_type

RATIO = column_type(core.RATIO)
SECONDS_US = column_type(core.SECONDS_US)  # prewarm: microseconds


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
    """One server, one poll (wide row): the catalogue's ``vllm_samples`` fields (meanings:
    ``vgpumon.model.ServerSample`` and docs/metrics.md).

    ``state`` is ``ServerState.code``; ``prefix_cache_unit`` 1 = tokens, 2 = blocks.

    From revision 0007: ``reason`` (why the state, e.g. "engine lost (pid 812 gone)", "poll
    failed: …"), ``metrics_error`` (why ``/metrics`` gave no reading: "too large", "HTTP 500",
    …), ``telemetry`` (``TELEMETRY_CODES``: full, limited, partial, down), ``metric_lines_dropped``
    (lines of ``/metrics`` that could not be read; NULL when no body was read) and
    ``latency_unreliable`` (bit per histogram whose quantiles cannot be true,
    ``vgpumon.model.vllm.LATENCY_HISTOGRAMS``; 0 when none) with its ``latency_unreliable_reason``.
    """

    __table__ = Table(
        "vllm_samples",
        Base.metadata,
        Column("instance_id", ForeignKey("vllm_instances.id"), primary_key=True),
        Column("ts", EpochMillis, primary_key=True),
        *catalogue_columns("vllm_samples"),
        sqlite_with_rowid=False,
        postgresql_partition_by="RANGE (ts)",
    )


class VllmEngineSampleRow(Base):
    """One data-parallel engine (and served model name) of one server, one poll."""

    __table__ = Table(
        "vllm_engine_samples",
        Base.metadata,
        Column("instance_id", ForeignKey("vllm_instances.id"), primary_key=True),
        Column("ts", EpochMillis, primary_key=True),
        Column("model_name", String(255), primary_key=True),  # "" when unlabelled
        Column("engine", String(32), primary_key=True),  # "" when unlabelled (before 0.8)
        *catalogue_columns("vllm_engine_samples"),
        sqlite_with_rowid=False,
        postgresql_partition_by="RANGE (ts)",
    )


class VllmGpuMapRow(Base):
    """Which GPUs a server start used: a GPU whose NVML compute-process list held one of the
    server's processes (API server, engine cores, workers), first and last seen."""

    __tablename__ = "vllm_gpu_map"

    instance_id: Mapped[int] = mapped_column(ForeignKey("vllm_instances.id"), primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(64), primary_key=True)
    first_seen: Mapped[float] = mapped_column(EpochMillis)
    last_seen: Mapped[float] = mapped_column(EpochMillis)


PREFIX_CACHE_UNIT_NAMES = {v: k for k, v in PREFIX_CACHE_UNITS.items()}
TELEMETRY_NAMES = {v: k for k, v in TELEMETRY_CODES.items()}
