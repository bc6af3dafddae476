"""The shape of the on-call report: what ``build_report`` returns, ``--json`` prints, the agent's
``/api/v1/diagnose`` serves, ``fetch_report`` reads back and ``vgpumon.diagnose.render`` prints.

TypedDicts, not classes: the report is JSON (a dict on every side of the wire), and a TypedDict
is that dict, checked by mypy wherever a key is read or written. docs/diagnose.md ("The JSON")
says what each key means; this module is where the keys and their types are decided. A key that
only some reports carry is in a ``total=False`` part, with who adds it. Values are in base units;
``None`` is unknown, with the reason beside it (a GPU's ``unknown``, a finding's message).

Imports nothing of vgpumon: the remote client and the renderer use it without the store.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from vgpumon.model.report_parts import Link, LinkCapacity, Span  # shared with the other report

#: A report's (and its verdict's) status; the exit code follows it (0, 1, 2, 3).
Status = Literal["ok", "warning", "critical", "unknown"]
#: A health area's status, as DCGM's health watches report it.
HealthStatus = Literal["PASS", "WARN", "FAIL", "UNKNOWN", "N/A"]


# -- shared parts -------------------------------------------------------------------------------


# -- findings and verdict -----------------------------------------------------------------------


class GpuRef(TypedDict):
    """The GPU a finding is about."""

    index: int
    uuid: str
    serial: str | None
    pci_bus_id: str | None
    name: str | None


class XidWords(TypedDict):
    """An XID code with our table's words for it (``vgpumon.catalogue.xid``)."""

    code: int
    mnemonic: str
    meaning: str
    bucket: str
    action: str
    by_application: bool


class FindingXid(XidWords):
    """One XID code of an XID alert's finding: our table's words and its events in the look-back."""

    count: int
    times: list[str]
    first_ts: float
    last_ts: float


class _Finding(TypedDict):
    severity: str  # critical, warning, unknown or info
    state: str | None  # the alert's (pending, firing); None for diagnose's own
    alert: str | None  # the rule's name; None for diagnose's own
    gpu: GpuRef | None
    subject: dict[str, str]
    summary: str
    message: str
    headline: str
    since: str | None
    since_ts: float | None
    since_exact: bool
    meaning: str | None
    next_step: str | None
    runbook_url: str | None
    xids: list[FindingXid] | None


class FindingKvOffload(TypedDict):
    """The part of a GPU's PCIe traffic that vLLM's KV offload moved over the window (means)."""

    servers: list[str]  # host:port
    split: int  # the most GPUs one server's traffic was split across (evenly)
    load_bytes_per_second: float  # offload medium → GPU: part of its RX
    store_bytes_per_second: float  # GPU → medium: part of its TX
    rx_share: float | None  # of the GPU's mean RX over the window
    tx_share: float | None  # of its mean TX


class Finding(_Finding, total=False):
    """One finding: a pending or firing alert of the rules, or an observation of diagnose's own."""

    kind: str  # diagnose's own findings only: no_data, no_samples, stale, unreadable_now, ...
    kv_offload: FindingKvOffload  # PCIe findings of a GPU a vLLM server offloads KV through


class Earlier(TypedDict):
    """A stored episode that overlapped the window and is not open now (the headline names it)."""

    name: str
    severity: str
    gpu: int | None
    fired_at: float
    resolved_at: float | None
    open_at_last_evaluation: bool


class _Verdict(TypedDict):
    status: Status
    counts: dict[str, int]  # severity -> findings
    reasons: list[Finding]  # at most three, most severe first


class Verdict(_Verdict, total=False):
    """The verdict and its top reasons."""

    earlier: list[Earlier]  # every report ``build_report`` finishes; not a stand-in's


# -- alerts -------------------------------------------------------------------------------------


class AlertRecord(TypedDict):
    """An alert as ``Alert.as_dict`` writes it (the webhook sink sends the same)."""

    name: str
    severity: str
    state: str
    labels: dict[str, str]
    summary: str
    description: str
    runbook_url: str
    value: float | None
    active_since: float
    fired_at: float | None
    resolved_at: float | None
    fingerprint: str


class AlertEpisode(AlertRecord):
    """A stored episode of the look-back that is not open at the window's end."""

    gpu: int | None
    open_at_last_evaluation: bool
    last_evaluated_at: float | None


class RuleUnknown(TypedDict):
    """A rule that could not judge a subject that is not one GPU (inputs absent)."""

    rule: str
    labels: dict[str, str]
    reason: str | None


# -- one GPU ------------------------------------------------------------------------------------


class Readable(TypedDict):
    now: bool
    since: float | None  # the first unreadable tick
    reason: str | None


class SmActivity(TypedDict):
    source: str | None  # "gpm", or None on GPUs without GPM
    mean_ratio: float | None
    max_ratio: float | None


class Ratios(TypedDict):
    mean_ratio: float | None
    max_ratio: float | None


class GpuMemory(TypedDict):
    used_last_bytes: float | None
    used_max_bytes: float | None
    reserved_last_bytes: float | None
    total_bytes: float | None
    used_last_ratio: float | None


