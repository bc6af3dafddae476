"""Fields only ``/metrics`` carries: signals the exporter derives from the snapshot at scrape time
(group ``exporter``) and the agent's own health (group ``agent``). Neither group is stored: the
store keeps what they derive from, and the agent's health is about this process, not the host.

Their ``table`` is the group's name, so ``fields_of("exporter")`` and ``fields_of("agent")`` list
them and ``docs/metrics.md`` gives each group a section; no store table has these names.
"""

from __future__ import annotations

from vgpumon.catalogue.core import (
    BOOL,
    BYTES_PER_SECOND,
    COUNT_MAX,
    INT64,
    RATIO,
    SECONDS_MS,
    SECONDS_US,
    Encoding,
    Field,
    text,
)

# 128 GB/s (Gen6 x16 raw) × the door's 1.25 headroom: the largest capacity or rate a link reports.
_LINK_MAX = 128e9 * 1.25
# A share of link capacity may read above 1: the counters include protocol overhead (94–96 % of
# Gen5 x16 under a full copy, FACTS §1) and the door admits up to 1.25 × capacity.
SHARE_OF_LINK_MAX = 1.25
_EPOCH_MAX = float(2**33)  # seconds since 1970: year 2242
_GIB48 = float(2**48)


def _derived(name: str, kind: str, unit: str, help: str, source: str, encoding: Encoding, **kw: object) -> Field:
    kw.setdefault("cadence", "scrape")
    return Field(name=name, table="exporter", kind=kind, unit=unit, help=help, source=source, encoding=encoding, **kw)  # type: ignore[arg-type]


def _agent(name: str, kind: str, unit: str, help: str, source: str, encoding: Encoding, **kw: object) -> Field:
    kw.setdefault("cadence", "scrape")
    return Field(name=name, table="agent", kind=kind, unit=unit, help=help, source=source, encoding=encoding, **kw)  # type: ignore[arg-type]


def _count(name: str, kind: str, help: str, source: str, label: str) -> Field:
    """An agent figure that counts (rows, ticks, rejections): a whole number from 0."""
    return _agent(name, kind, "count", help, source, INT64, lo=0, hi=COUNT_MAX, prometheus=f"vgpumon_agent_{name}",
                  display="count", label=label)


def _share(direction: str) -> Field:
    word = {"tx": "sent", "rx": "received"}[direction]
    return _derived(
        f"pcie_{direction}_link_share_ratio", "derived", "ratio",
        f"PCIe bytes {word} per second over the capacity of the max link (device ∧ slot).",
        f"pcie_{direction}_bytes_per_second ÷ pcie_link_capacity_bytes_per_second", RATIO, lo=0,
        hi=SHARE_OF_LINK_MAX, prometheus=f"vgpumon_gpu_pcie_{direction}_link_share_ratio", label=f"PCIe {direction.upper()} share of link",
        note="the denominator is the max link, not the current one: an idle link down-trains (FACTS §2); "
        "may read up to 1.25, the counters include protocol overhead",
    )


