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
  ``gpu`` (NVML index) and ``uuid`` (as dcgm-exporter, lower case), and nothing else that can
  change: product name, serial, bus id are labels of ``vgpumon_gpu_info`` only, and the
  kubelet's ``namespace``/``pod``/``container`` of ``vgpumon_gpu_kubernetes_holder_info`` only
  (joined ``on (hostname, uuid)``), so a pod moving to another GPU or a GPU to another pod
  neither splits a GPU's series nor makes its XID counters new series. GPU process series keep
  their own owner's labels: a process lives in one container.
* **XIDs are counted per code** (``vgpumon_gpu_xid_events_total{xid}``), the codes of
  ``catalogue.gpu.XID_NAMES`` from 0 so that ``increase()`` sees their first event.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from vgpumon import __version__
from vgpumon.alerts.feed import ALERT_STATES, ALERT_SUBJECT_LABELS, UNKNOWN_SUBJECT_LABELS, RulesFeed
from vgpumon.base.listen import ExporterConfig
from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.exporter.plans import (
    AGE,
    ALERTS,
    BACKLOG,
    BUILD_INFO,
    CAPACITY,
    COLLECTOR_FAULT,
    FAMILIES,
    GPU_FAST,
    GPU_INFO,
    GPU_SLOW,
    GPU_UP,
    HOLDER,
    HOLDERS,
    HOST,
    HTTP_CLOSE_REASONS,
    HTTP_CLOSED,
    IDENTITY,
    INFO_LABELS,
    PROCESS,
    REASON_BITS,
    REASONS,
    REJECTED,
    ROWS_FOLDED,
    RULE_UNKNOWN,
    SHARE,
    SLOPE,
    SLOW_NAMES,
    SOURCE_DURATION,
    SOURCE_SUCCESS,
    SOURCE_UP,
    STATS,
    UPSTREAM_CAPACITY,
    UPSTREAM_GPU,
    XID,
    XID_CODES,
    add_values,
)
from vgpumon.exporter.servers import VllmSeries
from vgpumon.exporter.text import Family, Labels, metrics, render
from vgpumon.model import GpuIdentity, GpuSample, HostSample, Snapshot, SourceStatus

if TYPE_CHECKING:
    from vgpumon.exporter.view import AgentView
    from vgpumon.model import PcieTopology
    from vgpumon.store.spool import Backlog

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
#: the sources whose times follow a replay's clock (the capture's, in a replay as fast as
#: possible): their timestamps are served moved onto the wall clock Prometheus compares them with
REPLAY_CLOCK_SOURCES = frozenset({"nvml", "vllm"})

_CACHE_MAX = 4096  # label sets kept across scrapes; identities change rarely, so this is a guard


