"""The on-call report: per GPU, what the store says about a recent window (pure; no printing).

The window ends at the newest stored sample of the host (not at "now"), so a report on a replayed
capture or on a host whose agent died an hour ago still describes the last data there is; the age
of that sample is part of the report.

Findings come from the rule engine (``vgpumon.rules``): the same rules the agent evaluates, at the
end of the window, through the same alert lifecycle (``Engine.evaluate_window``). The exit status
is the worst severity among the firing alerts (a pending alert is information), UNKNOWN when the
host has no data; a rule whose inputs are absent is listed as unknown with its reason, never as
healthy.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from vgpumon import catalogue
from vgpumon.config import default_hostname
from vgpumon.errors import ExitCode
from vgpumon.pcie import link_capacity_bytes_per_second
from vgpumon.store import Store, StoredGpu

_REPORTED = catalogue.fields_of("gpu_samples")
#: Columns summarised as mean and max over the window (catalogue: ``diagnose`` has ``window``).
WINDOW_COLUMNS = tuple(f.name for f in _REPORTED if "window" in f.diagnose)
#: Columns reported as their newest value (``last``: in the window; ``cumulative``: at or before
#: its end — counters and latched flags the slow set reads every few ticks).
LAST_COLUMNS = tuple(f.name for f in _REPORTED if {"last", "cumulative"} & set(f.diagnose))
CUMULATIVE = frozenset(f.name for f in _REPORTED if "cumulative" in f.diagnose)

SEVERITY_EXIT = {"ok": ExitCode.OK, "warning": ExitCode.WARNING, "critical": ExitCode.CRITICAL, "unknown": ExitCode.UNKNOWN}
_RANK = {"info": -1, "ok": 0, "warning": 1, "critical": 2, "unknown": 3}
#: Subjects whose alerts belong to one GPU's block of the report.
_GPU_SUBJECTS = ("gpu", "gpu_process")


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


def resolve_host(host: str, local: str | None = None) -> str:
    """Map the ``host`` argument to a stored host name: ``localhost`` → the name this machine's
    agent stores under (``local``: the ``agent.hostname`` setting; ``None``: the system host
    name)."""
    return (local or default_hostname()) if host in {"localhost", "127.0.0.1", "::1"} else host


def _rejected_reason(item: tuple[int, str] | None) -> str | None:
    if item is None:
        return None
    count, reason = item
    return f"reported impossible values {count} times ({reason})"


def _path(topology: Any, uuid: str, index_of: dict[str, int]) -> list[dict[str, Any]]:
    """The GPU's PCIe path (GPU first) with, per upstream hop, the other GPUs that share it."""
    out = []
    for hop in topology.path(uuid):
        others = [index_of[u] for u in topology.gpus_below(hop.bdf) if u != uuid and u in index_of]
        out.append(
            {
                "bdf": hop.bdf,
                "kind": hop.kind,
                "link_current": {"generation": hop.link_gen_current, "width": hop.link_width_current},
                "link_max": {"generation": hop.link_gen_max, "width": hop.link_width_max},
                "capacity_bytes_per_second": link_capacity_bytes_per_second(hop.link_gen_max, hop.link_width_max),
                "shared_with_gpus": sorted(others),
            }
        )
    return out


