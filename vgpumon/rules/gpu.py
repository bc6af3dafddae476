"""GPU health rules: ECC, row remapping, XIDs, a GPU lost, unreadable, missing or stuck, thermal
and power-brake slowdown, memory nearly full or held by idle SMs.

Each check reads the host's stored data as of the evaluation time (``HostView``) and yields one
``Finding`` per GPU: firing, ok, or unknown when its inputs are absent (a board without ECC, a
GPU without GPM) — never ok for lack of data. Thresholds: ``vgpumon.config.thresholds``.
"""

from __future__ import annotations

from typing import Iterable

from vgpumon import catalogue
from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.catalogue.gpu import CLOCKS_EVENT_REASONS
from vgpumon.catalogue.xid import XIDS
from vgpumon.config.thresholds import Thresholds
from vgpumon.model.gpu import GPU_LOST_REASON
from vgpumon.rules.core import Finding, Rule, Runbook, Twin, by, duration, gb, gpu_labels, pct, prom, prom_duration
from vgpumon.rules.view import HostView
from vgpumon.store import StoredGpu

G = "gpu_samples"
BY = by("gpu")

#: XIDs that page: NVIDIA's DCGM health watches (FACTS §4) and nvidia_gpu_exporter's allowlist
#: (FACTS §7) — 48, 62, 64, 74, 79, 95, 119, 120 and 140.
CRITICAL_XIDS = (48, 62, 64, 74, 79, 95, 119, 120, 140)
#: XIDs worth a ticket that never page alone: 94 (contained ECC error; DCGM: warning) and the
#: memory-class 31, 32, 43, 63 (FACTS §4) — 31 and 43 are mostly raised by application faults.
WARNING_XIDS = (94, 31, 32, 43, 63)
#: What an XID means, for descriptions: our table of NVIDIA's Xid catalog (``vgpumon.catalogue.xid``).
XID_MEANINGS: dict[int, str] = {code: x.meaning for code, x in XIDS.items()}
_THERMAL_BITS = tuple(b for b, n in CLOCKS_EVENT_REASONS.items() if n in ("sw_thermal_slowdown", "hw_thermal_slowdown"))
_BRAKE_BITS = tuple(b for b, n in CLOCKS_EVENT_REASONS.items() if n == "hw_power_brake_slowdown")


def _labels(view: HostView, g: StoredGpu) -> dict[str, str]:
    return gpu_labels(view.hostname, g.identity.index, g.identity.uuid)


def _unknown(rule: Rule, view: HostView, g: StoredGpu, reason: str) -> Finding:
    return Finding(rule.name, _labels(view, g), "unknown", reason=reason)


def _meanings(codes: dict[int, int]) -> str:
    return "; ".join(f"XID {c} × {n} ({XID_MEANINGS.get(c, 'see the Xid catalog')})" for c, n in sorted(codes.items()))


# -- cumulative counters and latched flags (slow set) ---------------------------------------------


