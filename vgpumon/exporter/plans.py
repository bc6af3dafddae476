"""What ``/metrics`` serves, planned once from the field catalogue: for each group of fields the
(attribute, family, extra label) triples the collector reads, and the names of the families it
fills by hand. A field added to the catalogue with a Prometheus name is served without an edit
here (``vgpumon.exporter.collector`` renders, ``vgpumon.exporter.servers`` the vLLM series)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from vgpumon import catalogue
from vgpumon.catalogue.gpu import CLOCKS_EVENT_REASONS, XID_NAMES
from vgpumon.exporter.text import Family, Labels
from vgpumon.model import ServerState

_F = catalogue.get


def _family(table: str, name: str) -> str:
    """The Prometheus family of a catalogue field that ``/metrics`` fills by hand."""
    family = _F(table, name).prometheus
    if family is None:
        raise LookupError(f"catalogue field {table}.{name} has no Prometheus name")
    return family


# What each group of catalogue fields reads from, as (attribute, family, extra label or None).
# Built once from the catalogue, so a field added there with a Prometheus name is served here.
Plan = tuple[tuple[str, str, "tuple[str, str] | None"], ...]
#: Fields not read every tick: ``/metrics`` serves each one's newest read.
SLOW_CADENCES = ("slow", "minute")


def plan(table: str | None, *, skip: Iterable[str] = (), slow: bool | None = None) -> Plan:
    """``slow``: only the fields read less often than every tick (True), only the others (False)."""
    out = []
    for f in catalogue.fields_of(table):
        if f.prometheus is None or f.name in skip:
            continue
        if slow is not None and (f.cadence in SLOW_CADENCES) != slow:
            continue
        extra = next(iter(f.prom_labels.items())) if f.prom_labels else None
        out.append((f.name, f.prometheus, extra))
    return tuple(out)


GPU_SPECIAL = {"up", "clocks_event_reasons"}
GPU_FAST = plan("gpu_samples", skip=GPU_SPECIAL, slow=False)
GPU_SLOW = plan("gpu_samples", skip=GPU_SPECIAL, slow=True)
SLOW_NAMES = tuple(f.name for f in catalogue.fields_of("gpu_samples") if f.cadence in SLOW_CADENCES)
IDENTITY = plan("gpus")
INFO_LABELS = tuple((f.name, f.prom_label) for f in catalogue.fields_of("gpus") if f.prom_label and f.name != "uuid")
PROCESS = {f.name: f.prometheus for f in catalogue.fields_of("gpu_process_samples") if f.prometheus is not None}
HOST = plan("host_samples")
VLLM = plan("vllm_samples", skip={"state", "telemetry_up", "telemetry", "latency_unreliable"})
TELEMETRY = _F("vllm_samples", "telemetry")
UNRELIABLE = _F("vllm_samples", "latency_unreliable")
#: latency percentile fields per histogram (``ttft`` → its p50/p95/p99 fields)
LATENCY_FIELDS = {
    h: frozenset(name for name, _, _ in VLLM if name.startswith(f"{h}_p")) for h in (UNRELIABLE.decode or {}).values()
}
ENGINE = plan("vllm_engine_samples")
INSTANCE = plan("vllm_instances")
FAMILIES = catalogue.families()

GPU_INFO = catalogue.INFO_METRICS["gpus"]
SERVER_INFO = catalogue.INFO_METRICS["vllm_instances"]
BUILD_INFO = catalogue.INFO_METRICS["agent"]
GPU_UP = _family("gpu_samples", "up")
REASONS = _family("gpu_samples", "clocks_event_reasons")
XID = _family("xid_events", "xid")
STATE = _family("vllm_samples", "state")
TELEMETRY_UP = _family("vllm_samples", "telemetry_up")
CAPACITY = _family("exporter", "pcie_link_capacity_bytes_per_second")
SHARE = {d: _family("exporter", f"pcie_{d}_link_share_ratio") for d in ("tx", "rx")}
AGE = _family("exporter", "sample_age_seconds")
SLOPE = _family("exporter", "memory_used_slope_bytes_per_second")
SERVER_GPU = _family("exporter", "server_gpu_info")
READY = _family("exporter", "vllm_ready_timestamp_seconds")
UPSTREAM_GPU = _family("exporter", "pcie_upstream_gpu_info")
UPSTREAM_CAPACITY = _family("exporter", "pcie_upstream_link_capacity_bytes_per_second")
HOLDER = _family("exporter", "kubernetes_holder_info")
HOLDERS = _family("exporter", "kubernetes_holders")
ALERTS = _family("exporter", "alerts")
RULE_UNKNOWN = _family("exporter", "rule_unknown")
COLLECTOR_FAULT = _family("exporter", "collector_fault")
SOURCE_UP = _family("agent", "source_up")
SOURCE_DURATION = _family("agent", "source_collect_duration_seconds")
SOURCE_SUCCESS = _family("agent", "source_last_success_timestamp_seconds")
REJECTED = _family("agent", "rejected_values_total")
BACKLOG = _family("agent", "backlog_rows")
ROWS_WRITTEN = _family("agent", "gpu_rows_written_total")
ROWS_FOLDED = _family("agent", "rows_folded_total")
OUTAGES = _family("agent", "store_outages_total")
TICKS = _family("agent", "ticks_total")
HTTP_CLOSED = _family("agent", "http_connections_closed_total")
#: the reasons ``HTTP_CLOSED`` is served with, each from 0
HTTP_CLOSE_REASONS = ("limit", "header_deadline", "idle")
#: (family, AgentStats attribute) of the agent's counters
STATS = (
    (ROWS_WRITTEN, "rows_written"), (OUTAGES, "outages"), (TICKS, "ticks"),
    (_family("agent", "ticks_skipped_total"), "ticks_skipped"),
    (_family("agent", "store_stalls_total"), "store_stalls"),
    (_family("agent", "dead_letters_total"), "dead_letters"),
)


XID_CODES = tuple(sorted(XID_NAMES))
REASON_BITS = tuple(sorted(CLOCKS_EVENT_REASONS.items()))
STATES = tuple(s.value for s in ServerState)



def add_values(fams: dict[str, Family], labels: Labels, obj: object, plan: Plan) -> None:
    """Add each field of ``plan`` that ``obj`` (a model record, read by the plan's attribute
    names, or a dict of slow values) knows; every such field is a number or ``None``."""
    get: Callable[[str], float | None] = obj.get if isinstance(obj, dict) else (lambda name: getattr(obj, name))
    for name, family, extra in plan:
        value = get(name)
        if value is None:
            continue
        fam = fams.get(family)
        if fam is not None:
            fam.add(labels.plus(*extra) if extra else labels, float(value))