DERIVED: tuple[Field, ...] = (
    _derived(
        "pcie_link_capacity_bytes_per_second", "derived", "bytes_per_second",
        "Capacity of one direction of the GPU's max PCIe link (device ∧ slot generation × width), after line coding.",
        "vgpumon.base.pcie.link_capacity_bytes_per_second(pcie_link_gen_max, pcie_link_width_max)", BYTES_PER_SECOND,
        cadence="static", lo=0, hi=_LINK_MAX, prometheus="vgpumon_gpu_pcie_link_capacity_bytes_per_second",
        label="PCIe link capacity", note="FACTS §3; TX and RX each have this capacity",
    ),
    _share("tx"),
    _share("rx"),
    _derived(
        "sample_age_seconds", "derived", "seconds",
        "Seconds since the agent received the newest tick (with this GPU's reading, or vgpumon_gpu_up 0 when it could not be read), on the agent's monotonic clock.",
        "the agent's clock at scrape − at the tick", SECONDS_US, lo=0, hi=COUNT_MAX / 1e6,
        prometheus="vgpumon_gpu_sample_age_seconds", label="sample age",
        note="older than 3 tick intervals: the GPU's readings are not served and vgpumon_gpu_up is 0",
    ),
    _derived(
        "memory_used_slope_bytes_per_second", "derived", "bytes_per_second",
        "Robust trend of the GPU's memory used (the rules engine's leak estimate).",
        "the rules engine (RulesFeed.memory_slopes), over stored rollups", BYTES_PER_SECOND,
        lo=-_GIB48, hi=_GIB48, prometheus="vgpumon_gpu_memory_used_slope_bytes_per_second", label="memory trend",
        note="served only while a rules engine feeds the exporter",
    ),
    _derived(
        "vllm_ready_timestamp_seconds", "derived", "seconds",
        "When the vLLM server's current start first answered /health 200 (end of its prewarm), epoch seconds.",
        "the state machine's ready time (vllm_instances.ready)", SECONDS_MS, cadence="poll", lo=0, hi=_EPOCH_MAX,
        prometheus="vgpumon_vllm_ready_timestamp_seconds", label="ready since",
        note="absent while the server is starting; the prewarm rules' twins compare it with time()",
    ),
    _derived(
        "server_gpu_info", "info", "text", "One series per GPU that holds a process of the vLLM server (labels gpu, uuid).",
        "vLLM server process tree ∩ NVML compute processes", text(64), cadence="poll",
        prometheus="vgpumon_vllm_server_gpu_info", label="server GPUs",
        note="value 1; empty for a static --vllm-url target, whose processes the agent cannot see",
    ),
    _derived(
        "pcie_upstream_gpu_info", "info", "text",
        "One series per GPU below a PCIe switch or root port that two or more GPUs share (labels port, kind, gpu, uuid).",
        "PCIe topology from sysfs (vgpumon.sources.pcie_topology)", text(64), cadence="static",
        prometheus="vgpumon_pcie_upstream_gpu_info", label="GPUs below a shared port",
        note="value 1; join on uuid to sum the GPUs' PCIe rates per shared port",
    ),
    _derived(
        "pcie_upstream_link_capacity_bytes_per_second", "derived", "bytes_per_second",
        "Capacity of one direction of a shared upstream port's max link (label port).",
        "sysfs max_link_speed × max_link_width of the port", BYTES_PER_SECOND, cadence="static", lo=0, hi=_LINK_MAX,
        prometheus="vgpumon_pcie_upstream_link_capacity_bytes_per_second", label="upstream link capacity",
        note="absent for a host bridge, which has no link of its own",
    ),
    _derived(
        "kubernetes_holder_info", "info", "text",
        "One series per container the kubelet allocated the GPU to (labels namespace, pod, container).",
        "kubelet pod-resources List() (vgpumon.sources.kubernetes)", text(64), cadence="kubelet",
        prometheus="vgpumon_gpu_kubernetes_holder_info", label="GPU holders",
        note="value 1; a GPU shared by several containers has no owner labels on its readings, "
        "only these (docs/kubernetes.md)",
    ),
    _derived(
        "kubernetes_holders", "gauge", "count", "Containers the kubelet allocated the GPU to.",
        "kubelet pod-resources List() (vgpumon.sources.kubernetes)", INT64, cadence="kubelet", lo=0, hi=2**16,
        prometheus="vgpumon_gpu_kubernetes_holders", display="count", label="GPU holder count",
        note="above 1: time-slicing, MPS or a finished pod still listed",
    ),
    _derived(
        "alerts", "state", "bool",
        "One series per pending or firing alert of the agent's rules engine (labels alertname, severity, state).",
        "the rules engine (RulesFeed.alerts)", BOOL, cadence="rules", lo=0, hi=1, prometheus="vgpumon_alerts",
        label="alerts", note="value 1; a resolved alert has no series (docs/exporter.md)",
    ),
    _derived(
        "collector_fault", "flag", "bool",
        "1 while the collector withholds the GPU's readings it found false (GPM PCIe against nvmlDeviceGetPcieThroughput).",
        "GpuSample.missing reasons 'collector fault: …' (vgpumon.sources.nvml.crosscheck)", BOOL, lo=0, hi=1,
        prometheus="vgpumon_gpu_collector_fault", display="yes_no", label="collector fault",
        note="absent while the GPU is not readable; VgpumonCollectorFault fires on it (docs/rules.md)",
    ),
    _derived(
        "rule_unknown", "state", "bool",
        "One series per rule and subject the agent's rules engine cannot judge (labels rule, severity, reason).",
        "the rules engine (RulesFeed.unknown)", BOOL, cadence="rules", lo=0, hi=1, prometheus="vgpumon_rule_unknown",
        label="rules that cannot judge",
        note="value 1; reason is a code: not_applicable, not_reported, no_data, warming_up, rule_failed, other (docs/rules.md)",
    ),
)