class MetricsExporter(VllmSeries, Collector):
    """A prometheus-client collector over the agent's newest snapshot, and the text it serves.

    Args:
        hostname: the ``hostname`` label (the host's store identity).
        interval: seconds between ticks; with ``config.stale_after_intervals`` it decides when
            a GPU's newest reading is too old to serve.
        config: listen address, selection file, staleness (``ExporterConfig``).
        selection: family names to serve; ``None`` serves every family of the catalogue.
        rules: the rules engine's feed (``RulesFeed``): alerts and memory slopes.
        stats: the agent's ``AgentStats`` (ticks, rows written, store outages).
        backlog: the agent's ``Backlog`` (spool depth).
        topology: returns the host's PCIe topology, or ``None`` when it was not read.
        monotonic: the clock that ages ticks (the agent's).
        wall: for a replay, the wall clock: the replay-clock stamps the exporter serves
            (the NVML and vLLM sources' last success, vLLM's ready time) are moved by
            ``wall() − tick time`` (about 0 at the recorded pace, which replays on the wall clock) measured as
            each tick is taken in, so Prometheus, which compares them with its own now, sees
            the ages the agent's rules see in data time; ``None`` (live) serves them as read.
    """

    def __init__(
        self,
        *,
        hostname: str,
        interval: float = 1.0,
        config: ExporterConfig | None = None,
        selection: frozenset[str] | None = None,
        rules: RulesFeed | None = None,
        stats: object = None,  # AgentStats (above the exporter): its counters are read by name (STATS)
        backlog: "Backlog | None" = None,
        topology: Callable[[], "PcieTopology | None"] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] | None = None,
    ) -> None:
        self.hostname = hostname
        self.interval = interval
        self.config = config or ExporterConfig()
        self.selection = selection
        self.rules = rules
        self.stats = stats
        self.backlog = backlog
        self.topology = topology
        self.monotonic = monotonic
        self.wall = wall
        self._offset = 0.0  # wall − data time of the newest tick (a replay's), else 0
        self._order = [n for n in FAMILIES if selection is None or n in selection]
        self._snap: Snapshot | None = None
        self._received = 0.0
        self._host: HostSample | None = None
        self._slow: dict[str, dict[str, float]] = {}  # per GPU, its newest slow-set values
        self._labels: dict[tuple[Hashable, ...], Labels] = {}
        self._host_labels = Labels((("hostname", hostname),))
        #: connections the HTTP server closed unanswered, by reason (``MetricsServer``'s door)
        self.http_closed: dict[str, int] = dict.fromkeys(HTTP_CLOSE_REASONS, 0)

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
        called on the thread that takes the tick), whose snapshots carry every source's readings
        and status (the vLLM servers' included); it reads the agent's stats, backlog and topology
        at scrape time."""
        exporter = cls(
            hostname=agent.hostname, interval=agent.interval, config=config, selection=selection, rules=rules, stats=agent.stats, backlog=agent.backlog,
            topology=lambda: agent.topology, monotonic=agent.monotonic, wall=None if agent.paced else time.time,
        )
        agent.observers.append(exporter.observe)
        return exporter

    # -- each tick -------------------------------------------------------------------------------

    def observe(self, snap: Snapshot) -> None:
        """Keep a tick's snapshot (once per tick, on the agent's sampling thread while a scrape
        may be rendering on the event loop: what a scrape reads is replaced whole, never changed
        in place)."""
        self._received = self.monotonic()
        if self.wall is not None:
            self._offset = self.wall() - snap.ts
        if snap.host is not None:
            self._host = snap.host
        slow: dict[str, dict[str, float]] | None = None
        for s in snap.samples:
            if not s.up:
                if s.uuid in self._slow:
                    slow = slow if slow is not None else dict(self._slow)
                    slow.pop(s.uuid, None)
            elif any(getattr(s, n) is not None or n in s.missing for n in SLOW_NAMES):
                # field by field: a slow tick need not read every slow field (the minute set is
                # read once a minute); one it did not read keeps its newest read
                slow = slow if slow is not None else dict(self._slow)
                kept = dict(slow.get(s.uuid, {}))
                for n in SLOW_NAMES:
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
        age = self.age()  # None before the first tick
        return age is not None and age <= self.config.stale_after_intervals * self.interval

    def age(self) -> float | None:
        """Seconds since the newest tick was observed; ``None`` before the first."""
        return None if self._snap is None else self.monotonic() - self._received

    def families(self) -> list[Family]:
        """Every selected family with this scrape's samples, in catalogue order."""
        fams = {name: Family(name, *FAMILIES[name]) for name in self._order}
        if len(self._labels) > _CACHE_MAX:
            self._labels.clear()
        fresh = self.fresh()
        snap = self._snap
        if snap is not None:
            self._gpus(fams, snap, fresh)
            if fresh and self._host is not None:
                self._host_series(fams, self._host)
            self._topology(fams, snap)
        if snap is not None and snap.vllm is not None:
            self._servers(fams, snap, snap.vllm)
        if self.rules is not None:
            self._alerts(fams)
        self._agent(fams, snap, fresh)
        return list(fams.values())

    # -- GPUs ------------------------------------------------------------------------------------

    def _gpu_base(self, g: GpuIdentity) -> Labels:
        key = ("gpu", g.index, g.uuid)
        labels = self._labels.get(key)
        if labels is None:
            labels = self._labels[key] = Labels((("hostname", self.hostname), ("gpu", str(g.index)), ("uuid", g.uuid)))
        return labels

    def _gpus(self, fams: dict[str, Family], snap: Snapshot, fresh: bool) -> None:
        k8s = snap.kubernetes
        now_age = self.age() or 0.0
        slopes = self.rules.memory_slopes() if self.rules is not None else {}
        host = self._host
        for g, s in zip(snap.gpus, snap.samples):
            attribution = k8s.gpus.get(g.uuid) if k8s is not None else None
            # the owner is on the holder info series only: never on the readings, counters or up
            base = plain = self._gpu_base(g)
            if (fam := fams.get(GPU_INFO)) is not None:
                info = self._labels.get(("info", g))
                if info is None:
                    extra = [(label, _label_value(getattr(g, name))) for name, label in INFO_LABELS if getattr(g, name) is not None]
                    info = self._labels[("info", g)] = Labels((*plain.items, *extra))
                fam.add(info, 1.0)
            add_values(fams, base, g, IDENTITY)
            capacity = link_capacity_bytes_per_second(g.pcie_link_gen_max, g.pcie_link_width_max)
            if capacity is not None and (fam := fams.get(CAPACITY)) is not None:
                fam.add(base, capacity)
            if (fam := fams.get(XID)) is not None:
                counts = s.xid_counts
                codes = XID_CODES if not counts else sorted({*XID_CODES, *counts})
                for code in codes:
                    fam.add(base.plus("xid", str(code)), float(counts.get(code, 0)))
            if attribution is not None and attribution.holders:
                if (fam := fams.get(HOLDER)) is not None:
                    for holder in attribution.holders:
                        fam.add(self._holder_labels(plain, holder.labels()), 1.0)
                if (fam := fams.get(HOLDERS)) is not None:
                    fam.add(plain, float(len(attribution.holders)))
            up = fresh and s.up
            if (fam := fams.get(GPU_UP)) is not None:
                fam.add(base, 1.0 if up else 0.0)
            if (fam := fams.get(AGE)) is not None:
                fam.add(base, now_age)
            if not up:
                continue
            add_values(fams, base, s, GPU_FAST)
            if (fam := fams.get(COLLECTOR_FAULT)) is not None:  # readings the collector found false and withholds
                fam.add(base, 1.0 if any(why.startswith("collector fault") for why in s.missing.values()) else 0.0)
            slow = self._slow.get(g.uuid)
            if slow is not None:
                add_values(fams, base, slow, GPU_SLOW)
            reasons = s.clocks_event_reasons
            if reasons is not None and (fam := fams.get(REASONS)) is not None:
                for bit, name in REASON_BITS:
                    fam.add(base.plus("reason", name), 1.0 if reasons & bit else 0.0)
            if capacity:
                for d, rate in (("tx", s.pcie_tx_bytes_per_second), ("rx", s.pcie_rx_bytes_per_second)):
                    if rate is not None and (fam := fams.get(SHARE[d])) is not None:
                        fam.add(base, rate / capacity)
            slope = slopes.get(g.uuid)
            if slope is not None and (fam := fams.get(SLOPE)) is not None:
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
        used_fam = fams.get(PROCESS["used_gpu_memory_bytes"])
        rss_fam = fams.get(PROCESS["rss_bytes"])
        cpu_fam = fams.get(PROCESS["cpu_seconds_total"])
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
        add_values(fams, self._host_labels, host, HOST)

    def _topology(self, fams: dict[str, Family], snap: Snapshot) -> None:
        topo = self.topology()
        if topo is None:
            return
        index = {g.uuid: g.index for g in snap.gpus}
        gpu_fam, cap_fam = fams.get(UPSTREAM_GPU), fams.get(UPSTREAM_CAPACITY)
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

    # -- rules, agent ----------------------------------------------------------------------------

    def _alerts(self, fams: dict[str, Family]) -> None:
        assert self.rules is not None
        fam = fams.get(ALERTS)
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
        fam = fams.get(RULE_UNKNOWN)
        if fam is None:
            return
        served: set[tuple[Hashable, ...]] = set()
        for u in self.rules.unknown():
            subject = tuple((k, str(u.labels[k])) for k in UNKNOWN_SUBJECT_LABELS if u.labels.get(k))
            key = ("unknown", u.rule, u.severity, u.reason, subject)
            if key in served:  # subjects below the served labels (processes of one GPU): one series
                continue
            served.add(key)
            fam.add(
                self._cached(
                    key,
                    lambda: Labels((("hostname", self.hostname), ("rule", u.rule), ("severity", u.severity), ("reason", u.reason), *subject)),  # noqa: B023  the factory runs at once, inside this iteration (_cached)
                ),
                1.0,
            )

    def statuses(self, snap: Snapshot | None = None, fresh: bool | None = None) -> list[SourceStatus]:
        """Each source's status as served: those the snapshot carries (NVML's, the kubelet's, the
        host's, vLLM's), down when the ticks stopped."""
        snap = self._snap if snap is None else snap
        fresh = self.fresh() if fresh is None else fresh
        out: list[SourceStatus] = []
        if snap is not None:
            for st in snap.sources:
                if not fresh:
                    st = SourceStatus(st.name, False, st.last_success_ts, st.collect_seconds, st.rejected, "no tick")
                if st.last_success_ts is not None and st.name in REPLAY_CLOCK_SOURCES and self._offset:
                    # the replay's time (a capture's, fast): moved to the wall clock it was taken in at
                    st = dataclasses.replace(st, last_success_ts=st.last_success_ts + self._offset)
                out.append(st)
        return out

    def _agent(self, fams: dict[str, Family], snap: Snapshot | None, fresh: bool) -> None:
        base = self._host_labels
        if (fam := fams.get(BUILD_INFO)) is not None:
            fam.add(base.plus("version", __version__), 1.0)
        up, duration, success, rejected = (fams.get(n) for n in (SOURCE_UP, SOURCE_DURATION, SOURCE_SUCCESS, REJECTED))
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
        if self.backlog is not None and (fam := fams.get(BACKLOG)) is not None:
            fam.add(base.plus("where", "spool"), float(self.backlog.spooled_rows))
            fam.add(base.plus("where", "memory"), float(self.backlog.memory_rows))
        if self.backlog is not None and (fam := fams.get(ROWS_FOLDED)) is not None:
            fam.add(base, float(self.backlog.folded_rows))
        if (fam := fams.get(HTTP_CLOSED)) is not None:
            for reason, count in self.http_closed.items():
                fam.add(base.plus("reason", reason), float(count))
        if self.stats is not None:
            for name, attr in STATS:
                if (fam := fams.get(name)) is not None:
                    fam.add(base, float(getattr(self.stats, attr)))

    def _cached(self, key: tuple[Hashable, ...], make: Callable[[], Labels]) -> Labels:
        labels = self._labels.get(key)
        if labels is None:
            labels = self._labels[key] = make()
        return labels


def _label_value(v: str | float) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