def _gpu_report(
    store: Store,
    gpu: StoredGpu,
    start: float,
    end: float,
    agg: dict[str, Any],
    topology: Any = None,
    index_of: dict[str, int] | None = None,
    rejected: dict[str, tuple[int, str]] | None = None,
) -> dict[str, Any]:
    g = gpu.identity
    last = store.last_values(gpu.id, end, LAST_COLUMNS)
    n = agg["samples"] or 0
    no_data = "no samples in window" if n == 0 else "not reported by this GPU in the window"
    rejected = rejected or {}

    def lv(name: str) -> Any:
        # Cumulative counters (ECC, remapped rows, replays) are read by the slow set only every
        # few ticks: their newest reading up to the window's end is the current count even when
        # it is older than the window's start. Gauges must fall inside the window.
        item = last.get(name)
        if item is None:
            return None
        return item[1] if item[0] >= start or name in CUMULATIVE else None

    unknown: dict[str, str] = {}

    def stat(name: str, kind: str, reason: str | None = None) -> Any:
        value = agg.get(f"{name}_{kind}")
        if value is None:
            unknown[f"{name}.{kind}"] = reason or _rejected_reason(rejected.get(name)) or no_data
        return value

    if g.gpm_supported:
        activity_source = "gpm"
        sm_mean, sm_max = stat("sm_active_ratio", "mean"), stat("sm_active_ratio", "max")
    else:
        activity_source = "utilization"  # pre-Hopper: no SM activity, only the busy-time proxy
        sm_mean, sm_max = stat("utilization_gpu_ratio", "mean"), stat("utilization_gpu_ratio", "max")

    capacity = link_capacity_bytes_per_second(g.pcie_link_gen_max, g.pcie_link_width_max)
    pcie: dict[str, Any] = {
        "link_max": {
            "generation": g.pcie_link_gen_max,
            "width": g.pcie_link_width_max,
            "capacity_bytes_per_second": capacity,
        },
        "link_current": {"generation": lv("pcie_link_gen_current"), "width": lv("pcie_link_width_current")},
        "gpu_max_generation": g.pcie_link_gen_gpu_max,
        "path": _path(topology, g.uuid, index_of or {}) if topology is not None else [],
    }
    no_gpm = "no GPM on this GPU (PCIe bytes/s need GPM, Hopper or newer)"
    for direction in ("tx", "rx"):
        col = f"pcie_{direction}_bytes_per_second"
        reason = None if g.gpm_supported else no_gpm
        mean, mx = stat(col, "mean", reason), stat(col, "max", reason)
        pcie[direction] = {
            "mean_bytes_per_second": mean,
            "max_bytes_per_second": mx,
            "mean_share_of_max_link": None if mean is None or not capacity else mean / capacity,
            "max_share_of_max_link": None if mx is None or not capacity else mx / capacity,
        }
    if capacity is None:
        unknown["pcie.link_max"] = "max link generation/width not reported"

    ecc = {
        "corrected_volatile": lv("ecc_corrected_volatile_total"),
        "uncorrected_volatile": lv("ecc_uncorrected_volatile_total"),
        "corrected_aggregate": lv("ecc_corrected_aggregate_total"),
        "uncorrected_aggregate": lv("ecc_uncorrected_aggregate_total"),
    }
    for k, v in ecc.items():
        if v is None:
            unknown[f"ecc.{k}"] = _rejected_reason(rejected.get(f"ecc_{k}_total")) or (
                "ECC not reported (disabled or not supported)" if n else no_data
            )

    findings: list[dict[str, str]] = []
    up = agg["up_samples"] or 0
    replays = store.series(gpu.id, start, end, ("pcie_replay_total",))
    replays = [(r["ts"], r["pcie_replay_total"]) for r in replays if r["pcie_replay_total"] is not None]
    replay_rate = None
    if len(replays) >= 2 and replays[-1][1] >= replays[0][1] and replays[-1][0] > replays[0][0]:
        replay_rate = (replays[-1][1] - replays[0][1]) / (replays[-1][0] - replays[0][0]) * 60
    pcie["replays_per_minute"] = replay_rate
    xid_counts: dict[int, int] = {}
    for _, code in store.xid_events(gpu.id, start, end):
        xid_counts[code] = xid_counts.get(code, 0) + 1
    mem_last, mem_total = lv("memory_used_bytes"), lv("memory_total_bytes") or g.memory_total_bytes
    if n == 0:
        findings.append({"severity": "unknown", "message": "no samples in the window"})
    for field, (count, reason) in sorted(rejected.items()):
        # Information, never a verdict: the value was refused, so nothing was concluded from it.
        findings.append(
            {"severity": "info", "message": f"{field}: reported impossible values {count} times in the window ({reason})"}
        )

    return {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "serial": g.serial,
        "pci_bus_id": g.pci_bus_id,
        "samples": n,
        "up_samples": up,
        "sm_active": {"source": activity_source, "mean_ratio": sm_mean, "max_ratio": sm_max},
        "sm_occupancy": {
            "mean_ratio": stat("sm_occupancy_ratio", "mean", None if g.gpm_supported else "no GPM on this GPU"),
            "max_ratio": stat("sm_occupancy_ratio", "max", None if g.gpm_supported else "no GPM on this GPU"),
        },
        "memory": {
            "used_last_bytes": mem_last,
            "used_max_bytes": stat("memory_used_bytes", "max"),
            "reserved_last_bytes": lv("memory_reserved_bytes"),
            "total_bytes": mem_total,
        },
        "pcie": pcie,
        "ecc": ecc,
        "temperature": {"mean_celsius": stat("temperature_celsius", "mean"), "max_celsius": stat("temperature_celsius", "max")},
        "power": {"mean_watts": stat("power_watts", "mean"), "max_watts": stat("power_watts", "max")},
        "sm_clock": {"mean_hertz": stat("sm_clock_hertz", "mean"), "max_hertz": stat("sm_clock_hertz", "max")},
        "remapped_rows": {
            "uncorrectable": lv("remapped_rows_uncorrectable_total"),
            "pending": lv("remapped_rows_pending"),
            "failure": lv("remapped_rows_failure"),
        },
        "xid_counts": {str(k): v for k, v in sorted(xid_counts.items())},
        "rejected": {k: {"count": c, "reason": r} for k, (c, r) in sorted(rejected.items())},
        "findings": findings,
        "unknown": unknown,
    }


