"""GPU usage rules: a GPU stuck (utilization without work), thermal and power-brake slowdown,
memory nearly full or held by idle SMs. They belong to the GPU health group: ``vgpumon.rules.gpu``
lists them after its own (``gpu.RULES``).

Each check reads the host's stored data as of the evaluation time (``HostView``) and yields one
``Finding`` per GPU: firing, ok, or unknown when its inputs are absent (a GPU without GPM) —
never ok for lack of data. Thresholds: ``vgpumon.config.thresholds``.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.catalogue.gpu import CLOCKS_EVENT_REASONS
from vgpumon.config.thresholds import Thresholds
from vgpumon.rules.core import (
    Finding,
    Rule,
    Runbook,
    Twin,
    by,
    duration,
    gb,
    gpu_labels,
    not_applicable,
    pct,
    prom,
    prom_duration,
)
from vgpumon.rules.view import HostView
from vgpumon.store import StoredGpu

G = "gpu_samples"
BY = by("gpu")

_THERMAL_BITS = tuple(b for b, n in CLOCKS_EVENT_REASONS.items() if n in ("sw_thermal_slowdown", "hw_thermal_slowdown"))
_BRAKE_BITS = tuple(b for b, n in CLOCKS_EVENT_REASONS.items() if n == "hw_power_brake_slowdown")


def _labels(view: HostView, g: StoredGpu) -> dict[str, str]:
    return gpu_labels(view.hostname, g.identity.index, g.identity.uuid)


def _unknown(rule: Rule, view: HostView, g: StoredGpu, reason: str) -> Finding:
    return Finding(rule.name, _labels(view, g), "unknown", reason=reason)


# -- stuck ------------------------------------------------------------------------------------------

_STUCK_COLUMNS = ("ts", "utilization_gpu_ratio", "sm_active_ratio", "tensor_active_ratio", "dram_active_ratio",
                  "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")


def _covers(a: dict, view: HostView, window: float) -> bool:
    """The window's rows span it (its oldest row within 10 % of its start)."""
    return a["samples"] > 0 and a["ts_min"] is not None and a["ts_min"] <= view.at - 0.9 * window


def _too_short(a: dict, view: HostView, window: float) -> str | None:
    """Why the window's rows cannot be judged when they do not span it (``_covers``): none
    stored, or a history shorter than the rule looks at (a 76-second replay against a 5-minute
    window), said as such — the inputs themselves may all be there."""
    if not a["samples"] or a["ts_min"] is None:
        return f"no samples in the last {duration(window)}"
    if _covers(a, view, window):
        return None
    return (f"samples span only the last {duration(max(0.0, view.at - a['ts_min']))}; it judges the last "
            f"{duration(window)} and needs samples over 90 % of it")


def _missing(names: Mapping[str, object]) -> str:
    """``a, b and c not reported`` for the inputs (name → value) that are absent."""
    absent = [n for n, v in names.items() if v is None or v is False]
    said = absent[0] if len(absent) == 1 else ", ".join(absent[:-1]) + f" and {absent[-1]}"
    return f"{said} not reported"


def _stuck(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.stuck_window_seconds
    agg = view.window(window, _STUCK_COLUMNS)
    for g in view.gpus:
        a = agg[g.id]
        cap = link_capacity_bytes_per_second(g.identity.pcie_link_gen_max, g.identity.pcie_link_width_max)
        if not g.identity.gpm_supported:
            yield _unknown(rule, view, g, not_applicable("no GPM on this GPU: SM activity unknown (utilization alone cannot tell stuck from busy)"))
            continue
        needed = ("utilization_gpu_ratio_min", "sm_active_ratio_max", "tensor_active_ratio_max", "dram_active_ratio_max",
                  "pcie_tx_bytes_per_second_max", "pcie_rx_bytes_per_second_max")
        util, sm, tensor, dram, tx, rx = (a[k] for k in needed)
        inputs = {"utilization": util, "SM activity": sm, "tensor activity": tensor, "DRAM activity": dram,
                  "PCIe TX": tx, "PCIe RX": rx, "the max link": bool(cap)}
        short = _too_short(a, view, window)
        if (short is not None or util is None or sm is None or tensor is None or dram is None or tx is None
                or rx is None or not cap):
            yield _unknown(rule, view, g, short or f"{_missing(inputs)} over the last {duration(window)}")
            continue
        engines = max(sm, tensor, dram)
        pcie = (tx + rx) / cap
        every_tick = a["utilization_gpu_ratio_count"] == a["samples"]  # NULL: that tick was unreadable
        on = (every_tick and util >= th.stuck_utilization_ratio
              and engines <= th.stuck_engine_ratio and pcie < th.stuck_pcie_ratio)
        yield Finding(rule.name, _labels(view, g), "firing" if on else "ok", util,
                      {"util": pct(util), "engines": pct(engines), "pcie": f"{pcie * 100:.2f} %",
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
            yield _unknown(rule, view, g, not_applicable("no GPM on this GPU: SM activity unknown"))
            continue
        short = _too_short(a, view, window)
        held, busiest, util = a["memory_used_bytes_min"], a["sm_active_ratio_max"], a["utilization_gpu_ratio_max"]
        if short is not None or held is None or busiest is None:
            yield _unknown(rule, view, g, short or f"{_missing({'memory used': held, 'SM activity': busiest})} over the last {duration(window)}")
            continue
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


RULES: tuple[Rule, ...] = (
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
