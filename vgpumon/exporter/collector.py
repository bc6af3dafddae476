"""``/metrics`` content: every catalogue field of the newest snapshot, under its Prometheus name.

Nothing here calls NVML, the kubelet or a vLLM server: ``observe`` keeps each tick's snapshot (the
agent calls it as it takes each tick, on its sampling thread), and a scrape renders what is kept
(STYLE §6).

What a scrape serves, and why (docs/exporter.md has the full label policy):

* **Absent is absent.** A ``None`` reading has no sample, never 0. A GPU that could not be read
  this tick (``up`` false) is served as ``vgpumon_gpu_up 0`` with its identity and nothing else.
* **Not fresh is not served.** When the newest tick is older than ``stale_after_intervals`` tick
  intervals (the NVML thread is wedged, the agent stalls), every GPU is served as down and the
  host's readings are left out; ``vgpumon_gpu_sample_age_seconds`` says how old the data is. A
  vLLM server whose newest poll is older than three poll intervals is left out likewise.
* **Slow fields keep their value between reads.** ECC, energy, BAR1, remapped rows … are read
  every ``slow_every`` ticks and are ``None`` on the ticks between (not read, not unknown): their
  newest read is served until the next one, so the series do not flicker (field by field: the
  energy counter is read on every sixth slow tick only). A slow field the GPU answered "not
  supported" (or a GPU going down) clears it.
* **Identity in ``_info`` gauges, few labels elsewhere.** Every GPU series carries ``hostname``,
  ``gpu`` (NVML index) and ``uuid`` (as dcgm-exporter, lower case), plus ``namespace``/``pod``/
  ``container`` when the kubelet names one owner; product name, serial, bus id are labels of
  ``vgpumon_gpu_info`` only.
* **XIDs are counted per code** (``vgpumon_gpu_xid_events_total{xid}``), the codes of
  ``catalogue.gpu.XID_NAMES`` from 0 so that ``increase()`` sees their first event.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from vgpumon import __version__, catalogue
from vgpumon.alerts.feed import ALERT_STATES, ALERT_SUBJECT_LABELS, RulesFeed
from vgpumon.base.listen import ExporterConfig
from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.catalogue.gpu import CLOCKS_EVENT_REASONS, XID_NAMES
from vgpumon.exporter.text import Family, Labels, metrics, render
from vgpumon.model import GpuIdentity, GpuSample, HostSample, ServerSample, ServerState, Snapshot, SourceStatus

if TYPE_CHECKING:
    from vgpumon.exporter.view import AgentView, VllmView
    from vgpumon.model import PcieTopology
    from vgpumon.store.spool import Backlog

_F = catalogue.get

# What each group of catalogue fields reads from, as (attribute, family, extra label or None).
# Built once from the catalogue, so a field added there with a Prometheus name is served here.
_Plan = tuple[tuple[str, str, "tuple[str, str] | None"], ...]
#: Fields not read every tick: ``/metrics`` serves each one's newest read.
_SLOW_CADENCES = ("slow", "minute")


def _plan(table: str | None, *, skip: Iterable[str] = (), slow: bool | None = None) -> _Plan:
    """``slow``: only the fields read less often than every tick (True), only the others (False)."""
    out = []
    for f in catalogue.fields_of(table):
        if f.prometheus is None or f.name in skip:
            continue
        if slow is not None and (f.cadence in _SLOW_CADENCES) != slow:
            continue
        extra = next(iter(f.prom_labels.items())) if f.prom_labels else None
        out.append((f.name, f.prometheus, extra))
    return tuple(out)


_GPU_SPECIAL = {"up", "clocks_event_reasons"}
_GPU_FAST = _plan("gpu_samples", skip=_GPU_SPECIAL, slow=False)
_GPU_SLOW = _plan("gpu_samples", skip=_GPU_SPECIAL, slow=True)
_SLOW_NAMES = tuple(f.name for f in catalogue.fields_of("gpu_samples") if f.cadence in _SLOW_CADENCES)
_IDENTITY = _plan("gpus")
_INFO_LABELS = tuple((f.name, f.prom_label) for f in catalogue.fields_of("gpus") if f.prom_label and f.name != "uuid")
_PROCESS = {f.name: f.prometheus for f in catalogue.fields_of("gpu_process_samples")}
_HOST = _plan("host_samples")
_VLLM = _plan("vllm_samples", skip={"state", "telemetry_up", "telemetry", "latency_unreliable"})
_TELEMETRY = _F("vllm_samples", "telemetry")
_UNRELIABLE = _F("vllm_samples", "latency_unreliable")
#: latency percentile fields per histogram (``ttft`` → its p50/p95/p99 fields)
_LATENCY_FIELDS = {
    h: frozenset(name for name, _, _ in _VLLM if name.startswith(f"{h}_p")) for h in (_UNRELIABLE.decode or {}).values()
}
_ENGINE = _plan("vllm_engine_samples")
_INSTANCE = _plan("vllm_instances")
_FAMILIES = catalogue.families()

GPU_INFO = catalogue.INFO_METRICS["gpus"]
SERVER_INFO = catalogue.INFO_METRICS["vllm_instances"]
BUILD_INFO = catalogue.INFO_METRICS["agent"]
_GPU_UP = _F("gpu_samples", "up").prometheus
_REASONS = _F("gpu_samples", "clocks_event_reasons").prometheus
_XID = _F("xid_events", "xid").prometheus
_STATE = _F("vllm_samples", "state").prometheus
_TELEMETRY_UP = _F("vllm_samples", "telemetry_up").prometheus
_CAPACITY = _F("exporter", "pcie_link_capacity_bytes_per_second").prometheus
_SHARE = {d: _F("exporter", f"pcie_{d}_link_share_ratio").prometheus for d in ("tx", "rx")}
_AGE = _F("exporter", "sample_age_seconds").prometheus
_SLOPE = _F("exporter", "memory_used_slope_bytes_per_second").prometheus
_SERVER_GPU = _F("exporter", "server_gpu_info").prometheus
_READY = _F("exporter", "vllm_ready_timestamp_seconds").prometheus
_UPSTREAM_GPU = _F("exporter", "pcie_upstream_gpu_info").prometheus
_UPSTREAM_CAPACITY = _F("exporter", "pcie_upstream_link_capacity_bytes_per_second").prometheus
_HOLDER = _F("exporter", "kubernetes_holder_info").prometheus
_HOLDERS = _F("exporter", "kubernetes_holders").prometheus
_ALERTS = _F("exporter", "alerts").prometheus
_SOURCE_UP = _F("agent", "source_up").prometheus
_SOURCE_DURATION = _F("agent", "source_collect_duration_seconds").prometheus
_SOURCE_SUCCESS = _F("agent", "source_last_success_timestamp_seconds").prometheus
_REJECTED = _F("agent", "rejected_values_total").prometheus
_BACKLOG = _F("agent", "backlog_rows").prometheus
_ROWS_WRITTEN = _F("agent", "gpu_rows_written_total").prometheus
_ROWS_FOLDED = _F("agent", "rows_folded_total").prometheus
_OUTAGES = _F("agent", "store_outages_total").prometheus
_TICKS = _F("agent", "ticks_total").prometheus
#: (family, AgentStats attribute) of the agent's counters
_STATS = (
    (_ROWS_WRITTEN, "rows_written"), (_OUTAGES, "outages"), (_TICKS, "ticks"),
    (_F("agent", "ticks_skipped_total").prometheus, "ticks_skipped"),
    (_F("agent", "store_stalls_total").prometheus, "store_stalls"),
    (_F("agent", "dead_letters_total").prometheus, "dead_letters"),
)

#: Every label name ``/metrics`` uses, and what it names. Identity only: a label whose value
#: changed with a reading would start a new series every scrape (FACTS §7). A series has at most
#: 8 of them, so that with Prometheus' ``job`` and ``instance`` it stays within 10.
LABEL_NAMES: dict[str, str] = {
    "hostname": "the host's store identity (--hostname), on every series",
    "gpu": "NVML index of the GPU, as a string (as dcgm-exporter)",
    "uuid": "GPU UUID",
    "name": "product name (vgpumon_gpu_info)",
    "serial": "board serial (vgpumon_gpu_info)",
    "pci_bus_id": "PCI bus id (vgpumon_gpu_info)",
    "gpm_supported": "true/false (vgpumon_gpu_info)",
    "namespace": "Kubernetes namespace of the GPU's or process's one owner",
    "pod": "Kubernetes pod of the owner",
    "container": "Kubernetes container of the owner",
    "pid": "host PID of a GPU process",
    "command": "process name (psutil) of a GPU process",
    "xid": "XID code",
    "reason": "clocks-event reason, decoded",
    "server": "vLLM server address host:port",
    "model_name": "served model (vLLM's own label name)",
    "engine": "vLLM data-parallel engine (vLLM's own label name)",
    "version": "vLLM or vgpumon version (info gauges)",
    "state": "vLLM server state, or alert state (pending, firing)",
    "percentile": "50, 95 or 99 (latency estimates over the poll interval)",
    "telemetry": "full, limited, partial or down: how much of a vLLM server's /metrics was read",
    "histogram": "ttft, itl, e2e or queue: the vLLM latency histogram a flag is about",
    "port": "PCI address of a shared PCIe switch or root port",
    "kind": "bridge, root or host_bridge (the shared port's kind)",
    "alertname": "rule name (CamelCase)",
    "severity": "critical, warning or info",
    "source": "agent source: nvml, host, vllm, kubernetes",
    "field": "catalogue field whose values were rejected",
    "where": "spool or memory (backlog)",
}
MAX_LABELS = 8

_XID_CODES = tuple(sorted(XID_NAMES))
_REASON_BITS = tuple(sorted(CLOCKS_EVENT_REASONS.items()))
_STATES = tuple(s.value for s in ServerState)
_CACHE_MAX = 4096  # label sets kept across scrapes; identities change rarely, so this is a guard


class MetricsExporter(Collector):
    """A prometheus-client collector over the agent's newest snapshot, and the text it serves.

    Args:
        hostname: the ``hostname`` label (the host's store identity).
        interval: seconds between ticks; with ``config.stale_after_intervals`` it decides when
            a GPU's newest reading is too old to serve.
        config: listen address, selection file, staleness (``ExporterConfig``).
        selection: family names to serve; ``None`` serves every family of the catalogue.
        vllm: the vLLM source; its ``servers`` are read at each scrape.
        host_source: the host source, for its rejected-value counts.
        rules: the rules engine's feed (``RulesFeed``): alerts and memory slopes.
        stats: the agent's ``AgentStats`` (ticks, rows written, store outages).
        backlog: the agent's ``Backlog`` (spool depth).
        topology: returns the host's PCIe topology, or ``None`` when it was not read.
        monotonic: the clock that ages ticks (the agent's).
    """

    def __init__(
        self,
        *,
        hostname: str,
        interval: float = 1.0,
        config: ExporterConfig | None = None,
        selection: frozenset[str] | None = None,
        vllm: "VllmView | None" = None,
        host_source: Any = None,
        rules: RulesFeed | None = None,
        stats: Any = None,
        backlog: "Backlog | None" = None,
        topology: Callable[[], "PcieTopology | None"] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hostname = hostname
        self.interval = interval
        self.config = config or ExporterConfig()
        self.selection = selection
        self.vllm = vllm
        self.host_source = host_source
        self.rules = rules
        self.stats = stats
        self.backlog = backlog
        self.topology = topology
        self.monotonic = monotonic
        self._order = [n for n in _FAMILIES if selection is None or n in selection]
        self._snap: Snapshot | None = None
        self._received = 0.0
        self._host: HostSample | None = None
        self._slow: dict[str, dict[str, Any]] = {}
        self._labels: dict[tuple[Any, ...], Labels] = {}
        self._host_labels = Labels((("hostname", hostname),))

    @classmethod
    def for_agent(
        cls,
        agent: "AgentView",
        config: ExporterConfig | None = None,
        *,
        selection: frozenset[str] | None = None,
        rules: RulesFeed | None = None,
    ) -> "MetricsExporter":
        """An exporter over ``agent``: it observes every tick (one of the agent's ``observers``,
        called on the thread that takes the tick) and reads the agent's sources, stats, backlog
        and topology at scrape time."""
        exporter = cls(
            hostname=agent.hostname, interval=agent.interval, config=config, selection=selection, vllm=agent.vllm,
            host_source=agent.host, rules=rules, stats=agent.stats, backlog=agent.backlog,
            topology=lambda: agent.topology, monotonic=agent.monotonic,
        )
        agent.observers.append(exporter.observe)
        return exporter

    # -- each tick -------------------------------------------------------------------------------

    def observe(self, snap: Snapshot) -> None:
        """Keep a tick's snapshot (once per tick, on the agent's sampling thread while a scrape
        may be rendering on the event loop: what a scrape reads is replaced whole, never changed
        in place)."""
        self._received = self.monotonic()
        if snap.host is not None:
            self._host = snap.host
        slow: dict[str, dict[str, Any]] | None = None
        for s in snap.samples:
            if not s.up:
                if s.uuid in self._slow:
                    slow = slow if slow is not None else dict(self._slow)
                    slow.pop(s.uuid, None)
            elif any(getattr(s, n) is not None or n in s.missing for n in _SLOW_NAMES):
                # field by field: a slow tick need not read every slow field (the minute set is
                # read once a minute); one it did not read keeps its newest read
                slow = slow if slow is not None else dict(self._slow)
                kept = dict(slow.get(s.uuid, {}))
                for n in _SLOW_NAMES:
                    value = getattr(s, n)
                    if value is not None:
                        kept[n] = value
                    elif n in s.missing:
                        kept.pop(n, None)
                slow[s.uuid] = kept
        if slow is not None:
            self._slow = slow
        self._snap = snap

    # -- each scrape -----------------------------------------------------------------------------

    def render(self) -> bytes:
        """``/metrics`` in the Prometheus text format 0.0.4."""
        return render(self.families())

    def collect(self) -> Iterator[Metric]:
        """prometheus-client's collector protocol: the same families as ``render``."""
        return metrics(self.families())

    def fresh(self) -> bool:
        """True when the newest tick is at most ``stale_after_intervals`` intervals old."""
        return self._snap is not None and self.age() <= self.config.stale_after_intervals * self.interval

    def age(self) -> float | None:
        """Seconds since the newest tick was observed; ``None`` before the first."""
        return None if self._snap is None else self.monotonic() - self._received

    def families(self) -> list[Family]:
        """Every selected family with this scrape's samples, in catalogue order."""
        fams = {name: Family(name, *_FAMILIES[name]) for name in self._order}
        if len(self._labels) > _CACHE_MAX:
            self._labels.clear()
        fresh = self.fresh()
        snap = self._snap
        if snap is not None:
            self._gpus(fams, snap, fresh)
            if fresh and self._host is not None:
                self._host_series(fams, self._host)
            self._topology(fams, snap)
        if self.vllm is not None:
            self._servers(fams, snap)
        if self.rules is not None:
            self._alerts(fams)
        self._agent(fams, snap, fresh)
        return list(fams.values())

    # -- GPUs ------------------------------------------------------------------------------------

    def _gpu_base(self, g: GpuIdentity, owner: Mapping[str, str]) -> Labels:
        key = ("gpu", g.index, g.uuid, tuple(owner.items()))
        labels = self._labels.get(key)
        if labels is None:
            labels = self._labels[key] = Labels((("hostname", self.hostname), ("gpu", str(g.index)), ("uuid", g.uuid), *owner.items()))
        return labels

    def _gpus(self, fams: dict[str, Family], snap: Snapshot, fresh: bool) -> None:
        k8s = snap.kubernetes
        now_age = self.age() or 0.0
        slopes = self.rules.memory_slopes() if self.rules is not None else {}
        host = self._host
        for g, s in zip(snap.gpus, snap.samples):
            attribution = k8s.gpus.get(g.uuid) if k8s is not None else None
            base = self._gpu_base(g, attribution.labels() if attribution is not None else {})
            plain = self._gpu_base(g, {})
            if (fam := fams.get(GPU_INFO)) is not None:
                info = self._labels.get(("info", g))
                if info is None:
                    extra = [(label, _label_value(getattr(g, name))) for name, label in _INFO_LABELS if getattr(g, name) is not None]
                    info = self._labels[("info", g)] = Labels((*plain.items, *extra))
                fam.add(info, 1.0)
            _add_values(fams, base, g, _IDENTITY)
            capacity = link_capacity_bytes_per_second(g.pcie_link_gen_max, g.pcie_link_width_max)
            if capacity is not None and (fam := fams.get(_CAPACITY)) is not None:
                fam.add(base, capacity)
            if (fam := fams.get(_XID)) is not None:
                counts = s.xid_counts
                codes = _XID_CODES if not counts else sorted({*_XID_CODES, *counts})
                for code in codes:
                    fam.add(base.plus("xid", str(code)), float(counts.get(code, 0)))
            if attribution is not None and attribution.holders:
                if (fam := fams.get(_HOLDER)) is not None:
                    for holder in attribution.holders:
                        fam.add(self._holder_labels(plain, holder.labels()), 1.0)
                if (fam := fams.get(_HOLDERS)) is not None:
                    fam.add(plain, float(len(attribution.holders)))
            up = fresh and s.up
            if (fam := fams.get(_GPU_UP)) is not None:
                fam.add(base, 1.0 if up else 0.0)
            if (fam := fams.get(_AGE)) is not None:
                fam.add(base, now_age)
            if not up:
                continue
            _add_values(fams, base, s, _GPU_FAST)
            slow = self._slow.get(g.uuid)
            if slow is not None:
                _add_values(fams, base, slow, _GPU_SLOW)
            reasons = s.clocks_event_reasons
            if reasons is not None and (fam := fams.get(_REASONS)) is not None:
                for bit, name in _REASON_BITS:
                    fam.add(base.plus("reason", name), 1.0 if reasons & bit else 0.0)
            if capacity:
                for d, rate in (("tx", s.pcie_tx_bytes_per_second), ("rx", s.pcie_rx_bytes_per_second)):
                    if rate is not None and (fam := fams.get(_SHARE[d])) is not None:
                        fam.add(base, rate / capacity)
            slope = slopes.get(g.uuid)
            if slope is not None and (fam := fams.get(_SLOPE)) is not None:
                fam.add(base, slope)
            if s.processes:
                self._processes(fams, snap, g, s, plain, host)

    def _holder_labels(self, plain: Labels, owner: Mapping[str, str]) -> Labels:
        key = ("holder", plain.items, tuple(owner.items()))
        labels = self._labels.get(key)
        if labels is None:
            labels = self._labels[key] = Labels((*plain.items, *owner.items()))
        return labels

    def _processes(
        self, fams: dict[str, Family], snap: Snapshot, g: GpuIdentity, s: GpuSample, plain: Labels, host: HostSample | None
    ) -> None:
        k8s = snap.kubernetes
        procs = host.processes if host is not None else {}
        used_fam = fams.get(_PROCESS["used_gpu_memory_bytes"])
        rss_fam = fams.get(_PROCESS["rss_bytes"])
        cpu_fam = fams.get(_PROCESS["cpu_seconds_total"])
        for pid, used in s.processes:
            info = procs.get(pid)
            pa = k8s.processes.get((g.uuid, pid)) if k8s is not None else None
            owner = pa.labels() if pa is not None else {}
            command = info.name if info is not None and info.name else None
            key = ("proc", plain.items, pid, command, tuple(owner.items()))
            labels = self._labels.get(key)
            if labels is None:
                extra = [("pid", str(pid))] + ([("command", command)] if command else [])
                labels = self._labels[key] = Labels((*plain.items, *extra, *owner.items()))
            if used is not None and used_fam is not None:
                used_fam.add(labels, float(used))
            if info is not None:
                if info.rss_bytes is not None and rss_fam is not None:
                    rss_fam.add(labels, float(info.rss_bytes))
                if info.cpu_seconds_total is not None and cpu_fam is not None:
                    cpu_fam.add(labels, info.cpu_seconds_total)

    def _host_series(self, fams: dict[str, Family], host: HostSample) -> None:
        _add_values(fams, self._host_labels, host, _HOST)

    def _topology(self, fams: dict[str, Family], snap: Snapshot) -> None:
        topo = self.topology()
        if topo is None:
            return
        index = {g.uuid: g.index for g in snap.gpus}
        gpu_fam, cap_fam = fams.get(_UPSTREAM_GPU), fams.get(_UPSTREAM_CAPACITY)
        for bdf, uuids in sorted(topo.shared().items()):
            hop = topo.hop(bdf)
            port = self._host_labels.plus("port", bdf)
            if cap_fam is not None and hop is not None:
                capacity = link_capacity_bytes_per_second(hop.link_gen_max, hop.link_width_max)
                if capacity is not None:
                    cap_fam.add(port, capacity)
            if gpu_fam is not None:
                kind = hop.kind if hop is not None else "bridge"
                for uuid in uuids:
                    if uuid in index:
                        gpu_fam.add(
                            self._cached(("up", bdf, uuid), lambda: Labels((*port.items, ("kind", kind), ("gpu", str(index[uuid])), ("uuid", uuid)))),  # noqa: B023  the factory runs at once, inside this iteration (_cached)
                            1.0,
                        )

    # -- vLLM ------------------------------------------------------------------------------------

    def _server_base(self, smp: ServerSample) -> Labels:
        model = smp.model_names[0] if smp.model_names else ""
        server = f"{smp.instance.host}:{smp.instance.port}"
        return self._cached(
            ("server", server, model),
            lambda: Labels((("hostname", self.hostname), ("server", server), *((("model_name", model),) if model else ()))),
        )

    def _engine_labels(self, base: Labels, model: str | None, engine: str | None) -> Labels:
        # an engine series names its own model (LoRA adapters share one server)
        def make() -> Labels:
            items = dict(base.items)
            if model:
                items["model_name"] = model
            if engine is not None:
                items["engine"] = engine
            return Labels(items.items())

        return self._cached(("engine", base.items, model, engine), make)

    def _servers(self, fams: dict[str, Family], snap: Snapshot | None) -> None:
        assert self.vllm is not None
        now = self.vllm.clock()
        too_old = 3 * self.vllm.interval
        index = {g.uuid: g.index for g in snap.gpus} if snap is not None else {}
        for smp in self.vllm.servers.values():
            if smp is None or now - smp.ts > too_old:
                continue
            base = self._server_base(smp)
            if (fam := fams.get(SERVER_INFO)) is not None:
                fam.add(base.plus("version", smp.version) if smp.version else base, 1.0)
            if (fam := fams.get(_STATE)) is not None:
                for state in _STATES:
                    fam.add(base.plus("state", state), 1.0 if smp.state.value == state else 0.0)
            if smp.telemetry is not None and (fam := fams.get(_TELEMETRY_UP)) is not None:
                fam.add(base, 0.0 if smp.telemetry == "down" else 1.0)
            if smp.telemetry is not None and (fam := fams.get(_TELEMETRY.prometheus)) is not None:  # type: ignore[arg-type]
                for value in (_TELEMETRY.decode or {}).values():
                    fam.add(base.plus("telemetry", value), 1.0 if smp.telemetry == value else 0.0)
            flagged = smp.latency_unreliable or {}
            if (fam := fams.get(_UNRELIABLE.prometheus)) is not None:  # type: ignore[arg-type]
                for histogram in (_UNRELIABLE.decode or {}).values():
                    fam.add(base.plus("histogram", histogram), 1.0 if histogram in flagged else 0.0)
            if flagged:
                # percentiles of a histogram that cannot be true are not served: a latency alert
                # must never fire from them (they are stored, flagged, with the reason)
                hidden = frozenset().union(*(_LATENCY_FIELDS.get(h, ()) for h in flagged))
                _add_values(fams, base, smp, tuple(p for p in _VLLM if p[0] not in hidden))
            else:
                _add_values(fams, base, smp, _VLLM)
            _add_values(fams, base, smp, _INSTANCE)
            for e in smp.engines:
                _add_values(fams, self._engine_labels(base, e.model_name, e.engine), e, _ENGINE)
            if smp.ready_ts is not None and (fam := fams.get(_READY)) is not None:
                fam.add(base, smp.ready_ts)
            if (fam := fams.get(_SERVER_GPU)) is not None:
                for uuid in smp.gpu_uuids:
                    gpu = index.get(uuid)
                    fam.add(
                        self._cached(
                            ("sgpu", base.items, uuid, gpu),
                            lambda: Labels((*base.items, ("uuid", uuid), *((("gpu", str(gpu)),) if gpu is not None else ()))),  # noqa: B023  the factory runs at once, inside this iteration (_cached)
                        ),
                        1.0,
                    )

    # -- rules, agent ----------------------------------------------------------------------------

    def _alerts(self, fams: dict[str, Family]) -> None:
        assert self.rules is not None
        fam = fams.get(_ALERTS)
        if fam is None:
            return
        for a in self.rules.alerts():
            if a.state not in ALERT_STATES:
                continue
            subject = tuple((k, str(a.labels[k])) for k in ALERT_SUBJECT_LABELS if a.labels.get(k) is not None)
            fam.add(
                self._cached(
                    ("alert", a.alertname, a.severity, a.state, subject),
                    lambda: Labels(
                        (("hostname", self.hostname), ("alertname", a.alertname), ("severity", a.severity), ("state", a.state), *subject)  # noqa: B023  the factory runs at once, inside this iteration (_cached)
                    ),
                ),
                1.0,
            )

    def statuses(self, snap: Snapshot | None = None, fresh: bool | None = None) -> list[SourceStatus]:
        """Each source's status as served: those the snapshot carries (NVML's, the kubelet's),
        down when the ticks stopped; the host's and vLLM's from their newest samples."""
        snap = self._snap if snap is None else snap
        fresh = self.fresh() if fresh is None else fresh
        out: list[SourceStatus] = []
        if snap is not None:
            for st in snap.sources:
                out.append(st if fresh else SourceStatus(st.name, False, st.last_success_ts, st.collect_seconds, st.rejected, "no tick"))
        if self.host_source is not None:
            h = self._host
            rejected = dict(getattr(self.host_source, "rejected", {}))
            out.append(SourceStatus("host", fresh and h is not None, h.ts if h is not None else None, float("nan"), rejected))
        if self.vllm is not None:
            now, too_old = self.vllm.clock(), 3 * self.vllm.interval
            samples = [s for s in self.vllm.servers.values() if s is not None]
            recent = [s for s in samples if now - s.ts <= too_old]
            last = max((s.ts for s in samples), default=None)
            duration = max((s.scrape_seconds for s in recent if s.scrape_seconds is not None), default=float("nan"))
            out.append(SourceStatus("vllm", bool(recent) or not samples, last, duration))
        return out

    def _agent(self, fams: dict[str, Family], snap: Snapshot | None, fresh: bool) -> None:
        base = self._host_labels
        if (fam := fams.get(BUILD_INFO)) is not None:
            fam.add(base.plus("version", __version__), 1.0)
        up, duration, success, rejected = (fams.get(n) for n in (_SOURCE_UP, _SOURCE_DURATION, _SOURCE_SUCCESS, _REJECTED))
        for st in self.statuses(snap, fresh):
            labels = base.plus("source", st.name)
            if up is not None:
                up.add(labels, 1.0 if st.up else 0.0)
            if duration is not None and st.collect_seconds == st.collect_seconds:  # NaN: not measured
                duration.add(labels, st.collect_seconds)
            if success is not None and st.last_success_ts is not None:
                success.add(labels, st.last_success_ts)
            if rejected is not None:
                for name, count in sorted(st.rejected.items()):
                    rejected.add(labels.plus("field", name), float(count))
        if self.backlog is not None and (fam := fams.get(_BACKLOG)) is not None:
            fam.add(base.plus("where", "spool"), float(self.backlog.spooled_rows))
            fam.add(base.plus("where", "memory"), float(self.backlog.memory_rows))
        if self.backlog is not None and (fam := fams.get(_ROWS_FOLDED)) is not None:
            fam.add(base, float(self.backlog.folded_rows))
        if self.stats is not None:
            for name, attr in _STATS:
                if (fam := fams.get(name)) is not None:
                    fam.add(base, float(getattr(self.stats, attr)))

    def _cached(self, key: tuple[Any, ...], make: Callable[[], Labels]) -> Labels:
        labels = self._labels.get(key)
        if labels is None:
            labels = self._labels[key] = make()
        return labels


def _label_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _add_values(fams: dict[str, Family], labels: Labels, obj: Any, plan: _Plan) -> None:
    """Add each field of ``plan`` that ``obj`` (an object, or a dict of slow values) knows."""
    get = obj.get if isinstance(obj, dict) else (lambda name: getattr(obj, name))
    for name, family, extra in plan:
        value = get(name)
        if value is None:
            continue
        fam = fams.get(family)
        if fam is not None:
            fam.add(labels.plus(*extra) if extra else labels, float(value))