def _latched(column: str, absent: str, fires: "callable") -> "callable":  # type: ignore[valid-type]
    """A check on the newest value of a slow-set counter or flag (at or before the evaluation)."""

    def check(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
        for g in view.gpus:
            item = view.last_values(g.id, (column,))[column]
            if item is None:
                yield _unknown(rule, view, g, absent)
                continue
            ts, value = item
            on = bool(fires(value))
            yield Finding(rule.name, _labels(view, g), "firing" if on else "ok", float(value),
                          {"value": int(value), "read": duration(view.at - ts) + " ago"})

    return check


def _latched_twin(column: str, condition: str, description: str) -> "callable":  # type: ignore[valid-type]
    """The twin of a ``_latched`` check: the newest value of ``column`` meets ``condition``."""

    def twin(th: Thresholds) -> list[Twin]:
        return [Twin(f"max {BY} ({prom(G, column)}) {condition}", description)]

    return twin


_ecc_twin = _latched_twin(
    "ecc_uncorrected_volatile_total", "> 0",
    "{{ $value }} volatile uncorrectable ECC errors on GPU {{ $labels.gpu }} of {{ $labels.hostname }}: drain and reset it.")
_remap_failure_twin = _latched_twin(
    "remapped_rows_failure", "== 1", "Row remapping failed on GPU {{ $labels.gpu }} of {{ $labels.hostname }}: the GPU needs replacing.")
_remap_pending_twin = _latched_twin(
    "remapped_rows_pending", "== 1", "A row remap waits for a reset on GPU {{ $labels.gpu }} of {{ $labels.hostname }}: drain it and reset.")
_remapped_high_twin = _latched_twin(
    "remapped_rows_uncorrectable_total", ">= 512",
    "{{ $value }} rows remapped after uncorrectable errors on GPU {{ $labels.gpu }} of {{ $labels.hostname }} (≥ 512).")


# -- XIDs -------------------------------------------------------------------------------------------


def _xid_check(codes: tuple[int, ...] | None, exclude: tuple[int, ...] = ()) -> "callable":  # type: ignore[valid-type]
    """XIDs of ``codes`` (``None``: any code not in ``exclude``) in the XID window, per GPU."""

    def check(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
        window = th.xid_window_seconds
        seen: dict[int, dict[int, int]] = {}
        for _, gpu_id, xid in view.xids(window):
            if (codes is None and xid not in exclude) or (codes is not None and xid in codes):
                seen.setdefault(gpu_id, {})
                seen[gpu_id][xid] = seen[gpu_id].get(xid, 0) + 1
        agg = view.window(window, ("up",), ("count",))
        for g in view.gpus:
            found = seen.get(g.id)
            if found:
                yield Finding(rule.name, _labels(view, g), "firing", float(sum(found.values())),
                              {"xids": _meanings(found), "window": duration(window)})
            elif not agg[g.id]["samples"]:
                # no tick in the window: nobody listened for XIDs there
                yield _unknown(rule, view, g, f"no samples in the last {duration(window)}")
            else:
                yield Finding(rule.name, _labels(view, g), "ok", 0.0, {"window": duration(window)})

    return check


def _xid_selector(codes: Iterable[int], negate: bool = False) -> str:
    regex = "|".join(str(c) for c in codes)
    metric = prom("xid_events", "xid")
    return f'{metric}{{xid{"!~" if negate else "=~"}"{regex}"}}'


def _xid_twin(codes: Iterable[int], negate: bool = False) -> "callable":  # type: ignore[valid-type]
    def twin(th: Thresholds) -> list[Twin]:
        sel, w = _xid_selector(codes, negate), prom_duration(th.xid_window_seconds)
        # a code's counter series starts at its first event (at 1): increase() misses that first
        # event, so a series that did not exist one window ago counts as well
        expr = f"sum {BY} ((increase({sel}[{w}]) > 0) or ({sel} unless {sel} offset {w})) > 0"
        return [Twin(expr, "XID events on GPU {{ $labels.gpu }} of {{ $labels.hostname }} in the last " + w
                     + "; their codes are the xid labels of " + prom("xid_events", "xid") + ".")]

    return twin


# -- readable, lost, missing --------------------------------------------------------------------


def down_reasons(view: HostView, th: Thresholds) -> dict[int, str]:
    """Per GPU unreadable at ``view.at``: the NVML source's newest word on why (``gpu_down`` or
    ``gpu_wedged`` detail since the GPU went down), or ``"unreadable"`` where it recorded none."""
    since = view.down_since()
    out = {gid: "unreadable" for gid in since}
    for e in view.events(th.missing_lookback_seconds):  # oldest first: the newest word wins
        gid = e["gpu_id"]
        if gid in since and e["kind"] in ("gpu_down", "gpu_wedged") and e["ts"] >= since[gid] - 1e-3:
            out[gid] = e["detail"] or e["kind"]
    return out


def _lost(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    """Unreadable now, and either for ``lost_for_seconds`` or with NVML's own "GPU is lost": that
    answer is the driver's verdict (the GPU fell off the bus or is otherwise inaccessible; only a
    reset or a reboot undoes it), so waiting a minute adds nothing but a minute."""
    window = th.lost_for_seconds
    newest = view.latest(("up",))
    since = view.down_since()
    reasons = down_reasons(view, th) if since else {}
    for g in view.gpus:
        last = newest.get(g.id)
        if last is None or view.at - last["ts"] > th.missing_after_seconds:
            # no recent row: nothing says whether it is readable (GpuMissing's case)
            yield _unknown(rule, view, g, f"no samples in the last {duration(th.missing_after_seconds)}")
            continue
        began = since.get(g.id)
        if began is None:
            yield Finding(rule.name, _labels(view, g), "ok", 0.0, {"window": duration(window)})
            continue
        reason = reasons.get(g.id, "unreadable")
        down_for = view.at - began
        on = down_for >= window or reason == GPU_LOST_REASON
        yield Finding(rule.name, _labels(view, g), "firing" if on else "ok", down_for,
                      {"since": duration(down_for), "reason": reason, "window": duration(window)})


def _unreadable(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.unreadable_window_seconds
    agg = view.window(window, ("up",), ("count",))
    newest = view.latest(("up",))
    for g in view.gpus:
        a, last = agg[g.id], newest.get(g.id)
        n, up = a["samples"], a["up_samples"] or 0
        if not n or last is None:
            yield _unknown(rule, view, g, f"no samples in the last {duration(window)}")
            continue
        # down now is GpuLost's case; this one is a GPU that came back (or flaps)
        on = up < n and bool(last["up"])
        yield Finding(rule.name, _labels(view, g), "firing" if on else "ok", float(n - up),
                      {"down": n - up, "ticks": n, "window": duration(window)})


def _missing(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    """GPUs registered for the host (seen before) without a recent sample while another GPU of
    the host reports: a driver reload or a GPU off the bus removed it from NVML's list. A GPU the
    NVML source recorded as gone (``gpu_disappeared``, not appeared since) is missing at once,
    with the moment it went."""
    newest = view.latest(("up",))
    recent = {gid for gid, row in newest.items() if view.at - row["ts"] <= th.missing_after_seconds}
    if not recent:
        for g in view.gpus:
            yield _unknown(rule, view, g, f"no GPU of the host reported in the last {duration(th.missing_after_seconds)}")
        return
    # the NVML source's own word, when it recorded one: the newest of "disappeared" / "appeared"
    last: dict[int, dict] = {}
    for e in view.events(th.missing_lookback_seconds):  # oldest first
        if e["gpu_id"] is not None and e["kind"] in ("gpu_disappeared", "gpu_appeared"):
            last[e["gpu_id"]] = e
    gone = {gid: e for gid, e in last.items() if e["kind"] == "gpu_disappeared"}
    for g in view.gpus:
        row = newest.get(g.id)
        if g.id in recent and g.id not in gone:
            yield Finding(rule.name, _labels(view, g), "ok")
            continue
        if row is None or view.at - row["ts"] > th.missing_lookback_seconds:
            continue  # not seen in the lookback: a card taken out long ago is no longer expected
        ev = gone.get(g.id)
        yield Finding(
            rule.name, _labels(view, g), "firing", view.at - row["ts"],
            {"last_seen": duration(view.at - row["ts"]) + " ago", "bus": g.identity.pci_bus_id or "?",
             "reporting": len(recent - set(gone)), "registered": len(view.gpus),
             "event": f"; the NVML source recorded it disappearing ({ev['detail'] or ev['kind']})" if ev else ""},
        )


# -- stuck ------------------------------------------------------------------------------------------

_STUCK_COLUMNS = ("ts", "utilization_gpu_ratio", "sm_active_ratio", "tensor_active_ratio", "dram_active_ratio",
                  "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")


def _covers(a: dict, view: HostView, window: float) -> bool:
    """The window's rows span it (its oldest row within 10 % of its start)."""
    return a["samples"] > 0 and a["ts_min"] is not None and a["ts_min"] <= view.at - 0.9 * window


def _stuck(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.stuck_window_seconds
    agg = view.window(window, _STUCK_COLUMNS)
    for g in view.gpus:
        a = agg[g.id]
        cap = link_capacity_bytes_per_second(g.identity.pcie_link_gen_max, g.identity.pcie_link_width_max)
        if not g.identity.gpm_supported:
            yield _unknown(rule, view, g, "no GPM on this GPU: SM activity unknown (utilization alone cannot tell stuck from busy)")
            continue
        needed = ("utilization_gpu_ratio_min", "sm_active_ratio_max", "tensor_active_ratio_max", "dram_active_ratio_max",
                  "pcie_tx_bytes_per_second_max", "pcie_rx_bytes_per_second_max")
        if not _covers(a, view, window) or any(a[k] is None for k in needed) or not cap:
            yield _unknown(rule, view, g, f"utilization, GPM activity, PCIe or the link not reported over the last {duration(window)}")
            continue
        engines = max(a["sm_active_ratio_max"], a["tensor_active_ratio_max"], a["dram_active_ratio_max"])
        pcie = (a["pcie_tx_bytes_per_second_max"] + a["pcie_rx_bytes_per_second_max"]) / cap
        every_tick = a["utilization_gpu_ratio_count"] == a["samples"]  # NULL: that tick was unreadable
        on = (every_tick and a["utilization_gpu_ratio_min"] >= th.stuck_utilization_ratio
              and engines <= th.stuck_engine_ratio and pcie < th.stuck_pcie_ratio)
        yield Finding(rule.name, _labels(view, g), "firing" if on else "ok", a["utilization_gpu_ratio_min"],
                      {"util": pct(a["utilization_gpu_ratio_min"]), "engines": pct(engines), "pcie": f"{pcie * 100:.2f} %",
                       "window": duration(window)})


def _stuck_twin(th: Thresholds) -> list[Twin]:
    cap = prom("exporter", "pcie_link_capacity_bytes_per_second")
    tx, rx = prom(G, "pcie_tx_bytes_per_second"), prom(G, "pcie_rx_bytes_per_second")
    expr = (
        f"max {BY} ({prom(G, 'utilization_gpu_ratio')}) >= {th.stuck_utilization_ratio}\n"
        f"and max {BY} ({prom(G, 'sm_active_ratio')}) <= {th.stuck_engine_ratio}\n"
        f"and max {BY} ({prom(G, 'tensor_active_ratio')}) <= {th.stuck_engine_ratio}\n"
        f"and max {BY} ({prom(G, 'dram_active_ratio')}) <= {th.stuck_engine_ratio}\n"
        f"and max {BY} (({tx} + {rx}) / on (hostname, gpu, uuid) group_left {cap}) < {th.stuck_pcie_ratio}"
    )
    return [Twin(expr, "GPU {{ $labels.gpu }} of {{ $labels.hostname }} reads utilization {{ $value | humanizePercentage }} "
                 "with every GPM engine idle and no PCIe traffic for " + prom_duration(th.stuck_window_seconds) + ".",
                 for_seconds=th.stuck_window_seconds)]


# -- thermal and power brake --------------------------------------------------------------------


def _share(rows: list[dict], bits: tuple[int, ...]) -> float | None:
    known = [r["clocks_event_reasons"] for r in rows if r["clocks_event_reasons"] is not None]
    if not known:
        return None
    mask = sum(bits)
    return sum(1 for v in known if int(v) & mask) / len(known)


#: What the thermal and power-brake rules read of each tick: one read serves both (their windows
#: are both 2 min by default; the view reads a window and a column set once per evaluation).
_CLOCKS_READ = ("clocks_event_reasons", "temperature_celsius", "power_watts")


def _thermal(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.thermal_window_seconds
    for g in view.gpus:
        rows = view.series(g.id, window, _CLOCKS_READ)
        share = _share(rows, _THERMAL_BITS)
        temps = [r["temperature_celsius"] for r in rows if r["temperature_celsius"] is not None]
        mean_t = sum(temps) / len(temps) if temps else None
        limit = g.identity.slowdown_temperature_celsius
        at_limit = mean_t is not None and limit is not None and mean_t >= limit - th.thermal_margin_celsius
        if share is None and (mean_t is None or limit is None):
            yield _unknown(rule, view, g, "neither clocks-event reasons nor temperature with the GPU's slowdown threshold reported")
            continue
        on = (share is not None and share >= 0.5) or at_limit
        yield Finding(rule.name, _labels(view, g), "firing" if on else "ok", mean_t,
                      {"share": pct(share), "temp": "N/A" if mean_t is None else f"{mean_t:.0f} °C",
                       "limit": "not reported" if limit is None else f"{limit:.0f} °C", "window": duration(window)})


def _thermal_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.thermal_window_seconds)
    reasons = prom(G, "clocks_event_reasons")
    thermal = "|".join(CLOCKS_EVENT_REASONS[b] for b in _THERMAL_BITS)
    limit = prom("gpus", "slowdown_temperature_celsius")
    desc = ("GPU {{ $labels.gpu }} of {{ $labels.hostname }} is slowed down by heat over the last " + w
            + " (thermal clocks-event reason, or temperature at the GPU's own slowdown threshold).")
    expr = (f'max {BY} (avg_over_time({reasons}{{reason=~"{thermal}"}}[{w}])) >= 0.5\n'
            f"or max {BY} (avg_over_time({prom(G, 'temperature_celsius')}[{w}]))\n"
            f"   >= on (hostname, gpu, uuid) (max {BY} ({limit}) - {th.thermal_margin_celsius:g})")
    return [Twin(expr, desc)]


def _brake(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.power_brake_window_seconds
    for g in view.gpus:
        rows = view.series(g.id, window, _CLOCKS_READ)
        share = _share(rows, _BRAKE_BITS)
        if share is None:
            yield _unknown(rule, view, g, "clocks-event reasons not reported")
            continue
        watts = [r["power_watts"] for r in rows if r["power_watts"] is not None]
        yield Finding(rule.name, _labels(view, g), "firing" if share >= 0.5 else "ok", share,
                      {"share": pct(share), "power": f"{max(watts):.0f} W" if watts else "N/A", "window": duration(window)})


def _brake_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.power_brake_window_seconds)
    reasons = prom(G, "clocks_event_reasons", reason="hw_power_brake_slowdown")
    return [Twin(f"max {BY} (avg_over_time({reasons}[{w}])) >= 0.5",
                 "GPU {{ $labels.gpu }} of {{ $labels.hostname }} had its hardware power brake engaged "
                 "{{ $value | humanizePercentage }} of the last " + w + ".")]


# -- memory -----------------------------------------------------------------------------------------


def _memory_full(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    newest = view.latest(("memory_used_bytes", "memory_total_bytes"))
    for g in view.gpus:
        row = newest.get(g.id)
        used = None if row is None else row["memory_used_bytes"]
        total = (row or {}).get("memory_total_bytes") or g.identity.memory_total_bytes
        if used is None or not total:
            yield _unknown(rule, view, g, "memory used or total not reported")
            continue
        share = used / total
        yield Finding(rule.name, _labels(view, g), "firing" if share >= th.memory_full_ratio else "ok", share,
                      {"share": pct(share), "used": gb(used), "total": gb(total)})


def _memory_full_twin(th: Thresholds) -> list[Twin]:
    return [Twin(f"max {BY} ({prom(G, 'memory_used_bytes')} / {prom(G, 'memory_total_bytes')}) >= {th.memory_full_ratio}",
                 "GPU {{ $labels.gpu }} of {{ $labels.hostname }} has {{ $value | humanizePercentage }} of its memory in use.")]


def _live_vllm_gpus(view: HostView, window: float) -> set[str]:
    """UUIDs of GPUs held by a vLLM server start that was alive in the window: its KV cache is
    allocated at start by design, so memory held with idle SMs there is not a finding."""
    out: set[str] = set()
    for inst in view.vllm_instances:
        if inst["ended"] is not None and inst["ended"] < view.at - window:
            continue
        if inst["last_seen"] < view.at - window:
            continue
        out.update(m["gpu_uuid"] for m in view.vllm_gpu_map(inst["id"]))
    return out


def _held_idle(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.memory_idle_window_seconds
    agg = view.window(window, ("ts", "memory_used_bytes", "sm_active_ratio", "utilization_gpu_ratio"))
    serving = _live_vllm_gpus(view, window)
    for g in view.gpus:
        a = agg[g.id]
        if not g.identity.gpm_supported:
            yield _unknown(rule, view, g, "no GPM on this GPU: SM activity unknown")
            continue
        if not _covers(a, view, window) or a["memory_used_bytes_min"] is None or a["sm_active_ratio_max"] is None:
            yield _unknown(rule, view, g, f"memory or SM activity not reported over the last {duration(window)}")
            continue
        held, busiest, util = a["memory_used_bytes_min"], a["sm_active_ratio_max"], a["utilization_gpu_ratio_max"]
        # utilization too: a copy engine at work (SM 0, utilization 100 %) is not idle
        idle = busiest <= th.memory_idle_sm_ratio and (util is None or util <= th.memory_idle_utilization_ratio)
        on = held >= th.memory_idle_min_bytes and idle and g.identity.uuid not in serving
        yield Finding(rule.name, _labels(view, g), "firing" if on else "ok", held,
                      {"held": gb(held), "sm": pct(busiest), "util": pct(util), "window": duration(window),
                       "vllm": " (held by a live vLLM server: its KV cache)" if g.identity.uuid in serving else ""})


def _held_idle_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.memory_idle_window_seconds)
    mapping = prom("exporter", "server_gpu_info")
    expr = (
        f"(max {BY} ({prom(G, 'memory_used_bytes')}) >= {th.memory_idle_min_bytes:.0f}\n"
        f" and max {BY} ({prom(G, 'sm_active_ratio')}) <= {th.memory_idle_sm_ratio}\n"
        f" and max {BY} ({prom(G, 'utilization_gpu_ratio')}) <= {th.memory_idle_utilization_ratio})\n"
        f"unless on (hostname, uuid) {mapping}"
    )
    return [Twin(expr, "GPU {{ $labels.gpu }} of {{ $labels.hostname }} has held {{ $value | humanize1024 }}B for " + w
                 + " while its SMs stayed idle, and no vLLM server holds it.", for_seconds=th.memory_idle_window_seconds)]


def _unreadable_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.unreadable_window_seconds)
    up = prom(G, "up")
    return [Twin(f"max {BY} (min_over_time({up}[{w}])) == 0 and max {BY} ({up}) == 1",
                 "GPU {{ $labels.gpu }} of {{ $labels.hostname }} could not be read for part of the last " + w
                 + " and answers again.")]


def _lost_twin(th: Thresholds) -> list[Twin]:
    return [Twin(f"max {BY} ({prom(G, 'up')}) == 0",
                 "GPU {{ $labels.gpu }} of {{ $labels.hostname }} has not answered NVML for "
                 + prom_duration(th.lost_for_seconds) + ".", for_seconds=th.lost_for_seconds)]


def _missing_twin(th: Thresholds) -> list[Twin]:
    info = catalogue.INFO_METRICS["gpus"]
    look = prom_duration(th.missing_lookback_seconds)
    expr = (f"max {BY} ((max_over_time({info}[{look}]) unless on (hostname, uuid) {info})\n"
            f"  and on (hostname) max by (hostname) ({info}))")
    return [Twin(expr, "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) of {{ $labels.hostname }} reported in the last " + look
                 + " and is gone from NVML's list while the host's other GPUs report.",
                 for_seconds=th.missing_after_seconds)]


RULES: tuple[Rule, ...] = (
    Rule(
        "GpuEccUncorrectable", "critical", "gpu",
        "A GPU reported uncorrectable (double-bit) ECC errors.",
        "{value} volatile uncorrectable ECC errors since the driver loaded (read {read}): drain and reset the GPU.",
        (f"{G}.ecc_uncorrected_volatile_total",),
        _latched("ecc_uncorrected_volatile_total", "ECC not reported (disabled or not supported)", lambda v: v > 0),
        _ecc_twin,
        Runbook(
            "The GPU's memory returned data that ECC could not correct since the driver was loaded. Results computed on "
            "it may be wrong, and NVIDIA's health watches (DCGM) fail a GPU on any volatile double-bit error.",
            "`nvidia-smi -q -d ECC -i <gpu>` shows the volatile and aggregate counts; `vgpumon diagnose <host>` shows "
            "them per GPU; the kernel log has XID 48 or 94/95 beside it.",
            "Drain the GPU (stop scheduling work on it), then reset it (`nvidia-smi -r -i <gpu>`) or reboot. If errors "
            "come back, or row remapping fails, open a hardware case with the serial number.",
        ),
    ),
    Rule(
        "GpuRowRemapFailed", "critical", "gpu",
        "Row remapping failed on a GPU: its memory can no longer be repaired.",
        "The GPU reports a failed row remap (read {read}): it needs replacing.",
        (f"{G}.remapped_rows_failure",),
        _latched("remapped_rows_failure", "row remapping not reported (NVML has it from Ampere on; this GPU, driver or capture gave none)", bool),
        _remap_failure_twin,
        Runbook(
            "HBM rows with uncorrectable errors are remapped to spare rows; a failed remap means no spare was left or "
            "the remap could not be recorded. DCGM treats it as a failed GPU.",
            "`nvidia-smi -q -d ROW_REMAPPER -i <gpu>` shows 'Remapping Failure Occurred: Yes'.",
            "Take the GPU out of service and open a hardware case (RMA) with its serial number.",
        ),
    ),
    Rule(
        "GpuRowRemapPending", "warning", "gpu",
        "A row remap waits for a GPU reset.",
        "A row remap is pending (read {read}): the GPU runs without it until it is reset.",
        (f"{G}.remapped_rows_pending",),
        _latched("remapped_rows_pending", "row remapping not reported (NVML has it from Ampere on; this GPU, driver or capture gave none)", bool),
        _remap_pending_twin,
        Runbook(
            "An uncorrectable error marked a memory row for remapping; the remap takes effect at the next GPU reset.",
            "`nvidia-smi -q -d ROW_REMAPPER -i <gpu>` shows 'Pending: Yes'; the kernel log has XID 63.",
            "Drain the GPU and reset it (`nvidia-smi -r -i <gpu>`) or reboot at the next window.",
        ),
    ),
    Rule(
        "GpuRemappedRowsHigh", "warning", "gpu",
        "A GPU has remapped many rows after uncorrectable errors.",
        "{value} rows remapped after uncorrectable errors (≥ 512, DCGM's warning level; read {read}).",
        (f"{G}.remapped_rows_uncorrectable_total",),
        _latched("remapped_rows_uncorrectable_total", "row remapping not reported (NVML has it from Ampere on; this GPU, driver or capture gave none)", lambda v: v >= 512),
        _remapped_high_twin,
        Runbook(
            "Each uncorrectable memory error uses a spare row; at 512 DCGM warns that the spares are running out.",
            "`nvidia-smi -q -d ROW_REMAPPER -i <gpu>` and the Bank Remap Availability Histogram.",
            "Plan a replacement; watch for `GpuRowRemapFailed`.",
        ),
    ),
    Rule(
        "GpuXidCritical", "critical", "gpu",
        "A GPU raised an XID that takes it out of service.",
        "{xids} in the last {window}.",
        ("xid_events.xid",),
        _xid_check(CRITICAL_XIDS),
        _xid_twin(CRITICAL_XIDS),
        Runbook(
            "The driver reported an XID of the critical allowlist (48, 62, 64, 74, 79, 95, 119, 120, 140; FACTS §4 and "
            "§7): double-bit or uncontained ECC errors, a halted micro-controller or GSP, an NVLink error, or the GPU "
            "falling off the bus. Work on the GPU has failed or will.",
            "`journalctl -k | grep -i xid` (or `dmesg`) shows the XID with its text; `vgpumon diagnose <host>` lists "
            "every event with its time, repeats included.",
            "Drain the GPU. 79 and 119/120: reset or reboot, then check PCIe seating and power. 48/95/140: see "
            "`GpuEccUncorrectable`. Repeated after a reset: open a hardware case.",
        ),
    ),
    Rule(
        "GpuXidWarning", "warning", "gpu",
        "A GPU raised an XID worth a look (contained ECC error or a memory-class fault).",
        "{xids} in the last {window}.",
        ("xid_events.xid",),
        _xid_check(WARNING_XIDS),
        _xid_twin(WARNING_XIDS),
        Runbook(
            "94 is a contained ECC error (the application that touched the memory was stopped, the GPU lives on); 31, 32 "
            "and 43 are memory faults and channel resets, most often caused by the application; 63 records a row remap. "
            "None of them pages on its own.",
            "`journalctl -k | grep -i xid` shows the process (pid) the driver blamed; the application's own log says "
            "whether it crashed.",
            "If one application raises it, hand it to its owners. If several do, or it repeats on one GPU, check "
            "`GpuRowRemapPending` and the ECC counts, and drain the GPU.",
        ),
    ),
    Rule(
        "GpuXidOther", "info", "gpu",
        "A GPU raised an XID outside the allowlists (usually an application fault).",
        "{xids} in the last {window}.",
        ("xid_events.xid",),
        _xid_check(None, exclude=CRITICAL_XIDS + WARNING_XIDS),
        _xid_twin(CRITICAL_XIDS + WARNING_XIDS, negate=True),
        Runbook(
            "XIDs such as 13 (graphics engine exception) are raised by application faults and never page (FACTS §7).",
            "`journalctl -k | grep -i xid` names the process.",
            "Nothing on the GPU side; tell the application's owners if it repeats.",
        ),
    ),
    Rule(
        "GpuLost", "critical", "gpu",
        "A GPU stopped answering NVML.",
        "Unreadable for {since} (NVML: {reason}): it is lost now.",
        (f"{G}.up", "gpu_events"),
        _lost,
        _lost_twin,
        Runbook(
            "NVML answers 'GPU is lost' or similar for this GPU: it fell off the bus, was reset, or its driver state is "
            "broken. A GPU that falls off the bus may never deliver its XID 79, so this alert stands on its own. It fires "
            "once the GPU has been unreadable for a minute, or at once when NVML answers 'GPU is lost' (the driver's own "
            "verdict, which only a reset or a reboot undoes); the Prometheus twin cannot see NVML's answer and waits the minute.",
            "`nvidia-smi` on the host lists the GPU as lost or errors; `journalctl -k | grep -i -e xid -e NVRM` shows "
            "what the driver saw; `lspci | grep -i nvidia` shows whether the device is still on the bus.",
            "Drain the host's work from it; try `nvidia-smi -r -i <gpu>`, else reboot. If it recurs, reseat the card "
            "and check the slot's power and riser.",
        ),
        every_seconds=15.0,
    ),
    Rule(
        "GpuUnreadable", "warning", "gpu",
        "A GPU could not be read for part of the window and answers again.",
        "GPU unreadable for {down} of {ticks} ticks in the last {window}.",
        (f"{G}.up",),
        _unreadable,
        _unreadable_twin,
        Runbook(
            "Some ticks could not read the GPU (lost, reset required, a wedged call) but it answers now: a transient "
            "fault, a reset, or the first sign of a GPU about to be lost.",
            "`vgpumon diagnose <host>` shows the unreadable ticks; `journalctl -k` around those times.",
            "If it repeats, drain the GPU and check XIDs and the PCIe link (`GpuPcieReplaysHigh`).",
        ),
    ),
    Rule(
        "GpuMissing", "critical", "gpu",
        "A GPU that the host had is gone from NVML's list.",
        "GPU (bus {bus}) last reported {last_seen}; {reporting} of the host's {registered} registered GPUs report now{event}.",
        (f"{G}.up", "gpus.uuid", "gpu_events"),
        _missing,
        _missing_twin,
        Runbook(
            "The GPU was seen on this host before but NVML no longer lists it while the other GPUs report: a driver "
            "reload or re-initialisation came back without it, or it fell off the bus and was removed.",
            "`nvidia-smi -L` and `lspci | grep -i nvidia` on the host; `journalctl -k` for XID 79 and PCIe errors.",
            "If the card was removed on purpose, the alert clears a day after its last sample. Otherwise drain the host, "
            "reboot, and reseat or replace the card if it stays missing.",
        ),
    ),
    Rule(
        "GpuStuck", "critical", "gpu",
        "A GPU reads fully utilized while nothing on it works.",
        "Utilization stayed at or above {util} for {window} while SM, tensor and DRAM activity stayed at or below {engines} "
        "and PCIe TX+RX at {pcie} of the link: the GPU is stuck, not busy.",
        (f"{G}.utilization_gpu_ratio", f"{G}.sm_active_ratio", f"{G}.tensor_active_ratio", f"{G}.dram_active_ratio",
         f"{G}.pcie_tx_bytes_per_second", f"{G}.pcie_rx_bytes_per_second", "gpus.pcie_link_gen_max", "gpus.pcie_link_width_max"),
        _stuck,
        _stuck_twin,
        Runbook(
            "utilization.gpu counts time any kernel or copy was resident, not work done. Near 100 % with every GPM engine "
            "idle and no PCIe traffic means a kernel or context that no longer progresses — often after an XID 31/43. "
            "A host→device copy also reads 100 % with SMs at 0, but moves tens of GB/s over PCIe: that is busy, and "
            "this rule leaves it alone (FACTS §1).",
            "`nvidia-smi -q -d UTILIZATION,PIDS -i <gpu>`; the application's progress (tokens/s, steps); "
            "`journalctl -k | grep -i xid`.",
            "Restart the process that holds the GPU; if the GPU stays stuck, reset it (`nvidia-smi -r -i <gpu>`).",
        ),
        every_seconds=30.0,
    ),
    Rule(
        "GpuThermalSlowdown", "warning", "gpu",
        "A GPU is slowed down by heat.",
        "Thermal clocks-event reason active {share} of the last {window}; mean temperature {temp} against this GPU's own "
        "slowdown threshold {limit}.",
        (f"{G}.clocks_event_reasons", f"{G}.temperature_celsius", "gpus.slowdown_temperature_celsius"),
        _thermal,
        _thermal_twin,
        Runbook(
            "The driver lowers the clocks because the GPU reached its thermal limit (software or hardware thermal "
            "slowdown in the clocks-event reasons), or the temperature stands at the GPU's own NVML slowdown threshold. "
            "The threshold is the GPU's, not a fixed 85 °C, which pages daily on SKUs that run hot (FACTS §7).",
            "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE -i <gpu>`; compare with the GPU's neighbours in the chassis.",
            "Check airflow, fans and inlet temperature of the chassis; move load off the GPU if it persists.",
        ),
        keep_firing_seconds=120.0,
        every_seconds=30.0,
    ),
    Rule(
        "GpuPowerBrakeSlowdown", "warning", "gpu",
        "A GPU's hardware power brake slows it down.",
        "Hardware power brake active {share} of the last {window} (peak draw {power}).",
        (f"{G}.clocks_event_reasons", f"{G}.power_watts"),
        _brake,
        _brake_twin,
        Runbook(
            "The board's power brake (an external signal, usually from the power supply or chassis) forces the clocks "
            "down. Software power capping at the power limit is normal under full load and is not this alert.",
            "`nvidia-smi -q -d PERFORMANCE -i <gpu>` shows 'HW Power Brake Slowdown: Active'.",
            "Check the chassis power supplies and their redundancy; ask the facility about power events.",
        ),
        keep_firing_seconds=120.0,
        every_seconds=30.0,
    ),
    Rule(
        "GpuMemoryNearlyFull", "warning", "gpu",
        "A GPU's memory is nearly full.",
        "{share} of the GPU's memory in use ({used} of {total}).",
        (f"{G}.memory_used_bytes", f"{G}.memory_total_bytes"),
        _memory_full,
        _memory_full_twin,
        Runbook(
            "Less than 5 % of the GPU's memory is free: the next allocation may fail with out-of-memory. vLLM allocates "
            "its KV cache up front (gpu_memory_utilization, 0.9 by default), so a server set to 0.95 or more reads like this.",
            "`nvidia-smi --query-compute-apps=pid,used_memory --format=csv -i <gpu>`; `GpuMemoryLeak` for a trend.",
            "Find the process that grew; lower vLLM's --gpu-memory-utilization if it is the reason.",
        ),
    ),
    Rule(
        "GpuMemoryHeldIdle", "warning", "gpu",
        "A GPU holds memory while its SMs have been idle for a long time.",
        "{held} held for the last {window} while SM activity never rose above {sm} and utilization above {util}{vllm}.",
        (f"{G}.memory_used_bytes", f"{G}.sm_active_ratio", f"{G}.utilization_gpu_ratio", "vllm_gpu_map"),
        _held_idle,
        _held_idle_twin,
        Runbook(
            "A process keeps GPU memory but has run nothing for an hour: a finished job that did not exit, a notebook "
            "kernel, a zombie. The GPU looks taken to schedulers while it does no work. GPUs held by a live vLLM server "
            "are left out (its KV cache is allocated by design).",
            "`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv -i <gpu>`; `vgpumon diagnose <host>`.",
            "Ask the owner, then end the process.",
        ),
        every_seconds=60.0,
    ),
)
