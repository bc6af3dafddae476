"""vLLM tables: one row per server start, wide sample rows per server per poll, per-engine rows,
and the server → GPU mapping. Same conventions as ``schema.py``: fixed-point integer columns that
convert to base units, epoch-millisecond sample times.

Ratios are stored in 1e-4, latencies in microseconds, rates in milli-units per second, CPU in
milli-cores (CPU seconds per second × 1000).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeAlias, TypedDict

from sqlalchemy import Column, ForeignKey, Integer, SmallInteger, String, UniqueConstraint

from vgpumon.catalogue import core
from vgpumon.catalogue.vllm import ENGINE_KEY_LENGTHS, PREFIX_CACHE_UNITS, TELEMETRY_CODES
from vgpumon.store.schema import ColumnValue, EpochMillis, column_type, table, time_table

RATIO = column_type(core.RATIO)
SECONDS_US = column_type(core.SECONDS_US)  # prewarm: microseconds


#: One start of one vLLM server: identity (host, port, pid, process start) and prewarm.
#:
#: ``pid`` and ``process_start`` are NULL for static targets (configured URLs), whose starts are
#: told apart by ``first_seen``. ``prewarm_seconds`` is process start → first ``/health`` 200;
#: NULL when the agent did not watch the start. ``prewarm_gpu_active_ratio`` is the mean SM
#: activity of the server's GPUs over that window (``prewarm_gpu_activity_source``: ``gpm``, or
#: ``utilization`` without GPM). ``final_state`` and ``ended`` are set when the process is gone.
VllmInstance = table(
    "vllm_instances",
    Column("id", Integer, primary_key=True),
    Column("host_id", ForeignKey("hosts.id"), index=True, nullable=False),
    Column("address", String(255), nullable=False),
    Column("port", Integer, nullable=False),
    Column("url", String(512), nullable=False),
    Column("origin", String(16), nullable=False),
    Column("pid", Integer),
    Column("process_start", EpochMillis),
    Column("first_seen", EpochMillis, nullable=False),
    Column("last_seen", EpochMillis, nullable=False),
    Column("version", String(64)),
    Column("model", String(1024)),
    Column("first_connect", EpochMillis),
    Column("ready", EpochMillis),
    Column("prewarm_seconds", SECONDS_US),
    Column("prewarm_gpu_active_ratio", RATIO),
    Column("prewarm_gpu_activity_source", String(16)),
    Column("ended", EpochMillis),
    Column("final_state", SmallInteger),
    UniqueConstraint("host_id", "port", "pid", "process_start", "first_seen", name="identity"),
)


#: One server, one poll (wide row): the catalogue's ``vllm_samples`` fields (meanings:
#: ``vgpumon.model.ServerSample`` and docs/metrics.md).
#:
#: ``state`` is ``ServerState.code``; ``prefix_cache_unit`` 1 = tokens, 2 = blocks.
#:
#: From revision 0007: ``reason`` (why the state, e.g. "engine lost (pid 812 gone)", "poll
#: failed: …"), ``metrics_error`` (why ``/metrics`` gave no reading: "too large", "HTTP 500",
#: …), ``telemetry`` (``TELEMETRY_CODES``: full, limited, partial, down), ``metric_lines_dropped``
#: (lines of ``/metrics`` that could not be read; NULL when no body was read) and
#: ``latency_unreliable`` (bit per histogram whose quantiles cannot be true,
#: ``vgpumon.model.vllm.LATENCY_HISTOGRAMS``; 0 when none) with its ``latency_unreliable_reason``.
VllmSampleRow = time_table("vllm_samples", "instance_id", "vllm_instances.id")


#: One data-parallel engine (and served model name) of one server, one poll.
VllmEngineSampleRow = time_table(
    "vllm_engine_samples", "instance_id", "vllm_instances.id",
    Column("model_name", String(ENGINE_KEY_LENGTHS["model_name"]), primary_key=True),  # "" when unlabelled
    Column("engine", String(ENGINE_KEY_LENGTHS["engine"]), primary_key=True),  # "" when unlabelled (before 0.8)
)


#: Which GPUs a server start used: a GPU whose NVML compute-process list held one of the
#: server's processes (API server, engine cores, workers), first and last seen.
VllmGpuMapRow = table(
    "vllm_gpu_map",
    Column("instance_id", ForeignKey("vllm_instances.id"), primary_key=True),
    Column("gpu_uuid", String(64), primary_key=True),
    Column("first_seen", EpochMillis, nullable=False),
    Column("last_seen", EpochMillis, nullable=False),
)


PREFIX_CACHE_UNIT_NAMES = {v: k for k, v in PREFIX_CACHE_UNITS.items()}
TELEMETRY_NAMES = {v: k for k, v in TELEMETRY_CODES.items()}


# -- rows as the write path carries them and the reads return them --------------------------


class InstanceIdentity(TypedDict):
    """Which server start a sample belongs to (``vllm_instances``' identity columns; times in
    epoch seconds)."""

    address: str
    port: int
    url: str
    origin: str
    pid: int | None
    process_start: float | None
    first_seen: float


class StartFacts(TypedDict):
    """What is known of a server start as of one sample (the other ``vllm_instances`` columns)."""

    version: str | None
    model: str | None
    first_connect: float | None
    ready: float | None
    prewarm_seconds: float | None
    prewarm_gpu_active_ratio: float | None
    prewarm_gpu_activity_source: str | None
    ended: float | None
    final_state: int | None


class EngineValues(TypedDict):
    """One engine's figures of a sample (a ``vllm_engine_samples`` row without instance and time)."""

    model_name: str
    engine: str
    running: float | None
    waiting: float | None
    kv_cache_usage_ratio: float | None


#: A ``vllm_samples`` row (column → value in base units; the column types encode them): its
#: columns are the catalogue's, chosen by name (``_VALUE_COLUMNS``).
SampleValues: TypeAlias = dict[str, ColumnValue]

#: A ``vllm_instances`` row as ``VllmRepository.instances`` reads it: every column of the table in
#: base units, ``final_state`` a ``ServerState`` or ``None``. (A plain dict: callers keep it
#: among dicts of their own.)
InstanceRecord: TypeAlias = dict[str, ColumnValue]


class StoredEngineSample(TypedDict):
    """A ``vllm_engine_samples`` row (base units)."""

    instance_id: int
    ts: float
    model_name: str
    engine: str
    running: float | None
    waiting: float | None
    kv_cache_usage_ratio: float | None


class StoredGpuMapping(TypedDict):
    """A ``vllm_gpu_map`` row: a GPU one server start used, and when."""

    instance_id: int
    gpu_uuid: str
    first_seen: float
    last_seen: float


#: A ``vllm_samples`` row as ``VllmRepository.samples`` reads it: ``SampleValues`` with
#: ``state`` a ``ServerState``, ``telemetry`` and ``prefix_cache_unit`` names and
#: ``latency_unreliable`` a frozenset of histogram names.
StoredSample: TypeAlias = dict[str, ColumnValue]

#: The identity of a server start (``instance_key``): host id, port, pid, first seen.
InstanceKey: TypeAlias = tuple[Hashable, ...]


class VllmRow(TypedDict):
    """One vLLM sample as the backlog and the write path carry it: a JSON-able dict (see
    ``encode_sample``), so that it can wait in the spool like a GPU row."""

    host_id: int
    instance: InstanceIdentity
    start: StartFacts
    sample: SampleValues
    engines: list[EngineValues]
    gpus: list[str]