def _finding(alert: Any) -> dict[str, Any]:
    """A report finding of a pending or firing alert (a pending alert is information)."""
    firing = alert.state == "firing"
    return {
        "severity": alert.severity if firing else "info",
        "message": alert.description if firing else f"pending: {alert.description}",
        "alert": alert.name,
        "state": alert.state,
        "summary": alert.summary,
        "labels": dict(alert.labels),
        "runbook_url": alert.runbook_url,
    }


def _add_rule_findings(report: dict[str, Any], store: Store, hostname: str, end: float, thresholds: Any) -> None:
    """Evaluate the rule catalogue at the window's end (``Engine.evaluate_window``) and put each
    pending or firing alert under its GPU (GPU subjects) or the host; list the rules whose inputs
    are absent as unknown, with the reason."""
    from vgpumon.rules.catalogue import BY_NAME
    from vgpumon.rules.engine import Engine

    engine = Engine(thresholds)
    findings, book = engine.evaluate_window(store, hostname, end)
    by_uuid = {g["uuid"]: g for g in report["gpus"]}
    for g in report["gpus"]:
        g["rules_unknown"] = {}
    report["rules_unknown"] = []
    for f in findings:
        if f.state != "unknown":
            continue
        gpu = by_uuid.get(f.labels.get("uuid", "")) if BY_NAME[f.rule].subject in _GPU_SUBJECTS else None
        if gpu is not None:
            gpu["rules_unknown"][f.rule] = f.reason
        else:
            report["rules_unknown"].append({"rule": f.rule, "labels": f.labels, "reason": f.reason})
    report["alerts"] = [a.as_dict() for a in book.open()]
    for a in book.open():
        gpu = by_uuid.get(a.labels.get("uuid", "")) if BY_NAME[a.name].subject in _GPU_SUBJECTS else None
        (gpu or report)["findings"].append(_finding(a))