AGENT: tuple[Field, ...] = (
    _agent(
        "version", "info", "text", "vgpumon version of the agent.", "vgpumon.__version__", text(32),
        cadence="static", prom_label="version", label="version",
    ),
    _agent(
        "source_up", "flag", "bool", "1 when the source's last collection answered (label source).",
        "SourceStatus.up of nvml, host, vllm and kubernetes", BOOL, lo=0, hi=1, prometheus="vgpumon_agent_source_up",
        display="up_down", label="source up",
    ),
    _agent(
        "source_collect_duration_seconds", "gauge", "seconds", "Wall time of the source's last collection.",
        "SourceStatus.collect_seconds", SECONDS_US, lo=0, hi=86400.0,
        prometheus="vgpumon_agent_source_collect_duration_seconds", label="collect duration",
    ),
    _agent(
        "source_last_success_timestamp_seconds", "gauge", "seconds",
        "When the source last answered (seconds since the epoch; in a replay, the wall time its tick was taken in).",
        "SourceStatus.last_success_ts", SECONDS_MS, lo=0, hi=_EPOCH_MAX,
        prometheus="vgpumon_agent_source_last_success_timestamp_seconds", label="last success",
    ),
    _count("rejected_values_total", "counter", "Values refused at the door as impossible since the agent started (labels source, field).",
           "SourceStatus.rejected (catalogue.Door)", "rejected values"),
    _count("backlog_rows", "gauge", "Rows waiting for the store (label where: spool or memory).",
           "Backlog.spooled_rows, Backlog.memory_rows", "backlog"),
    _count("gpu_rows_written_total", "counter", "GPU rows the store committed since the agent started.",
           "AgentStats.rows_written", "GPU rows written"),
    _count("rows_folded_total", "counter", "Raw ticks kept only as 1-minute rollups because a backlog bound was reached.",
           "Backlog.folded_rows", "rows folded"),
    _count("store_outages_total", "counter", "Times the store became unreachable since the agent started.",
           "AgentStats.outages", "store outages"),
    _count("ticks_total", "counter", "Ticks sampled since the agent started.", "AgentStats.ticks", "ticks"),
    _count("ticks_skipped_total", "counter",
           "Tick slots left without a tick because the tick before ran past them (a call slow but within its "
           "deadline, a starved host) since the agent started.", "AgentStats.ticks_skipped", "ticks skipped"),
    _count("store_stalls_total", "counter",
           "Times a store call went the store deadline without an answer and the agent closed the store's "
           "connections (a database that accepts and never answers) since the agent started.",
           "AgentStats.store_stalls", "store stalls"),
    _count("dead_letters_total", "counter",
           "Rows the store refused for what they hold, set aside in the dead-letter file beside the spool "
           "instead of stored, since the agent started.", "AgentStats.dead_letters", "dead letters"),
    _count("http_connections_closed_total", "counter",
           "Connections the agent's HTTP server closed unanswered since the agent started (label reason: "
           "limit, max_connections were open; header_deadline, a request's headers not complete within "
           "header_timeout; idle, a keep-alive connection unused for keepalive_timeout).",
           "the HTTP server's door (vgpumon.exporter.server)", "HTTP connections closed"),
)
