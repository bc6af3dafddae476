"""History from a Prometheus-compatible engine: a host's exported series, read through the HTTP API
and written into a temporary store, so that ``diagnose`` and ``capacity`` build their reports with
the same code as from a vgpumon store (docs/store.md, "Prometheus-compatible source").

What the exposition carries is hydrated: the GPUs (``vgpumon_gpu_info`` and the static gauges),
their samples (one row per scrape, or per step on long windows), XID events (the increases of
``vgpumon_gpu_xid_events_total``, dated to the scrape that saw them), host samples and the shared
PCIe ports (``vgpumon_pcie_upstream_*``). Every value passes the catalogue's door, as any outside
value does; a refused one is NULL and counted in ``rejected_values`` like the agent's own. What it
does not carry is named in ``Hydrated.notes``, which the reports print: the GPU process lists, the
agent's stored alert lifecycle, the vLLM servers, the full-depth PCIe tree, and raw ticks between
scrapes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from vgpumon import catalogue
from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.catalogue.door import Door, Rejected
from vgpumon.catalogue.gpu import CLOCKS_EVENT_REASONS
from vgpumon.model import Alert, GpuIdentity, PcieHop
from vgpumon.store.alerts import AlertRepository
from vgpumon.store.codec import GPU_ID, GPU_ROW_COLUMNS, TS, UP, encoder
from vgpumon.store.prometheus_api import MAX_POINTS, Matrix, PrometheusApi, PrometheusUnavailableError, quote
from vgpumon.store.repository import Store

_GPU_FIELDS = [f for f in catalogue.fields_of("gpu_samples") if f.prometheus and f.name not in ("up", "clocks_event_reasons")]
_HOST_FIELDS = [f for f in catalogue.fields_of("host_samples") if f.prometheus]
_STATIC = [f for f in catalogue.fields_of("gpus") if f.prometheus]
_UP = catalogue.get("gpu_samples", "up").prometheus
_REASONS = catalogue.get("gpu_samples", "clocks_event_reasons").prometheus
_XID = catalogue.get("xid_events", "xid").prometheus
_GPU_INFO = catalogue.INFO_METRICS["gpus"]
_UPSTREAM_GPU = catalogue.get("exporter", "pcie_upstream_gpu_info").prometheus
_UPSTREAM_CAPACITY = catalogue.get("exporter", "pcie_upstream_link_capacity_bytes_per_second").prometheus
_PROCESS = catalogue.get("gpu_process_samples", "used_gpu_memory_bytes").prometheus
_VLLM = catalogue.get("vllm_samples", "state").prometheus
_ALERTS = catalogue.get("exporter", "alerts").prometheus
_REFUSED = catalogue.get("agent", "rejected_values_total").prometheus
_REASON_BITS = {name: bit for bit, name in CLOCKS_EVENT_REASONS.items()}
_ENCODERS = {f.name: (GPU_ROW_COLUMNS.index(f.name), encoder(f)) for f in catalogue.fields_of("gpu_samples")}
#: How far before "now" a host's newest sample is looked for.
HORIZON_S = 7 * 86400.0


@dataclass
class Hydrated:
    """What was read into the temporary store.

    Attributes:
        host: the host.
        start, end: the span read (epoch seconds).
        step_seconds: ``None`` when every scraped sample was read (``resolution`` says the
            scrape interval seen), else the range query's step.
        resolution: the sample interval in words, for the report.
        notes: what the Prometheus source cannot say that the store would (one sentence each).
        requests: API requests made.
        rejected: values the door refused, per field.
    """

    host: str
    start: float
    end: float
    step_seconds: float | None
    resolution: str
    notes: list[str] = field(default_factory=list)
    requests: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def as_dict(self, url: str) -> dict[str, object]:
        """The JSON of the report's ``prometheus`` key."""
        return {"url": url, "start": self.start, "end": self.end, "step_seconds": self.step_seconds,
                "resolution": self.resolution, "notes": list(self.notes), "requests": self.requests}


def _sel(metric: str, host: str) -> str:
    return f"{metric}{{hostname={quote(host)}}}"


def hostnames(api: PrometheusApi, now: float, horizon_s: float = HORIZON_S) -> list[str]:
    """The hosts with GPU series in the horizon before ``now``."""
    door = Door(catalogue.fields_of("gpus"))
    out = []
    for v in api.label_values("hostname", _UP or "", now - horizon_s, now):
        try:
            out.append(door.text("uuid", v, 255))
        except Rejected:
            continue
    return sorted(set(out))