class PcieDirection(TypedDict):
    mean_bytes_per_second: float | None
    max_bytes_per_second: float | None
    mean_share_of_max_link: float | None
    max_share_of_max_link: float | None


class PcieHopEntry(TypedDict):
    """One hop of a GPU's PCIe path (GPU first), with the other GPUs below it."""

    bdf: str
    kind: str  # gpu, bridge, root, host_bridge
    link_current: Link
    link_max: Link
    capacity_bytes_per_second: float | None
    shared_with_gpus: list[int]


class GpuPcie(TypedDict):
    link_max: LinkCapacity
    link_current: Link
    gpu_max_generation: int | None
    path: list[PcieHopEntry]
    tx: PcieDirection
    rx: PcieDirection


class Ecc(TypedDict):
    corrected_volatile: float | None
    uncorrected_volatile: float | None
    corrected_aggregate: float | None
    uncorrected_aggregate: float | None


class Temperature(TypedDict):
    mean_celsius: float | None
    max_celsius: float | None


class Power(TypedDict):
    mean_watts: float | None
    max_watts: float | None


class SmClock(TypedDict):
    mean_hertz: float | None
    max_hertz: float | None


class RemappedRows(TypedDict):
    uncorrectable: float | None
    pending: bool | None
    failure: bool | None


class Rejected(TypedDict):
    """A field whose values were refused at the door in the window."""

    count: int
    reason: str


class AreaHealth(TypedDict):
    status: HealthStatus
    rules: dict[str, str]  # rule -> the GPU's state at the window's end
    reason: str | None  # why UNKNOWN (or N/A)


class GpuBlock(TypedDict):
    """One GPU's figures over the window, its health per area and its findings."""

    index: int
    uuid: str
    name: str | None
    serial: str | None
    pci_bus_id: str | None
    samples: int
    up_samples: int
    readable: Readable
    sm_active: SmActivity
    utilization: Ratios
    sm_occupancy: Ratios
    memory: GpuMemory
    pcie: GpuPcie
    ecc: Ecc
    temperature: Temperature
    power: Power
    sm_clock: SmClock
    remapped_rows: RemappedRows
    rejected: dict[str, Rejected]
    findings: list[Finding]
    unknown: dict[str, str]  # "<field>.<stat>" -> why it is None
    xid_counts: dict[str, int]  # XID code (as text, a JSON key) -> events in the window
    rules_unknown: dict[str, str]  # rule -> why it could not judge this GPU
    rules_not_applicable: dict[str, str]  # rule -> why it does not apply to this GPU (no GPM, no ECC)
    health: dict[str, AreaHealth]  # area (HEALTH_AREAS) -> its health


# -- around the GPUs ----------------------------------------------------------------------------


class _StackDump(TypedDict):
    pid: int


class StackDump(_StackDump, total=False):
    """A py-spy dump of one process: its ``text``, or one line saying why there is none."""

    text: str
    error: str
    role: str  # added by the agent: "api server" or "engine"


class _VllmServer(TypedDict):
    url: str
    server: str  # host:port, as the rules label it
    model: str | None
    version: str | None
    pid: int | None
    state: str | None
    reason: str | None
    state_since: str | None
    ended: str | None
    prewarm_seconds: float | None
    prewarm_gpu_active_ratio: float | None
    running: float | None
    waiting: float | None
    kv_cache_usage_ratio: float | None
    kv_fragmentation_ratio: float | None
    kv_fragmentation_mean_ratio: float | None
    kv_block_size: int | None
    energy_per_token_joules: float | None  # its GPUs' energy per generated token, newest interval
    energy_interval_joules: float | None  # the energy charged to it over that interval
    energy_per_token_note: str | None  # why there is none, or how shared GPUs were split
    telemetry: str | None
    gpus: list[int]
    gpu_uuids: list[str]  # GPUs this host no longer has
    newest_poll: str | None
    newest_poll_ts: float | None


class SloFigure(TypedDict):
    """A server's newest attainment figure of one SLO (``vgpumon.sources.vllm.slo``)."""

    target_seconds: float  # the rules' vllm_slo_ttft_seconds / vllm_slo_itl_seconds
    objective_ratio: float
    attainment_ratio: float | None  # None: no observation in the window
    observations: float | None
    interpolated: bool  # the target lies between bucket bounds
    below_objective: bool


class VllmSignals(TypedDict):
    """A server's serving signals over its recent polls (``VLLM_RECENT_SECONDS``); ``None`` where
    the server reported none (docs/diagnose.md, "vLLM servers")."""

    slo_window_seconds: float
    ttft: SloFigure
    itl: SloFigure
    prefix_cache_hit_ratio: float | None  # mean over the polls with a figure
    prefix_cache_unit: str | None  # tokens or blocks
    preemptions: float | None  # counted over the recent polls (rate × interval)
    preemptions_per_second_max: float | None
    spec_decode_acceptance_ratio: float | None  # mean over the polls with drafts
    kv_offload_load_bytes_per_second: float | None  # mean: offload medium → GPUs
    kv_offload_store_bytes_per_second: float | None  # mean: GPUs → medium
    lmcache_retrieve_hit_ratio: float | None  # mean over the polls with a retrieve
    lmcache_lookup_hit_ratio: float | None  # mean over the polls with a lookup
    lmcache_local_cache_usage_bytes: float | None  # the newest poll's
    polls: int