def build_report(
    store: Store,
    host: str,
    *,
    window_seconds: float = 900.0,
    now: float | None = None,
    max_age_seconds: float | None = None,
    local_hostname: str | None = None,
    thresholds: Any = None,
) -> dict[str, Any]:
    """Build the diagnose report of one host from the store.

    Args:
        store: an open store.
        host: host name as stored; ``localhost`` means this machine.
        window_seconds: length of the window that ends at the host's newest stored sample.
        now: current time (epoch seconds) for the sample age; ``time.time()`` when ``None``.
        max_age_seconds: when set, a newest sample older than this makes the report UNKNOWN
            ("is the agent running?"), as monitoring plugins treat stale data; ``None`` reports
            on whatever the store holds (replays, post-mortems).
        local_hostname: the name ``localhost`` stands for (``resolve_host``).
        thresholds: the rules' ``vgpumon.rules.Thresholds`` (defaults when ``None``).

    Returns:
        A JSON-able dict: ``host``, ``status`` (``ok``/``warning``/``critical``/``unknown``),
        ``window`` (start, end, seconds), ``newest_sample_age_seconds``, ``gpus`` (one dict per GPU,
        values in base units, ``None`` where unknown with the reason under ``unknown``, the
        GPU's alerts under ``findings`` and its rules without inputs under ``rules_unknown``),
        ``findings`` (the host's own: vLLM servers, shared PCIe ports, sources), ``alerts`` (every
        pending or firing alert) and ``rules_unknown`` (host rules without inputs).

    Raises:
        StoreUnavailableError: the store cannot be read.
    """
    import time

    now = time.time() if now is None else now
    hostname = resolve_host(host, local_hostname)
    report = unknown_report(hostname)
    known = store.hostnames()  # also checks that the store holds vgpumon tables
    gpus = store.gpus_of(hostname) if hostname in known else []
    if not gpus:
        hint = f"; hosts in the store: {', '.join(known)}" if known else "; the store is empty"
        report["findings"].append({"severity": "unknown", "message": f"host {hostname!r} not in the store{hint}"})
        return report
    end = store.newest_ts([g.id for g in gpus])
    if end is None:
        report["findings"].append({"severity": "unknown", "message": "no samples stored for this host"})
        return report
    start = end - window_seconds
    report["window"] = {"start": _iso(start), "end": _iso(end), "seconds": window_seconds}
    report["newest_sample_age_seconds"] = max(0.0, now - end)
    if max_age_seconds is not None and now - end > max_age_seconds:
        report["findings"].append(
            {"severity": "unknown", "message": f"newest sample is {now - end:.0f} s old (> {max_age_seconds:.0f} s): is the agent running?"}
        )
    report["findings"] += _unidentified_findings(store.events(hostname, 0, end, kinds=_DEVICE_SET_EVENTS))
    topology = store.topology(hostname)
    index_of = {g.identity.uuid: g.identity.index for g in gpus}
    # one window query for all GPUs: a tick's rows share pages, so per-GPU queries would read
    # every page once per GPU (docs/benchmarks.md, store section)
    aggs = store.window_aggregates_many([g.id for g in gpus], start, end, WINDOW_COLUMNS)
    rejected = store.rejections(hostname, start, end)
    report["gpus"] = [
        _gpu_report(store, g, start, end, aggs[g.id], topology, index_of, rejected.get(f"gpu:{g.identity.uuid}"))
        for g in gpus
    ]
    _add_rule_findings(report, store, hostname, end, thresholds)
    worst = "ok"
    for gpu in [*report["gpus"], {"findings": report["findings"]}]:
        for f in gpu["findings"]:
            if _RANK[f["severity"]] > _RANK[worst]:
                worst = f["severity"]
    report["status"] = worst
    return report


_DEVICE_SET_EVENTS = ("gpu_unidentified", "gpu_appeared")


def _unidentified_findings(events: list[Any]) -> list[dict[str, str]]:
    """A device NVML counts but cannot name (no UUID: it has no history, so no rule sees it) and
    that has not been named since: the host has a GPU it cannot report on. A GPU that was named
    and went is the GpuMissing rule's."""
    open_: dict[str, Any] = {}
    for e in events:  # oldest first
        if e.kind == "gpu_appeared":
            index = e.detail.split(",", 1)[0].removeprefix("index ").strip()
            open_.pop(f"index:{index}", None)
        else:
            open_[e.subject] = e
    return [
        {"severity": "warning", "message": f"{subject} cannot be identified since {_iso(e.ts)} ({e.detail})"}
        for subject, e in open_.items()
    ]


def unknown_report(host: str, message: str | None = None) -> dict[str, Any]:
    """A report with status ``unknown`` (no data, store unreachable), optionally with a finding."""
    findings = [{"severity": "unknown", "message": message}] if message else []
    return {"host": host, "status": "unknown", "window": None, "gpus": [], "findings": findings}


def exit_code(report: dict[str, Any]) -> ExitCode:
    """Exit code for a report's status (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN)."""
    return SEVERITY_EXIT[report["status"]]