def newest_sample(api: PrometheusApi, host: str, now: float, horizon_s: float = HORIZON_S) -> float | None:
    """When the host's newest GPU sample was scraped (epoch seconds), or ``None`` when it has none
    in the horizon before ``now``.

    Range functions, not ``timestamp()``: an instant lookup finds nothing past the staleness
    marker a failed scrape writes, and a dead agent's newest sample is what the report is for.
    First the newest of 1 000 slices of the horizon that holds a sample, then its raw samples."""
    sel = _sel(_UP or "", host)
    width = int(math.ceil(horizon_s / 1000))
    # one step past ``now``: an engine that aligns the steps to multiples of the step
    # (VictoriaMetrics) still has one at or after the newest sample
    slices = api.range(f"count_over_time({sel}[{width}s])", now - 1000 * width, now + width, width)
    held = [ts for _, pts in slices for ts, v in pts if v > 0]
    if not held:
        return None
    samples = api.instant(f"{sel}[{width}s]", min(max(held), now))
    newest = [ts for _, pts in samples for ts, _ in pts if ts <= now + 300]
    return max(newest) if newest else None


def hydrate(store: Store, api: PrometheusApi, host: str, start: float, end: float) -> Hydrated:
    """Read ``host``'s series between ``start`` and ``end`` into ``store`` (a fresh, empty one).

    Raises:
        PrometheusUnavailableError: the API cannot answer.
        StoreUnavailableError: the temporary store cannot be written.
    """
    span = max(1.0, end - start)
    counts = api.instant(f"max(count_over_time({_sel(_UP or '', host)}[{int(math.ceil(span))}s]))", end)
    points = max((v for _, pts in counts for _, v in pts if math.isfinite(v)), default=0.0)
    raw = points <= MAX_POINTS
    step = None if raw else float(math.ceil(span / MAX_POINTS))
    out = Hydrated(host, start, end, step, "")

    def read(metric: str) -> Matrix:
        if raw:
            return api.instant(f"{_sel(metric, host)}[{int(math.ceil(span))}s]", end)
        assert step is not None
        return api.range(_sel(metric, host), start, end, step)

    gpu_door = Door(catalogue.fields_of("gpu_samples"))
    ident_door = Door(catalogue.fields_of("gpus"))
    rejected: list[dict[str, object]] = []

    # the GPUs: identity labels of the newest info series, static gauges' newest values
    info: dict[str, dict[str, str]] = {}
    for labels, pts in read(_GPU_INFO):
        uuid = labels.get("uuid")
        if uuid and pts:
            newest = max(ts for ts, _ in pts)
            if uuid not in info or newest >= float(info[uuid].get("_ts", "0")):
                info[uuid] = {**labels, "_ts": str(newest)}
    statics: dict[str, dict[str, float]] = defaultdict(dict)
    for f in _STATIC:
        for labels, pts in read(f.prometheus or ""):
            if labels.get("uuid") and pts:
                statics[labels["uuid"]][f.name] = max(pts)[1]
    up = read(_UP or "")
    gaps = sorted(b[0] - a[0] for _, pts in up for a, b in zip(pts, pts[1:]))
    interval = gaps[len(gaps) // 2] if gaps else None  # the median: the scrape interval
    out.resolution = (f"every scraped sample (about {interval:.3g} s apart)" if raw and interval else "every scraped sample" if raw
                      else f"one point per {step:g} s (range query step: {int(points)} scrapes in the window)")
    uuids = sorted({lab["uuid"] for lab, _ in up if lab.get("uuid")} | set(info))
    if not uuids:
        return out
    totals: dict[str, float] = {}
    for labels, pts in read(catalogue.get("gpu_samples", "memory_total_bytes").prometheus or ""):
        if labels.get("uuid") and pts:
            totals[labels["uuid"]] = max(pts)[1]
    idents = []
    for uuid in uuids:
        lab = info.get(uuid, {})
        try:
            index = int(lab.get("gpu") or next(x.get("gpu", "") for x, _ in up if x.get("uuid") == uuid))
            ident_door.text("uuid", uuid)
        except (ValueError, StopIteration, Rejected):
            continue
        st = statics.get(uuid, {})
        idents.append(GpuIdentity(
            index=index, uuid=uuid, name=_text(ident_door, "name", lab.get("name")), serial=_text(ident_door, "serial", lab.get("serial")),
            pci_bus_id=_text(ident_door, "pci_bus_id", lab.get("pci_bus_id")),
            memory_total_bytes=_num(ident_door, "memory_total_bytes", totals.get(uuid)),
            pcie_link_gen_max=_num(ident_door, "pcie_link_gen_max", st.get("pcie_link_gen_max")),
            pcie_link_width_max=_num(ident_door, "pcie_link_width_max", st.get("pcie_link_width_max")),
            pcie_link_gen_gpu_max=_num(ident_door, "pcie_link_gen_gpu_max", st.get("pcie_link_gen_gpu_max")),
            gpm_supported=lab.get("gpm_supported") == "true",
            sm_clock_max_hertz=_num(ident_door, "sm_clock_max_hertz", st.get("sm_clock_max_hertz")),
            memory_clock_max_hertz=_num(ident_door, "memory_clock_max_hertz", st.get("memory_clock_max_hertz")),
            slowdown_temperature_celsius=_num(ident_door, "slowdown_temperature_celsius", st.get("slowdown_temperature_celsius")),
        ))
    ids = store.register_gpus(host, idents)
    host_id = store.host_id(host)
    gpm = {g.uuid: g.gpm_supported for g in idents}

    # the samples: one row per GPU and scrape (or step), keyed by the timestamp in ms
    rows: dict[tuple[int, int], list[Any]] = {}

    def row(uuid: str, ts: float, create: bool = False) -> list[Any] | None:
        """The row of ``uuid`` at ``ts``: made by the ``up`` series only (a GPU is up or down at
        each scrape), filled by the others."""
        gid = ids.get(uuid)
        if gid is None:
            return None
        key = (gid, int(round(ts * 1000)))
        r = rows.get(key)
        if r is None:
            if not create:
                return None
            r = rows[key] = [None] * len(GPU_ROW_COLUMNS)
            r[GPU_ID], r[TS], r[UP] = gid, key[1], False
        return r

    for labels, pts in up:
        for ts, v in pts:
            r = row(labels.get("uuid", ""), ts, create=True)
            if r is not None:
                r[UP] = v == 1.0
                pos, enc = _ENCODERS["activity_source"]
                r[pos] = enc("gpm" if gpm.get(labels.get("uuid", "")) else "utilization")
    for f in _GPU_FIELDS:
        pos, enc = _ENCODERS[f.name]
        for labels, pts in read(f.prometheus or ""):
            if any(labels.get(k) != v for k, v in f.prom_labels.items()):
                continue
            uuid = labels.get("uuid", "")
            for ts, v in pts:
                r = row(uuid, ts)
                if r is None:
                    continue
                try:
                    r[pos] = enc(gpu_door.value(f.name, v))
                except Rejected as exc:
                    rejected.append({"host_id": host_id, "ts": ts, "subject": f"gpu:{uuid}", "field": f.name, "reason": exc.reason})
    pos, enc = _ENCODERS["clocks_event_reasons"]
    for labels, pts in read(_REASONS or ""):
        bit = _REASON_BITS.get(labels.get("reason", ""))
        for ts, v in pts:
            r = row(labels.get("uuid", ""), ts)
            if r is not None and bit is not None and math.isfinite(v):
                r[pos] = (r[pos] or 0) | (bit if v >= 1 else 0)
    store.write_gpu_rows([tuple(r) for r in rows.values()])

    extra: dict[str, list[dict[str, object]]] = {"xid_events": _xids(read(_XID or ""), ids, start), "host_samples": [],
                                                 "rejected_values": rejected}
    host_rows: dict[int, dict[str, object]] = {}
    host_door = Door(catalogue.fields_of("host_samples"))
    for f in _HOST_FIELDS:
        for _, pts in read(f.prometheus or ""):
            for ts, v in pts:
                hr = host_rows.setdefault(int(round(ts * 1000)), {"host_id": host_id, "ts": ts, **{h.name: None for h in _HOST_FIELDS}})
                try:
                    hr[f.name] = host_door.value(f.name, v)
                except Rejected as exc:
                    rejected.append({"host_id": host_id, "ts": ts, "subject": "host", "field": f.name, "reason": exc.reason})
    extra["host_samples"] = list(host_rows.values())
    store.write_extra_rows([extra])  # type: ignore[list-item,unused-ignore]  # dict rows of the extra tables
    _topology(store, api, read, host_id, ids, {g.uuid: g for g in idents}, end)
    episodes = _alerts(read(_ALERTS or ""), host, end, step or interval or 15.0)
    if episodes:
        AlertRepository(store.engine).save(host, episodes)
    if any(not r[UP] for r in rows.values()):
        out.notes.append("The NVML reason a GPU was unreadable is not exported: GpuLost waits for a minute of unreadable "
                         "scrapes where the store knows at once that NVML said 'GPU is lost'.")
    out.rejected = {**gpu_door.rejected, **host_door.rejected}
    out.notes.extend(_gaps(api, host, end, span, raw, step))
    out.requests = api.requests
    return out


#: Labels of ``vgpumon_alerts`` that are the alert's own, not its subject's.
_ALERT_OWN = ("__name__", "alertname", "severity", "state", "job", "instance")


def _alerts(matrix: Matrix, host: str, end: float, interval: float) -> list[Alert]:
    """The agent's alert episodes as its ``vgpumon_alerts`` series show them: a run of points
    (pending, then firing) is one episode; a run that stops before the span's end was resolved
    at its last point. Summaries and descriptions are not exported: the episode has none."""
    gap = max(3 * interval, 60.0)
    runs: dict[tuple[str, str, tuple[tuple[str, str], ...]], list[tuple[float, str]]] = defaultdict(list)
    door = Door(catalogue.fields_of("gpus"))
    for labels, pts in matrix:
        name, severity, state = labels.get("alertname"), labels.get("severity"), labels.get("state")
        if not name or severity not in ("critical", "warning", "info") or state not in ("pending", "firing"):
            continue
        try:
            door.text("uuid", name, 255)
        except Rejected:
            continue
        subject = tuple(sorted((k, v) for k, v in labels.items() if k not in _ALERT_OWN))
        runs[(name, severity, subject)].extend((ts, str(state)) for ts, v in pts if v == 1.0)
    out = []
    for (name, severity, subject), seen in runs.items():
        seen.sort()
        episode: list[tuple[float, str]] = []
        for point in [*seen, (math.inf, "")]:
            if episode and point[0] - episode[-1][0] > gap:
                first, last = episode[0][0], episode[-1][0]
                fired = next((ts for ts, st in episode if st == "firing"), None)
                closed = last < end - gap
                if fired is not None or not closed:  # a pending run that stopped never fired: the agent drops it
                    out.append(Alert(name=name, severity=severity, labels={"hostname": host, **dict(subject)},
                                     state="resolved" if closed else ("firing" if fired is not None else "pending"),
                                     active_since=first, last_eval=last, fired_at=fired, resolved_at=last if closed else None))
                episode = []
            episode.append(point)
    return out


def _text(door: Door, name: str, raw: str | None) -> str | None:
    try:
        return door.text(name, raw) if raw is not None else None
    except Rejected:
        return None


def _num(door: Door, name: str, raw: float | None) -> Any:
    """The door's value of ``raw`` (an ``int`` for integral fields), ``None`` when refused."""
    try:
        return door.value(name, raw) if raw is not None else None
    except Rejected:
        return None


def _xids(matrix: Matrix, ids: dict[str, int], start: float) -> list[dict[str, object]]:
    """XID events from the agent's counters: each increase is that many events at the scrape
    that saw it; a series that begins inside the span (the agent started then) counts its first
    value as events at its first scrape."""
    events: list[dict[str, object]] = []
    for labels, pts in matrix:
        gid = ids.get(labels.get("uuid", ""))
        try:
            xid = int(labels.get("xid", ""))
        except ValueError:
            continue
        if gid is None or not 0 < xid < 2**31 or not pts:
            continue
        prev = 0.0 if pts[0][0] > start + 60 else None
        for ts, v in pts:
            if not math.isfinite(v) or v < 0:
                continue
            if prev is not None and v > prev:
                for seq in range(min(int(v - prev), 1000)):
                    events.append({"gpu_id": gid, "ts": ts, "xid": xid, "seq": seq})
            prev = v
    return events


def _link_of(capacity: float) -> tuple[int | None, int | None]:
    """The (generation, width) whose capacity is ``capacity`` (x16 first), or unknown."""
    for width in (16, 8, 32, 4, 2, 1):
        for gen in range(6, 0, -1):
            c = link_capacity_bytes_per_second(gen, width)
            if c is not None and abs(c - capacity) <= 1e-6 * capacity:
                return gen, width
    return None, None


def _bdf(pci_bus_id: str | None) -> str | None:
    """NVML's ``00000000:18:00.0`` as sysfs writes it, ``0000:18:00.0``."""
    if not pci_bus_id or ":" not in pci_bus_id:
        return None
    domain, rest = pci_bus_id.split(":", 1)
    return f"{domain[-4:]}:{rest}".lower()


def _topology(store: Store, api: PrometheusApi, read: object, host_id: int | None, ids: dict[str, int],
              gpus: dict[str, GpuIdentity], end: float) -> None:
    """The shared PCIe ports above the GPUs (the exposition names only those): each GPU below the
    smallest port that holds it, each port below the next larger one."""
    assert callable(read)
    members: dict[str, set[str]] = defaultdict(set)
    kinds: dict[str, str] = {}
    for labels, pts in read(_UPSTREAM_GPU or ""):
        if pts and labels.get("port") and labels.get("uuid") in gpus and len(labels["port"]) <= 64:
            members[labels["port"]].add(labels["uuid"])
            kinds[labels["port"]] = labels.get("kind") if labels.get("kind") in ("bridge", "root", "host_bridge") else "bridge"
    if not members or host_id is None:
        return
    caps: dict[str, float] = {}
    for labels, pts in read(_UPSTREAM_CAPACITY or ""):
        if labels.get("port") in members and pts and math.isfinite(max(pts)[1]):
            caps[labels["port"]] = max(pts)[1]
    rank = {"bridge": 0, "root": 1, "host_bridge": 2}  # a switch and its root port may hold the same GPUs
    by_size = sorted(members, key=lambda p: (len(members[p]), rank[kinds[p]], p))
    hops = []
    for i, port in enumerate(by_size):
        above = next((q for q in by_size[i + 1:] if members[port] <= members[q]), None)
        gen, width = _link_of(caps[port]) if port in caps else (None, None)
        hops.append(PcieHop(bdf=port, kind=kinds[port], parent_bdf=above, link_gen_max=gen, link_width_max=width))
    for uuid, g in gpus.items():
        bdf = _bdf(g.pci_bus_id)
        below = next((p for p in by_size if uuid in members[p]), None)
        if bdf is not None and below is not None:
            hops.append(PcieHop(bdf=bdf, kind="gpu", parent_bdf=below, link_gen_max=g.pcie_link_gen_max,
                                link_width_max=g.pcie_link_width_max, uuid=uuid))
    store.replace_topology(host_id, hops, ids, end)


def _gaps(api: PrometheusApi, host: str, end: float, span: float, raw: bool, step: float | None) -> list[str]:
    """What this source cannot say that a store would, as sentences for the report."""
    notes = []
    if not raw:
        notes.append(f"Prometheus source: the window holds more than {MAX_POINTS} scrapes per series, so it was read at one "
                     f"point per {step:g} s; maxima and percentiles can miss what lay between the points.")
    else:
        notes.append("Prometheus source: figures come from the scraped samples, not every agent tick (the store keeps every tick); "
                     "a maximum or an unreadable spell shorter than the scrape interval can be missed.")
    window = f"[{int(math.ceil(span))}s]"
    present = {name for name, expr in (("processes", _PROCESS), ("vllm", _VLLM), ("alerts", _ALERTS))
               if api.instant(f"count(count_over_time({_sel(expr or '', host)}{window}))", end)}
    notes.append("GPU process lists are not read from Prometheus (the exposition has no process start times to tell reused "
                 "PIDs apart)" + (": this host exported process series, see its dashboards." if "processes" in present else "."))
    notes.append("The agent's alert episodes come from its vgpumon_alerts series: their times to the scrape, without their "
                 "summaries, values or the evaluations between scrapes." if "alerts" in present else
                 "The host exported no vgpumon_alerts series: no agent's alert episodes, the findings are diagnose's own evaluation.")
    if "vllm" in present:
        notes.append("vLLM servers are not read from Prometheus yet: this host exported vLLM series, see its dashboards.")
    refused = api.instant(f"max(max_over_time({_sel(_REFUSED or '', host)}{window}))", end)
    if any(v > 0 for _, pts in refused for _, v in pts):
        notes.append("The agent refused impossible values at the door; Prometheus holds only their count per field "
                     "(vgpumon_agent_rejected_values_total), so the report cannot say which GPU reported them when.")
    notes.append("The PCIe tree holds only the shared switches and root ports the agent exports, not every hop.")
    return notes


__all__ = ["HORIZON_S", "Hydrated", "PrometheusUnavailableError", "hostnames", "hydrate", "newest_sample"]