class VllmServer(_VllmServer, total=False):
    """A vLLM server seen in the look-back (its newest start and newest poll)."""

    signals: VllmSignals  # the builder adds them; absent in a report from an older agent

    stacks: list[StackDump]  # the agent, asked for stacks
    stacks_note: str  # the agent: why this server has no stacks


class _Process(TypedDict):
    gpu: int
    pid: int
    name: str | None
    cmdline: str | None
    username: str | None
    container_id: str | None
    pod: str | None  # the agent fills it in (Kubernetes owners are not stored)
    used_gpu_memory_bytes: int | None
    rss_bytes: int | None
    resolved: bool
    ts: str


class Process(_Process, total=False):
    """A process holding GPU memory at the window's newest process sample."""

    pod_note: str | None  # the agent: why the owner is not known


class PciePeak(TypedDict):
    direction: str  # tx or rx
    bytes_per_second: float
    share_of_max_link: float | None
    at: str
    at_ts: float


class GpuTrend(TypedDict):
    index: int
    memory_used_bytes: list[float | None]
    memory_total_bytes: int | None
    memory_slope_bytes_per_second: float | None
    pcie_tx_p95_bytes_per_second: list[float | None]
    pcie_rx_p95_bytes_per_second: list[float | None]
    pcie_capacity_bytes_per_second: float | None
    pcie_peak: PciePeak | None


class Trends(TypedDict):
    """Memory and PCIe p95 per GPU over the look-back, one bucket a sparkline character."""

    source: Literal["raw", "rollups"]
    start: str
    start_ts: float
    end: str
    bucket_seconds: float
    gpus: list[GpuTrend]


class SourceAge(TypedDict):
    newest: str | None
    age_seconds: float | None


class AgentClock(TypedDict):
    last_tick_age_seconds: float | None
    fresh: bool


class _Freshness(TypedDict):
    now: str
    newest_sample: str
    age_seconds: float
    max_age_seconds: float | None
    stale: bool
    sources: dict[str, SourceAge]  # gpu_samples, host_samples, vllm, rollups


class Freshness(_Freshness, total=False):
    """How old each source's newest data is."""

    agent: AgentClock  # the agent's API: its newest tick on its own clock


class XidEventEntry(TypedDict):
    gpu: int | None
    at: str
    ts: float


class XidEntry(XidWords):
    """One XID code of the look-back: our table's words and each event."""

    events: list[XidEventEntry]


class Evaluation(TypedDict):
    """Whose verdicts the report shows: ``agent`` when the store holds the agent's alert rows for
    the host (the stored lifecycle: start times, episodes, open at its last evaluation), else
    ``diagnose``: no agent evaluated, so diagnose's own evaluation of the stored window fills in."""

    by: Literal["agent", "diagnose"]
    alert_rows: int
    agent_last_evaluation: str | None  # ISO 8601 UTC; None without alert rows
    note: str


class Source(TypedDict):
    """Where ``vgpumon diagnose`` got the report: its agent, its agent refusing (the report is
    the refusal), or the store."""

    kind: Literal["agent", "refused", "store", "prometheus"]
    where: str


class PrometheusSource(TypedDict):
    """How a report from ``--prometheus`` read its series (``vgpumon.store.prometheus_source``)."""

    url: str
    start: float
    end: float
    step_seconds: float | None  # None: every scraped sample was read
    resolution: str
    notes: list[str]  # what this source cannot say that a store would
    requests: int


# -- the report ---------------------------------------------------------------------------------


class _Report(TypedDict):
    host: str
    status: Status
    verdict: Verdict
    window: Span | None  # None: no data (the report is its verdict)
    gpus: list[GpuBlock]
    findings: list[Finding]  # most severe first
    vllm: list[VllmServer]
    processes: list[Process]
    trends: Trends | None
    freshness: Freshness | None
    alerts: list[AlertRecord]  # pending and firing at the window's end
    alert_history: list[AlertEpisode]
    xids: list[XidEntry]
    rules_unknown: list[RuleUnknown]


class Report(_Report, total=False):
    """The on-call report of one host. Keys in JSON order: the required ones, then these as
    they are added."""

    lookback: Span  # a report with data
    rules_not_applicable: list[RuleUnknown]  # host-level subjects a rule does not apply to
    evaluation: Evaluation  # a report with data
    newest_sample_age_seconds: float  # a report with data
    store_note: str  # the CLI: how the store was read
    source: Source  # the CLI
    source_note: str  # the CLI: the agent did not answer, the store did; or what --prometheus cannot say
    prometheus: PrometheusSource  # the CLI: --prometheus
    stacks_note: str  # why there are no stacks (the agent, or the CLI for a store's report)
